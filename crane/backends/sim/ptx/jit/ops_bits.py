"""Bit-manipulation instructions in compiled kernels: popc, clz, brev, bfind, bfe, bfi, prmt,
lop3, shf, sad, dp4a, dp2a, bmsk, szext — each the interpreter's semantics
(:mod:`..ops_bits`) on one lane.

Why in their own module: nvcc emits them everywhere (``__popc``, ``__clz``, 64-bit shifts as
``shf``, byte shuffles as ``prmt``, any three-input logic as ``lop3``), and their PTX field
rules — positions and lengths modulo 256 clipped to the width, ``bfe.s``'s sign fill,
``prmt``'s sign-replicating selectors — need care that the arithmetic handlers do not. Field
arithmetic is done in i64 with shift counts clamped below 64, as the interpreter computes in
uint64 with ``np.minimum(…, 63)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..ptxtypes import TYPES
from .irtypes import I32, I64, c64, ity, lane_type

if TYPE_CHECKING:
    from .lower import KernelLowering

__all__ = ["BIT_HANDLERS"]

_U32 = TYPES["u32"]
#: prmt's modes: [c & 3][result byte] -> source byte (the interpreter's tables)
_PRMT = {
    "f4e": [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]],
    "b4e": [[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]],
    "rc8": [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]],
    "ecl": [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]],
    "ecr": [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]],
    "rc16": [[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]],
}


def _bit_type(k: KernelLowering, types, kinds=("b", "u", "s")):
    t = k.one_type(types)
    if t.kind not in kinds or t.bits not in (32, 64):
        raise k.refuse(f"type .{t.name}")
    return t


def _count(name: str):
    """popc / clz: a u32 count of a 32- or 64-bit operand."""

    def h(k: KernelLowering, types, mods, ops) -> None:
        k.only(mods)
        t = _bit_type(k, types)
        if len(ops) != 2:
            raise k.refuse("operand count")
        a = k.get(ops[1], t)
        it = lane_type(a.type)  # (a lane's: the vector form's intrinsics are made of it)
        if name == "popc":
            v = k.b.call(k.intrinsic(f"llvm.ctpop.i{it.width}", it, [it]), [a])
        else:
            f = k.intrinsic(f"llvm.ctlz.i{it.width}", it, [it, ir.IntType(1)])
            v = k.b.call(f, [a, ir.Constant(ir.IntType(1), 0)])
        k.put(ops[0], _U32, _to32(k, v))

    return h


def _to32(k: KernelLowering, v):
    w = lane_type(v.type).width
    if w == 32:
        return v
    return k.b.trunc(v, I32) if w > 32 else k.b.zext(v, I32)


def _h_brev(k: KernelLowering, types, mods, ops) -> None:
    k.only(mods)
    t = _bit_type(k, types)
    if len(ops) != 2:
        raise k.refuse("operand count")
    a = k.get(ops[1], t)
    st = lane_type(a.type)
    f = k.intrinsic(f"llvm.bitreverse.i{t.bits}", st, [st])
    k.put(ops[0], t, k.b.call(f, [a]))


def _h_bfind(k: KernelLowering, types, mods, ops) -> None:
    k.only(mods, ("shiftamt",))
    t = _bit_type(k, types, ("u", "s"))
    if len(ops) != 2:
        raise k.refuse("operand count")
    b = k.b
    a = k.get(ops[1], t)
    it = lane_type(a.type)
    u = a
    if t.kind == "s":  # a negative value: the highest clear bit
        u = b.select(b.icmp_signed("<", a, ir.Constant(it, 0)), b.not_(a), a)
    ctlz = k.intrinsic(f"llvm.ctlz.i{t.bits}", it, [it, ir.IntType(1)])
    lz = _to32(k, b.call(ctlz, [u, ir.Constant(ir.IntType(1), 0)]))
    none = b.icmp_unsigned("==", u, ir.Constant(it, 0))
    pos = lz if "shiftamt" in mods else b.sub(ir.Constant(I32, t.bits - 1), lz)
    k.put(ops[0], _U32, b.select(none, ir.Constant(I32, 0xFFFFFFFF), pos))


def _field_mask(k: KernelLowering, bits: int, pos, ln):
    """The interpreter's ``mask``: ``clip(min(ln, bits - pos), 0, 64)`` low bits (i64)."""
    b = k.b
    eff = b.sub(c64(bits), pos)
    eff = b.select(b.icmp_signed("<", ln, eff), ln, eff)
    eff = b.select(b.icmp_signed("<", eff, c64(0)), c64(0), eff)
    full = b.icmp_signed(">=", eff, c64(64))
    low = b.sub(b.shl(c64(1), b.select(full, c64(0), eff)), c64(1))
    return b.select(full, c64(-1), low)


def _pos_len(k: KernelLowering, ops):
    b = k.b
    pos = b.and_(b.zext(k.get(ops[0], _U32), I64), c64(0xFF))
    ln = b.and_(b.zext(k.get(ops[1], _U32), I64), c64(0xFF))
    return pos, ln


def _min63(k: KernelLowering, v):
    return k.b.select(k.b.icmp_signed("<", v, c64(63)), v, c64(63))


def _h_bfe(k: KernelLowering, types, mods, ops) -> None:
    k.only(mods)
    t = _bit_type(k, types, ("u", "s"))
    if len(ops) != 4:
        raise k.refuse("operand count")
    b = k.b
    bits = t.bits
    u = b.zext(k.get(ops[1], t), I64) if bits < 64 else k.get(ops[1], t)
    pos, ln = _pos_len(k, ops[2:4])
    field = b.select(b.icmp_signed(">=", pos, c64(bits)), c64(0), b.lshr(u, _min63(k, pos)))
    mask = _field_mask(k, bits, pos, ln)
    field = b.and_(field, mask)
    if t.kind == "s":
        sp = b.sub(b.add(pos, ln), c64(1))
        sp = b.select(b.icmp_signed("<", sp, c64(bits - 1)), sp, c64(bits - 1))
        sp = b.select(b.icmp_signed("<", sp, c64(0)), c64(0), _min63(k, sp))
        sbit = b.and_(b.lshr(u, sp), c64(1))
        fill = b.and_(b.icmp_unsigned("!=", sbit, c64(0)), b.icmp_unsigned("!=", ln, c64(0)))
        field = b.or_(field, b.select(fill, b.not_(mask), c64(0)))
    k.put(ops[0], t, b.trunc(field, ity(bits)) if bits < 64 else field)


def _h_bfi(k: KernelLowering, types, mods, ops) -> None:
    k.only(mods)
    t = _bit_type(k, types)
    if len(ops) != 5:
        raise k.refuse("operand count")
    b = k.b
    bits = t.bits

    def wide(v):
        return b.zext(v, I64) if bits < 64 else v

    fa, fb = wide(k.get(ops[1], t)), wide(k.get(ops[2], t))
    pos, ln = _pos_len(k, ops[3:5])
    mask = _field_mask(k, bits, pos, ln)
    sh = _min63(k, pos)
    full = c64(-1 if bits == 64 else (1 << bits) - 1)
    msh = b.select(b.icmp_signed(">=", pos, c64(bits)), c64(0), b.and_(b.shl(mask, sh), full))
    r = b.or_(b.and_(fb, b.not_(msh)), b.and_(b.shl(fa, sh), msh))
    k.put(ops[0], t, b.trunc(r, ity(bits)) if bits < 64 else r)


def _h_prmt(k: KernelLowering, types, mods, ops) -> None:
    modes = [m for m in mods if m in _PRMT]
    k.only(mods, tuple(modes))
    t = k.one_type(types)
    if t.bits != 32 or len(ops) != 4 or len(modes) > 1:
        raise k.refuse("prmt form")
    b = k.b
    bt = TYPES["b32"]
    a, hi, c = (b.zext(k.get(o, bt), I64) for o in ops[1:4])
    src = b.or_(a, b.shl(hi, c64(32)))
    out = c64(0)
    for j in range(4):
        if modes:  # the selector's two low bits pick a row of the mode's table
            s = b.and_(c, c64(3))
            sel = c64(0)
            for row in range(3, -1, -1):
                pick = b.icmp_unsigned("==", s, c64(row))
                sel = b.select(pick, c64(_PRMT[modes[0]][row][j]), sel)
            byte = b.and_(b.lshr(src, b.mul(sel, c64(8))), c64(0xFF))
        else:
            sel = b.and_(b.lshr(c, c64(4 * j)), c64(0xF))
            byte = b.and_(b.lshr(src, b.mul(b.and_(sel, c64(7)), c64(8))), c64(0xFF))
            neg = b.icmp_unsigned("!=", b.and_(byte, c64(0x80)), c64(0))
            sign = b.select(neg, c64(0xFF), c64(0))
            byte = b.select(b.icmp_unsigned("!=", b.and_(sel, c64(8)), c64(0)), sign, byte)
        out = b.or_(out, b.shl(byte, c64(8 * j)))
    k.put(ops[0], bt, b.trunc(out, I32))


def _h_lop3(k: KernelLowering, types, mods, ops) -> None:
    k.only(mods)
    t = _bit_type(k, types)
    if len(ops) != 5 or ops[4][0] != "int" or ops[0][0] != "reg":
        raise k.refuse("lop3 form")
    b = k.b
    lut = ops[4][1] & 0xFF
    a, bb, c = (k.get(o, t) for o in ops[1:4])
    out = ir.Constant(lane_type(a.type), 0)
    for j in range(8):
        if lut >> j & 1:
            ta = a if (0xF0 >> j) & 1 else b.not_(a)
            tb = bb if (0xCC >> j) & 1 else b.not_(bb)
            tc = c if (0xAA >> j) & 1 else b.not_(c)
            out = b.or_(out, b.and_(b.and_(ta, tb), tc))
    k.put(ops[0], t, out)


def _h_shf(k: KernelLowering, types, mods, ops) -> None:
    direction = [m for m in mods if m in ("l", "r")]
    mode = [m for m in mods if m in ("wrap", "clamp")]
    k.only(mods, (*direction, *mode))
    t = k.one_type(types)
    if len(direction) != 1 or len(mode) != 1 or t.bits != 32 or len(ops) != 4:
        raise k.refuse("shf form")
    b = k.b
    bt = TYPES["b32"]
    lo, hi = (b.zext(k.get(o, bt), I64) for o in ops[1:3])
    n = b.zext(k.get(ops[3], _U32), I64)
    if mode[0] == "wrap":
        n = b.and_(n, c64(31))
    else:
        n = b.select(b.icmp_unsigned("<", n, c64(32)), n, c64(32))
    v = b.or_(lo, b.shl(hi, c64(32)))
    r = b.lshr(b.shl(v, n), c64(32)) if direction[0] == "l" else b.lshr(v, n)
    k.put(ops[0], bt, b.trunc(r, I32))


def _h_sad(k: KernelLowering, types, mods, ops) -> None:
    """``|a - b| + c``: the difference in i64 (wrapping, as the interpreter's int64), its
    absolute value cut to the type, plus ``c`` modulo the width."""
    k.only(mods)
    t = _bit_type(k, types, ("u", "s"))
    if len(ops) != 4:
        raise k.refuse("operand count")
    b = k.b
    signed = t.kind == "s"

    def wide(v):
        if t.bits == 64:
            return v
        return b.sext(v, I64) if signed else b.zext(v, I64)

    d = b.sub(wide(k.get(ops[1], t)), wide(k.get(ops[2], t)))
    ad = b.select(b.icmp_signed("<", d, c64(0)), b.sub(c64(0), d), d)
    ad = b.trunc(ad, ity(t.bits)) if t.bits < 64 else ad
    k.put(ops[0], t, b.add(ad, k.get(ops[3], t)))


def _dot(k: KernelLowering, types, mods, ops, two: bool) -> None:
    """dp4a / dp2a: byte (and half-word) products summed onto ``c``, modulo 2^32 — the
    interpreter's int64 sum cut to 32 bits, which i32 arithmetic gives directly."""
    part = [m for m in mods if m in ("lo", "hi")] if two else []
    k.only(mods, tuple(part))
    if len(types) != 2 or len(ops) != 4 or any(t.kind not in ("u", "s") for t in types):
        raise k.refuse("dp2a/dp4a form")
    sa, sb = (t.kind == "s" for t in types)
    b = k.b
    bt = TYPES["b32"]
    ct = TYPES["s32"] if sa or sb else _U32
    a, bb = k.get(ops[1], bt), k.get(ops[2], bt)

    def piece(v, j: int, width: int, signed: bool):
        x = b.trunc(b.lshr(v, ir.Constant(I32, width * j)), ir.IntType(width))
        return b.sext(x, I32) if signed else b.zext(x, I32)

    acc = k.get(ops[3], ct)
    if two:
        off = 2 if part == ["hi"] else 0
        for j in range(2):
            acc = b.add(acc, b.mul(piece(a, j, 16, sa), piece(bb, off + j, 8, sb)))
    else:
        for j in range(4):
            acc = b.add(acc, b.mul(piece(a, j, 8, sa), piece(bb, j, 8, sb)))
    k.put(ops[0], ct, acc)


def _clamp_or_wrap(k: KernelLowering, v, wrap: bool):
    """A 32-bit field operand (i64): modulo 32 (``.wrap``) or at most 32 (``.clamp``)."""
    b = k.b
    if wrap:
        return b.and_(v, c64(31))
    return b.select(b.icmp_unsigned("<", v, c64(32)), v, c64(32))


def _h_bmsk(k: KernelLowering, types, mods, ops) -> None:
    """``bmsk.{clamp,wrap}.b32 d, pos, len``: ``len`` one bits from bit ``pos`` (CUB's bit
    fields), as the interpreter: both wrapped or clamped to 32, ``len`` cut at bit 32."""
    mode = [m for m in mods if m in ("wrap", "clamp")]
    k.only(mods, tuple(mode))
    t = k.one_type(types)
    if len(mode) != 1 or t.bits != 32 or len(ops) != 3:
        raise k.refuse("bmsk form")
    b = k.b
    pos, ln = (_clamp_or_wrap(k, b.zext(k.get(o, _U32), I64), mode[0] == "wrap") for o in ops[1:])
    room = b.sub(c64(32), pos)
    ln = b.select(b.icmp_unsigned("<", ln, room), ln, room)
    mask = b.shl(b.sub(b.shl(c64(1), ln), c64(1)), pos)
    k.put(ops[0], TYPES["b32"], b.trunc(mask, I32))


def _h_szext(k: KernelLowering, types, mods, ops) -> None:
    """``szext.{clamp,wrap}.{u32,s32} d, a, n``: the low ``n`` bits of ``a``, zero- or
    sign-extended (``n`` wrapped or clamped to 32; 0 bits give 0)."""
    mode = [m for m in mods if m in ("wrap", "clamp")]
    k.only(mods, tuple(mode))
    t = _bit_type(k, types, ("u", "s"))
    if len(mode) != 1 or t.bits != 32 or len(ops) != 3:
        raise k.refuse("szext form")
    b = k.b
    v = b.zext(k.get(ops[1], _U32), I64)
    n = _clamp_or_wrap(k, b.zext(k.get(ops[2], _U32), I64), mode[0] == "wrap")
    mask = b.sub(b.shl(c64(1), n), c64(1))
    r = b.and_(v, mask)
    if t.kind == "s":
        top = b.and_(b.lshr(r, b.sub(n, c64(1))), c64(1))  # (n = 0: r is 0 anyway)
        neg = b.and_(b.icmp_unsigned("==", top, c64(1)), b.icmp_unsigned("!=", n, c64(0)))
        r = b.select(neg, b.or_(r, b.not_(mask)), r)
    k.put(ops[0], t, b.trunc(r, I32))


BIT_HANDLERS = {
    "bmsk": _h_bmsk,
    "szext": _h_szext,
    "dp4a": lambda k, types, mods, ops: _dot(k, types, mods, ops, False),
    "dp2a": lambda k, types, mods, ops: _dot(k, types, mods, ops, True),
    "sad": _h_sad,
    "popc": _count("popc"),
    "clz": _count("clz"),
    "brev": _h_brev,
    "bfind": _h_bfind,
    "bfe": _h_bfe,
    "bfi": _h_bfi,
    "prmt": _h_prmt,
    "lop3": _h_lop3,
    "shf": _h_shf,
}
