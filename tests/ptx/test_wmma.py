"""Tensor cores through the WMMA C++ API (``kernels/wmma.cu``, nvcc's ``wmma.load``,
``wmma.mma``, ``wmma.store``): half, bf16, tf32, int8 and double tiles, row- and column-major,
from global and shared memory, checked against NumPy (exactly against the interpreter's
documented order where the inputs make every rounding exact or known, else with a tolerance
against float64), and the faults of a misaligned matrix address."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import KernelFault, load_ptx


def _sm80(arch: str) -> None:
    if arch == "compute_75":
        pytest.skip("bf16, tf32 and f64 WMMA need sm_80 (the kernel is empty below)")


def _acc_f32(a, b, c):
    """The documented order: C, then the k products added one at a time in f32."""
    d = c.astype(np.float32).copy()
    for k in range(a.shape[-1]):
        d += a[..., :, k, None].astype(np.float32) * b[..., k, None, :].astype(np.float32)
    return d


def test_wmma_f16_f32(dev, rng, program, arch) -> None:
    tiles = 3
    a = rng.standard_normal((tiles, 16, 16)).astype(np.float16)
    b = rng.standard_normal((tiles, 16, 16)).astype(np.float16)  # B[k][n]
    c = rng.standard_normal((tiles, 16, 16)).astype(np.float32)
    bt = np.ascontiguousarray(b.transpose(0, 2, 1))  # column-major B
    pa, pb, pc = dev.upload(a), dev.upload(bt), dev.upload(c)
    pd = dev.zeros(tiles * 256, np.float32)
    alpha = np.float32(0.5)
    dev.launch(
        program("wmma", arch), "wmma_f16", tiles, 32, [Ptr(pa), Ptr(pb), Ptr(pc), Ptr(pd), alpha]
    )
    got = dev.download(pd, tiles * 256, np.float32).reshape(tiles, 16, 16)
    want64 = (a.astype(np.float64) @ b.astype(np.float64) + c) * 0.5
    np.testing.assert_allclose(got, want64, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got, _acc_f32(a, b, c) * alpha)


def test_wmma_f16_shared_f16_acc(dev, rng, program, arch) -> None:
    a = rng.standard_normal((32, 16)).astype(np.float16)  # A 32x16, stored column-major ld 32
    b = rng.standard_normal((16, 16)).astype(np.float16)  # B 16x8 inside a 16-wide row-major
    c = rng.standard_normal((32, 8)).astype(np.float16)
    pa = dev.upload(np.ascontiguousarray(a.T))
    pb, pc = dev.upload(b), dev.upload(c)
    pd = dev.zeros(32 * 8, np.float16)
    dev.launch(
        program("wmma", arch), "wmma_f16_shared", 1, 32, [Ptr(pa), Ptr(pb), Ptr(pc), Ptr(pd)]
    )
    got = dev.download(pd, 256, np.float16).reshape(8, 32).T  # stored column-major
    want = _acc_f32(a, b[:, :8], c).astype(np.float16)
    np.testing.assert_array_equal(got, want)
    ref = a.astype(np.float64) @ b[:, :8].astype(np.float64) + c
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2e-3, atol=2e-2)


def test_wmma_int8(dev, rng, program, arch) -> None:
    a = rng.integers(-128, 128, (8, 16)).astype(np.int8)
    b = rng.integers(-128, 128, (16, 32)).astype(np.int8)
    c = rng.integers(-(2**31), 2**31 - 1, (8, 32)).astype(np.int32)
    ua = rng.integers(0, 256, (16, 16)).astype(np.uint8)
    ub = rng.integers(0, 256, (16, 16)).astype(np.uint8)
    args = [
        dev.upload(a),
        dev.upload(b),
        dev.upload(c),
        dev.zeros(256, np.int32),
        dev.upload(np.ascontiguousarray(ua.T)),
        dev.upload(np.ascontiguousarray(ub.T)),
        dev.zeros(256, np.int32),
    ]
    dev.launch(program("wmma", arch), "wmma_s8", 1, 32, [Ptr(p) for p in args])
    want = (a.astype(np.int64) @ b.astype(np.int64) + c).astype(np.int32)  # wraps
    np.testing.assert_array_equal(dev.download(args[3], 256, np.int32).reshape(8, 32), want)
    uwant = ua.astype(np.int64) @ ub.astype(np.int64) + 7
    np.testing.assert_array_equal(dev.download(args[6], 256, np.int32).reshape(16, 16), uwant)


def _tf32(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)


def test_wmma_bf16_tf32(dev, rng, program, arch) -> None:
    _sm80(arch)
    a = rng.standard_normal((16, 16)).astype(np.float32)
    b = rng.standard_normal((16, 16)).astype(np.float32)
    a16 = (a.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation: exact values
    b16 = (b.view(np.uint32) >> 16).astype(np.uint16)
    af = (a16.astype(np.uint32) << 16).view(np.float32)
    bf = (b16.astype(np.uint32) << 16).view(np.float32)
    ta = rng.standard_normal((16, 8)).astype(np.float32)
    tb = rng.standard_normal((8, 16)).astype(np.float32)
    args = [
        dev.upload(a16),
        dev.upload(b16),
        dev.zeros(256, np.float32),
        dev.upload(ta),
        dev.upload(np.ascontiguousarray(tb.T)),
        dev.zeros(256, np.float32),
    ]
    dev.launch(program("wmma", arch), "wmma_bf16_tf32", 1, 32, [Ptr(p) for p in args])
    got = dev.download(args[2], 256, np.float32).reshape(16, 16)
    zero = np.zeros((16, 16), np.float32)
    np.testing.assert_array_equal(got, _acc_f32(af, bf, zero))
    np.testing.assert_allclose(got, af.astype(np.float64) @ bf, rtol=1e-5, atol=1e-5)
    tgot = dev.download(args[5], 256, np.float32).reshape(16, 16).T  # stored column-major
    np.testing.assert_array_equal(tgot, _acc_f32(_tf32(ta), _tf32(tb), zero))
    np.testing.assert_allclose(tgot, ta.astype(np.float64) @ tb, rtol=2e-2, atol=2e-2)


def test_wmma_f64(dev, rng, program, arch) -> None:
    _sm80(arch)
    a, b, c = rng.standard_normal((8, 4)), rng.standard_normal((4, 8)), rng.standard_normal((8, 8))
    args = [
        dev.upload(a),
        dev.upload(np.ascontiguousarray(b.T)),
        dev.upload(c),
        dev.zeros(64, np.float64),
    ]
    dev.launch(program("wmma", arch), "wmma_f64", 1, 32, [Ptr(p) for p in args])
    got = dev.download(args[3], 64, np.float64).reshape(8, 8)
    np.testing.assert_allclose(got, a @ b + c, rtol=1e-13, atol=1e-14)


def test_wmma_misaligned_address_faults(dev, rng, program) -> None:
    prog = program("wmma", "compute_80")
    pa, pb = dev.zeros(600, np.float16), dev.zeros(600, np.float16)
    pc, pd = dev.zeros(600, np.float32), dev.zeros(600, np.float32)
    # one tile past the base is 512 bytes: aligned; base + 2 bytes is not 256-bit aligned
    with pytest.raises(KernelFault, match="256-bit aligned") as e:
        dev.launch(prog, "wmma_f16", 1, 32, [Ptr(pa + 2), Ptr(pb), Ptr(pc), Ptr(pd), np.float32(1)])
    assert e.value.code == 716
    with pytest.raises(KernelFault) as e:  # past the end of the allocation
        dev.launch(
            prog, "wmma_f16", 1, 32, [Ptr(pa), Ptr(pb), Ptr(pc + (1 << 30)), Ptr(pd), np.float32(1)]
        )
    assert e.value.code == 700


def test_wmma_partial_warp_faults(dev, program) -> None:
    prog = program("wmma", "compute_80")
    p = [dev.zeros(256, np.float32) for _ in range(4)]
    with pytest.raises(KernelFault, match="partial warp") as e:
        dev.launch(prog, "wmma_f16", 1, 16, [Ptr(x) for x in p] + [np.float32(1)])
    assert e.value.code == 715


@pytest.mark.parametrize(
    "form",
    [
        "wmma.load.a.sync.aligned.row.m16n16k16.global.f32",
        "wmma.load.c.sync.aligned.row.m16n16k8.global.f16",
        "wmma.mma.sync.aligned.row.col.m16n16k16.f32.bf16.bf16.f16",
        "wmma.load.a.sync.aligned.row.m8n8k32.global.s4",
    ],
)
def test_unserved_wmma_forms_are_refused(form: str) -> None:
    from crane.backends.sim.ptx import PtxUnsupported

    text = f""".version 8.0
.target sm_80
.address_size 64
.visible .entry t(.param .u64 p)
{{
    .reg .b32 %r<20>;
    .reg .f32 %f<20>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [p];
    {form} {{%r1, %r2, %r3, %r4, %r5, %r6, %r7, %r8}}, [%rd1];
    ret;
}}
"""
    if form.startswith("wmma.mma"):
        text = text.replace(
            "[%rd1];", "{%r1, %r2, %r3, %r4}, {%r1, %r2, %r3, %r4}, {%r1, %r2, %r3, %r4};"
        ).replace(
            "{%r1, %r2, %r3, %r4, %r5, %r6, %r7, %r8}, ",
            "{%f1, %f2, %f3, %f4, %f5, %f6, %f7, %f8}, ",
        )
    with pytest.raises(PtxUnsupported, match="wmma form"):
        load_ptx(text)
