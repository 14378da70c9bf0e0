"""Integer and bit-manipulation instructions (ALU class).

Integers wrap like the hardware: values live in NumPy arrays of the instruction's width and
signedness, whose arithmetic is modular. Where PTX defines results NumPy does not (shifts by
the width or more, division by zero, ``bfe``/``bfi``/``prmt`` field rules) the handlers spell
the PTX rule out. Division by zero gives all ones for the quotient and the dividend for the
remainder, as NVIDIA GPUs do.
"""

from __future__ import annotations

import numpy as np

from .operands import Reg
from .ops_common import Mods, h_binary, h_unary, set_binary, set_ternary, set_unary
from .ptxtypes import TYPES, UINT

__all__ = [
    "as_array",
    "dec_abs",
    "dec_add",
    "dec_addc",
    "dec_cnot",
    "dec_div",
    "dec_logic",
    "dec_mad",
    "dec_mad24",
    "dec_madc",
    "dec_max",
    "dec_min",
    "dec_mul",
    "dec_mul24",
    "dec_neg",
    "dec_not",
    "dec_rem",
    "dec_shl",
    "dec_shr",
    "dec_sub",
    "dec_subc",
    "int_type",
    "unsigned_view",
]

_U64 = np.uint64


def as_array(x) -> np.ndarray:
    return np.asarray(x)


def unsigned_view(x) -> np.ndarray:
    x = as_array(x)
    return x.view(UINT[x.dtype.itemsize * 8]) if x.ndim else x.astype(UINT[x.dtype.itemsize * 8])


def int_type(ctx, m: Mods, allowed=("u", "s", "b")):
    ty = m.one_type()
    if ty.kind not in allowed or ty.bits == 8:
        raise ctx.unsupported(f"type .{ty.name}")
    return ty


# ---- add / sub with saturation and carry ------------------------------------------------------


def _sat_s32(x: np.ndarray) -> np.ndarray:
    return np.clip(x, -(2**31), 2**31 - 1).astype(np.int32)


def _carry_sum(ua, ub, cin, bits: int):
    """``(ua + ub + cin) mod 2**bits`` and its carry out, on unsigned 64-bit values: the one
    adder behind ``add.cc``/``addc``/``sub.cc``/``subc`` and ``mad.cc``/``madc``."""
    if bits == 32:
        r = ua + ub + cin
        return r & _U64(0xFFFFFFFF), r >> _U64(32)
    s1 = ua + ub
    c1 = (s1 < ua).astype(_U64)
    s2 = s1 + cin
    c2 = (s2 < s1).astype(_U64)
    return s2, c1 | c2


def _carry_in(st, idx):
    return st.cc if idx is None else st.cc[idx]


def _put_with_carry(st, ins, idx, out, cout) -> None:
    """``d`` from the adder's unsigned result; CC.CF too where the instruction has ``.cc``."""
    if ins.e:
        cout = np.broadcast_to(cout, np.shape(out)) if np.ndim(out) else cout
        if idx is None:
            st.cc[...] = cout
        else:
            st.cc[idx] = cout
    u = UINT[ins.t.bits]
    out = out.astype(u) if np.ndim(out) else u.type(out)
    ins.d.put(st, idx, out.view(ins.t.dtype) if np.ndim(out) else ins.t.dtype.type(out))


def _h_add_cc(st, ins, idx) -> None:
    a = as_array(ins.a.get(st, idx))
    b = as_array(ins.b.get(st, idx))
    sub, carry_in, bits = ins.x
    ua = unsigned_view(a).astype(_U64)
    ub = unsigned_view(b).astype(_U64)
    cin = _carry_in(st, idx) if carry_in else _U64(0)
    if sub:  # a - b = a + ~b + 1; subc: a - (b + borrow) = a + ~b + !borrow
        ub = ~ub & _U64((1 << bits) - 1)
        cin = (_U64(1) - cin.astype(_U64)) if carry_in else _U64(1)
    out, cout = _carry_sum(ua, ub, cin, bits)
    if sub:  # subtraction keeps a *borrow* in CC.CF (subc computes a - (b + CF))
        cout = _U64(1) - cout
    _put_with_carry(st, ins, idx, out, cout)


def _dec_addsub(ctx, mods, sub: bool, carry_in: bool) -> None:
    m = Mods(ctx, mods)
    sat = m.has("sat")
    cc = m.has("cc")
    ty = m.types()
    if len(ty) != 1:
        raise ctx.error("expected one type")
    ty = ty[0]
    m.done()
    if ty.kind in ("f", "h", "h2", "bh", "bh2"):
        raise AssertionError("float add routed to ops_int")
    if ty.bits == 8:
        raise ctx.unsupported(f"type .{ty.name}")
    if cc or carry_in:
        if ty.bits not in (32, 64):
            raise ctx.unsupported("carry on 16-bit types")
        set_binary(ctx, ty, None)
        ctx.ins.fn = _h_add_cc
        ctx.ins.x = (sub, carry_in, ty.bits)
        ctx.ins.e = cc
        ctx.ins.t = ty
        return
    if sat:
        if ty.name != "s32":
            raise ctx.unsupported(".sat on a type other than .s32")
        f = (
            (lambda a, b: _sat_s32(as_array(a).astype(np.int64) - b))
            if sub
            else (lambda a, b: _sat_s32(as_array(a).astype(np.int64) + b))
        )
        set_binary(ctx, ty, f)
        return
    set_binary(ctx, ty, np.subtract if sub else np.add)


def dec_add(ctx, mods) -> None:
    _dec_addsub(ctx, mods, sub=False, carry_in=False)


def dec_sub(ctx, mods) -> None:
    _dec_addsub(ctx, mods, sub=True, carry_in=False)


def dec_addc(ctx, mods) -> None:
    _dec_addsub(ctx, mods, sub=False, carry_in=True)


def dec_subc(ctx, mods) -> None:
    _dec_addsub(ctx, mods, sub=True, carry_in=True)


# ---- multiply ------------------------------------------------------------------------------


def _mulhi_u64(a, b) -> np.ndarray:
    a = as_array(a).astype(_U64)
    b = as_array(b).astype(_U64)
    m32 = _U64(0xFFFFFFFF)
    s32 = _U64(32)
    al, ah = a & m32, a >> s32
    bl, bh = b & m32, b >> s32
    ll = al * bl
    lh = al * bh
    hl = ah * bl
    hh = ah * bh
    mid = (ll >> s32) + (lh & m32) + (hl & m32)
    return hh + (lh >> s32) + (hl >> s32) + (mid >> s32)


def _mulhi(ty):
    bits = ty.bits
    if bits == 64:
        if ty.kind == "s":

            def f(a, b):
                a = as_array(a).astype(np.int64)
                b = as_array(b).astype(np.int64)
                hi = _mulhi_u64(a.view(_U64) if a.ndim else a.astype(_U64), b.astype(_U64))
                hi = hi - np.where(a < 0, b.astype(_U64), _U64(0))
                hi = hi - np.where(b < 0, a.astype(_U64), _U64(0))
                return as_array(hi).astype(np.int64)

            return f
        return lambda a, b: _mulhi_u64(a, b)
    wide = np.int64 if ty.kind == "s" else _U64
    dt = ty.dtype

    def g(a, b):
        r = (as_array(a).astype(wide) * as_array(b).astype(wide)) >> wide(bits)
        return r.astype(dt)

    return g


def _wide(ty):
    """Source type ``ty`` → the double-width destination type."""
    if ty.bits not in (16, 32):
        raise ValueError
    return TYPES[f"{'s' if ty.kind == 's' else 'u'}{ty.bits * 2}"]


def dec_mul(ctx, mods) -> None:
    m = Mods(ctx, mods)
    mode = m.take("lo", "hi", "wide", default="lo")
    ty = int_type(ctx, m)
    m.done()
    if mode == "lo":
        set_binary(ctx, ty, np.multiply)
    elif mode == "hi":
        set_binary(ctx, ty, _mulhi(ty))
    else:
        if ty.bits not in (16, 32):
            raise ctx.unsupported(f"mul.wide.{ty.name}")
        wt = _wide(ty)
        set_binary(
            ctx, wt, lambda a, b: as_array(a).astype(wt.dtype) * as_array(b).astype(wt.dtype), ty
        )


def _h_mad_wide(st, ins, idx) -> None:
    wt = ins.t
    a = as_array(ins.a.get(st, idx)).astype(wt.dtype)
    b = as_array(ins.b.get(st, idx)).astype(wt.dtype)
    ins.d.put(st, idx, a * b + ins.c.get(st, idx))


def _h_mad_lo(st, ins, idx) -> None:
    a = ins.a.get(st, idx)
    b = ins.b.get(st, idx)
    c = ins.c.get(st, idx)
    d = ins.d
    if idx is None and type(d) is Reg:
        np.add(np.multiply(a, b), c, out=d.row(st))
    else:
        d.put(st, idx, a * b + c)


def _mad_mods(ctx, mods):
    """``mad``'s and ``madc``'s modifiers: (half, .sat, .cc, type)."""
    m = Mods(ctx, mods)
    mode = m.take("lo", "hi", "wide", default="lo")
    sat = m.has("sat")
    cc = m.has("cc")
    ty = int_type(ctx, m)
    m.done()
    return mode, sat, cc, ty


def dec_mad(ctx, mods) -> None:
    mode, sat, cc, ty = _mad_mods(ctx, mods)
    if cc:
        _set_mad_carry(ctx, ty, mode, sat, carry_in=False, write_cc=True)
        return
    ins = ctx.ins
    if mode == "lo":
        set_ternary(ctx, ty, None)
        ins.fn = _h_mad_lo
    elif mode == "hi":
        hi = _mulhi(ty)
        if sat:
            if ty.name != "s32":
                raise ctx.unsupported("mad.hi.sat on a type other than .s32")
            set_ternary(ctx, ty, lambda a, b, c: _sat_s32(hi(a, b).astype(np.int64) + c))
        else:
            set_ternary(ctx, ty, lambda a, b, c: hi(a, b) + c)
    else:
        if ty.bits not in (16, 32):
            raise ctx.unsupported(f"mad.wide.{ty.name}")
        wt = _wide(ty)
        ctx.nops(4)
        ins.d = ctx.dst(ctx.ops[0], wt)
        ins.a = ctx.src(ctx.ops[1], ty)
        ins.b = ctx.src(ctx.ops[2], ty)
        ins.c = ctx.src(ctx.ops[3], wt)
        ins.t = wt
        ins.fn = _h_mad_wide


def _h_mad_cc(st, ins, idx) -> None:
    half, carry_in = ins.x
    bits = ins.t.bits
    p = unsigned_view(as_array(half(ins.a.get(st, idx), ins.b.get(st, idx)))).astype(_U64)
    uc = unsigned_view(as_array(ins.c.get(st, idx))).astype(_U64)
    cin = _carry_in(st, idx) if carry_in else _U64(0)
    out, cout = _carry_sum(p, uc, cin, bits)
    _put_with_carry(st, ins, idx, out, cout)


def _lo(ty):
    mask = _U64((1 << ty.bits) - 1)
    return lambda a, b: (unsigned_view(a).astype(_U64) * unsigned_view(b).astype(_U64)) & mask


def _set_mad_carry(ctx, ty, mode: str, sat: bool, carry_in: bool, write_cc: bool) -> None:
    """``mad{.lo,.hi}.cc`` and ``madc{.lo,.hi}{.cc}`` (32 and 64 bits): the product's half
    plus ``c`` (plus CC.CF for ``madc``) through the carry adder, as multi-word arithmetic
    (libdevice's double-precision argument reduction) chains them."""
    if ty.bits not in (32, 64) or mode == "wide" or sat:
        what = "madc" if carry_in else "mad.cc"
        raise ctx.unsupported(f"{what} with .{mode if mode == 'wide' else 'sat'} or .{ty.name}")
    set_ternary(ctx, ty, None)
    ins = ctx.ins
    ins.fn = _h_mad_cc
    ins.x = (_mulhi(ty) if mode == "hi" else _lo(ty), carry_in)
    ins.e = write_cc
    ins.t = ty


def dec_madc(ctx, mods) -> None:
    mode, sat, cc, ty = _mad_mods(ctx, mods)
    _set_mad_carry(ctx, ty, mode, sat, carry_in=True, write_cc=cc)


def _low24(x, signed: bool) -> np.ndarray:
    x = as_array(x).astype(np.int64) & 0xFFFFFF
    if signed:
        x = np.where(x >= 0x800000, x - 0x1000000, x)
    return x


def dec_mul24(ctx, mods) -> None:
    m = Mods(ctx, mods)
    mode = m.take("lo", "hi", default="lo")
    ty = int_type(ctx, m, ("u", "s"))
    m.done()
    if ty.bits != 32:
        raise ctx.unsupported(f"mul24.{ty.name}")
    s = ty.kind == "s"
    shift = 0 if mode == "lo" else 16

    def f(a, b):
        p = _low24(a, s) * _low24(b, s)
        return ((p >> shift) & 0xFFFFFFFF).astype(np.uint32).view(ty.dtype)

    set_binary(ctx, ty, f)


def dec_mad24(ctx, mods) -> None:
    m = Mods(ctx, mods)
    mode = m.take("lo", "hi", default="lo")
    ty = int_type(ctx, m, ("u", "s"))
    m.done()
    if ty.bits != 32:
        raise ctx.unsupported(f"mad24.{ty.name}")
    s = ty.kind == "s"
    shift = 0 if mode == "lo" else 16

    def f(a, b, c):
        p = _low24(a, s) * _low24(b, s)
        r = ((p >> shift) & 0xFFFFFFFF).astype(np.uint32).view(ty.dtype)
        return r + c

    set_ternary(ctx, ty, f)


# ---- division -------------------------------------------------------------------------------


def _divrem(ty, want_rem: bool):
    dt = ty.dtype

    def f(a, b):
        a = as_array(a).astype(dt)
        b = as_array(b).astype(dt)
        zero = b == 0
        bs = np.where(zero, dt.type(1), b)
        if ty.kind == "s":
            # C semantics: truncate toward zero; INT_MIN / -1 wraps to INT_MIN
            neg1 = bs == -1
            bs = np.where(neg1, dt.type(1), bs)
            q = np.floor_divide(a, bs)
            r = np.remainder(a, bs)  # floor semantics: the sign of the divisor
            fix = (r != 0) & ((a < 0) != (bs < 0))
            q = np.where(fix, q + dt.type(1), q)
            r = np.where(fix, r - bs, r)
            q = np.where(neg1, np.negative(a), q)
            r = np.where(neg1, dt.type(0), r)
        else:
            q = np.floor_divide(a, bs)
            r = np.remainder(a, bs)
        if want_rem:
            return np.where(zero, a, r)
        return np.where(zero, dt.type(-1) if ty.kind == "s" else ~dt.type(0), q)

    return f


def dec_div(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = int_type(ctx, m, ("u", "s"))
    m.done()
    set_binary(ctx, ty, _divrem(ty, False))


def dec_rem(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = int_type(ctx, m, ("u", "s"))
    m.done()
    set_binary(ctx, ty, _divrem(ty, True))


# ---- simple unary/binary ------------------------------------------------------------------


def dec_abs(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = int_type(ctx, m, ("s",))
    m.done()
    set_unary(ctx, ty, np.abs)


def dec_neg(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = int_type(ctx, m, ("s",))
    m.done()
    set_unary(ctx, ty, np.negative)


def _minmax(ctx, mods, f) -> None:
    m = Mods(ctx, mods)
    relu = m.has("relu")
    ty = int_type(ctx, m, ("u", "s"))
    m.done()
    if relu:
        if ty.kind != "s":
            raise ctx.unsupported(".relu on unsigned")
        set_binary(ctx, ty, lambda a, b: np.maximum(f(a, b), ty.dtype.type(0)))
    else:
        set_binary(ctx, ty, f)


def dec_min(ctx, mods) -> None:
    _minmax(ctx, mods, np.minimum)


def dec_max(ctx, mods) -> None:
    _minmax(ctx, mods, np.maximum)


def dec_logic(op: str):
    uf = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op]

    def dec(ctx, mods) -> None:
        m = Mods(ctx, mods)
        ty = m.one_type()
        m.done()
        if ty.kind == "pred":
            ctx.nops(3)
            ins = ctx.ins
            ins.d = ctx.dst(ctx.ops[0], ty)
            ins.a = _PredSrc(*ctx.pred(ctx.ops[1]))
            ins.b = _PredSrc(*ctx.pred(ctx.ops[2]))
            ins.fn = h_binary
            ins.x = uf
            return
        if ty.kind not in ("b", "u", "s"):
            raise ctx.unsupported(f"{op}.{ty.name}")
        set_binary(ctx, TYPES[f"b{ty.bits}"] if ty.bits > 8 else ty, uf)

    return dec


class _PredSrc:
    """A predicate operand that may be negated (``!%p``)."""

    __slots__ = ("neg", "r")

    def __init__(self, r, neg: bool) -> None:
        self.r, self.neg = r, neg

    def get(self, st, idx):
        v = self.r.get(st, idx)
        return ~v if self.neg else v


def dec_not(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    if ty.kind == "pred":
        ctx.nops(2)
        ctx.ins.d = ctx.dst(ctx.ops[0], ty)
        ctx.ins.a = _PredSrc(*ctx.pred(ctx.ops[1]))
        ctx.ins.fn = h_unary
        ctx.ins.x = np.logical_not
        return
    set_unary(ctx, TYPES[f"b{ty.bits}"], np.invert)


def dec_cnot(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    set_unary(ctx, ty, lambda a: (as_array(a) == 0).astype(ty.dtype))


# ---- shifts ------------------------------------------------------------------------------


def _shift(ty, left: bool):
    bits = ty.bits
    dt = ty.dtype
    arith = ty.kind == "s" and not left

    def f(a, b):
        a = as_array(a)
        b = np.minimum(as_array(b).astype(np.uint64), bits - 1 if arith else bits).astype(dt)
        return np.left_shift(a, b) if left else np.right_shift(a, b)

    return f


def dec_shl(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    ty = TYPES[f"b{ty.bits}"]
    _shift_operands(ctx, ty, _shift(ty, True))


def dec_shr(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    if ty.kind == "b":
        ty = TYPES[f"u{ty.bits}"]
    _shift_operands(ctx, ty, _shift(ty, False))


def _shift_operands(ctx, ty, f) -> None:
    ctx.nops(3)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], ty)
    ins.a = ctx.src(ctx.ops[1], ty)
    ins.b = ctx.src(ctx.ops[2], TYPES["u32"])
    ins.fn = h_binary
    ins.x = f
