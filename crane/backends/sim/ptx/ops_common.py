"""Shared pieces of the ``ops_*`` decoders: modifier parsing and generic lane-wise handlers.

A handler has the signature ``fn(st, ins, idx)``. The generic ones apply ``ins.x`` (a NumPy
ufunc or any function of arrays) to the source operands; with ``idx is None`` (all lanes) and
a ufunc they write straight into the destination register row (``out=``), which saves a copy
on the hot path.
"""

from __future__ import annotations

import numpy as np

from .operands import Reg
from .ptxtypes import TYPES, PtxType

__all__ = [
    "IGNORED_MODS",
    "Mods",
    "h_binary",
    "h_nop",
    "h_ternary",
    "h_unary",
    "set_binary",
    "set_ternary",
    "set_unary",
]

#: Memory-ordering, scope, cache and hint qualifiers that do not change single-copy results
#: in a sequentially executed simulation.
IGNORED_MODS = frozenset(
    {
        "volatile",
        "relaxed",
        "acquire",
        "release",
        "acq_rel",
        "sc",
        "weak",
        "mmio",
        "cta",
        "gpu",
        "sys",
        "cluster",
        "nc",
        "ca",
        "cg",
        "cs",
        "lu",
        "cv",
        "wb",
        "wt",
        "uni",
        "aligned",
        "L1::evict_normal",
        "L1::evict_unchanged",
        "L1::evict_first",
        "L1::evict_last",
        "L1::no_allocate",
        "L2::evict_normal",
        "L2::evict_first",
        "L2::evict_last",
        "L2::64B",
        "L2::128B",
        "L2::256B",
        "unified",
    }
)


class Mods:
    """The dot-modifiers of one instruction, consumed by its decoder.

    ``take`` removes and returns the first modifier from a set of choices; ``types`` removes
    type names; whatever remains at :meth:`done` (other than ignorable qualifiers) makes the
    instruction unsupported, so an unknown modifier is never silently dropped.
    """

    def __init__(self, ctx, mods: list[str]) -> None:
        self.ctx = ctx
        self.rest = list(mods)

    def take(self, *choices: str, default: str | None = None) -> str | None:
        for i, m in enumerate(self.rest):
            if m in choices:
                del self.rest[i]
                return m
        return default

    def has(self, name: str) -> bool:
        return self.take(name) is not None

    def types(self) -> list[PtxType]:
        out = []
        keep = []
        for m in self.rest:
            if m in TYPES:
                out.append(TYPES[m])
            else:
                keep.append(m)
        self.rest = keep
        return out

    def one_type(self) -> PtxType:
        ts = self.types()
        if len(ts) != 1:
            raise self.ctx.error("expected exactly one type modifier")
        return ts[0]

    def done(self, ignore: frozenset[str] = IGNORED_MODS) -> None:
        left = [m for m in self.rest if m not in ignore]
        if left:
            raise self.ctx.unsupported(f"modifier .{'.'.join(left)}")


def h_nop(st, ins, idx) -> None:
    pass


def h_unary(st, ins, idx) -> None:
    a = ins.a.get(st, idx)
    d = ins.d
    if idx is None and isinstance(ins.x, np.ufunc) and type(d) is Reg:
        ins.x(a, out=d.row(st))
    else:
        d.put(st, idx, ins.x(a))


def h_binary(st, ins, idx) -> None:
    a = ins.a.get(st, idx)
    b = ins.b.get(st, idx)
    d = ins.d
    if idx is None and isinstance(ins.x, np.ufunc) and type(d) is Reg:
        ins.x(a, b, out=d.row(st))
    else:
        d.put(st, idx, ins.x(a, b))


def h_ternary(st, ins, idx) -> None:
    d = ins.d
    d.put(st, idx, ins.x(ins.a.get(st, idx), ins.b.get(st, idx), ins.c.get(st, idx)))


def _operands(ctx, ty: PtxType, nsrc: int, src_ty: PtxType | None = None) -> None:
    ctx.nops(nsrc + 1)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], ty)
    sty = src_ty or ty
    srcs = [ctx.src(op, sty) for op in ctx.ops[1:]]
    for slot, s in zip(("a", "b", "c"), srcs, strict=False):
        setattr(ins, slot, s)


def set_unary(ctx, ty: PtxType, f, src_ty: PtxType | None = None) -> None:
    _operands(ctx, ty, 1, src_ty)
    ctx.ins.fn = h_unary
    ctx.ins.x = f


def set_binary(ctx, ty: PtxType, f, src_ty: PtxType | None = None) -> None:
    _operands(ctx, ty, 2, src_ty)
    ctx.ins.fn = h_binary
    ctx.ins.x = f


def set_ternary(ctx, ty: PtxType, f, src_ty: PtxType | None = None) -> None:
    _operands(ctx, ty, 3, src_ty)
    ctx.ins.fn = h_ternary
    ctx.ins.x = f
