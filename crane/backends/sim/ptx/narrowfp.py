"""Narrow floating-point formats of ``cvt``: FP8 (E4M3, E5M2), FP6 (E2M3, E3M2), FP4 (E2M1),
the exponent-only UE8M0 and TF32, encoded and decoded bit-exactly, vectorized over lanes.

Definitions (PTX ISA "Alternate floating-point data formats", OCP MX v1.0), as NVIDIA's own
host fallbacks in ``cuda_fp8.hpp``/``cuda_fp6.hpp``/``cuda_fp4.hpp`` implement them:

* every encoder rounds to nearest even from the exact value (f32 and f16 sources are exact in
  float64), with subnormals; ``.satfinite`` clamps overflow (and infinity) to the largest finite
  value of the sign;
* E4M3 has no infinity: NaN is ``S.1111.111``; E5M2 is IEEE-like (infinity ``S.11111.00``);
  a NaN source gives the canonical ``0x7F`` for both;
* E2M3, E3M2 and E2M1 have no infinity or NaN: a NaN source gives the *positive* largest
  finite value; each FP6 value sits in the low 6 bits of its own byte;
* UE8M0 is an unsigned biased exponent (value ``2^(e-127)``, ``0xFF`` = NaN); it is produced
  from the magnitude, rounded toward zero or toward +infinity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "NARROW",
    "NarrowFormat",
    "decode_to_f16",
    "encode",
    "f16_satfinite",
    "tf32",
    "ue8m0_from_bf16",
    "ue8m0_from_f32",
    "ue8m0_to_bf16",
]


@dataclass(frozen=True)
class NarrowFormat:
    name: str
    ebits: int
    mbits: int
    bias: int
    maxcode: int  # the largest finite magnitude's code
    nan: int | None  # NaN code, None where the format has none
    inf: int | None  # infinity code (without sign), None where the format has none

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)

    @property
    def values(self) -> np.ndarray:
        """Magnitudes of the codes 0..maxcode, increasing."""
        return _table(self)


NARROW = {
    "e4m3": NarrowFormat("e4m3", 4, 3, 7, 0x7E, 0x7F, None),
    "e5m2": NarrowFormat("e5m2", 5, 2, 15, 0x7B, 0x7F, 0x7C),
    "e2m3": NarrowFormat("e2m3", 2, 3, 1, 0x1F, None, None),
    "e3m2": NarrowFormat("e3m2", 3, 2, 3, 0x1F, None, None),
    "e2m1": NarrowFormat("e2m1", 2, 1, 1, 0x7, None, None),
}
_TABLES: dict[str, np.ndarray] = {}


def _table(fmt: NarrowFormat) -> np.ndarray:
    t = _TABLES.get(fmt.name)
    if t is None:
        codes = np.arange(fmt.maxcode + 1)
        e = codes >> fmt.mbits
        m = codes & ((1 << fmt.mbits) - 1)
        sub = np.ldexp(m.astype(np.float64), 1 - fmt.bias - fmt.mbits)
        nrm = np.ldexp((m + (1 << fmt.mbits)).astype(np.float64), e - fmt.bias - fmt.mbits)
        t = np.where(e == 0, sub, nrm)
        _TABLES[fmt.name] = t
    return t


def relu(x: np.ndarray) -> np.ndarray:
    """``.relu``: negative values (and -0) become +0; NaN stays NaN."""
    return np.where(np.signbit(x) & ~np.isnan(x), 0.0, x)


def encode(x, fmt: NarrowFormat, satfinite: bool = True) -> np.ndarray:
    """Round ``x`` (float64, exact source values) to ``fmt``'s codes, nearest even."""
    x = np.asarray(x, np.float64)
    nan = np.isnan(x)
    sign = np.signbit(x) & ~nan
    ax = np.abs(np.where(nan, 0.0, x))
    _, e2 = np.frexp(ax)
    exp = np.maximum(e2 - 1, 1 - fmt.bias) - fmt.mbits  # the quantum's exponent
    v = np.ldexp(np.rint(np.ldexp(ax, -exp)), exp)
    vals = fmt.values
    over = v > vals[-1]
    code = np.searchsorted(vals, np.where(over, 0.0, v)).astype(np.uint32)
    if satfinite or (fmt.inf is None and fmt.nan is None):
        code = np.where(over, fmt.maxcode, code)
    elif fmt.inf is not None:
        code = np.where(over, fmt.inf, code)
    else:
        code = np.where(over, fmt.nan, code)
    code = code | np.where(sign, fmt.sign_bit, 0).astype(np.uint32)
    return np.where(nan, fmt.nan if fmt.nan is not None else fmt.maxcode, code).astype(np.uint32)


def decode_to_f16(codes, fmt: NarrowFormat) -> np.ndarray:
    """Codes → f16 bit patterns (exact; NaN → canonical 0x7FFF)."""
    c = np.asarray(codes).astype(np.int64) & (2 * fmt.sign_bit - 1)
    mag = c & (fmt.sign_bit - 1)
    v = _table(fmt)[np.minimum(mag, fmt.maxcode)]
    if fmt.inf is not None:
        v = np.where(mag == fmt.inf, np.inf, v)
    bits = np.where(c & fmt.sign_bit, -v, v).astype(np.float16).view(np.uint16)
    if fmt.nan is not None:
        nanm = mag > (fmt.inf if fmt.inf is not None else fmt.maxcode)
        bits = np.where(nanm, np.uint16(0x7FFF), bits)
    return bits.astype(np.uint16)


def f16_satfinite(bits, kind: str) -> np.ndarray:
    """``.satfinite`` on f16/bf16 results: an infinity becomes the largest finite value."""
    b = np.asarray(bits).astype(np.uint16)
    inf, mx = (0x7C00, 0x7BFF) if kind == "h" else (0x7F80, 0x7F7F)
    return np.where((b & 0x7FFF) == inf, (b & 0x8000) | mx, b).astype(np.uint16)


def f16_relu(bits, kind: str) -> np.ndarray:
    """``.relu`` on f16/bf16 bit patterns: negatives → +0, NaN → canonical NaN."""
    b = np.asarray(bits).astype(np.uint16)
    inf = 0x7C00 if kind == "h" else 0x7F80
    nan = (b & 0x7FFF) > inf
    out = np.where(b & 0x8000, np.uint16(0), b)
    return np.where(nan, np.uint16(0x7FFF), out).astype(np.uint16)


def tf32(bits, mode: str, satfinite: bool, use_relu: bool) -> np.ndarray:
    """f32 bit patterns → TF32 (an f32 pattern whose low 13 mantissa bits are zero):
    ``rna`` nearest with ties away from zero, ``rn`` nearest even, ``rz`` truncation."""
    b = np.asarray(bits).astype(np.uint32)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    if use_relu:
        b = np.where(b & 0x80000000, np.uint32(0), b)
    if mode == "rna":
        r = b + np.uint32(0x1000)
    elif mode == "rn":
        r = b + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))
    else:
        r = b
    r = np.where((b & 0x7FFFFFFF) == 0x7F800000, b, r) & np.uint32(0xFFFFE000)
    if satfinite:
        r = np.where((r & 0x7FFFFFFF) == 0x7F800000, (r & 0x80000000) | 0x7F7FE000, r)
    return np.where(nan, np.uint32(0x7FFFFFFF), r).astype(np.uint32)


def ue8m0_from_bf16(bits, mode: str, satfinite: bool) -> np.ndarray:
    """bf16 patterns → UE8M0 codes: the exponent of the magnitude, ``rz`` or ``rp``."""
    b = np.asarray(bits).astype(np.uint32)
    a = b & 0x7FFF
    res = (b >> np.uint32(7)) & np.uint32(0xFF)
    if mode == "rp":
        up = ((b & 0x7F) != 0) & (a > 0x40) & (a < 0x7F80)
        res = res + up.astype(np.uint32)
    if satfinite:
        res = np.where((a <= 0x7F80) & (res == 0xFF), np.uint32(0xFE), res)
    return res.astype(np.uint32)


def ue8m0_from_f32(bits, mode: str, satfinite: bool) -> np.ndarray:
    """f32 patterns → UE8M0: through bf16 of the magnitude, truncated (``rz``) or rounded up
    (``rp``), so no double rounding can carry past the exponent."""
    b = np.asarray(bits).astype(np.uint32)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    if mode == "rz":
        h = b >> np.uint32(16)
    else:
        a = b & np.uint32(0x7FFFFFFF)
        h = (a >> np.uint32(16)) + (((a & 0xFFFF) != 0) & (a < 0x7F800000)).astype(np.uint32)
    h = np.where(nan, np.uint32(0x7FFF), h)
    return ue8m0_from_bf16(h, mode, satfinite)


def ue8m0_to_bf16(codes) -> np.ndarray:
    """UE8M0 codes → bf16 patterns: 2^(e-127); 0 is the subnormal 2^-127, 0xFF NaN."""
    c = np.asarray(codes).astype(np.uint32) & 0xFF
    out = c << np.uint32(7)
    out = np.where(c == 0, np.uint32(0x40), out)
    return np.where(c == 0xFF, np.uint32(0x7FFF), out).astype(np.uint16)
