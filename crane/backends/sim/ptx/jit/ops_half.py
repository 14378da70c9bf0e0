"""Half-precision arithmetic (``.f16``, ``.f16x2``: add, sub, mul, fma, neg, abs, min, max),
lowered to give the interpreter's bits (``ptx/ops_float.py`` ``_half_op``).

Why these forms: the interpreter widens each half to float64, computes exactly (fma through
TwoSum and round-to-odd) and rounds once to half. Here the halves widen to float32 (the
host's F16C conversion, exact), add, subtract and multiply in float32 and round to half: float32
carries 24 bits, at least 2 x 11 + 2, so rounding twice gives the once-rounded half (Figueroa's
bound for +, -, x). fma needs the exact sum: float64 product and TwoSum, rounded to odd in
float64 and again to odd in float32 (both at least 11 + 2 bits: the final rounding to nearest
half is unaffected). ``neg`` and ``abs`` flip or clear the sign bit and ``min``/``max`` select
one operand's bits, as NumPy's negation and ``fmin``/``fmax`` keep a NaN's bits. ``.sat``
clamps before the rounding, as there; ``.ftz``, ``.relu`` and bf16 are refused (the kernel
runs interpreted).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from llvmlite import ir

from ..ptxtypes import TYPES
from .irtypes import F32, F64, I16, I32, I64
from .ops_cvt import fma_two_sum
from .ops_sfu import sat_float

if TYPE_CHECKING:
    from .lower import KernelLowering

__all__ = ["HALF_OPS", "host_converts_halves", "is_half", "lower_half"]

HALF_OPS = ("add", "sub", "mul", "fma", "neg", "abs", "min", "max")
_HALF = ir.HalfType()


def is_half(types) -> bool:
    """Whether an instruction's one type is ``.f16`` or ``.f16x2`` (bf16 is not taken)."""
    return len(types) == 1 and types[0].kind in ("h", "h2")


@functools.cache
def host_converts_halves() -> bool:
    """Whether this CPU converts between float32 and half in hardware (F16C, or AVX512-FP16):
    elsewhere LLVM would call a runtime helper the loaded kernel cannot resolve."""
    import llvmlite.binding as llvm

    feats = llvm.get_host_cpu_features()
    return bool(feats.get("f16c") or feats.get("avx512fp16"))


def lower_half(k: KernelLowering, op: str, types, mods, ops) -> None:
    """Lower ``op`` on ``.f16``/``.f16x2`` operands (refused where the host cannot convert
    halves in hardware)."""
    t = types[0]
    if not host_converts_halves():
        raise k.refuse("half arithmetic (the host CPU has no F16C)")
    rounding = op in ("add", "sub", "mul", "fma")
    k.only(mods, ("rn", "sat") if rounding else ())
    nin = {"neg": 1, "abs": 1, "fma": 3}.get(op, 2)
    if op not in HALF_OPS or len(ops) != nin + 1:
        raise k.refuse(f"{op}.{t.name} form")
    if op == "fma" and "rn" not in mods:
        raise k.refuse("fma.f16 without .rn")
    b = k.b
    word = TYPES["b16"] if t.kind == "h" else TYPES["b32"]
    args = [k.get(o, word) for o in ops[1:]]
    if t.kind == "h":
        k.put(ops[0], word, _one(k, op, args, "sat" in mods))
        return
    halves = []
    for shift in (0, 16):
        xs = [b.trunc(b.lshr(a, ir.Constant(I32, shift)), I16) for a in args]
        halves.append(b.zext(_one(k, op, xs, "sat" in mods), I32))
    k.put(ops[0], word, b.or_(halves[0], b.shl(halves[1], ir.Constant(I32, 16))))


def _one(k: KernelLowering, op: str, xs, sat: bool):
    """One half lane: ``xs`` are i16 bit patterns; the result's bits."""
    b = k.b
    if op == "neg":
        return b.xor(xs[0], ir.Constant(I16, 0x8000))
    if op == "abs":
        return b.and_(xs[0], ir.Constant(I16, 0x7FFF))
    fs = [b.fpext(b.bitcast(x, _HALF), F32) for x in xs]
    if op in ("min", "max"):  # NumPy's fmin/fmax: the non-NaN operand, else the first if it
        # is strictly smaller (larger), else the second; the chosen operand's own bits
        pred = "olt" if op == "min" else "ogt"
        take_a = b.or_(b.fcmp_ordered(pred, fs[0], fs[1]), b.fcmp_unordered("uno", fs[1], fs[1]))
        return b.select(take_a, xs[0], xs[1])
    if op == "add":
        r = b.fadd(fs[0], fs[1])
    elif op == "sub":
        r = b.fsub(fs[0], fs[1])
    elif op == "mul":
        r = b.fmul(fs[0], fs[1])
    else:
        r = _fma_odd(k, *fs)
    if sat:
        r = sat_float(k, r)
    return b.bitcast(b.fptrunc(r, _HALF), I16)


def _fma_odd(k: KernelLowering, a, c, d):
    """float32 ``a * c + d`` (halves widened) rounded to odd: exact float64 product, TwoSum,
    round to odd in float64, then to odd in float32. Non-finite sums pass unchanged."""
    b = k.b
    s, e = fma_two_sum(k, a, c, d)
    fabs64 = k.intrinsic("llvm.fabs.f64", F64, [F64])
    finite = b.fcmp_ordered("<", b.call(fabs64, [s]), ir.Constant(F64, float("inf")))
    zero = ir.Constant(F64, 0.0)
    inexact = b.and_(b.fcmp_unordered("une", e, zero), finite)
    toward_zero = b.xor(b.fcmp_ordered("<", e, zero), b.fcmp_ordered("<", s, zero))
    sb = b.bitcast(s, I64)
    t = b.select(toward_zero, b.sub(sb, ir.Constant(I64, 1)), sb)
    s_odd = b.bitcast(b.select(inexact, b.or_(t, ir.Constant(I64, 1)), sb), F64)
    # to float32, again to odd (the sum of halves is far inside float32's range)
    r = b.fptrunc(s_odd, F32)
    back = b.fpext(r, F64)
    inexact32 = b.fcmp_ordered("one", back, s_odd)
    rb = b.bitcast(r, I32)
    over = b.fcmp_ordered(">", b.call(fabs64, [back]), b.call(fabs64, [s_odd]))
    rb2 = b.select(over, b.sub(rb, ir.Constant(I32, 1)), rb)
    return b.bitcast(b.select(inexact32, b.or_(rb2, ir.Constant(I32, 1)), rb), F32)
