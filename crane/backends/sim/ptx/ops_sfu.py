"""Special-function instructions: rcp, sqrt, rsqrt, ex2, lg2, sin, cos, tanh.

IEEE forms (``.rn`` and the directed modes of ``rcp``/``sqrt``) are correctly rounded. The
``.approx`` forms are computed in float64 and rounded to the result type, i.e. *more* accurate
than the hardware's special-function unit (which is within ~2 ulp for ex2/lg2/rsqrt, and has an
absolute error of about 2^-21 for sin/cos on [-pi, pi]). Kernels that depend on the exact bits of
an approximate result therefore differ by those few ulp; nvcc's IEEE library functions
(``expf``, ``sinf``, ``logf`` ...) only use approximate instructions as seeds or on reduced
arguments, so their results are usually bit-identical.
"""

from __future__ import annotations

import numpy as np

from . import fp
from .exp2poly import exp2_to_f32
from .ops_common import Mods, set_unary
from .ops_float import HALF_KINDS, half_pack, half_unpack

__all__ = [
    "dec_cos",
    "dec_ex2",
    "dec_lg2",
    "dec_rcp",
    "dec_rsqrt",
    "dec_sin",
    "dec_sqrt",
    "dec_tanh",
]


def _parse(ctx, mods):
    m = Mods(ctx, mods)
    rnd = m.take("rn", "rz", "rm", "rp")
    approx = m.has("approx")
    ftz = m.has("ftz")
    full = m.has("full")
    ty = m.one_type()
    m.done()
    return rnd, approx or full, ftz, ty


def _via64(f64fn, ty, ftz: bool, rounded=None):
    """``f64fn`` computed in float64 and rounded to ``ty`` (``rounded``: a function that
    returns the rounded result itself, given the float64 operands)."""

    def f(a):
        a = np.asarray(a)
        if ftz and ty.bits == 32:
            a = fp.ftz(a)
        a64 = a.astype(np.float64)
        r = rounded(a64) if rounded is not None else f64fn(a64).astype(ty.dtype)
        return fp.ftz(r) if ftz and ty.bits == 32 else r

    return f


def _half(ctx, ty, f64fn) -> None:
    def f(a):
        return half_pack([f64fn(x) for x in half_unpack(a, ty.kind)], ty.kind)

    set_unary(ctx, ty, f)


def dec_rcp(ctx, mods) -> None:
    rnd, approx, ftz, ty = _parse(ctx, mods)
    if ty.kind != "f":
        raise ctx.unsupported(f"rcp.{ty.name}")
    one = ty.dtype.type(1)
    if approx or rnd in (None, "rn"):
        f = lambda a: np.divide(one, a)  # noqa: E731
    else:
        from .ops_float import _div_directed

        g = _div_directed(ty, rnd)
        f = lambda a: g(one, a)  # noqa: E731
    if ftz and ty.bits == 32:
        f = lambda a, f=f: fp.ftz(f(fp.ftz(a)))  # noqa: E731
    set_unary(ctx, ty, f)


def dec_sqrt(ctx, mods) -> None:
    rnd, approx, ftz, ty = _parse(ctx, mods)
    if ty.kind in HALF_KINDS:
        _half(ctx, ty, np.sqrt)
        return
    if ty.kind != "f":
        raise ctx.unsupported(f"sqrt.{ty.name}")
    if rnd not in (None, "rn") and not approx:
        raise ctx.unsupported(f"sqrt.{rnd}")
    f = np.sqrt
    if ftz and ty.bits == 32:
        f = lambda a: fp.ftz(np.sqrt(fp.ftz(a)))  # noqa: E731
    set_unary(ctx, ty, f)


def dec_rsqrt(ctx, mods) -> None:
    _rnd, _approx, ftz, ty = _parse(ctx, mods)
    if ty.kind in HALF_KINDS:
        _half(ctx, ty, lambda x: 1.0 / np.sqrt(x))
        return
    if ty.kind != "f":
        raise ctx.unsupported(f"rsqrt.{ty.name}")
    set_unary(ctx, ty, _via64(lambda x: 1.0 / np.sqrt(x), ty, ftz))


def _simple(name: str, f64fn, rounded=None):
    def dec(ctx, mods) -> None:
        _rnd, _approx, ftz, ty = _parse(ctx, mods)
        if ty.kind in HALF_KINDS:
            _half(ctx, ty, f64fn)
            return
        if ty.kind != "f" or ty.bits != 32:
            raise ctx.unsupported(f"{name}.{ty.name}")
        set_unary(ctx, ty, _via64(f64fn, ty, ftz, rounded))

    return dec


# (float32's rounding of a fixed polynomial the compiler makes too: exp2poly.py)
dec_ex2 = _simple("ex2", np.exp2, exp2_to_f32)
dec_lg2 = _simple("lg2", np.log2)
dec_sin = _simple("sin", np.sin)
dec_cos = _simple("cos", np.cos)
dec_tanh = _simple("tanh", np.tanh)
