"""``trap`` in compiled kernels: a kernel that carries one (a library's bounds check, nvcc's
grid-sync check) compiles, runs at native speed while no lane reaches it, and a lane that
does fails the launch with the interpreter's CUDA_ERROR_LAUNCH_FAILED (719) and wording, in
the fast lane loop, in barrier regions and in loops (the vector form's regions leave it to
their scalar rounds)."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import KernelFault, jit, load_ptx

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: out[tid] = tid * 2, but thread ``bad`` traps first (a bounds check); barrier-free, loop-free:
#: the fast lane loop's form
FLAT = (
    HEAD
    + """
.visible .entry t(.param .u64 out, .param .u32 bad)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [bad];
    mov.u32 %r2, %tid.x;
    setp.ne.s32 %p1, %r2, %r1;
    @%p1 bra $L__ok;
    trap;
$L__ok:
    shl.b32 %r3, %r2, 1;
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r3;
    ret;
}
"""
)

#: the same check guarded (``@p trap``), after a barrier, inside a loop that sums ``n`` words
#: (so the kernel has barrier regions and a loop region)
LOOPED = (
    HEAD
    + """
.visible .entry t(.param .u64 out, .param .u32 bad)
{
    .reg .pred %p<4>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<6>;
    .shared .align 4 .b8 sh[1024];
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [bad];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, sh;
    shl.b32 %r4, %r2, 2;
    add.s32 %r5, %r3, %r4;
    st.shared.u32 [%r5], %r2;
    bar.sync 0;
    mov.u32 %r6, 0;
    mov.u32 %r7, 0;
$L__loop:
    setp.eq.s32 %p1, %r7, %r1;
    @%p1 trap;
    shl.b32 %r8, %r7, 2;
    add.s32 %r9, %r3, %r8;
    ld.shared.u32 %r10, [%r9];
    add.s32 %r6, %r6, %r10;
    add.s32 %r7, %r7, 1;
    setp.le.u32 %p2, %r7, %r2;
    @%p2 bra $L__loop;
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r6;
    ret;
}
"""
)

pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _compiled(source: str) -> bool:
    """Whether this module's kernel ``t`` was compiled (not refused)."""
    got = jit._cache.get((load_ptx(source).source_hash, "t"))
    return isinstance(got, jit.CompiledKernel)


def _run(dev, source: str, threads: int, bad: int, mode: str, monkeypatch):
    monkeypatch.setenv("CRANE_PTX_JIT", mode)
    prog = load_ptx(source)
    out = dev.zeros(threads, np.uint32)
    try:
        dev.launch(prog, "t", 1, threads, [Ptr(out), np.uint32(bad)])
    except KernelFault as e:
        return e
    return dev.download(out, threads, np.uint32)


@pytest.mark.parametrize("source", [FLAT, LOOPED], ids=["flat", "looped"])
def test_a_kernel_with_a_trap_compiles_and_runs_while_no_lane_reaches_it(dev, monkeypatch, source):
    got = _run(dev, source, 128, 1000, "1", monkeypatch)
    assert _compiled(source), jit.stats()["refused"]
    want = _run(dev, source, 128, 1000, "0", monkeypatch)
    assert isinstance(got, np.ndarray) and np.array_equal(got, want)


@pytest.mark.parametrize("source", [FLAT, LOOPED], ids=["flat", "looped"])
@pytest.mark.parametrize("bad", [0, 77, 127])
def test_a_lane_that_reaches_it_fails_the_launch_as_the_interpreter_does(
    dev, monkeypatch, source, bad
):
    got = _run(dev, source, 128, bad, "1", monkeypatch)
    assert _compiled(source), jit.stats()["refused"]
    want = _run(dev, source, 128, bad, "0", monkeypatch)
    assert isinstance(got, KernelFault) and isinstance(want, KernelFault)
    assert got.code == want.code == 719
    assert str(got) == str(want)
    assert "trap" in str(got) and "PTX line" in str(got)
