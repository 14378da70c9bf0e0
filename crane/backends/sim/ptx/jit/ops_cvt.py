"""Directed rounding (``.rz``/``.rm``/``.rp``) for the ``cvt`` forms that round (integer →
float, float64 → float32), ``fma.f32``, and ``add``/``sub`` (float32 and float64) and
``mul.f32`` (CUDA's ``__fadd_rz``, ``__fmul_rd``, ..., and ``erfinvf``/``lgammaf``, whose
polynomials add toward zero).

Why not LLVM's constrained intrinsics: they tell the optimizer which rounding mode the code
runs under but do not set it, and the lanes run under the host's round-to-nearest. Instead the
value is converted to nearest (exact IEEE, as the interpreter's first step), compared exactly
with the source, and moved one unit in the last place where round-to-nearest went the wrong
way — the interpreter's :func:`..fp.round_f32` on the exact value, which is the IEEE result in
that mode (a float32 overflow under ``.rz`` gives the largest finite value, as there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from .irtypes import F64, lane_type

if TYPE_CHECKING:
    from ..ptxtypes import PtxType
    from .lower import KernelLowering

__all__ = [
    "DIRECTED",
    "binop_directed",
    "fma_directed_f32",
    "fma_two_sum",
    "int_to_float_directed",
    "narrow_directed",
]

DIRECTED = ("rz", "rm", "rp")


def _step(k: KernelLowering, r, mode: str, above, below):
    """``r`` (nearest) moved one ulp where it lies on the wrong side of the exact value:
    ``above``/``below`` say that ``r`` is greater/less than it."""
    b = k.b
    it = ir.IntType(64 if r.type == F64 else 32)
    bits = b.bitcast(r, it)
    one = ir.Constant(it, 1)
    neg = b.icmp_signed("<", bits, ir.Constant(it, 0))  # the sign bit
    down_mag = b.sub(bits, one)  # toward zero (inf -> the largest finite value)
    if mode == "rz":
        pos = b.fcmp_ordered(">", r, ir.Constant(r.type, 0.0))
        negv = b.fcmp_ordered("<", r, ir.Constant(r.type, 0.0))
        adj = b.or_(b.and_(above, pos), b.and_(below, negv))
        out = b.select(adj, down_mag, bits)
    elif mode == "rm":  # toward -inf: larger magnitude when negative
        out = b.select(above, b.select(neg, b.add(bits, one), down_mag), bits)
    else:  # rp
        out = b.select(below, b.select(neg, down_mag, b.add(bits, one)), bits)
    return b.bitcast(out, r.type)


def narrow_directed(k: KernelLowering, a, mode: str):
    """float64 ``a`` → float32 rounded in ``mode``."""
    b = k.b
    r = b.fptrunc(a, ir.FloatType())
    rd = b.fpext(r, F64)
    return _step(k, r, mode, b.fcmp_ordered(">", rd, a), b.fcmp_ordered("<", rd, a))


def fma_two_sum(k: KernelLowering, a, c, d):
    """float32 (or narrower, widened) ``a * c + d`` exactly as float64 ``(s, e)``: ``s`` the
    nearest float64 to it, ``e`` the rest (the product is exact in float64; TwoSum)."""
    b = k.b
    return _two_sum(k, b.fmul(b.fpext(a, F64), b.fpext(c, F64)), b.fpext(d, F64))


def _two_sum(k: KernelLowering, p, d):
    """``(s, e)``: ``s = fl(p + d)`` and its exact error (the interpreter's ``fp.two_sum``)."""
    b = k.b
    s = b.fadd(p, d)
    bb = b.fsub(s, p)
    return s, b.fadd(b.fsub(p, b.fsub(s, bb)), b.fsub(d, bb))


def _round_f32(k: KernelLowering, s, e, mode: str):
    """The exact value ``s + e`` (``s`` its nearest float64) rounded to float32 in ``mode``:
    the float32 nearest to ``s`` moved one ulp where it lies on the wrong side of ``s + e``
    (``(r - s) - e``: ``r - s`` is exact, so the sign is right)."""
    b = k.b
    r = b.fptrunc(s, ir.FloatType())
    diff = b.fsub(b.fsub(b.fpext(r, F64), s), e)
    zero = ir.Constant(F64, 0.0)
    return _step(k, r, mode, b.fcmp_ordered(">", diff, zero), b.fcmp_ordered("<", diff, zero))


def binop_directed(k: KernelLowering, name: str, a, c, mode: str):
    """``add``/``sub`` (float32 or float64) or ``mul`` (float32) of ``a``, ``c`` rounded once
    in ``mode``, as the interpreter's ``fp.add_f32``/``add_f64``/``mul_f32``: TwoSum (float32
    operands widened; a float32 product is exact in float64) and the nearest result moved
    one ulp where it went the wrong way. ``sub`` adds ``-c``, whose NaN the interpreter makes
    by a multiplication that keeps its sign: a NaN ``c`` (with ``a`` not NaN) is the answer,
    quieted."""
    b = k.b
    f32 = lane_type(a.type) != F64
    x = b.fneg(c) if name == "sub" else c
    if f32:
        a64, x64 = b.fpext(a, F64), b.fpext(x, F64)
        if name == "mul":
            r = _round_f32(k, b.fmul(a64, x64), ir.Constant(F64, 0.0), mode)
        else:
            r = _round_f32(k, *_two_sum(k, a64, x64), mode)
    else:
        s, e = _two_sum(k, a, x)
        zero = ir.Constant(F64, 0.0)
        r = _step(k, s, mode, b.fcmp_ordered("<", e, zero), b.fcmp_ordered(">", e, zero))
    if name != "sub":
        return r
    it = ir.IntType(32 if f32 else 64)
    quiet = ir.Constant(it, 1 << (22 if f32 else 51))
    nan_c = b.bitcast(b.or_(b.bitcast(c, it), quiet), c.type)
    take = b.and_(b.fcmp_unordered("uno", c, c), b.fcmp_ordered("ord", a, a))
    return b.select(take, nan_c, r)


def fma_directed_f32(k: KernelLowering, a, c, d, mode: str):
    """float32 ``a * c + d`` rounded once in ``mode`` (``fma.rz/rm/rp.f32``; sinf's and
    cosf's range reduction use ``fma.rm``), as the interpreter's ``fp.fma_f32``: the product is
    exact in float64, the sum is float64's nearest ``s`` plus its exact error ``e`` (TwoSum),
    and the float32 nearest to ``s`` moves one ulp where it lies on the wrong side of
    ``s + e`` (``(r - s) - e``: ``r - s`` is exact, so the sign is right)."""
    return _round_f32(k, *fma_two_sum(k, a, c, d), mode)


def int_to_float_directed(k: KernelLowering, a, st: PtxType, vt, mode: str):
    """Integer ``a`` (of type ``st``) → float type ``vt`` rounded in ``mode``: the nearest
    value converted back exactly (saturating; a result at 2^bits, or 2^(bits-1) for signed
    sources, is above every source value) and compared with ``a``."""
    b = k.b
    signed = st.kind == "s"
    r = b.sitofp(a, vt) if signed else b.uitofp(a, vt)
    it = a.type
    name = "fptosi" if signed else "fptoui"
    fn = k.intrinsic(f"llvm.{name}.sat.i{it.width}.{k.fname(vt)}", it, [vt])
    back = b.call(fn, [r])
    limit = float(2 ** (it.width - 1 if signed else it.width))
    over = b.fcmp_ordered(">=", r, ir.Constant(vt, limit))
    cmp = b.icmp_signed if signed else b.icmp_unsigned
    above = b.or_(over, cmp(">", back, a))
    below = b.and_(b.not_(over), cmp("<", back, a))
    return _step(k, r, mode, above, below)
