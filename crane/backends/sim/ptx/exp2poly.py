"""``ex2.approx.f32``: the same float32 bits from the interpreter and the PTX compiler, fast in
both.

Why: the compiler used to call the C library's ``exp2`` once per lane (LLVM does not vectorize a
libm call), which held every kernel with an ``expf`` (softmax, sigmoid, GELU, option pricing:
nvcc's ``expf`` and ``__expf`` are ``ex2.approx.ftz.f32`` on a reduced argument) to a third of
NumPy's speed; and NumPy's ``exp2``, which the interpreter uses, is not the C library's, so the
two may differ in the last float64 bit, which after the rounding to float32 shows where ``2**x``
lies next to a rounding midpoint.

The compiler computes :func:`exp2_f64`, spelled out in IEEE operations without fused
multiply-adds: ``n = rint(x)``, ``f = x - n`` (exact, ``|f| <= 1/2``), ``2**f`` by Horner's rule
on the Taylor polynomial of ``exp(f ln 2)`` of degree :data:`DEGREE`, times ``2**n`` made from
its exponent bits (exact); then one rounding to float32. Its relative error is below 2**-46.5
(measured against NumPy's ``exp2`` over millions of inputs), so rounded to float32 it is the
correctly rounded ``2**x`` but next to a midpoint, well inside the hardware's 2 ulp.

The interpreter (:func:`exp2_to_f32`) takes NumPy's ``exp2`` (error below 2**-50) and rounds
it, except on lanes whose float64 result lies within :data:`HARD` (relative) of a float32
rounding midpoint, which it computes with :func:`exp2_f64` as the compiler does. Elsewhere the
true value, NumPy's and the polynomial's are all on the same side of every midpoint, so the two
roundings agree: the same bits on every input, at NumPy's speed.

``x`` is clamped to [-:data:`LIMIT`, :data:`LIMIT`] first, where float64 still holds ``2**x``
as a normal number and its float32 rounding is already 0 or infinity; a NaN passes (its payload
travels through the arithmetic; ``n``'s bits are taken from 0 instead).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["COEFFS", "DEGREE", "HARD", "LIMIT", "MAGIC", "exp2_f64", "exp2_to_f32"]

DEGREE = 11
#: Horner's coefficients of 2**f = exp(f ln 2), the highest power's first: (ln 2)**k / k!
COEFFS = tuple(math.log(2.0) ** k / math.factorial(k) for k in range(DEGREE, -1, -1))
LIMIT = 200.0
#: 1.5 * 2**52: an integer-valued float64 ``n`` (|n| < 2**31) added to it leaves ``n`` in the
#: low bits of the sum's representation
MAGIC = 6755399441055744.0
#: lanes whose NumPy result is this close (relative) to a float32 rounding midpoint take the
#: polynomial (far above both functions' errors, 2**-46.5 and 2**-50)
HARD = 2.0**-40


def exp2_f64(x: np.ndarray) -> np.ndarray:
    """``2**x`` for a float64 array, the operations in the order the compiler makes them
    (``jit/ops_sfu.py``'s ``exp2_f64``)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        x = np.where(x > LIMIT, LIMIT, x)
        x = np.where(x < -LIMIT, -LIMIT, x)
        n = np.rint(x)
        f = x - n
        p = np.full_like(f, COEFFS[0])
        for c in COEFFS[1:]:
            p *= f
            p += c
        n0 = np.where(np.isnan(n), 0.0, n)
    bits = ((n0 + MAGIC).view(np.int64) + 1023) << 52
    return p * bits.view(np.float64)


def exp2_to_f32(x: np.ndarray) -> np.ndarray:
    """``2**x`` rounded to float32 for a float64 array ``x`` (float32 values): the float32
    rounding of :func:`exp2_f64`, computed with NumPy's ``exp2`` where that rounds alike."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        r64 = np.exp2(x)
        r32 = np.asarray(r64.astype(np.float32))
        back = r32.astype(np.float64)
        up = np.nextafter(r32, np.float32(np.inf)).astype(np.float64)
        down = np.nextafter(r32, np.float32(-np.inf)).astype(np.float64)
        dist = np.minimum(np.abs(r64 - (back + up) * 0.5), np.abs(r64 - (back + down) * 0.5))
        hard = dist <= np.abs(r64) * HARD
        hard |= np.isinf(r32) & np.isfinite(r64)  # rounded up to infinity: near the overflow
    if hard.any():
        with np.errstate(over="ignore"):
            r32[hard] = exp2_f64(x[hard]).astype(np.float32)
    return r32
