"""``atomicAdd`` on ``__half``, ``__half2``, ``__nv_bfloat16`` and ``__nv_bfloat162`` compiled
(``atom.add.noftz.f16`` and kin, and the 16-bit ``atom.cas.b16`` loop sm_80 code emulates the
bfloat16 one with): a compare-and-swap loop whose new value is the half sum, each half rounded
once, as the interpreter rounds it.

Many lanes add into a few bins, so the order of the updates decides the rounded sums: a grid
under one core's share runs its blocks and lanes in the interpreter's order, and the compiled
bins, old values and shared-memory bins must be the interpreter's bit for bit (each kernel
is run both ways here, so this holds with ``CRANE_PTX_JIT=1`` in the environment too).
"""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import i32

from crane.backends.sim.ptx import jit
from crane.backends.sim.ptx.jit.ops_half import host_converts_halves

pytestmark = [
    pytest.mark.usefixtures("compile_every_launch"),
    pytest.mark.skipif(not host_converts_halves(), reason="the host CPU has no F16C"),
]

N = 3000
BINS = 7


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 values to bfloat16 bits (truncated: any bfloat16 values serve as inputs)."""
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _run_both(dev, prog, kernel, inputs, outs, monkeypatch):
    """``outs``: (dtype, count) of each output; the outputs interpreted, then compiled."""
    got = []
    for mode in ("0", "1"):
        monkeypatch.setenv("CRANE_PTX_JIT", mode)
        ins = [dev.upload(a) for a in inputs]
        ptrs = [dev.zeros(n, dt) for dt, n in outs]
        dev.launch(prog, kernel, (N + 127) // 128, 128, [*ins[:2], *ptrs, *ins[2:], i32(N)])
        got.append([dev.download(p, n, dt) for p, (dt, n) in zip(ptrs, outs, strict=True)])
    return got


CASES = [
    ("add_h", False, True),
    ("add_h2", True, False),
    ("add_bh", False, True),
    ("add_bh2", True, False),
]


@pytest.mark.parametrize(("kernel", "pairs", "old"), CASES)
def test_half_atomic_adds_are_the_interpreters(
    program, arch, dev, rng, monkeypatch, kernel, pairs, old
):
    prog = program("half_atomics", arch)
    width = 2 if pairs else 1
    vals = rng.uniform(-4, 4, N * width).astype(np.float32)
    if kernel.startswith("add_bh"):
        raw, as_float = _bf16(vals), lambda u: (u.astype(np.uint32) << 16).view(np.float32)
    else:
        raw, as_float = vals.astype(np.float16).view(np.uint16), lambda u: u.view(np.float16)
    bins = rng.integers(0, BINS, N).astype(np.int32)
    outs = [(np.uint16, BINS * width)] + ([(np.uint16, N)] if old else [])
    interpreted, compiled = _run_both(dev, prog, kernel, [raw, bins], outs, monkeypatch)
    for i, c in zip(interpreted, compiled, strict=True):
        np.testing.assert_array_equal(c, i)
    assert kernel in dict(jit.stats()["compiled"]), jit.stats()["refused"]
    # the bins hold about the sums (each half rounded after every add)
    per = as_float(raw).astype(np.float64).reshape(N, width)
    want = np.stack([np.bincount(bins, per[:, j], BINS) for j in range(width)], axis=1)
    got = as_float(compiled[0]).astype(np.float64).reshape(BINS, width)
    np.testing.assert_allclose(got, want, atol=0.05 * N / BINS)


def test_half_atomic_adds_on_shared_memory(program, dev, rng, monkeypatch):
    prog = program("half_atomics", "compute_80")
    raw = rng.uniform(-2, 2, N).astype(np.float16).view(np.uint16)
    bins = rng.integers(0, 64, N).astype(np.int32)
    blocks = (N + 127) // 128
    interpreted, compiled = _run_both(
        dev, prog, "add_h_shared", [raw, bins], [(np.uint16, blocks * 16)], monkeypatch
    )
    np.testing.assert_array_equal(compiled[0], interpreted[0])
    assert "add_h_shared" in dict(jit.stats()["compiled"]), jit.stats()["refused"]
