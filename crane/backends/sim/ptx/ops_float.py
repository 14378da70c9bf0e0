"""Floating-point arithmetic (ALU class): f32/f64 and the half types f16, bf16, f16x2, bf16x2.

float32 arithmetic stays float32 (NumPy's float32 ufuncs are IEEE round-to-nearest); ``fma``
and the directed rounding modes go through :mod:`.fp`, which rounds exactly once. ``.ftz``
flushes float32 subnormal inputs and results to signed zero; ``.sat`` clamps to [0, 1] with
NaN → 0. Half types are computed in float64 and rounded once to the half format (exact for
add/sub/mul of two halves; ``fma`` rounds to odd first so the final rounding is still single).
"""

from __future__ import annotations

import numpy as np

from . import fp
from .ops_common import Mods, h_binary, set_binary, set_ternary, set_unary
from .ptxtypes import TYPES

__all__ = [
    "HALF_KINDS",
    "dec_copysign",
    "dec_fabs",
    "dec_fadd",
    "dec_fdiv",
    "dec_ffma",
    "dec_fmax",
    "dec_fmin",
    "dec_fmul",
    "dec_fneg",
    "dec_fsub",
    "dec_testp",
    "half_pack",
    "half_unpack",
]

HALF_KINDS = ("h", "bh", "h2", "bh2")


def _sat(x):
    x = np.asarray(x)
    return np.where(np.isnan(x), x.dtype.type(0), np.clip(x, 0, 1)).astype(x.dtype)


def _wrap(f, ftz: bool, sat: bool, nin: int):
    g = f
    if ftz:
        if nin == 1:
            g = lambda a, f=g: fp.ftz(f(fp.ftz(a)))  # noqa: E731
        elif nin == 2:
            g = lambda a, b, f=g: fp.ftz(f(fp.ftz(a), fp.ftz(b)))  # noqa: E731
        else:
            g = lambda a, b, c, f=g: fp.ftz(f(fp.ftz(a), fp.ftz(b), fp.ftz(c)))  # noqa: E731
    if sat:
        if nin == 2:
            g = lambda a, b, f=g: _sat(f(a, b))  # noqa: E731
        elif nin == 3:
            g = lambda a, b, c, f=g: _sat(f(a, b, c))  # noqa: E731
        else:
            g = lambda a, f=g: _sat(f(a))  # noqa: E731
    return g


def _parse(ctx, mods, rounding=("rn", "rz", "rm", "rp")):
    m = Mods(ctx, mods)
    rnd = m.take(*rounding)
    ftz = m.has("ftz")
    sat = m.has("sat")
    relu = m.has("relu")
    approx = m.has("approx")
    full = m.has("full")
    noftz = m.has("noftz")
    oob = m.has("oob")
    ty = m.one_type()
    m.done()
    if oob:
        raise ctx.unsupported(".oob")
    return rnd, ftz, sat, relu, approx, full, noftz, ty


# ---- half helpers ---------------------------------------------------------------------------


def half_unpack(x, kind: str) -> list[np.ndarray]:
    """Half-typed raw values → float64 lanes (two lists entries for x2 types: low, high)."""
    x = np.asarray(x)
    if kind in ("h", "bh"):
        parts = [x.astype(np.uint16)]
    else:
        u = x.astype(np.uint32)
        parts = [(u & np.uint32(0xFFFF)).astype(np.uint16), (u >> np.uint32(16)).astype(np.uint16)]
    if kind in ("h", "h2"):
        return [
            p.view(np.float16).astype(np.float64) if p.ndim else np.float64(p.view(np.float16))
            for p in parts
        ]
    return [fp.bf16_to_f32(p).astype(np.float64) for p in parts]


def half_pack(vals: list[np.ndarray], kind: str, odd: list | None = None) -> np.ndarray:
    """float64 lanes → raw half values, rounding to nearest even once."""
    bits = []
    for v in vals:
        if kind in ("h", "h2"):
            bits.append(fp.f64_to_f16(v))
        else:
            bits.append(fp.f64_to_bf16(v))
    if kind in ("h", "bh"):
        return bits[0]
    return bits[0].astype(np.uint32) | (bits[1].astype(np.uint32) << np.uint32(16))


def _round_odd(s, e):
    """``s + e`` (exact, ``s`` = RN) rounded to odd in float64, for a later single rounding."""
    s = np.asarray(s, np.float64)
    e = np.asarray(e, np.float64)
    inexact = (e != 0) & np.isfinite(s)
    if not np.any(inexact):
        return s
    t = np.where((np.sign(e) != np.sign(s)) & inexact, np.nextafter(s, 0.0), s)
    tb = t.view(np.uint64) | np.uint64(1)
    return np.where(inexact, tb.view(np.float64), s)


def _half_op(kind: str, op: str, sat: bool, relu: bool, ftz: bool):
    def f(*args):
        lanes = [half_unpack(a, kind) for a in args]
        outs = []
        for k in range(len(lanes[0])):
            xs = [lane[k] for lane in lanes]
            if ftz and kind in ("h", "h2"):
                xs = [np.where(np.abs(x) < 2.0**-14, np.copysign(0.0, x), x) for x in xs]
            if op == "add":
                r = xs[0] + xs[1]
            elif op == "sub":
                r = xs[0] - xs[1]
            elif op == "mul":
                r = xs[0] * xs[1]
            elif op == "fma":
                s, e = fp.two_sum(np.asarray(xs[0] * xs[1]), np.asarray(xs[2], np.float64))
                r = _round_odd(s, np.where(np.isfinite(s), e, 0.0))
            elif op == "neg":
                r = -xs[0]
            elif op == "abs":
                r = np.abs(xs[0])
            elif op == "min":
                r = np.fmin(xs[0], xs[1])
            elif op == "max":
                r = np.fmax(xs[0], xs[1])
            else:
                raise AssertionError(op)
            if sat:
                r = np.where(np.isnan(r), 0.0, np.clip(r, 0.0, 1.0))
            if relu:
                r = np.where(np.isnan(r), r, np.maximum(r, 0.0))
            outs.append(r)
        return half_pack(outs, kind)

    return f


def _dec_half(ctx, ty, op: str, nin: int, sat: bool, relu: bool, ftz: bool, rnd) -> None:
    if rnd not in (None, "rn"):
        raise ctx.unsupported(f"rounding .{rnd} on half types")
    f = _half_op(ty.kind, op, sat, relu, ftz)
    {1: set_unary, 2: set_binary, 3: set_ternary}[nin](ctx, ty, f)


# ---- f32 / f64 ------------------------------------------------------------------------------


def _dec_addsubmul(ctx, mods, op: str) -> None:
    rnd, ftz, sat, relu, _, _, _, ty = _parse(ctx, mods)
    if ty.kind in HALF_KINDS:
        _dec_half(ctx, ty, op, 2, sat, relu, ftz, rnd)
        return
    if ty.kind != "f" or relu:
        raise ctx.unsupported(f"{op}.{ty.name}")
    mode = rnd or "rn"
    f32 = ty.bits == 32
    if mode == "rn":
        f = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op]
    elif op == "mul":
        f = (lambda a, b: fp.mul_f32(a, b, mode)) if f32 else (lambda a, b: fp.mul_f64(a, b, mode))
    else:
        sign = -1 if op == "sub" else 1
        add = fp.add_f32 if f32 else fp.add_f64
        f = lambda a, b: add(a, np.multiply(b, ty.dtype.type(sign)), mode)  # noqa: E731
    set_binary(ctx, ty, _wrap(f, ftz and f32, sat, 2))


def dec_fadd(ctx, mods) -> None:
    _dec_addsubmul(ctx, mods, "add")


def dec_fsub(ctx, mods) -> None:
    _dec_addsubmul(ctx, mods, "sub")


def dec_fmul(ctx, mods) -> None:
    _dec_addsubmul(ctx, mods, "mul")


def dec_ffma(ctx, mods) -> None:
    """``fma`` and float ``mad`` (a fused multiply-add on every target nvcc 13 supports)."""
    rnd, ftz, sat, relu, _, _, _, ty = _parse(ctx, mods)
    if ty.kind in HALF_KINDS:
        _dec_half(ctx, ty, "fma", 3, sat, relu, ftz, rnd)
        return
    if ty.kind != "f" or relu:
        raise ctx.unsupported(f"fma.{ty.name}")
    mode = rnd or "rn"
    if ty.bits == 32:
        f = lambda a, b, c: fp.fma_f32(a, b, c, mode)  # noqa: E731
    else:
        f = lambda a, b, c: fp.fma_f64(a, b, c, mode)  # noqa: E731
    set_ternary(ctx, ty, _wrap(f, ftz and ty.bits == 32, sat, 3))


def _div_directed(ty, mode):
    def f(a, b):
        a64 = np.asarray(a, np.float64)
        b64 = np.asarray(b, np.float64)
        if ty.bits == 32:
            q = a64 / b64  # RN double quotient
            # sign of the exact remainder a - q*b decides the direction of the error
            r = fp.fma_f64(-q, b64, a64)
            lo = np.where(np.isfinite(q) & (b64 != 0), r / b64, 0.0)
            return fp.round_f32(q, lo, mode)
        q = a64 / b64
        r = fp.fma_f64(-q, b64, a64)
        lo = np.where(np.isfinite(q) & (b64 != 0), r / b64, 0.0)
        return fp.round_f64(q, lo, mode)

    return f


def dec_fdiv(ctx, mods) -> None:
    rnd, ftz, sat, _, approx, full, _, ty = _parse(ctx, mods)
    if ty.kind != "f":
        raise ctx.unsupported(f"div.{ty.name}")
    # div.approx / div.full are IEEE-rounded here (hardware: within 2 ulp)
    f = np.divide if rnd in (None, "rn") or approx or full else _div_directed(ty, rnd)
    set_binary(ctx, ty, _wrap(f, ftz and ty.bits == 32, sat, 2))


def dec_fabs(ctx, mods) -> None:
    _, ftz, _, _, _, _, _, ty = _parse(ctx, mods)
    if ty.kind in HALF_KINDS:
        _dec_half(ctx, ty, "abs", 1, False, False, ftz, None)
        return
    set_unary(ctx, ty, _wrap(np.abs, ftz and ty.bits == 32, False, 1))


def dec_fneg(ctx, mods) -> None:
    _, ftz, _, _, _, _, _, ty = _parse(ctx, mods)
    if ty.kind in HALF_KINDS:
        _dec_half(ctx, ty, "neg", 1, False, False, ftz, None)
        return
    set_unary(ctx, ty, _wrap(np.negative, ftz and ty.bits == 32, False, 1))


def _dec_minmax(ctx, mods, op: str) -> None:
    m = Mods(ctx, mods)
    ftz = m.has("ftz")
    nan = m.has("NaN")
    relu = m.has("relu")
    if m.has("xorsign") or m.has("abs"):
        raise ctx.unsupported(f"{op}.xorsign.abs")
    ty = m.one_type()
    m.done()
    if ty.kind in HALF_KINDS:
        if nan:
            raise ctx.unsupported(f"{op}.NaN on half types")
        _dec_half(ctx, ty, op, 2, False, relu, ftz, None)
        return
    if relu:
        raise ctx.unsupported(f"{op}.relu.{ty.name}")
    f = (np.minimum if op == "min" else np.maximum) if nan else np.fmin if op == "min" else np.fmax
    set_binary(ctx, ty, _wrap(f, ftz and ty.bits == 32, False, 2))


def dec_fmin(ctx, mods) -> None:
    _dec_minmax(ctx, mods, "min")


def dec_fmax(ctx, mods) -> None:
    _dec_minmax(ctx, mods, "max")


def dec_copysign(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    # copysign d, a, b: the sign of a, the magnitude of b
    set_binary(ctx, ty, lambda a, b: np.copysign(b, a))


def dec_testp(ctx, mods) -> None:
    m = Mods(ctx, mods)
    op = m.take("finite", "infinite", "number", "notanumber", "normal", "subnormal")
    ty = m.one_type()
    m.done()
    if op is None or ty.kind != "f":
        raise ctx.unsupported("testp form")
    tiny = np.finfo(ty.dtype).tiny

    def f(a):
        a = np.asarray(a)
        if op == "finite":
            return np.isfinite(a)
        if op == "infinite":
            return np.isinf(a)
        if op == "number":
            return ~np.isnan(a)
        if op == "notanumber":
            return np.isnan(a)
        ab = np.abs(a)
        if op == "normal":
            return np.isfinite(a) & (ab >= tiny)
        return (ab < tiny) & (ab > 0)

    ctx.nops(2)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], TYPES["pred"])
    ins.a = ctx.src(ctx.ops[1], ty)
    ins.fn = _h_unary_any
    ins.x = f


def _h_unary_any(st, ins, idx) -> None:
    ins.d.put(st, idx, ins.x(ins.a.get(st, idx)))


_ = h_binary
