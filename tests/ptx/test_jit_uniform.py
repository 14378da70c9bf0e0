"""Shared loads whose address is the same for every lane of a row (computed before a barrier
from %tid.y, %ctaid, parameters and constants, as ``As[ty][k]`` in a tiled matmul): the
vectorized regions load them without a per-lane condition, from offset 0 where the check
failed (``lower.KernelLowering.shared_ptr``). What must hold: the values the interpreter
gives, and its fault, word for word, when that address is outside shared memory."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import KernelFault, jit, load_ptx
from crane.backends.sim.ptx.jit.lower import rematerializable, x_uniform
from crane.backends.sim.ptx.parser import parse_module

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: sh[lin] = lin for every lane; after the barrier each lane adds sh[ty + idx] and
#: sh[ty + idx + 1] (the same two words for a whole row) and stores the sum to out[lin]
ROW = (
    HEAD
    + """
.visible .entry t(.param .u64 out, .param .u32 idx)
{
    .reg .b32 %r<20>;
    .reg .b64 %rd<8>;
    .shared .align 4 .b8 sh[256];
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [idx];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, %tid.y;
    mov.u32 %r4, %ntid.x;
    mad.lo.s32 %r5, %r3, %r4, %r2;
    mov.u32 %r6, sh;
    shl.b32 %r7, %r5, 2;
    add.s32 %r8, %r6, %r7;
    shl.b32 %r9, %r3, 2;
    shl.b32 %r11, %r1, 2;
    add.s32 %r12, %r9, %r11;
    add.s32 %r13, %r6, %r12;
    st.shared.u32 [%r8], %r5;
    bar.sync 0;
    ld.shared.u32 %r14, [%r13];
    ld.shared.u32 %r15, [%r13+4];
    add.s32 %r16, %r14, %r15;
    mul.wide.u32 %rd2, %r5, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r16;
    ret;
}
"""
)


pytestmark = pytest.mark.usefixtures("compile_every_launch")


def test_row_uniform_registers():
    """%r13 (from %tid.y, a parameter and the shared base) is the same across a row; %r8
    (from %tid.x) is not."""
    fn = parse_module(ROW).functions["t"]
    _, prefix = rematerializable(fn.body)
    names = {r.uid: r.name for r in fn.regs}
    uniform = {names[uid] for uid in x_uniform(fn.body, prefix)}
    assert {"%r13", "%r12", "%r9", "%r11", "%r1", "%r6"} <= uniform
    assert not {"%r2", "%r5", "%r7", "%r8"} & uniform


@pytest.mark.parametrize("idx", [0, 3, 50])
def test_row_uniform_loads_same_as_interpreter(dev, monkeypatch, idx):
    """2-D blocks, every lane at the barrier: the vectorized region reads the row's words;
    diff mode compares every byte with the interpreter."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(ROW + f"\n// idx {idx}\n")
    out = dev.zeros(64, np.uint32)
    dev.launch(prog, "t", 1, (16, 4, 1), [Ptr(out), np.uint32(idx)])
    ty = np.arange(64) // 16
    want = (ty + idx) + (ty + idx + 1)
    assert np.array_equal(dev.download(out, 64, np.uint32), want.astype(np.uint32))
    assert "t" in {n for n, _ in jit.stats()["compiled"]}


@pytest.mark.parametrize("idx", [64, 1 << 20, 0xFFFFFFF0])
def test_row_uniform_load_fault_same_as_interpreter(dev, monkeypatch, idx):
    """The rows' address past the 256 bytes of shared memory (or, 0xFFFFFFF0, below it):
    the lanes run again scalar and the first faults as the interpreter words it
    (instruction, address, PTX line). (Where one row would fault at the first load and
    another only at the second, the two paths name different instructions, compiler or
    not: the interpreter runs instruction by instruction over all lanes, the compiled
    code lane by lane.)"""
    prog = load_ptx(ROW + f"\n// fault {idx}\n")
    out = dev.zeros(64, np.uint32)
    got, want = [], []
    for mode, into in (("1", got), ("0", want)):
        monkeypatch.setenv("CRANE_PTX_JIT", mode)
        with pytest.raises(KernelFault) as e:
            dev.launch(prog, "t", 1, (16, 4, 1), [Ptr(out), np.uint32(idx)])
        into.append(e.value)
    assert got[0].code == want[0].code
    assert str(got[0]) == str(want[0])
    assert "ld.shared.u32" in str(got[0])
