"""``mma.sync`` (f16, bf16, tf32, int8 forms), ``ldmatrix``, ``movmatrix`` and ``stmatrix`` in
nvcc-built inline-PTX kernels (``kernels/mma_sync.cu``), the fragments loaded by ldmatrix or by
each lane at the positions the PTX ISA documents, checked against NumPy: exactly against the
interpreter's documented accumulation order (C, then the k products one at a time in f32)
and with a tolerance against float64."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr

ARCHS = ("compute_80", "compute_90")


def _acc_f32(a, b, c):
    d = c.astype(np.float32).copy()
    for k in range(a.shape[-1]):
        d += a[:, k, None].astype(np.float32) * b[k, None, :].astype(np.float32)
    return d


@pytest.mark.parametrize("arch", ARCHS)
def test_mma_f16_with_ldmatrix(dev, rng, program, arch) -> None:
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 8)).astype(np.float16)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    args = [
        dev.upload(a),
        dev.upload(b),
        dev.upload(c),
        dev.zeros(128, np.float32),
        dev.zeros(128, np.float32),
        dev.zeros(128, np.float16),
    ]
    dev.launch(program("mma_sync", arch), "mma_f16_ldmatrix", 1, 32, [Ptr(p) for p in args])
    want = _acc_f32(a, b, c)
    d1 = dev.download(args[3], 128, np.float32).reshape(16, 8)
    d2 = dev.download(args[4], 128, np.float32).reshape(16, 8)
    np.testing.assert_array_equal(d1, want)  # B through ldmatrix.trans
    np.testing.assert_array_equal(d2, want)  # B through ldmatrix of B^T
    np.testing.assert_allclose(d1, a.astype(np.float64) @ b + c, rtol=1e-5, atol=1e-5)
    d3 = dev.download(args[5], 128, np.float16).reshape(16, 8)
    np.testing.assert_array_equal(d3, _acc_f32(a, b, np.zeros((16, 8))).astype(np.float16))


@pytest.mark.parametrize("arch", ARCHS)
def test_mma_bf16(dev, rng, program, arch) -> None:
    a = (rng.standard_normal((16, 16)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    b = (rng.standard_normal((16, 8)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    af = (a.astype(np.uint32) << 16).view(np.float32)
    bf = (b.astype(np.uint32) << 16).view(np.float32)
    pa, pb, pd = dev.upload(a), dev.upload(b), dev.zeros(128, np.float32)
    dev.launch(program("mma_sync", arch), "mma_bf16", 1, 32, [Ptr(pa), Ptr(pb), Ptr(pd)])
    got = dev.download(pd, 128, np.float32).reshape(16, 8)
    np.testing.assert_array_equal(got, _acc_f32(af, bf, np.zeros((16, 8))))
    np.testing.assert_allclose(got, af.astype(np.float64) @ bf, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_mma_s8_satfinite(dev, rng, program, arch) -> None:
    a = rng.integers(-128, 128, (16, 32)).astype(np.int8)
    b = rng.integers(-128, 128, (32, 8)).astype(np.int8)
    c = rng.integers(-1000, 1000, (16, 8)).astype(np.int32)
    c[0, :4] = 2**31 - 100  # these overflow: wrap without .satfinite, clamp with it
    c[15, 4:] = -(2**31) + 100
    a[0, :], b[:, :4] = 127, 127
    a[15, :], b[:, 4:] = -128, 127
    args = [
        dev.upload(a),
        dev.upload(b),
        dev.upload(c),
        dev.zeros(128, np.int32),
        dev.zeros(128, np.int32),
    ]
    dev.launch(program("mma_sync", arch), "mma_s8", 1, 32, [Ptr(p) for p in args])
    exact = a.astype(np.int64) @ b.astype(np.int64) + c
    assert exact.max() > 2**31 - 1 and exact.min() < -(2**31)
    got = dev.download(args[3], 128, np.int32).reshape(16, 8)
    np.testing.assert_array_equal(got, exact.astype(np.int32))  # two's-complement wrap
    sat = dev.download(args[4], 128, np.int32).reshape(16, 8)
    np.testing.assert_array_equal(sat, np.clip(exact, -(2**31), 2**31 - 1))


@pytest.mark.parametrize("arch", ARCHS)
def test_mma_tf32_drops_low_mantissa_bits(dev, rng, program, arch) -> None:
    a = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal((8, 8)).astype(np.float32)
    pa, pb, pd = dev.upload(a), dev.upload(b), dev.zeros(128, np.float32)
    dev.launch(program("mma_sync", arch), "mma_tf32", 1, 32, [Ptr(pa), Ptr(pb), Ptr(pd)])
    got = dev.download(pd, 128, np.float32).reshape(16, 8)

    def trunc(x):
        return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)

    np.testing.assert_array_equal(got, _acc_f32(trunc(a), trunc(b), np.zeros((16, 8))))
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("arch", ARCHS)
def test_movmatrix_and_stmatrix(dev, rng, program, arch) -> None:
    m = rng.integers(0, 2**16, 256).astype(np.uint16)
    pm, p1, p2 = dev.upload(m), dev.zeros(64, np.uint16), dev.zeros(256, np.uint16)
    dev.launch(program("mma_sync", arch), "move_matrix", 1, 32, [Ptr(pm), Ptr(p1), Ptr(p2)])
    tiles = m.reshape(4, 8, 8)
    np.testing.assert_array_equal(dev.download(p1, 64, np.uint16).reshape(8, 8), tiles[0].T)
    if arch == "compute_90":
        got = dev.download(p2, 256, np.uint16).reshape(4, 8, 8)
        np.testing.assert_array_equal(got, tiles.transpose(0, 2, 1))
