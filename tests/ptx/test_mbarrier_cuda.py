"""CUDA's cuda::barrier, cuda::memcpy_async and cuda::pipeline (libcu++), compiled by nvcc for
compute_80 (mbarrier + cp.async) and compute_90 (also try_wait, expect_tx, cp.async.bulk),
run on the simulated GPU and checked against the host."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import load_ptx

SRC = Path(__file__).parent / "extra_kernels" / "async_copy.cu"
ARCHS = ("compute_80", "compute_90")


@pytest.fixture(scope="module")
def async_progs(nvcc, tmp_path_factory):
    out = tmp_path_factory.mktemp("async")
    progs = {}
    for arch in ARCHS:
        p = out / f"async_{arch}.ptx"
        cmd = [nvcc, "-ptx", "-O3", "-std=c++17", f"-arch={arch}", str(SRC), "-o", str(p)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
        text = p.read_text()
        if arch == "compute_90":  # the Hopper paths are the ones exercised there
            for form in (
                "cp.async.bulk.shared::cluster.global",
                "mbarrier.try_wait.parity",
                "mbarrier.expect_tx",
            ):
                assert form in text, form
        progs[arch] = load_ptx(text)
    return progs


@pytest.mark.parametrize("arch", ARCHS)
def test_barrier_phases(dev, rng, async_progs, arch):
    n, blocks, rounds = 96, 3, 5
    x = rng.integers(-1000, 1000, blocks * n).astype(np.int32)
    pin, pout = dev.upload(x), dev.zeros(blocks * n, np.int32)
    dev.launch(
        async_progs[arch], "barrier_phases", blocks, n, [Ptr(pin), Ptr(pout), np.int32(rounds)]
    )
    got = dev.download(pout, blocks * n, np.int32).reshape(blocks, n)
    v = x.reshape(blocks, n).astype(np.int64)
    for _ in range(rounds):
        v = v + np.roll(v, -1, axis=1)
    assert (got == v.astype(np.int32)).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_memcpy_async_with_barrier(dev, rng, async_progs, arch):
    blocks, tiles, n = 2, 3, 256
    x = rng.standard_normal(blocks * tiles * 512).astype(np.float32)
    pin, pout = dev.upload(x), dev.zeros(blocks * n, np.float32)
    dev.launch(
        async_progs[arch], "memcpy_barrier", blocks, n, [Ptr(pin), Ptr(pout), np.int32(tiles)]
    )
    got = dev.download(pout, blocks * n, np.float32).reshape(blocks, n)
    t = x.reshape(blocks, tiles, 512)
    want = np.zeros((blocks, n), np.float32)
    for k in range(tiles):
        want = want + (t[:, k, :n] * np.float32(k + 1) + t[:, k, 511 - np.arange(n)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_thread_scope_pipeline(dev, rng, async_progs, arch):
    blocks, chunks, n = 2, 5, 128
    x = rng.integers(-100, 100, blocks * chunks * n * 4).astype(np.int32)
    pin, pout = dev.upload(x), dev.zeros(blocks * n, np.int32)
    dev.launch(
        async_progs[arch], "thread_pipeline", blocks, n, [Ptr(pin), Ptr(pout), np.int32(chunks)]
    )
    got = dev.download(pout, blocks * n, np.int32).reshape(blocks, n)
    v = x.reshape(blocks, chunks, n, 4).astype(np.int64)
    want = (v * np.array([1, 2, 3, 4])).sum(axis=(1, 3))
    assert (got == want).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_producer_consumer_pipeline(dev, rng, async_progs, arch):
    """Warp 0 produces through a two-stage block pipeline, warps 1..3 consume; consumers
    wait first in program order, so they must park until the producer's stage lands."""
    blocks, chunks, n = 2, 6, 128
    x = rng.standard_normal(blocks * chunks * 256).astype(np.float32)
    pin, pout = dev.upload(x), dev.zeros(blocks * n, np.float32)
    dev.launch(
        async_progs[arch], "role_pipeline", blocks, n, [Ptr(pin), Ptr(pout), np.int32(chunks)]
    )
    got = dev.download(pout, blocks * n, np.float32).reshape(blocks, n)
    v = x.reshape(blocks, chunks, 256)
    ncons = n - 32
    for b in range(blocks):
        assert (got[b, :32] == 0).all()
        for c in range(ncons):
            want = v[b, :, c::ncons].sum()
            assert abs(got[b, 32 + c] - want) < 1e-4, (b, c)
