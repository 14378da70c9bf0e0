"""A kernel with the vectorizable form (barrier-free, loop-free) is compiled with only the
driver its 1-D launches run; the general driver is compiled when a launch with 2-D or 3-D
blocks first comes (``jit.compiled_kernel``). What must hold: both launches give the
interpreter's bytes, the general driver is compiled once, and a kernel loaded from the disk
cache compiles it on demand as well."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import jit, load_ptx

#: each thread stores its linear thread id times 3 (plus the block's) to out[linear id]
LINEAR = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry t(.param .u64 out)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %tid.y;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %ntid.y;
    mov.u32 %r5, %ctaid.x;
    mad.lo.s32 %r6, %r2, %r3, %r1;
    mul.lo.s32 %r7, %r3, %r4;
    mad.lo.s32 %r8, %r5, %r7, %r6;
    mul.lo.s32 %r9, %r8, 3;
    mul.wide.u32 %rd2, %r8, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r9;
    ret;
}
"""


pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _entry(prog):
    with jit._lock:
        return jit._cache[(prog.source_hash, "t")]


def test_general_driver_compiled_when_a_2d_launch_comes(dev, monkeypatch):
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(LINEAR + "\n// drivers\n")
    out = dev.zeros(256, np.uint32)
    dev.launch(prog, "t", 2, 128, [Ptr(out)])
    ck = _entry(prog)
    assert ck.fast is not None and ck.fn is None  # only the 1-D driver so far
    assert np.array_equal(dev.download(out, 256, np.uint32), np.arange(256) * 3)
    out2 = dev.zeros(256, np.uint32)
    dev.launch(prog, "t", 2, (16, 8, 1), [Ptr(out2)])
    assert ck.fn is not None
    general = ck.fn
    assert np.array_equal(dev.download(out2, 256, np.uint32), np.arange(256) * 3)
    dev.launch(prog, "t", 2, (8, 16, 1), [Ptr(out2)])
    assert ck.fn is general  # compiled once
    assert _entry(prog) is ck


def test_disk_cached_kernel_compiles_its_general_driver(dev, monkeypatch, tmp_path):
    """Loaded from the disk cache (which keeps the 1-D driver's object), a 2-D launch still
    finds its driver."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    monkeypatch.setenv("CRANE_PTX_JIT_CACHE", str(tmp_path))
    text = LINEAR + "\n// disk\n"
    prog = load_ptx(text)
    out = dev.zeros(256, np.uint32)
    dev.launch(prog, "t", 2, 128, [Ptr(out)])
    with jit._lock:  # as a new process would: nothing compiled in memory
        del jit._cache[(prog.source_hash, "t")]
    dev.launch(prog, "t", 2, (16, 8, 1), [Ptr(out)])
    ck = _entry(prog)
    assert ck.from_disk and ck.fn is not None
    assert np.array_equal(dev.download(out, 256, np.uint32), np.arange(256) * 3)
