"""``ptx/exp2poly.py``: the interpreter's ``ex2.approx.f32`` (NumPy's ``exp2``, the polynomial
on lanes next to a rounding midpoint) rounds exactly as the compiler's polynomial does, and the
polynomial is ``2**x`` to within 2**-46 relative."""

from __future__ import annotations

import numpy as np

from crane.backends.sim.ptx import exp2poly
from crane.backends.sim.ptx.exp2poly import exp2_f64, exp2_to_f32


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def _sample() -> np.ndarray:
    rng = np.random.default_rng(3)
    return np.concatenate(
        [
            rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            np.linspace(-151, -125, 400_000, dtype=np.float32),
            np.linspace(126, 129, 100_000, dtype=np.float32),
            np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -150.0, 128.0], np.float32),
        ]
    ).astype(np.float64)


def test_the_interpreters_rounding_is_the_polynomials() -> None:
    x = _sample()
    with np.errstate(over="ignore", invalid="ignore"):
        want = exp2_f64(x).astype(np.float32)
    got = exp2_to_f32(x)
    same = (_bits(got) == _bits(want)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), x[~same][:10]


def near_midpoints(bound: float) -> np.ndarray:
    """Every float32 x in [1, 2) whose 2**x (NumPy's) lies within ``bound`` (relative) of a
    float32 rounding midpoint."""
    x = np.arange(0x3F800000, 0x40000000, dtype=np.uint32).view(np.float32).astype(np.float64)
    r = np.exp2(x)
    r32 = r.astype(np.float32)
    mid = (r32.astype(np.float64) + np.nextafter(r32, np.float32(np.inf))) * 0.5
    mid_down = (r32.astype(np.float64) + np.nextafter(r32, np.float32(0))) * 0.5
    d = np.minimum(np.abs(r - mid), np.abs(r - mid_down))
    return x[d < r * bound]


def test_lanes_next_to_a_midpoint_take_the_polynomial(monkeypatch) -> None:
    """Where a float64 ``exp2`` other than NumPy's could round to the other float32 (here one
    that answers the midpoint itself wherever the true value is that close), the result stays
    the polynomial's: the interpreter does not depend on its libm's last bit."""
    x = near_midpoints(2.0**-41)
    assert len(x) >= 20
    want = exp2_f64(x).astype(np.float32)
    real = np.exp2
    r = real(x)
    mid = r.astype(np.float32).astype(np.float64)
    mid = np.where(
        r > mid,
        (mid + np.nextafter(r.astype(np.float32), np.float32(np.inf))) * 0.5,
        (mid + np.nextafter(r.astype(np.float32), np.float32(0))) * 0.5,
    )
    # the midpoint rounds (to even) apart from the polynomial on some of them: the test can fail
    assert (_bits(mid.astype(np.float32)) != _bits(want)).any()
    monkeypatch.setattr(exp2poly.np, "exp2", lambda v: np.where(np.isin(v, x), mid_of(v), real(v)))
    lookup = dict(zip(x.tolist(), mid.tolist(), strict=True))

    def mid_of(v):
        return np.array([lookup.get(t, 0.0) for t in np.asarray(v).tolist()])

    assert (_bits(exp2_to_f32(x)) == _bits(want)).all()


def test_the_polynomial_is_two_to_the_x() -> None:
    x = np.concatenate([np.linspace(-0.5, 0.5, 100_001), np.linspace(-140, 120, 100_001)])
    rel = np.abs(exp2_f64(x) - np.exp2(x)) / np.exp2(x)
    assert rel.max() < 2.0**-46
    with np.errstate(over="ignore"):
        ends = exp2_f64(np.array([-np.inf, np.inf, -1e9, 1e9, np.nan]))
    assert ends[0] < 1e-60 and ends[2] < 1e-60
    assert ends[1] > 1e60 and ends[3] > 1e60
    assert np.isnan(ends[4])
