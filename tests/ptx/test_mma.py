"""Warp-level MMA (``ops_mma.py``): ``mma.sync.aligned.m8n8k4.row.col.f64`` in hand-written PTX,
each lane loading its fragments at the PTX ISA's positions, two warps with their own matrices,
D written over C in place; other forms are refused at load, naming them."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import PtxUnsupported, load_ptx

KERNEL = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry t(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd,
                  .param .u64 pe)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<24>;
    .reg .f64 %fd<8>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u64 %rd4, [pd];
    ld.param.u64 %rd20, [pe];
    mov.u32 %r1, %laneid;
    shr.u32 %r2, %r1, 2;            // groupID
    and.b32 %r3, %r1, 3;            // threadID_in_group
    mov.u32 %r9, %tid.x;
    shr.u32 %r8, %r9, 5;            // warp: its own A, B (32 elements each) and C, D (64)
    mad.lo.u32 %r4, %r2, 4, %r3;    // A[groupID][tig], A 8x4 row-major
    mad.lo.u32 %r4, %r8, 32, %r4;
    mul.wide.u32 %rd5, %r4, 8;
    add.s64 %rd6, %rd1, %rd5;
    ld.global.f64 %fd1, [%rd6];
    mad.lo.u32 %r5, %r3, 8, %r2;    // B[tig][groupID], B 4x8 stored row-major
    mad.lo.u32 %r5, %r8, 32, %r5;
    mul.wide.u32 %rd7, %r5, 8;
    add.s64 %rd8, %rd2, %rd7;
    ld.global.f64 %fd2, [%rd8];
    shl.b32 %r6, %r3, 1;            // C[groupID][2 tig + i], 8x8 row-major
    mad.lo.u32 %r7, %r2, 8, %r6;
    mad.lo.u32 %r7, %r8, 64, %r7;
    mul.wide.u32 %rd9, %r7, 8;
    add.s64 %rd10, %rd3, %rd9;
    ld.global.v2.f64 {%fd3, %fd4}, [%rd10];
    mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%fd5, %fd6}, {%fd1}, {%fd2}, {%fd3, %fd4};
    add.s64 %rd11, %rd4, %rd9;
    st.global.v2.f64 [%rd11], {%fd5, %fd6};
    mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%fd3, %fd4}, {%fd1}, {%fd2}, {%fd3, %fd4};
    add.s64 %rd12, %rd20, %rd9;
    st.global.v2.f64 [%rd12], {%fd3, %fd4};
    ret;
}
"""


def test_mma_m8n8k4_f64(dev, rng) -> None:
    a = rng.standard_normal((2, 8, 4))
    b = rng.standard_normal((2, 4, 8))
    c = rng.standard_normal((2, 8, 8))
    a[1, 2, 3], b[0, 1, 5] = 3.0, -0.5  # exact values among the random ones
    pa, pb, pc = dev.upload(a), dev.upload(b), dev.upload(c)
    pd, pe = dev.zeros(128, np.float64), dev.zeros(128, np.float64)
    dev.launch(load_ptx(KERNEL), "t", 1, 64, [Ptr(pa), Ptr(pb), Ptr(pc), Ptr(pd), Ptr(pe)])
    want = a @ b + c
    got = dev.download(pd, 128, np.float64).reshape(2, 8, 8)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)
    in_place = dev.download(pe, 128, np.float64).reshape(2, 8, 8)
    np.testing.assert_array_equal(in_place, got)
    # integers: every partial sum exact, so the result is exact whatever the order
    ia, ib, ic = (np.round(x * 8) for x in (a, b, c))
    pa, pb, pc = dev.upload(ia), dev.upload(ib), dev.upload(ic)
    dev.launch(load_ptx(KERNEL), "t", 1, 64, [Ptr(pa), Ptr(pb), Ptr(pc), Ptr(pd), Ptr(pe)])
    np.testing.assert_array_equal(dev.download(pd, 128, np.float64).reshape(2, 8, 8), ia @ ib + ic)


@pytest.mark.parametrize(
    "form",
    [
        "m16n8k16.row.row.f32.f16.f16.f32",
        "m8n8k4.row.col.f32.f16.f16.f32",
        "m16n8k16.row.col.f32.f16.bf16.f32",
        "m16n8k16.row.col.satfinite.f32.f16.f16.f32",
        "m8n8k4.row.row.f64.f64.f64.f64",
        "m8n8k4.rz.row.col.f64.f64.f64.f64",
    ],
)
def test_other_mma_forms_are_refused_at_load(form: str) -> None:
    text = KERNEL.replace(
        "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%fd5", f"mma.sync.aligned.{form} {{%fd5"
    )
    with pytest.raises(PtxUnsupported, match=f"mma form .sync.aligned.{form}"):
        load_ptx(text)
