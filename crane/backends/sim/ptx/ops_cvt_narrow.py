"""``cvt`` to and from the narrow formats: FP8/FP6/FP4 pairs, UE8M0 pairs and TF32.

The forms of the PTX ISA (8.x/9.x) served here:

* ``cvt.rn.satfinite{.relu}.{e4m3x2,e5m2x2,e2m3x2,e3m2x2,e2m1x2}.f32 d, a, b`` — ``a`` goes to
  the upper half of ``d`` (a byte, or a nibble for ``e2m1x2``), ``b`` to the lower;
* ``cvt.rn.satfinite{.relu}.{e4m3x2,e5m2x2}.f16x2 d, a`` — per half of ``a``;
* ``cvt.rn{.relu}.f16x2.{e4m3x2,e5m2x2,e2m3x2,e3m2x2,e2m1x2} d, a`` — exact widening;
* ``cvt.{rz,rp}{.satfinite}.ue8m0x2.{f32,bf16x2}`` and ``cvt.rn.bf16x2.ue8m0x2``;
* ``cvt.rna{.satfinite}.tf32.f32`` and ``cvt.{rn,rz}{.satfinite}{.relu}.tf32.f32``.

Stochastic rounding (``.rs`` with random bits) and the x4 forms stay refused at load.
"""

from __future__ import annotations

import numpy as np

from . import narrowfp as nf
from .ops_common import Mods, h_unary
from .ptxtypes import TYPES

__all__ = ["NARROW_TYPES", "dec_cvt_narrow"]

#: the x2 format names cvt uses, to their element format
_X2 = {f"{k}x2": nf.NARROW[k] for k in nf.NARROW}
NARROW_TYPES = frozenset({*_X2, "ue8m0x2", "tf32"})


def _h_pair(st, ins, idx) -> None:
    """Two f32 sources → one packed narrow pair (``a`` high)."""
    hi = ins.x(ins.a.get(st, idx))
    lo = ins.x(ins.b.get(st, idx))
    ins.d.put(st, idx, ((hi << np.uint32(ins.e)) | lo).astype(np.uint32))


def _pair_of_one(conv, in_bits: int, out_bits: int):
    """A function of one packed pair: ``conv`` of its upper and of its lower ``in_bits``,
    packed as two ``out_bits`` fields (upper from upper)."""
    mask = np.uint32((1 << in_bits) - 1)

    def f(a):
        a = np.asarray(a).astype(np.uint32)
        hi = np.asarray(conv((a >> np.uint32(in_bits)) & mask)).astype(np.uint32)
        lo = np.asarray(conv(a & mask)).astype(np.uint32)
        return (hi << np.uint32(out_bits)) | lo

    return f


def dec_cvt_narrow(ctx, mods) -> None:
    m = Mods(ctx, mods)
    rnd = m.take("rn", "rz", "rm", "rp", "rna", "rs")
    satfinite = m.has("satfinite")
    use_relu = m.has("relu")
    names = [x for x in m.rest if x in NARROW_TYPES or x in TYPES]
    m.rest = [x for x in m.rest if x not in names]
    m.done()
    if len(names) != 2:
        raise ctx.error("cvt needs a destination and a source type")
    dname, sname = names
    where = f"cvt.{dname}.{sname}"
    if rnd == "rs":
        raise ctx.unsupported(f"{where} with stochastic rounding (.rs)")
    ins = ctx.ins
    if dname in _X2 and sname == "f32":
        fmt = _X2[dname]
        if rnd != "rn" or not satfinite:
            raise ctx.error(f"{where} requires .rn.satfinite")
        ctx.nops(3)
        ins.d = ctx.dst(ctx.ops[0], TYPES["b8" if fmt.name == "e2m1" else "b16"])
        ins.a = ctx.src(ctx.ops[1], TYPES["f32"])
        ins.b = ctx.src(ctx.ops[2], TYPES["f32"])
        ins.e = 4 if fmt.name == "e2m1" else 8
        ins.x = _encoder(fmt, use_relu)
        ins.fn = _h_pair
        return
    if dname in ("e4m3x2", "e5m2x2") and sname == "f16x2":
        fmt = _X2[dname]
        if rnd != "rn" or not satfinite:
            raise ctx.error(f"{where} requires .rn.satfinite")
        enc = _encoder(fmt, use_relu)
        _unary(ctx, "b16", "b32", _pair_of_one(lambda h: enc(_f16_value(h)), 16, 8))
        return
    if dname == "f16x2" and sname in _X2:
        fmt = _X2[sname]
        if rnd != "rn" or satfinite:
            raise ctx.error(f"{where} takes .rn (and .relu) only")
        w = 4 if fmt.name == "e2m1" else 8

        def widen(c):
            h = nf.decode_to_f16(c, fmt)
            return nf.f16_relu(h, "h") if use_relu else h

        _unary(ctx, "b32", "b8" if w == 4 else "b16", _pair_of_one(widen, w, 16))
        return
    if dname == "ue8m0x2" and sname in ("f32", "bf16x2"):
        if rnd not in ("rz", "rp") or use_relu:
            raise ctx.error(f"{where} takes .rz or .rp (and .satfinite)")
        if sname == "f32":
            ctx.nops(3)
            ins.d = ctx.dst(ctx.ops[0], TYPES["b16"])
            ins.a = ctx.src(ctx.ops[1], TYPES["b32"])
            ins.b = ctx.src(ctx.ops[2], TYPES["b32"])
            ins.e = 8
            ins.x = lambda a, r=rnd: nf.ue8m0_from_f32(a, r, satfinite)
            ins.fn = _h_pair
            return
        conv = lambda h, r=rnd: nf.ue8m0_from_bf16(h, r, satfinite)  # noqa: E731
        _unary(ctx, "b16", "b32", _pair_of_one(conv, 16, 8))
        return
    if dname == "bf16x2" and sname == "ue8m0x2":
        if rnd != "rn" or satfinite or use_relu:
            raise ctx.error(f"{where} takes .rn only")
        _unary(ctx, "b32", "b16", _pair_of_one(nf.ue8m0_to_bf16, 8, 16))
        return
    if dname == "tf32" and sname == "f32":
        if rnd == "rna" and use_relu:
            raise ctx.error("cvt.rna.tf32.f32 takes no .relu")
        if rnd not in ("rna", "rn", "rz"):
            raise ctx.error(f"{where} takes .rna, .rn or .rz")
        mode = rnd

        def t(a):
            return nf.tf32(a, mode, satfinite, use_relu)

        ctx.nops(2)
        ins.d = ctx.dst(ctx.ops[0], TYPES["b32"])
        ins.a = ctx.src(ctx.ops[1], TYPES["b32"])
        ins.x = t
        ins.fn = h_unary
        return
    raise ctx.unsupported(where)


def _encoder(fmt: nf.NarrowFormat, use_relu: bool):
    def enc(v):
        v = np.asarray(v, np.float64)
        return nf.encode(nf.relu(v) if use_relu else v, fmt)

    return enc


def _f16_value(bits) -> np.ndarray:
    return np.asarray(bits).astype(np.uint16).view(np.float16).astype(np.float64)


def _unary(ctx, dty: str, sty: str, f) -> None:
    ins = ctx.ins
    ctx.nops(2)
    ins.d = ctx.dst(ctx.ops[0], TYPES[dty])
    ins.a = ctx.src(ctx.ops[1], TYPES[sty])
    ins.x = lambda a: f(a).astype(TYPES[dty].dtype)
    ins.fn = h_unary
