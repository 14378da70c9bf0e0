"""Bit-manipulation instructions (ALU class): popc, clz, brev, bfind, bfe, bfi, prmt, sad,
dp4a, dp2a, shf, lop3, bmsk, szext.

Field rules follow the PTX ISA exactly (``bfe``/``bfi`` positions and lengths are taken
modulo 256 and clipped to the width; ``bfe.s`` replicates the field's sign bit; ``prmt``'s
default mode can replicate a byte's sign). Values are widened to uint64 to compute, then
narrowed to the instruction type.
"""

from __future__ import annotations

import numpy as np

from .ops_common import Mods, set_binary, set_ternary, set_unary
from .ops_int import as_array, int_type, unsigned_view
from .ptxtypes import TYPES, UINT

__all__ = [
    "dec_bfe",
    "dec_bfi",
    "dec_bfind",
    "dec_bmsk",
    "dec_brev",
    "dec_clz",
    "dec_dp2a",
    "dec_dp4a",
    "dec_lop3",
    "dec_popc",
    "dec_prmt",
    "dec_sad",
    "dec_shf",
    "dec_szext",
]


# ---- bit counting ----------------------------------------------------------------------------


def dec_popc(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    set_unary(ctx, TYPES["u32"], lambda a: np.bitwise_count(as_array(a)).astype(np.uint32), ty)


def _bit_length(a) -> np.ndarray:
    """Number of significant bits of unsigned values (0 for 0)."""
    a = as_array(a).astype(np.uint64)
    hi = (a >> np.uint64(32)).astype(np.float64)
    lo = (a & np.uint64(0xFFFFFFFF)).astype(np.float64)
    _, eh = np.frexp(hi)
    _, el = np.frexp(lo)
    return np.where(hi > 0, eh + 32, el).astype(np.int64)


def dec_clz(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    bits = ty.bits
    set_unary(
        ctx,
        TYPES["u32"],
        lambda a: (bits - _bit_length(unsigned_view(a))).astype(np.uint32),
        TYPES[f"b{bits}"],
    )


_REV8 = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], np.uint8)


def _brev(a) -> np.ndarray:
    a = np.ascontiguousarray(as_array(a))
    by = a.reshape(-1).view(np.uint8).reshape(-1, a.dtype.itemsize)
    out = _REV8[by[:, ::-1]]
    return np.ascontiguousarray(out).view(a.dtype).reshape(a.shape)


def dec_brev(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    set_unary(ctx, TYPES[f"b{ty.bits}"], _brev)


def dec_bfind(ctx, mods) -> None:
    m = Mods(ctx, mods)
    shiftamt = m.has("shiftamt")
    ty = int_type(ctx, m, ("u", "s"))
    m.done()
    bits = ty.bits

    def f(a):
        a = as_array(a)
        u = unsigned_view(a).astype(np.uint64)
        if ty.kind == "s":
            neg = a < 0
            u = np.where(neg, ~u & np.uint64((1 << bits) - 1), u)
        pos = _bit_length(u) - 1  # -1 when no bit
        res = np.where(pos < 0, -1, bits - 1 - pos) if shiftamt else pos
        return (res & 0xFFFFFFFF).astype(np.uint32)

    set_unary(ctx, TYPES["u32"], f, ty)


# ---- bit fields ----------------------------------------------------------------------------


def _bfe(ty):
    bits = ty.bits
    signed = ty.kind == "s"

    def f(a, b, c):
        a = as_array(a)
        u = unsigned_view(a).astype(np.uint64)
        pos = as_array(b).astype(np.int64) & 0xFF
        ln = as_array(c).astype(np.int64) & 0xFF
        sh = np.minimum(pos, 63).astype(np.uint64)
        field = np.where(pos >= bits, np.uint64(0), u >> sh)
        eff = np.clip(np.minimum(ln, bits - pos), 0, 64)
        mask = np.where(
            eff >= 64,
            np.uint64(2**64 - 1),
            (np.uint64(1) << np.minimum(eff, 63).astype(np.uint64)) - np.uint64(1),
        )
        field = field & mask
        if signed:
            sbit_pos = np.minimum(pos + ln - 1, bits - 1)
            sbit = (u >> np.clip(sbit_pos, 0, 63).astype(np.uint64)) & np.uint64(1)
            sbit = np.where(ln == 0, np.uint64(0), sbit)
            fill = np.where(sbit == 1, ~mask, np.uint64(0))
            field = field | fill
        field = field & np.uint64((1 << bits) - 1) if bits < 64 else field
        return (
            field.astype(UINT[bits]).view(ty.dtype)
            if np.ndim(field)
            else ty.dtype.type(
                int(field) - ((1 << bits) if signed and int(field) >> (bits - 1) else 0)
            )
        )

    return f


def dec_bfe(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = int_type(ctx, m, ("u", "s"))
    m.done()
    ctx.nops(4)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], ty)
    ins.a = ctx.src(ctx.ops[1], ty)
    ins.b = ctx.src(ctx.ops[2], TYPES["u32"])
    ins.c = ctx.src(ctx.ops[3], TYPES["u32"])
    ins.fn = _h_fn3
    ins.x = _bfe(ty)


def _h_fn3(st, ins, idx) -> None:
    ins.d.put(st, idx, ins.x(ins.a.get(st, idx), ins.b.get(st, idx), ins.c.get(st, idx)))


def _h_fn4(st, ins, idx) -> None:
    ins.d.put(
        st,
        idx,
        ins.x(ins.a.get(st, idx), ins.b.get(st, idx), ins.c.get(st, idx), ins.e.get(st, idx)),
    )


def dec_bfi(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    bits = ty.bits
    ctx.nops(5)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], ty)
    ins.a = ctx.src(ctx.ops[1], ty)
    ins.b = ctx.src(ctx.ops[2], ty)
    ins.c = ctx.src(ctx.ops[3], TYPES["u32"])
    ins.e = ctx.src(ctx.ops[4], TYPES["u32"])
    full = np.uint64(2**64 - 1) if bits == 64 else np.uint64((1 << bits) - 1)

    def f(a, b, c, e):
        fa = as_array(a).astype(np.uint64)
        fb = as_array(b).astype(np.uint64)
        pos = as_array(c).astype(np.int64) & 0xFF
        ln = as_array(e).astype(np.int64) & 0xFF
        eff = np.clip(np.minimum(ln, bits - pos), 0, 64)
        mask = np.where(
            eff >= 64,
            np.uint64(2**64 - 1),
            (np.uint64(1) << np.minimum(eff, 63).astype(np.uint64)) - np.uint64(1),
        )
        sh = np.minimum(pos, 63).astype(np.uint64)
        mask_sh = np.where(pos >= bits, np.uint64(0), (mask << sh) & full)
        r = (fb & ~mask_sh) | ((fa << sh) & mask_sh)
        return r.astype(ty.dtype)

    ins.fn = _h_fn4
    ins.x = f


def _prmt(mode: str | None):
    def f(a, b, c):
        a = as_array(a).astype(np.uint64)
        b = as_array(b).astype(np.uint64)
        c = as_array(c).astype(np.uint64)
        src = a | (b << np.uint64(32))  # bytes 0..7
        out = np.zeros(np.broadcast_shapes(a.shape, b.shape, c.shape), np.uint64)
        if mode is None:
            for k in range(4):
                sel = (c >> np.uint64(4 * k)) & np.uint64(0xF)
                byte = (src >> ((sel & np.uint64(7)) * np.uint64(8))) & np.uint64(0xFF)
                sign = np.where((byte & np.uint64(0x80)) != 0, np.uint64(0xFF), np.uint64(0))
                byte = np.where((sel & np.uint64(8)) != 0, sign, byte)
                out = out | (byte << np.uint64(8 * k))
            return out.astype(np.uint32)
        s = (c & np.uint64(3)).astype(np.int64)
        tables = {
            "f4e": [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]],
            "b4e": [[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]],
            "rc8": [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]],
            "ecl": [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]],
            "ecr": [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]],
            "rc16": [[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]],
        }
        tab = np.array(tables[mode], np.uint64)  # [s][result byte] -> source byte
        for k in range(4):
            sel = tab[s, k]
            byte = (src >> (sel * np.uint64(8))) & np.uint64(0xFF)
            out = out | (byte << np.uint64(8 * k))
        return out.astype(np.uint32)

    return f


def dec_prmt(ctx, mods) -> None:
    m = Mods(ctx, mods)
    mode = m.take("f4e", "b4e", "rc8", "ecl", "ecr", "rc16")
    ty = m.one_type()
    m.done()
    if ty.bits != 32:
        raise ctx.unsupported(f"prmt.{ty.name}")
    set_ternary(ctx, TYPES["b32"], _prmt(mode))


def dec_sad(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = int_type(ctx, m, ("u", "s"))
    m.done()

    def f(a, b, c):
        a = as_array(a).astype(np.int64)
        b = as_array(b).astype(np.int64)
        return (
            (np.abs(a - b).astype(UINT[ty.bits]) + as_array(c).astype(UINT[ty.bits])).view(ty.dtype)
            if np.ndim(a - b)
            else ty.dtype.type(abs(int(a) - int(b)) + int(c))
        )

    set_ternary(ctx, ty, f)


def _bytes_of(x, signed: bool) -> list[np.ndarray]:
    x = as_array(x).astype(np.uint32).astype(np.int64)
    out = []
    for k in range(4):
        v = (x >> (8 * k)) & 0xFF
        if signed:
            v = np.where(v >= 128, v - 256, v)
        out.append(v)
    return out


def dec_dp4a(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ts = m.types()
    m.done()
    if len(ts) != 2:
        raise ctx.error("dp4a needs two types")
    sa, sb = ts[0].kind == "s", ts[1].kind == "s"
    signed_c = sa or sb
    cty = TYPES["s32"] if signed_c else TYPES["u32"]

    def f(a, b, c):
        acc = as_array(c).astype(np.int64)
        for x, y in zip(_bytes_of(a, sa), _bytes_of(b, sb), strict=True):
            acc = acc + x * y
        return (acc & 0xFFFFFFFF).astype(np.uint32).view(cty.dtype)

    ctx.nops(4)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], cty)
    ins.a = ctx.src(ctx.ops[1], TYPES["b32"])
    ins.b = ctx.src(ctx.ops[2], TYPES["b32"])
    ins.c = ctx.src(ctx.ops[3], cty)
    ins.fn = _h_fn3
    ins.x = f


def dec_dp2a(ctx, mods) -> None:
    m = Mods(ctx, mods)
    part = m.take("lo", "hi", default="lo")
    ts = m.types()
    m.done()
    if len(ts) != 2:
        raise ctx.error("dp2a needs two types")
    sa, sb = ts[0].kind == "s", ts[1].kind == "s"
    cty = TYPES["s32"] if (sa or sb) else TYPES["u32"]

    def f(a, b, c):
        a = as_array(a).astype(np.uint32).astype(np.int64)
        acc = as_array(c).astype(np.int64)
        bb = _bytes_of(b, sb)
        off = 0 if part == "lo" else 2
        for k in range(2):
            h = (a >> (16 * k)) & 0xFFFF
            if sa:
                h = np.where(h >= 32768, h - 65536, h)
            acc = acc + h * bb[off + k]
        return (acc & 0xFFFFFFFF).astype(np.uint32).view(cty.dtype)

    ctx.nops(4)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], cty)
    ins.a = ctx.src(ctx.ops[1], TYPES["b32"])
    ins.b = ctx.src(ctx.ops[2], TYPES["b32"])
    ins.c = ctx.src(ctx.ops[3], cty)
    ins.fn = _h_fn3
    ins.x = f


def dec_shf(ctx, mods) -> None:
    m = Mods(ctx, mods)
    direction = m.take("l", "r")
    mode = m.take("wrap", "clamp")
    ty = m.one_type()
    m.done()
    if direction is None or mode is None or ty.bits != 32:
        raise ctx.unsupported("shf form")

    def f(a, b, c):
        lo = as_array(a).astype(np.uint64)
        hi = as_array(b).astype(np.uint64)
        n = as_array(c).astype(np.uint64)
        n = n & np.uint64(31) if mode == "wrap" else np.minimum(n, np.uint64(32))
        v = lo | (hi << np.uint64(32))
        r = v << n >> np.uint64(32) if direction == "l" else v >> n
        return (r & np.uint64(0xFFFFFFFF)).astype(np.uint32)

    set_ternary(ctx, TYPES["b32"], f)
    ctx.ins.c = ctx.src(ctx.ops[3], TYPES["u32"])


def dec_lop3(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    ctx.nops(5)
    lut_op = ctx.ops[4]
    if lut_op[0] != "int":
        raise ctx.unsupported("lop3 with a non-immediate table")
    lut = lut_op[1] & 0xFF
    full = ty.dtype.type(~ty.dtype.type(0))

    def f(a, b, c):
        a, b, c = as_array(a), as_array(b), as_array(c)
        out = np.zeros(np.broadcast_shapes(a.shape, b.shape, c.shape), ty.dtype)
        for k in range(8):
            if lut >> k & 1:
                ta = a if (0xF0 >> k) & 1 else a ^ full
                tb = b if (0xCC >> k) & 1 else b ^ full
                tc = c if (0xAA >> k) & 1 else c ^ full
                out |= ta & tb & tc
        return out

    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], ty)
    ins.a = ctx.src(ctx.ops[1], ty)
    ins.b = ctx.src(ctx.ops[2], ty)
    ins.c = ctx.src(ctx.ops[3], ty)
    ins.fn = _h_fn3
    ins.x = f


def dec_bmsk(ctx, mods) -> None:
    m = Mods(ctx, mods)
    mode = m.take("clamp", "wrap")
    ty = m.one_type()
    m.done()
    if mode is None or ty.bits != 32:
        raise ctx.unsupported("bmsk form")

    def f(a, b):
        pos = as_array(a).astype(np.int64)
        ln = as_array(b).astype(np.int64)
        if mode == "wrap":
            pos, ln = pos & 31, ln & 31
        else:
            pos, ln = np.minimum(pos, 32), np.minimum(ln, 32)
        ln = np.minimum(ln, 32 - pos)
        mask = ((np.int64(1) << ln) - 1) << pos
        return (mask & 0xFFFFFFFF).astype(np.uint32)

    set_binary(ctx, TYPES["b32"], f, TYPES["u32"])


def dec_szext(ctx, mods) -> None:
    m = Mods(ctx, mods)
    mode = m.take("clamp", "wrap")
    ty = int_type(ctx, m, ("u", "s"))
    m.done()
    if mode is None or ty.bits != 32:
        raise ctx.unsupported("szext form")

    def f(a, b):
        v = as_array(a).astype(np.uint32).astype(np.int64)
        n = as_array(b).astype(np.int64)
        n = n & 31 if mode == "wrap" else np.minimum(n, 32)
        mask = (np.int64(1) << n) - 1
        r = v & mask
        if ty.kind == "s":
            sign = (r >> np.maximum(n - 1, 0)) & 1
            r = np.where((sign == 1) & (n > 0), r | ~mask, r)
            r = np.where(n == 0, 0, r)
        return (r & 0xFFFFFFFF).astype(np.uint32).view(ty.dtype)

    set_binary(ctx, ty, f)
    ctx.ins.b = ctx.src(ctx.ops[2], TYPES["u32"])
