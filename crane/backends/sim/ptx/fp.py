"""IEEE rounding that NumPy does not give directly: fused multiply-add, directed rounding
modes, flush-to-zero, and half/bfloat16 conversions.

Approach: compute an *exact* result as an unevaluated sum ``hi + lo`` of two float64 values
(error-free transformations: the product of two float32 values is exact in float64, TwoSum
gives the exact error of an addition, Dekker's TwoProduct that of a float64 product), then
round that once to the target format in the requested mode. Lanes where the cheap float64 path
could double-round (a float64 result exactly halfway between two float32 values, or inputs
where TwoProduct over/underflows) take an exact path: Python ``fractions`` per lane, which is
slow but only ever sees a handful of lanes.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

__all__ = [
    "RM",
    "RN",
    "RP",
    "RZ",
    "add_f32",
    "add_f64",
    "bf16_to_f32",
    "f16_to_f32",
    "f32_to_bf16",
    "f32_to_f16",
    "f64_to_f16",
    "f64_to_f32",
    "fma_f32",
    "fma_f64",
    "ftz",
    "mul_f32",
    "mul_f64",
    "round_f32",
    "round_f64",
    "two_sum",
]

RN, RZ, RM, RP = "rn", "rz", "rm", "rp"

_F32_MIN_NORMAL = np.float64(2.0**-126)
_F64_MIN_NORMAL = np.float64(2.0**-1022)
_MID_MASK = np.uint64(0x1FFFFFFF)
_MID = np.uint64(0x10000000)
_FMAX = np.float32(3.4028235e38)


def _arr(x, dtype) -> np.ndarray:
    return np.asarray(x, dtype=dtype)


def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``s = fl(a+b)`` and the exact error ``e`` (``a + b == s + e``) for finite inputs."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


_SPLIT = np.float64(134217729.0)  # 2**27 + 1


def _two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dekker: ``p = fl(a*b)`` and the exact error, barring over/underflow."""
    p = a * b
    t = _SPLIT * a
    ah = t - (t - a)
    al = a - ah
    t = _SPLIT * b
    bh = t - (t - b)
    bl = b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def round_f32(hi: np.ndarray, lo: np.ndarray, mode: str) -> np.ndarray:
    """Round the exact value ``hi + lo`` (``hi = fl64(hi + lo)``) to float32 in ``mode``."""
    hi = _arr(hi, np.float64)
    lo = _arr(lo, np.float64)
    with np.errstate(all="ignore"):
        r = hi.astype(np.float32)
        rd = r.astype(np.float64)
        m = hi - rd  # exact (Sterbenz / both multiples of the finer ulp)
        fin = np.isfinite(hi)
        if mode == RN:
            # hi exactly halfway between two float32 values while lo is not zero
            toward = np.where(m > 0, np.float32(np.inf), np.float32(-np.inf))
            nb = np.nextafter(r, toward)
            half = (nb.astype(np.float64) - rd) * 0.5
            tie = (m == half) & (lo != 0) & (m != 0) & fin
            if tie.any():
                beyond = np.sign(lo) == np.sign(m)
                r = np.where(tie & beyond, nb, r)
            return r
        d = m + lo  # sign of (exact - r)
        big = np.isinf(r) & fin
        if mode == RZ:
            adj = ((d < 0) & (r > 0)) | ((d > 0) & (r < 0))
            r = np.where(adj, np.nextafter(r, np.float32(0)), r)
            r = np.where(big, np.where(hi > 0, _FMAX, -_FMAX), r)
        elif mode == RM:
            r = np.where(d < 0, np.nextafter(r, np.float32(-np.inf)), r)
            r = np.where(big & (hi > 0), _FMAX, r)
        elif mode == RP:
            r = np.where(d > 0, np.nextafter(r, np.float32(np.inf)), r)
            r = np.where(big & (hi < 0), -_FMAX, r)
        else:
            raise ValueError(mode)
        return r


def round_f64(hi: np.ndarray, lo: np.ndarray, mode: str) -> np.ndarray:
    """Directed rounding of ``hi + lo`` (``hi`` already the round-to-nearest double)."""
    if mode == RN:
        return hi
    with np.errstate(all="ignore"):
        fin = np.isfinite(hi)
        if mode == RZ:
            adj = ((lo < 0) & (hi > 0)) | ((lo > 0) & (hi < 0))
            r = np.where(adj & fin, np.nextafter(hi, 0.0), hi)
        elif mode == RM:
            r = np.where((lo < 0) & fin, np.nextafter(hi, -np.inf), hi)
        elif mode == RP:
            r = np.where((lo > 0) & fin, np.nextafter(hi, np.inf), hi)
        else:
            raise ValueError(mode)
        return r


def _exact_round(values: list[Fraction], fmt: str, mode: str) -> list[float]:
    out = []
    for x in values:
        try:
            hi = float(x)  # correctly rounded (Python int/int division)
        except OverflowError:
            hi = float("inf") if x > 0 else float("-inf")
        lo = float(x - Fraction(hi)) if np.isfinite(hi) else 0.0
        if fmt == "f32":
            out.append(float(round_f32(np.array([hi]), np.array([lo]), mode)[0]))
        else:
            out.append(float(round_f64(np.array([hi]), np.array([lo]), mode)[0]))
    return out


def fma_f32(a, b, c, mode: str = RN) -> np.ndarray:
    """Correctly rounded float32 ``a*b + c``."""
    a, b, c = np.broadcast_arrays(_arr(a, np.float32), _arr(b, np.float32), _arr(c, np.float32))
    shape = a.shape
    with np.errstate(all="ignore"):
        p = a.astype(np.float64).reshape(-1) * b.astype(np.float64).reshape(-1)  # exact
        c64 = c.astype(np.float64).reshape(-1)
        s = p + c64
        if mode == RN:
            r = s.astype(np.float32)
            bits = s.view(np.uint64) & _MID_MASK
            hard = (bits == _MID) | (np.abs(s) < _F32_MIN_NORMAL)
            if hard.any():
                h = np.flatnonzero(hard)
                s2, e2 = two_sum(p[h], c64[h])
                e2 = np.where(np.isfinite(s2), e2, 0.0)
                r[h] = round_f32(s2, e2, RN)
            return r.reshape(shape)
        s, e = two_sum(p, c64)
        e = np.where(np.isfinite(s), e, 0.0)
        return round_f32(s, e, mode).reshape(shape)


def _to_fraction_lanes(a, b, c, idx):
    return [Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i])) for i in idx]


def fma_f64(a, b, c, mode: str = RN) -> np.ndarray:
    """Correctly rounded float64 ``a*b + c``."""
    a = _arr(a, np.float64)
    b = _arr(b, np.float64)
    c = _arr(c, np.float64)
    shape = np.broadcast_shapes(a.shape, b.shape, c.shape)
    a, b, c = (np.broadcast_to(x, shape).reshape(-1) for x in (a, b, c))
    with np.errstate(all="ignore"):
        p, pe = _two_prod(a, b)
        s1, e1 = two_sum(p, c)
        s2, e2 = two_sum(e1, pe)
        r, e3 = two_sum(s1, s2)
        t = e3 + e2
        res = r + t
        # certain lanes: everything finite and comfortably inside the normal range, and the
        # tail t not near a rounding boundary of r
        absr = np.abs(res)
        ulp = np.spacing(absr)
        dist = np.abs(np.abs((r - res) + t) - ulp * 0.5)
        ok = (
            np.isfinite(res)
            & np.isfinite(p)
            & (np.abs(a) < 1e299)
            & (np.abs(b) < 1e299)
            & ((res.view(np.uint64) & np.uint64(0xFFFFFFFFFFFFF)) != 0)
            & ((np.abs(a) > 1e-140) | (a == 0))
            & ((np.abs(b) > 1e-140) | (b == 0))
            & ((absr > 1e-290) | (res == 0))
            & (dist > ulp * 2.0**-30)
        )
        out = round_f64(res, (r - res) + t, mode) if mode != RN else res.copy()
        special = ~(np.isfinite(a) & np.isfinite(b) & np.isfinite(c))
        if special.any():
            out[special] = a[special] * b[special] + c[special]
        bad = np.flatnonzero(~ok & ~special)
        if bad.size:
            fr = _to_fraction_lanes(a, b, c, bad)
            zero = [x == 0 for x in fr]
            vals = _exact_round(fr, "f64", mode)
            for j, i in enumerate(bad):
                v = vals[j]
                if zero[j]:
                    # exact zero: sign per IEEE (+0 unless both terms are -0, or RM)
                    pz = np.signbit(a[i]) ^ np.signbit(b[i])
                    v = -0.0 if (pz and np.signbit(c[i])) or mode == RM else 0.0
                out[i] = v
        return out.reshape(shape)


def add_f32(a, b, mode: str) -> np.ndarray:
    a64 = _arr(a, np.float32).astype(np.float64)
    b64 = _arr(b, np.float32).astype(np.float64)
    if mode == RN:
        return np.add(_arr(a, np.float32), _arr(b, np.float32))
    with np.errstate(all="ignore"):
        s, e = two_sum(a64, b64)
        e = np.where(np.isfinite(s), e, 0.0)
    return round_f32(s, e, mode)


def mul_f32(a, b, mode: str) -> np.ndarray:
    if mode == RN:
        return np.multiply(_arr(a, np.float32), _arr(b, np.float32))
    with np.errstate(all="ignore"):
        p = _arr(a, np.float32).astype(np.float64) * _arr(b, np.float32).astype(np.float64)
    return round_f32(p, np.zeros_like(p), mode)


def add_f64(a, b, mode: str) -> np.ndarray:
    a = _arr(a, np.float64)
    b = _arr(b, np.float64)
    if mode == RN:
        return a + b
    with np.errstate(all="ignore"):
        s, e = two_sum(a, b)
        e = np.where(np.isfinite(s), e, 0.0)
    return round_f64(s, e, mode)


def mul_f64(a, b, mode: str) -> np.ndarray:
    a = _arr(a, np.float64)
    b = _arr(b, np.float64)
    if mode == RN:
        return a * b
    zero = np.zeros(np.broadcast_shapes(a.shape, b.shape))
    return fma_f64(a, b, zero, mode)


def ftz(x: np.ndarray) -> np.ndarray:
    """Flush float32 subnormals to sign-preserving zero."""
    x = np.asarray(x)
    tiny = np.abs(x) < np.float32(1.17549435e-38)
    if not np.any(tiny):
        return x
    return np.where(tiny, np.copysign(np.float32(0), x), x)


def f64_to_f32(x, mode: str) -> np.ndarray:
    x = _arr(x, np.float64)
    with np.errstate(all="ignore"):
        if mode == RN:
            return x.astype(np.float32)
        return round_f32(x, np.zeros_like(x), mode)


# ---- half and bfloat16 (values travel as their raw 16-bit patterns) -------------------------


def f32_to_f16(x, mode: str = RN) -> np.ndarray:
    x = _arr(x, np.float32)
    with np.errstate(all="ignore"):
        if mode == RN:
            return x.astype(np.float16).view(np.uint16)
        return f64_to_f16(x.astype(np.float64), mode)


def f64_to_f16(x, mode: str = RN) -> np.ndarray:
    x = _arr(x, np.float64)
    with np.errstate(all="ignore"):
        h = x.astype(np.float16)  # correctly rounded, nearest-even
        if mode == RN:
            return h.view(np.uint16)
        hd = h.astype(np.float64)
        fin = np.isfinite(x)
        if mode == RZ:
            adj = (np.abs(hd) > np.abs(x)) & fin
            h = np.where(adj, np.nextafter(h, np.float16(0)), h)
        elif mode == RM:
            h = np.where((hd > x) & fin, np.nextafter(h, np.float16(-np.inf)), h)
        elif mode == RP:
            h = np.where((hd < x) & fin, np.nextafter(h, np.float16(np.inf)), h)
        return h.astype(np.float16).view(np.uint16)


def f16_to_f32(bits) -> np.ndarray:
    return _arr(bits, np.uint16).view(np.float16).astype(np.float32)


def f32_to_bf16(x, mode: str = RN) -> np.ndarray:
    """float32 → bfloat16 bits (round to nearest even; NaN stays a quiet NaN)."""
    u = _arr(x, np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(_arr(x, np.float32))
    if mode == RN:
        r = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    elif mode == RZ:
        r = u >> np.uint64(16)
    else:
        neg = (u >> np.uint64(31)) & np.uint64(1)
        inexact = (u & np.uint64(0xFFFF)) != 0
        up = inexact & ((neg == 0) if mode == RP else (neg == 1))
        r = (u >> np.uint64(16)) + up.astype(np.uint64)
    r = np.where(nan, (u >> np.uint64(16)) | np.uint64(0x40), r)
    return r.astype(np.uint16)


def f64_to_bf16(x, mode: str = RN) -> np.ndarray:
    """float64 → bfloat16 bits, rounding once (via round-to-odd float32)."""
    x = _arr(x, np.float64)
    with np.errstate(all="ignore"):
        f = x.astype(np.float32)
        fd = f.astype(np.float64)
        inexact = (fd != x) & np.isfinite(x)
        if inexact.any():
            # round to odd: truncate toward zero and set the sticky last bit
            t = np.where(np.abs(fd) > np.abs(x), np.nextafter(f, np.float32(0)), f)
            tb = t.view(np.uint32) | np.uint32(1)
            f = np.where(inexact, tb.view(np.float32), f)
    return f32_to_bf16(f, mode)


def bf16_to_f32(bits) -> np.ndarray:
    return (_arr(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
