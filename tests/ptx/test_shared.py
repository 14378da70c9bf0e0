"""Shared-memory kernels with barriers: tiled matmul, reductions, scan, bitonic sort,
histogram, dynamic shared memory."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import blocks, fma32_ref, i32


def _matmul_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each output is fma(a[k], b[k], acc) for k = 0.. in order, in float32."""
    m, k = a.shape
    acc = np.zeros((m, b.shape[1]), np.float32)
    for kk in range(k):
        acc = fma32_ref(a[:, kk][:, None], b[kk, :][None, :], acc)
    return acc


@pytest.mark.parametrize(("m", "n", "k"), [(16, 16, 16), (33, 17, 45), (5, 70, 3)])
def test_matmul_tiled(program, arch, dev, rng, m, n, k):
    prog = program("matmul", arch)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    pa, pb, pc = dev.upload(a), dev.upload(b), dev.zeros(m * n, np.float32)
    grid = (blocks(n, 16), blocks(m, 16), 1)
    dev.launch(prog, "matmul_tiled", grid, (16, 16, 1), [pa, pb, pc, i32(m), i32(n), i32(k)])
    got = dev.download(pc, m * n, np.float32).reshape(m, n)
    # zero padding adds fma(0, 0, acc) = acc, so the chain per element is exact in order
    assert np.array_equal(got, _matmul_ref(a, b))


def test_matmul_square(program, arch, dev, rng):
    prog = program("matmul", arch)
    n = 48
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    pa, pb, pc = dev.upload(a), dev.upload(b), dev.zeros(n * n, np.float32)
    dev.launch(prog, "matmul_square", (3, 3, 1), (16, 16, 1), [pa, pb, pc, i32(n)])
    got = dev.download(pc, n * n, np.float32).reshape(n, n)
    assert np.allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def _tree_reduce_ref(x: np.ndarray, bs: int) -> np.ndarray:
    """The kernel's exact float32 summation order, per block."""
    n = x.size
    nb = blocks(n, 2 * bs)
    pad = np.zeros(nb * 2 * bs, np.float32)
    pad[:n] = x
    v = pad.reshape(nb, 2, bs)
    s = v[:, 0, :] + v[:, 1, :]
    k = bs // 2
    while k > 0:
        s[:, :k] = s[:, :k] + s[:, k : 2 * k]
        k //= 2
    return s[:, 0]


@pytest.mark.parametrize(("n", "bs"), [(1, 64), (1000, 128), (5000, 256), (4096, 32)])
def test_reduce_shared_exact_order(program, arch, dev, rng, n, bs):
    prog = program("reduce", arch)
    x = rng.standard_normal(n).astype(np.float32)
    nb = blocks(n, 2 * bs)
    px, pp = dev.upload(x), dev.zeros(nb, np.float32)
    dev.launch(prog, "reduce_shared", nb, bs, [px, pp, i32(n)], shared=bs * 4)
    assert np.array_equal(dev.download(pp, nb, np.float32), _tree_reduce_ref(x, bs))


@pytest.mark.parametrize(("n", "grid", "bs"), [(1000, 4, 128), (100000, 16, 256), (77, 1, 96)])
def test_reduce_atomic(program, arch, dev, rng, n, grid, bs):
    prog = program("reduce", arch)
    x = rng.random(n).astype(np.float32)
    px, po = dev.upload(x), dev.zeros(1, np.float32)
    dev.launch(prog, "reduce_atomic", grid, bs, [px, po, i32(n)])
    got = dev.download(po, 1, np.float32)[0]
    assert got == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-5)


@pytest.mark.parametrize(("n", "grid"), [(1, 1), (12345, 7), (256 * 9, 9)])
def test_reduce_int_exact(program, arch, dev, rng, n, grid):
    prog = program("reduce", arch)
    x = rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int32)
    px, po = dev.upload(x), dev.zeros(1, np.uint64)
    dev.launch(prog, "reduce_int", grid, 256, [px, po, i32(n)])
    got = dev.download(po, 1, np.int64)[0]
    assert got == int(x.astype(np.int64).sum())


def _scan(prog, dev, x: np.ndarray, bs: int) -> np.ndarray:
    n = x.size
    nb = blocks(n, 2 * bs)
    px, po, ps = dev.upload(x), dev.zeros(n, np.int32), dev.zeros(nb, np.int32)
    dev.launch(prog, "scan_blocks", nb, bs, [px, po, ps, i32(n)], shared=2 * bs * 4)
    sums = dev.download(ps, nb, np.int32)
    scanned = np.concatenate([[0], np.cumsum(sums)[:-1]]).astype(np.int32)
    pss = dev.upload(scanned)
    dev.launch(prog, "scan_add", nb, bs, [po, pss, i32(n)])
    return dev.download(po, n, np.int32)


@pytest.mark.parametrize(("n", "bs"), [(1, 32), (1000, 64), (4096, 128), (3001, 256)])
def test_prefix_scan(program, arch, dev, rng, n, bs):
    prog = program("scan", arch)
    x = rng.integers(-1000, 1000, n, dtype=np.int32)
    got = _scan(prog, dev, x, bs)
    assert np.array_equal(got, np.concatenate([[0], np.cumsum(x)[:-1]]).astype(np.int32))


@pytest.mark.parametrize(("nseg", "bs"), [(1, 512), (3, 64), (8, 16)])
def test_bitonic_block(program, arch, dev, rng, nseg, bs):
    prog = program("bitonic", arch)
    x = rng.standard_normal(nseg * 2 * bs).astype(np.float32)
    p = dev.upload(x)
    dev.launch(prog, "bitonic_block", nseg, bs, [p], shared=2 * bs * 4)
    got = dev.download(p, x.size, np.float32).reshape(nseg, 2 * bs)
    assert np.array_equal(got, np.sort(x.reshape(nseg, 2 * bs), axis=1))


def test_bitonic_global(program, arch, dev, rng):
    prog = program("bitonic", arch)
    n = 1 << 11
    x = rng.integers(0, 2**32, n, dtype=np.uint32)
    p = dev.upload(x)
    k = 2
    while k <= n:
        j = k // 2
        while j > 0:
            dev.launch(prog, "bitonic_step", n // 256, 256, [p, i32(j), i32(k)])
            j //= 2
        k *= 2
    assert np.array_equal(dev.download(p, n, np.uint32), np.sort(x))


@pytest.mark.parametrize(
    ("n", "grid", "bs"), [(1, 1, 64), (10000, 5, 128), (65536, 8, 256), (999, 3, 300)]
)
def test_histogram(program, arch, dev, rng, n, grid, bs):
    prog = program("histogram", arch)
    # skewed data: many collisions on a few bins
    data = np.minimum(rng.geometric(0.05, n), 255).astype(np.uint8)
    pd, ph = dev.upload(data), dev.zeros(256, np.uint32)
    dev.launch(prog, "histogram", grid, bs, [pd, ph, i32(n)])
    assert np.array_equal(dev.download(ph, 256, np.uint32), np.bincount(data, minlength=256))


@pytest.mark.parametrize(("n", "bs"), [(1, 32), (1000, 128), (1024, 256)])
def test_dynamic_shared(program, arch, dev, rng, n, bs):
    prog = program("shared_dyn", arch)
    x = rng.integers(-(10**6), 10**6, n, dtype=np.int32)
    nb = blocks(n, bs)
    pin, pout = dev.upload(x), dev.zeros(n, np.int32)
    dev.launch(prog, "reverse_dyn", nb, bs, [pin, pout, i32(n)], shared=bs * 4)
    got = dev.download(pout, n, np.int32)
    pad = np.zeros(nb * bs, np.int32)
    pad[:n] = x
    ref = pad.reshape(nb, bs)[:, ::-1] + (np.arange(nb) * 1000)[:, None]
    # out[j] = buf[t] + bias where j = block*bs + (bs-1-t)
    assert np.array_equal(got, ref.reshape(-1)[:n])
    f = rng.standard_normal(n).astype(np.float32)
    pin, pout = dev.upload(f), dev.zeros(n, np.float32)
    dev.launch(prog, "dyn_two_arrays", nb, bs, [pin, pout, i32(n)], shared=bs * 12)
    padf = np.zeros(nb * bs, np.float32)
    padf[:n] = f
    pf = padf.reshape(nb, bs)
    nxt = np.roll(pf, -1, axis=1)
    ref = ((nxt.astype(np.float64) * 2.0).astype(np.float32) + (nxt + np.float32(1))).reshape(-1)
    assert np.array_equal(dev.download(pout, n, np.float32), ref[:n])


def test_grid_larger_than_one_batch(program, dev, rng):
    """Blocks run in batches (program.LANES_PER_BATCH lanes); results must not depend on it."""
    from crane.backends.sim.ptx import program as program_mod

    prog = program("reduce", "compute_80")
    bs = 256
    n = 2 * bs * (program_mod.LANES_PER_BATCH // bs) * 2 + 1234  # three batches
    x = rng.standard_normal(n).astype(np.float32)
    nb = blocks(n, 2 * bs)
    px, pp = dev.upload(x), dev.zeros(nb, np.float32)
    dev.launch(prog, "reduce_shared", nb, bs, [px, pp, i32(n)], shared=bs * 4)
    assert np.array_equal(dev.download(pp, nb, np.float32), _tree_reduce_ref(x, bs))
