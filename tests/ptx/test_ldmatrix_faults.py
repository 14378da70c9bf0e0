"""``ldmatrix`` in hand-written PTX: each lane's row address, its faults (outside shared
memory, misaligned, a partial warp) on the launch's KernelFault path as ``ld``'s, and the PTX
compiler leaving tensor-core kernels to the interpreter with one log line naming the
instruction."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import KernelFault, PtxUnsupported, load_ptx

#: lane L stores L * 16 + k into shared element (8 L + k)... then ldmatrix.x4 with lane L's
#: row address sh + 16 L + off; every lane writes its four registers to out[4 L ..]
KERNEL = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry t(.param .u64 out, .param .u32 off)
{
    .reg .b16 %h<4>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    .shared .align 16 .b8 sh[1024];
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r10, [off];
    mov.u32 %r1, %laneid;
    mov.u32 %r2, sh;
    shl.b32 %r3, %r1, 4;
    add.u32 %r4, %r2, %r3;
    mov.u32 %r5, 0;
LOOP:
    shl.b32 %r6, %r1, 3;
    add.u32 %r6, %r6, %r5;
    cvt.u16.u32 %h1, %r6;
    shl.b32 %r7, %r5, 1;
    add.u32 %r7, %r4, %r7;
    st.shared.u16 [%r7], %h1;
    add.u32 %r5, %r5, 1;
    setp.lt.u32 %p1, %r5, 8;
    @%p1 bra LOOP;
    bar.warp.sync -1;
    add.u32 %r8, %r4, %r10;
    ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r11, %r12, %r13, %r14}, [%r8];
    mul.wide.u32 %rd2, %r1, 16;
    add.s64 %rd3, %rd1, %rd2;
    st.global.v4.u32 [%rd3], {%r11, %r12, %r13, %r14};
    ret;
}
""".replace(".reg .b64 %rd<8>;", ".reg .b64 %rd<8>;\n    .reg .pred %p<2>;")


def test_ldmatrix_x4_distribution(dev) -> None:
    out = dev.zeros(128, np.uint32)
    dev.launch(load_ptx(KERNEL), "t", 1, 32, [Ptr(out), np.uint32(0)])
    got = dev.download(out, 128, np.uint32).reshape(32, 4)
    sh = np.arange(256).reshape(4, 8, 8)  # matrix i row j = lane 8 i + j's row
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            lo, hi = sh[i, g, 2 * t], sh[i, g, 2 * t + 1]
            assert got[lane, i] == lo | (hi << 16), (lane, i)


def test_ldmatrix_faults(dev) -> None:
    out = dev.zeros(128, np.uint32)
    prog = load_ptx(KERNEL)
    with pytest.raises(KernelFault, match="misaligned") as e:
        dev.launch(prog, "t", 1, 32, [Ptr(out), np.uint32(8)])
    assert e.value.code == 716
    with pytest.raises(KernelFault) as e:  # past the 1024 bytes of shared memory
        dev.launch(prog, "t", 1, 32, [Ptr(out), np.uint32(4096)])
    assert e.value.code == 700
    with pytest.raises(KernelFault, match="partial warp") as e:
        dev.launch(prog, "t", 1, 24, [Ptr(out), np.uint32(0)])
    assert e.value.code == 715


@pytest.mark.parametrize(
    "form",
    ["m8n8.x3.shared.b16", "m16n16.x1.trans.shared.b8", "m8n8.x1.global.b16"],
)
def test_unserved_ldmatrix_forms_are_refused(form: str) -> None:
    text = KERNEL.replace("m8n8.x4.shared.b16", form)
    with pytest.raises((PtxUnsupported,)):
        load_ptx(text)


def test_compiler_refuses_tensor_core_kernels_with_a_log_line(dev, monkeypatch, caplog):
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")  # always tries to compile
    prog = load_ptx(KERNEL + "\n// refusal test\n")  # a module of its own (cache by hash)
    out = dev.zeros(128, np.uint32)
    with caplog.at_level(logging.INFO, logger="crane.sim.ptx.jit"):
        dev.launch(prog, "t", 1, 32, [Ptr(out), np.uint32(0)])
    lines = [r.getMessage() for r in caplog.records if r.name == "crane.sim.ptx.jit"]
    assert len(lines) == 1, lines
    assert "runs interpreted" in lines[0] and "ldmatrix" in lines[0]
