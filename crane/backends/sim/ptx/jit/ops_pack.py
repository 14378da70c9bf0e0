"""``mov`` between a wide register and a vector of narrower ones, in compiled kernels:
``mov.b64 %rd, {%r1, %r2}`` (pack, the first element lowest) and ``mov.b64 {%r1, %r2}, %rd``
(unpack; a ``_`` element discards its part). nvcc emits these for every double's halves
(``__double2hiint``, the slow paths of math functions) and for 64-bit values built from
32-bit ones. Semantics are the interpreter's (:func:`..ops_move.dec_mov`): raw bits, each part
``bits / n`` wide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..ptxtypes import TYPES

if TYPE_CHECKING:
    from ..ptxtypes import PtxType
    from .lower import KernelLowering

__all__ = ["mov_vector"]


def mov_vector(k: KernelLowering, t: PtxType, dst, src) -> None:
    """Pack ``src`` (a vector operand) into ``dst`` or unpack ``src`` into vector ``dst``."""
    b = k.b
    vec = dst if dst[0] == "vec" else src
    parts = vec[1]
    n = len(parts)
    if n not in (2, 4) or t.bits % n or (dst[0] == "vec") == (src[0] == "vec"):
        raise k.refuse("mov form")
    bits = t.bits // n
    part_t, whole_t = TYPES[f"b{bits}"], TYPES[f"b{t.bits}"]
    wide = ir.IntType(t.bits)
    if dst[0] == "vec":
        v = k.get(src, whole_t)
        for j, d in enumerate(parts):
            if _is_sink(d):
                continue
            x = b.trunc(b.lshr(v, ir.Constant(wide, bits * j)), ir.IntType(bits))
            k.put(d, part_t, x)
        return
    acc = ir.Constant(wide, 0)
    for j, p in enumerate(parts):
        if _is_sink(p):
            raise k.refuse("a sink as a mov source")
        x = b.zext(k.get(p, part_t), wide)
        acc = b.or_(acc, b.shl(x, ir.Constant(wide, bits * j)))
    k.put(dst, whole_t, acc)


def _is_sink(op) -> bool:
    """The ``_`` element (parsed as a name or a register)."""
    return op[0] in ("reg", "name") and op[1] == "_"
