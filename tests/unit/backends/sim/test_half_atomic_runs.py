"""The interpreter's long runs of half-precision atomic adds on one word
(``crane.backends.sim.ptx.atomics``): taken as NumPy float16 accumulations, they must give
what adding one lane at a time with :func:`combine` gives (the old value each lane sees and
the final word), for ``.f16`` and ``.f16x2``, with overflow to infinity, and with NaNs and
infinities in the run (left to the one-at-a-time loop)."""

from __future__ import annotations

import numpy as np
import pytest

from crane.backends.sim.ptx.atomics import apply_atomic, combine


def _one_at_a_time(view: np.ndarray, ei: np.ndarray, kind: str, b: np.ndarray) -> np.ndarray:
    old = np.empty(ei.size, view.dtype)
    for j in range(ei.size):
        old[j] = view[ei[j]]
        view[ei[j]] = combine("add", kind, view[ei[j] : ei[j] + 1], b[j : j + 1])[0]
    return old


def _halves(rng, n: int, scale: float) -> np.ndarray:
    return (rng.standard_normal(n) * scale).astype(np.float16).view(np.uint16)


@pytest.mark.parametrize("kind", ["f16", "f16x2"])
@pytest.mark.parametrize("case", ["plain", "overflow", "nan", "inf"])
def test_long_runs_equal_adding_one_lane_at_a_time(kind: str, case: str) -> None:
    rng = np.random.default_rng(7)
    n, words = 3000, 5
    scale = 3000.0 if case == "overflow" else 2.0
    if kind == "f16":
        b, dt = _halves(rng, n, scale), np.uint16
        init = _halves(rng, words, scale)
    else:
        lo, hi = _halves(rng, n, scale), _halves(rng, n, scale)
        b, dt = lo.astype(np.uint32) | (hi.astype(np.uint32) << 16), np.uint32
        init = _halves(rng, words, scale).astype(np.uint32) * 0x10001
    special = {"nan": np.float16(np.nan), "inf": np.float16(-np.inf)}.get(case)
    if special is not None:
        b[1234] = int(np.array([special]).view(np.uint16)[0]) * (0x10001 if dt == np.uint32 else 1)
    ei = rng.integers(0, words, n)
    fast, slow = init.astype(dt), init.astype(dt)
    got = apply_atomic(fast, ei, "add", kind, b)
    want = _one_at_a_time(slow, ei, kind, b)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(fast, slow)
