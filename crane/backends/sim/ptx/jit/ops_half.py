"""Half-precision arithmetic (``.f16``, ``.f16x2``, ``.bf16``, ``.bf16x2``: add, sub, mul, fma,
neg, abs, min, max) and bfloat16 conversions, lowered to give the interpreter's bits
(``ptx/ops_float.py`` ``_half_op``, ``ptx/fp.py`` ``f64_to_bf16``).

Why these forms: the interpreter widens each half to float64, computes exactly (fma through
TwoSum and round-to-odd) and rounds once to half. Here the halves widen to float32 (the
host's F16C conversion, exact), add, subtract and multiply in float32 and round to half: float32
carries 24 bits, at least 2 x 11 + 2, so rounding twice gives the once-rounded half (Figueroa's
bound for +, -, x). fma needs the exact sum: float64 product and TwoSum, rounded to odd in
float64 and again to odd in float32 (both at least 11 + 2 bits: the final rounding to nearest
half is unaffected). ``neg`` and ``abs`` flip or clear the sign bit and ``min``/``max`` select
one operand's bits, as NumPy's negation and ``fmin``/``fmax`` keep a NaN's bits. ``.sat``
and ``.relu`` clamp before the rounding, as there; ``.ftz`` on f16 is refused (the kernel
runs interpreted).

bfloat16 follows the interpreter's path exactly: widened to float64 (exact), computed there
(add, sub and mul in float64, fma as above), rounded to odd in float32 and then to nearest
even bfloat16 by integer arithmetic on the float32 bits (a NaN keeps its high bits, made
quiet). ``neg``, ``abs``, ``min`` and ``max`` go through the same rounding, so a NaN operand
comes out quiet, as there. ``.ftz`` is accepted and does nothing on bfloat16, as there.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from llvmlite import ir

from ..ptxtypes import TYPES
from .irtypes import F32, F64, I16, I32, I64
from .ops_cvt import fma_two_sum
from .ops_sfu import float_binop, ftz32, sat_float

if TYPE_CHECKING:
    from .lower import KernelLowering

__all__ = [
    "HALF_OPS",
    "bf16_bits",
    "bf16_to_f32",
    "f16_bits",
    "half_add_bits",
    "half_lanes",
    "host_converts_halves",
    "is_half",
    "lower_cvt_half",
    "lower_half",
]

HALF_OPS = ("add", "sub", "mul", "fma", "neg", "abs", "min", "max")
_HALF = ir.HalfType()


def is_half(types) -> bool:
    """Whether an instruction's one type is a half type (``.f16``, ``.bf16`` or a pair)."""
    return len(types) == 1 and types[0].kind in ("h", "h2", "bh", "bh2")


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
    bf = t.kind in ("bh", "bh2")
    if not bf and not host_converts_halves():
        raise k.refuse("half arithmetic (the host CPU has no F16C)")
    rounding = op in ("add", "sub", "mul", "fma")
    if rounding:
        k.only(mods, ("rn", "sat", "relu", *(("ftz",) if bf else ())))
    else:
        k.only(mods, ("relu",) if op in ("min", "max") else ())
    nin = {"neg": 1, "abs": 1, "fma": 3}.get(op, 2)
    if op not in HALF_OPS or len(ops) != nin + 1:
        raise k.refuse(f"{op}.{t.name} form")
    if op == "fma" and "rn" not in mods:
        raise k.refuse("fma.f16 without .rn")
    b = k.b
    word = TYPES["b16"] if t.kind in ("h", "bh") else TYPES["b32"]
    args = [k.get(o, word) for o in ops[1:]]
    one = _one_bf16 if bf else _one
    clamp = ("sat" in mods, "relu" in mods)
    if t.kind in ("h", "bh"):
        k.put(ops[0], word, one(k, op, args, *clamp))
        return
    halves = []
    for shift in (0, 16):
        xs = [b.trunc(b.lshr(a, ir.Constant(I32, shift)), I16) for a in args]
        halves.append(b.zext(one(k, op, xs, *clamp), I32))
    k.put(ops[0], word, b.or_(halves[0], b.shl(halves[1], ir.Constant(I32, 16))))


def half_add_bits(k: KernelLowering, kind: str, a, c):
    """The bits of ``a + c`` for raw half words ``a``, ``c`` of PTX type kind ``kind``
    (``h``/``bh``: i16, ``h2``/``bh2``: i32, each half added apart), rounded once as the
    interpreter's ``atomics.combine`` does: what ``atom.add.noftz.f16x2`` and its kin store."""
    b = k.b
    one = _one_bf16 if kind in ("bh", "bh2") else _one
    if kind in ("h", "bh"):
        return one(k, "add", [a, c], False, False)
    halves = []
    for shift in (0, 16):
        xs = [b.trunc(b.lshr(v, ir.Constant(I32, shift)), I16) for v in (a, c)]
        halves.append(b.zext(one(k, "add", xs, False, False), I32))
    return b.or_(halves[0], b.shl(halves[1], ir.Constant(I32, 16)))


def _clamped(k: KernelLowering, r, sat: bool, relu: bool):
    """``.sat`` (NaN and negatives to +0, above 1 to 1) and ``.relu`` (negatives and -0 to
    +0, NaN kept: NumPy's ``maximum(r, 0)``), before the rounding, as the interpreter."""
    if sat:
        r = sat_float(k, r)
    if relu:
        b = k.b
        zero = ir.Constant(r.type, 0.0)
        keep = b.or_(b.fcmp_ordered(">", r, zero), b.fcmp_unordered("uno", r, r))
        r = b.select(keep, r, zero)
    return r


def _one(k: KernelLowering, op: str, xs, sat: bool, relu: bool = False):
    """One half lane: ``xs`` are i16 bit patterns; the result's bits."""
    b = k.b
    if relu and op not in ("add", "sub", "mul", "fma", "min", "max"):
        raise k.refuse(f"{op}.relu")
    if op == "neg":
        return b.xor(xs[0], ir.Constant(I16, 0x8000))
    if op == "abs":
        return b.and_(xs[0], ir.Constant(I16, 0x7FFF))
    fs = [b.fpext(b.bitcast(x, _HALF), F32) for x in xs]
    if op in ("min", "max"):  # NumPy's fmin/fmax: the non-NaN operand, else the first if it
        # is strictly smaller (larger), else the second; the chosen operand's own bits
        pred = "olt" if op == "min" else "ogt"
        take_a = b.or_(b.fcmp_ordered(pred, fs[0], fs[1]), b.fcmp_unordered("uno", fs[1], fs[1]))
        if not relu:
            return b.select(take_a, xs[0], xs[1])
        r = b.select(take_a, fs[0], fs[1])
    elif op == "fma":
        r = _odd_f32(k, _fma_odd64(k, *fs))
    else:  # float32 carries the exact result of two halves (add, sub, mul)
        r = float_binop(k, op, fs[0], fs[1])
    r = _clamped(k, r, sat, relu)
    return b.bitcast(b.fptrunc(r, _HALF), I16)


def _one_bf16(k: KernelLowering, op: str, xs, sat: bool, relu: bool):
    """One bfloat16 lane, as the interpreter: ``xs`` (i16 bits) widened to float64, the
    operation there, ``.sat``/``.relu``, then rounded once to bfloat16 (:func:`bf16_bits`)."""
    b = k.b
    ds = [b.fpext(bf16_to_f32(k, x), F64) for x in xs]
    if op == "neg":
        r = b.fneg(ds[0])
    elif op == "abs":
        r = b.call(k.intrinsic("llvm.fabs.f64", F64, [F64]), [ds[0]])
    elif op == "fma":
        r = _fma_odd64(k, *(b.fptrunc(d, F32) for d in ds))  # (exact: bf16 fits float32)
    else:  # add, sub, mul in float64 (as the interpreter), min, max (NumPy's fmin/fmax)
        r = float_binop(k, op, ds[0], ds[1])
    return bf16_bits(k, _odd_f32(k, _clamped(k, r, sat, relu)), "rn")


def bf16_to_f32(k: KernelLowering, x):
    """A bfloat16's bits (i16) as the float32 they are the high half of (exact)."""
    b = k.b
    return b.bitcast(b.shl(b.zext(x, I32), ir.Constant(I32, 16)), F32)


def bf16_bits(k: KernelLowering, f, mode: str):
    """float32 ``f`` rounded to bfloat16 in ``mode`` (rn, rz, rm, rp) by integer arithmetic
    on its bits, as the interpreter's ``fp.f32_to_bf16``: nearest even adds 0x7FFF plus the
    kept part's last bit; a NaN keeps its high half with the quiet bit set."""
    b = k.b
    u = b.bitcast(f, I32)
    hi = b.lshr(u, ir.Constant(I32, 16))
    if mode == "rn":
        bias = b.add(ir.Constant(I32, 0x7FFF), b.and_(hi, ir.Constant(I32, 1)))
        r = b.lshr(b.add(u, bias), ir.Constant(I32, 16))
    elif mode == "rz":
        r = hi
    else:
        neg = b.icmp_signed("<", u, ir.Constant(I32, 0))
        inexact = b.icmp_unsigned("!=", b.and_(u, ir.Constant(I32, 0xFFFF)), ir.Constant(I32, 0))
        up = b.and_(inexact, b.not_(neg) if mode == "rp" else neg)
        r = b.add(hi, b.zext(up, I32))
    r = b.select(b.fcmp_unordered("uno", f, f), b.or_(hi, ir.Constant(I32, 0x40)), r)
    return b.trunc(r, I16)


def _fma_odd64(k: KernelLowering, a, c, d):
    """float32 ``a * c + d`` (halves widened) rounded to odd in float64: exact float64
    product, TwoSum, the sticky bit set where the sum was inexact. Non-finite sums pass
    unchanged."""
    b = k.b
    s, e = fma_two_sum(k, a, c, d)
    fabs64 = k.intrinsic("llvm.fabs.f64", F64, [F64])
    finite = b.fcmp_ordered("<", b.call(fabs64, [s]), ir.Constant(F64, float("inf")))
    zero = ir.Constant(F64, 0.0)
    inexact = b.and_(b.fcmp_unordered("une", e, zero), finite)
    toward_zero = b.xor(b.fcmp_ordered("<", e, zero), b.fcmp_ordered("<", s, zero))
    sb = b.bitcast(s, I64)
    t = b.select(toward_zero, b.sub(sb, ir.Constant(I64, 1)), sb)
    return b.bitcast(b.select(inexact, b.or_(t, ir.Constant(I64, 1)), sb), F64)


def _odd_f32(k: KernelLowering, x):
    """float64 ``x`` to float32 rounded to odd (``fp.f64_to_bf16``'s first step): the
    nearest float32, moved one toward zero where it lies beyond ``x``, with the last bit
    set where it was inexact; a float32 ``x`` passes unchanged."""
    b = k.b
    if x.type == F32:
        return x
    fabs64 = k.intrinsic("llvm.fabs.f64", F64, [F64])
    r = b.fptrunc(x, F32)
    back = b.fpext(r, F64)
    inexact = b.fcmp_ordered("one", back, x)
    rb = b.bitcast(r, I32)
    over = b.fcmp_ordered(">", b.call(fabs64, [back]), b.call(fabs64, [x]))
    rb2 = b.select(over, b.sub(rb, ir.Constant(I32, 1)), rb)
    return b.bitcast(b.select(inexact, b.or_(rb2, ir.Constant(I32, 1)), rb), F32)


#: per half kind: (its infinity's bits, its largest finite value's bits)
_LIMITS = {"h": (0x7C00, 0x7BFF), "bh": (0x7F80, 0x7F7F)}


def lower_cvt_half(k: KernelLowering, dt, st, r, mods, ops) -> bool:
    """A ``cvt`` to or from a half type (``__float2half_rz``, ``__float2bfloat16``,
    ``__half2float``, the pair forms ``cvt.rn.f16x2.f32 d, hi, lo``), lowered and True;
    False when neither type is one, or for a half to an integer (the caller converts the
    half's exact float32 value). As the interpreter: a float source (flushed under ``.ftz``
    if float32) takes ``.relu`` and ``.sat`` in float64, is rounded to odd in float32 and
    then to the half type in the cvt's mode; ``.relu`` then makes a NaN the canonical one
    and ``.satfinite`` an infinity the largest finite value. An integer source goes through
    float64. Widening is exact. (A signalling float64 NaN comes out quiet in an f16, where
    the interpreter's NumPy conversion keeps it signalling.)"""
    half_kinds = ("h", "bh", "h2", "bh2")
    if dt.kind not in half_kinds and st.kind not in half_kinds:
        return False
    if st.kind in ("h", "bh") and dt.kind in ("u", "s"):
        return False
    if "h" in (dt.kind, st.kind, dt.kind[:1]) and not host_converts_halves():
        raise k.refuse("half conversions (the host CPU has no F16C)")
    b = k.b
    k.only(mods, ("rn", "rz", "rm", "rp", "ftz", "sat", "relu", "satfinite"))
    if dt.kind == "f" and st.kind in ("h", "bh") and len(ops) == 2:
        if r not in (None, "rn") or {"sat", "relu", "satfinite"} & set(mods):
            raise k.refuse(f"cvt.{dt.name}.{st.name} with these modifiers")
        v = half_lanes(k, st, k.get(ops[1], TYPES["b16"]), False)[0]
        if dt.bits == 64:
            v = b.fpext(v, F64)
        elif "ftz" in mods:
            v = ftz32(k, v)
        k.put(ops[0], dt, v)
        return True
    kind = dt.kind[:-1] if dt.kind in ("h2", "bh2") else dt.kind
    pair = dt.kind != kind
    ok = kind in ("h", "bh") and r in (None, "rn", "rz", "rm", "rp")
    if not ok or st.kind not in ("f", "u", "s") or (st.kind != "f" and (pair or r is None)):
        raise k.refuse(f"cvt between .{dt.name} and .{st.name}")
    if st.kind == "f" and r is None:
        raise k.refuse(f"cvt.{dt.name}.{st.name} without a rounding mode")
    if ("satfinite" in mods and st.name != "f32") or (st.kind != "f" and "sat" in mods):
        raise k.refuse(f"cvt.{dt.name}.{st.name} with these modifiers")
    if len(ops) != (3 if pair else 2) or (pair and st.name != "f32"):
        raise k.refuse(f"cvt.{dt.name}.{st.name} form")
    inf, top = _LIMITS[kind]

    def one(op):
        v = k.get(op, st)
        if st.kind != "f":  # to float64: exact up to 32 bits, else nearest (NumPy's astype)
            v = b.sitofp(v, F64) if st.kind == "s" else b.uitofp(v, F64)
        elif "ftz" in mods and st.bits == 32:
            v = ftz32(k, v)
        if st.kind == "f" and ("relu" in mods or "sat" in mods):
            v = _clamped(k, b.fpext(v, F64) if st.bits == 32 else v, "sat" in mods, "relu" in mods)
        v = _odd_f32(k, v)
        bits = bf16_bits(k, v, r) if kind == "bh" else f16_bits(k, v, r)
        if "relu" in mods:  # negatives +0, a NaN the canonical NaN (narrowfp.f16_relu)
            nan = b.icmp_unsigned(
                ">", b.and_(bits, ir.Constant(I16, 0x7FFF)), ir.Constant(I16, inf)
            )
            neg = b.icmp_signed("<", bits, ir.Constant(I16, 0))
            bits = b.select(neg, ir.Constant(I16, 0), bits)
            bits = b.select(nan, ir.Constant(I16, 0x7FFF), bits)
        if "satfinite" in mods:  # an infinity becomes the largest finite value of its sign
            is_inf = b.icmp_unsigned(
                "==", b.and_(bits, ir.Constant(I16, 0x7FFF)), ir.Constant(I16, inf)
            )
            sat = b.or_(b.and_(bits, ir.Constant(I16, -0x8000)), ir.Constant(I16, top))
            bits = b.select(is_inf, sat, bits)
        return bits

    if not pair:
        k.put(ops[0], TYPES["b16"], one(ops[1]))
        return True
    hi, lo = (b.zext(one(o), I32) for o in ops[1:])
    k.put(ops[0], TYPES["b32"], b.or_(lo, b.shl(hi, ir.Constant(I32, 16))))
    return True


def f16_bits(k: KernelLowering, f, mode: str):
    """float32 ``f`` rounded to an f16 in ``mode``, as the interpreter's ``fp.f64_to_f16``:
    the nearest (the host's conversion), moved to its neighbour toward zero, down or up
    where it lies on the wrong side of a finite ``f``."""
    b = k.b
    h = b.bitcast(b.fptrunc(f, _HALF), I16)
    if mode == "rn":
        return h
    back = b.fpext(b.bitcast(h, _HALF), F32)
    fabs = k.intrinsic("llvm.fabs.f32", F32, [F32])
    finite = b.fcmp_ordered("<", b.call(fabs, [f]), ir.Constant(F32, float("inf")))
    one = ir.Constant(I16, 1)
    if mode == "rz":
        wrong = b.fcmp_ordered(">", b.call(fabs, [back]), b.call(fabs, [f]))
        return b.select(b.and_(wrong, finite), b.sub(h, one), h)
    down = mode == "rm"
    wrong = b.fcmp_ordered(">" if down else "<", back, f)
    zero = b.icmp_unsigned("==", b.and_(h, ir.Constant(I16, 0x7FFF)), ir.Constant(I16, 0))
    positive = b.icmp_signed(">=", h, ir.Constant(I16, 0))
    away = (
        b.select(positive, b.sub(h, one), b.add(h, one))
        if down
        else (b.select(positive, b.add(h, one), b.sub(h, one)))
    )
    step = b.select(zero, ir.Constant(I16, 0x8001 - 0x10000 if down else 1), away)
    return b.select(b.and_(wrong, finite), step, h)


def half_lanes(k: KernelLowering, t, v, ftz: bool) -> list:
    """A half-typed operand's bits (i16, or i32 for a pair) as float32 values, low half first
    (exact); ``ftz`` flushes f16 subnormals to zero, as the interpreter's comparisons do."""
    b = k.b
    if t.kind in ("h", "h2") and not host_converts_halves():
        raise k.refuse("half comparisons (the host CPU has no F16C)")
    parts = (
        [v]
        if t.kind in ("h", "bh")
        else [b.trunc(b.lshr(v, ir.Constant(I32, sh)), I16) for sh in (0, 16)]
    )
    out = []
    for x in parts:
        if t.kind in ("bh", "bh2"):
            out.append(bf16_to_f32(k, x))
            continue
        f = b.fpext(b.bitcast(x, _HALF), F32)
        if ftz:
            fabs = k.intrinsic("llvm.fabs.f32", F32, [F32])
            tiny = b.fcmp_ordered("<", b.call(fabs, [f]), ir.Constant(F32, 2.0**-14))
            f = b.select(tiny, ir.Constant(F32, 0.0), f)
        out.append(f)
    return out
