"""Directed-rounding ``add``/``sub`` (float32, float64) and ``mul.f32`` compiled
(:func:`crane.backends.sim.ptx.jit.ops_cvt.binop_directed`): bit for bit the interpreter's
``fp.add_f32``/``add_f64``/``mul_f32`` on operands chosen to make every rounding decision
(ties, sticky bits, cancellation, overflow to the largest finite value, subnormals, zeros of
both signs, infinities, NaNs), and the math functions whose polynomials add toward zero
(``erfinvf``, ``lgammaf``) compiled.

The suite's diff mode runs every compiled launch interpreted too and compares the bytes; here
each kernel also runs once per mode explicitly, so the comparison holds with
``CRANE_PTX_JIT=1`` in the environment as well, and the kernels must have been compiled.
"""

from __future__ import annotations

from fractions import Fraction
from math import erf, lgamma

import numpy as np
import pytest
from ptxdev import i32

from crane.backends.sim.ptx import jit

pytestmark = pytest.mark.usefixtures("compile_every_launch")

F32_KERNELS = ("fadd_dir", "fsub_dir", "fmul_dir", "fadd_rz_only", "fsub_rd_only", "fmul_ru_only")
F64_KERNELS = ("dadd_dir", "dsub_dir", "dsub_rz_only", "dadd_ru_only")


def _operands(rng, dtype, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs that exercise the roundings: random magnitudes, near-cancellations (b close to
    -a or a), one-ulp neighbours, overflowing pairs, subnormals and specials."""
    with np.errstate(over="ignore"):  # (pairs that overflow to infinity are wanted too)
        return _pairs(rng, dtype, n)


def _pairs(rng, dtype, n: int) -> tuple[np.ndarray, np.ndarray]:
    fi = np.finfo(dtype)
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    q = n // 8
    b[:q] = -a[:q] * (1 + rng.integers(-3, 4, q) * fi.eps)  # cancellation
    b[q : 2 * q] = np.nextafter(a[q : 2 * q], np.inf) * rng.choice([-1, 1], q)
    b[2 * q : 3 * q] = a[2 * q : 3 * q] * dtype(2.0) ** rng.integers(-60, 60, q)  # far apart
    big = fi.max * dtype(0.75)
    special = [
        (big, big), (-big, -big), (fi.max, fi.max), (-fi.max, fi.max), (fi.tiny, -fi.tiny),
        (fi.smallest_subnormal, fi.smallest_subnormal), (0.0, -0.0), (-0.0, -0.0), (-0.0, 0.0),
        (np.inf, 1.0), (-np.inf, np.inf), (np.nan, 1.0), (1.0, np.nan), (1.0, -np.nan),
        (1.0, 2.0 ** -30), (1.0, -(2.0 ** -30)), (1e30, 1e30), (3.0, 1e-40),
    ]  # fmt: skip
    for i, (x, y) in enumerate(special):
        a[3 * q + i], b[3 * q + i] = x, y
    return a, b


def _run_both(dev, prog, kernel: str, arrays, scalars, out_dtype, n, monkeypatch):
    """The kernel's output interpreted, then compiled (each from the same inputs)."""
    got = []
    for mode in ("0", "1"):
        monkeypatch.setenv("CRANE_PTX_JIT", mode)
        ptrs = [dev.upload(a) for a in arrays]
        out = dev.zeros(n, out_dtype)
        dev.launch(prog, kernel, (n + 127) // 128, 128, [*ptrs, out, *scalars])
        got.append(dev.download(out, n, out_dtype))
    return got


@pytest.mark.parametrize("kernel", F32_KERNELS + F64_KERNELS)
def test_directed_arithmetic_matches_the_interpreter(program, dev, rng, monkeypatch, kernel):
    prog = program("directed", "compute_80")
    dtype = np.float32 if kernel in F32_KERNELS else np.float64
    n = 4096
    a, b = _operands(rng, dtype, n)
    interpreted, compiled = _run_both(dev, prog, kernel, [a, b], [i32(n)], dtype, n, monkeypatch)
    bits = np.uint32 if dtype == np.float32 else np.uint64
    np.testing.assert_array_equal(compiled.view(bits), interpreted.view(bits))
    assert kernel in dict(jit.stats()["compiled"]), jit.stats()["refused"]


def test_round_toward_zero_is_exact(program, dev, rng, monkeypatch):
    """``__fadd_rz`` against exact rational arithmetic: the float32 of largest magnitude not
    above the exact sum's (finite operands whose sum is in range)."""
    prog = program("directed", "compute_80")
    n = 2048
    a, b = _operands(rng, np.float32, n)
    keep = np.isfinite(a) & np.isfinite(b) & (np.abs(a) < 1e38) & (np.abs(b) < 1e38)
    a, b = a[keep], b[keep]
    n = len(a)
    _, compiled = _run_both(dev, prog, "fadd_rz_only", [a, b], [i32(n)], np.float32, n, monkeypatch)
    for x, y, r in zip(a.tolist(), b.tolist(), compiled.tolist(), strict=True):
        exact = Fraction(x) + Fraction(y)
        assert abs(Fraction(r)) <= abs(exact), (x, y, r)
        up = np.nextafter(np.float32(r), np.float32(np.inf if exact > 0 else -np.inf))
        assert exact == 0 or abs(Fraction(float(up))) > abs(exact), (x, y, r)


def test_math_functions_and_loops_with_directed_adds_compile(program, dev, rng, monkeypatch):
    """``erfinvf`` and ``lgammaf`` (their polynomials add with ``.rz``) and a loop of
    directed adds (its region's vector form): compiled, the interpreter's bits."""
    prog = program("directed", "compute_80")
    n = 3000
    a = rng.uniform(-1, 1, n).astype(np.float32)
    b = rng.uniform(0.5, 30, n).astype(np.float32)
    interp, comp = _run_both(dev, prog, "math_f32", [a, b], [i32(n)], np.float32, n, monkeypatch)
    np.testing.assert_array_equal(comp.view(np.uint32), interp.view(np.uint32))
    # erfinvf(0.999 a) + lgammaf(b): less lgamma(b), the error function gives 0.999 a back
    roots = comp.astype(np.float64) - np.array([lgamma(float(y)) for y in b])
    back = np.array([erf(r) for r in roots])
    np.testing.assert_allclose(back, a.astype(np.float64) * 0.999, atol=2e-3)
    assert "math_f32" in dict(jit.stats()["compiled"]), jit.stats()["refused"]

    interp, comp = _run_both(
        dev, prog, "fadd_rz_loop", [a], [i32(n), i32(37)], np.float32, n, monkeypatch
    )
    np.testing.assert_array_equal(comp.view(np.uint32), interp.view(np.uint32))
    assert "fadd_rz_loop" in dict(jit.stats()["compiled"]), jit.stats()["refused"]
