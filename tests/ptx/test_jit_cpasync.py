"""``cp.async`` compiled (:mod:`crane.backends.sim.ptx.jit.ops_cpasync`): global → shared
copies of 4, 8 and 16 bytes made at once, with the interpreter's forms (immediate, register
and ``ignore-src`` predicate source sizes, zero fill) and faults, checked against NumPy and,
each kernel run both ways here, against the interpreter byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr, i32

from crane.api.generated.cuda_enums import CUresult
from crane.backends.sim.ptx import KernelFault, jit

pytestmark = pytest.mark.usefixtures("compile_every_launch")

N, B = 1024, 256


def _both(dev, prog, kernel, inputs, out_dtype, out_n, scalars, monkeypatch):
    """The output interpreted, then compiled (each from the same inputs)."""
    got = []
    for mode in ("0", "1"):
        monkeypatch.setenv("CRANE_PTX_JIT", mode)
        ptrs = [dev.upload(a) for a in inputs]
        out = dev.zeros(out_n, out_dtype)
        dev.launch(prog, kernel, N // B, B, [*ptrs, out, *scalars])
        got.append(dev.download(out, out_n, out_dtype))
    np.testing.assert_array_equal(got[1], got[0])
    assert kernel in dict(jit.stats()["compiled"]), jit.stats()["refused"]
    return got[1]


def _zero_tail(words: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Rows of 16 bytes with the bytes from ``keep`` (per row) on zero."""
    raw = words.view(np.uint8).reshape(len(words), 16).copy()
    raw[np.arange(16)[None, :] >= keep[:, None]] = 0
    return raw.view(words.dtype).reshape(words.shape)


def _neighbour(rows: np.ndarray, step: int) -> np.ndarray:
    """Lane t of each block reads what lane (t + step) % B copied."""
    blocks = rows.reshape(N // B, B, *rows.shape[1:])
    return np.roll(blocks, -step, axis=1).reshape(rows.shape)


@pytest.mark.parametrize("shift", [0, 3])
def test_zero_fill_by_immediate_and_register_source_sizes(program, dev, rng, monkeypatch, shift):
    prog = program("cp_async", "compute_80")
    x = rng.integers(-(2**31), 2**31, (N, 4), dtype=np.int64).astype(np.int32)
    i = np.arange(N)
    got = _both(
        dev,
        prog,
        "fill16",
        [x.view(np.float32)],
        np.float32,
        4 * N,
        [i32(N), i32(shift)],
        monkeypatch,
    )
    want = _neighbour(_zero_tail(x, 16 - ((i + shift) % 5) * 4), 1)
    np.testing.assert_array_equal(got.view(np.int32).reshape(N, 4), want)
    got = _both(dev, prog, "fill_reg", [x], np.int32, 4 * N, [i32(N), i32(shift)], monkeypatch)
    want = _neighbour(_zero_tail(x, np.minimum((i + shift) % 17, 16)), 5)
    np.testing.assert_array_equal(got.reshape(N, 4), want)


def test_small_copies_and_the_ignore_src_predicate(program, dev, rng, monkeypatch):
    prog = program("cp_async", "compute_80")
    off = 7
    x2 = rng.standard_normal((N + off, 2)).astype(np.float32)
    x1 = rng.standard_normal(N + off).astype(np.float32)
    got = _both(dev, prog, "small", [x2, x1], np.float32, N, [i32(N), i32(off)], monkeypatch)
    b = _neighbour(x1[off:], 0).reshape(N // B, B)[:, ::-1].reshape(N)
    np.testing.assert_array_equal(got, x2[off:, 0] * np.float32(2) + x2[off:, 1] + b)

    x = rng.integers(-1000, 1000, (N, 4), dtype=np.int32)
    got = _both(dev, prog, "pred_imm", [x], np.int32, 4 * N, [i32(N)], monkeypatch)
    i = np.arange(N)
    s = np.where(((i & 3) == 1)[:, None], 0, x)
    t = _neighbour(_zero_tail(x, np.full(N, 8)), 3)
    np.testing.assert_array_equal(got.reshape(N, 4), s + t)


def test_faults_are_the_interpreters(program, dev, monkeypatch):
    """A whole copy past the allocation: an illegal address; a source off the copy's
    alignment: misaligned (whole and partial reads alike)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    prog = program("cp_async", "compute_80")
    x2 = dev.zeros(2 * N, np.float32)
    x1 = dev.zeros(N, np.float32)
    out = dev.zeros(N, np.float32)
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "small", N // B, B, [x2, x1, out, i32(N), i32(1 << 22)])
    assert e.value.code == CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    assert "PTX line" in e.value.message
    x = dev.zeros(4 * N + 4, np.int32)
    out4 = dev.zeros(4 * N, np.int32)
    for shift in (16, 1):  # lane 0 reads 16 bytes (whole), or 1 (partial)
        with pytest.raises(KernelFault) as e:
            dev.launch(prog, "fill_reg", N // B, B, [Ptr(x + 4), out4, i32(N), i32(shift)])
        assert e.value.code == CUresult.CUDA_ERROR_MISALIGNED_ADDRESS
    assert "fill_reg" in dict(jit.stats()["compiled"])
