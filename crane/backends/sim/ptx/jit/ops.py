"""Instruction handlers of the PTX→LLVM lowering: one per PTX opcode the compiler takes.

Each takes ``(k, types, modifiers, operands)`` — ``k`` the :class:`~.lower.KernelLowering` of
the kernel being lowered, its builder positioned where the lane's code goes — and emits that
instruction for one lane, or raises :class:`~.irtypes.Refusal` for a form it does not take.
Semantics follow the interpreter where PTX leaves a choice (see :mod:`.lower`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..memspace import LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW
from ..parser import Label
from ..ptxtypes import TYPES, PtxType
from . import layout as L
from .irtypes import (
    F32,
    F64,
    FAULTED,
    I1,
    I32,
    I64,
    SPECIAL_GEOM,
    c64,
    ity,
    resize,
    storage_bits,
    vty,
)
from .local import lane_base
from .ops_atomic import ATOMIC_HANDLERS
from .ops_barred import lower_bar_red
from .ops_bits import BIT_HANDLERS
from .ops_carry import lower_addsub_carry, lower_mad_carry
from .ops_cpasync import CP_HANDLERS
from .ops_cvt import (
    DIRECTED,
    binop_directed,
    fma_directed_f32,
    int_to_float_directed,
    narrow_directed,
)
from .ops_half import half_lanes, is_half, lower_cvt_half, lower_half
from .ops_order import ORDER_HANDLERS, ORDER_MODS, access_ordering
from .ops_pack import mov_vector
from .ops_sfu import SFU_HANDLERS, float_binop, flushed, ftz32, sat_float
from .param import param_ptr
from .spin import YIELD_OP
from .warp import YIELD

if TYPE_CHECKING:
    from .lower import KernelLowering

__all__ = ["HANDLERS", "ld_put", "space_of", "st_value"]

#: PTX float comparisons → (ordered?, LLVM predicate); "ne" is ordered, as the interpreter's
#: ``a < b | a > b``, and the "u" forms are also true when either operand is NaN
_FCMP = {
    "eq": (True, "=="),
    "ne": (True, "!="),
    "lt": (True, "<"),
    "le": (True, "<="),
    "gt": (True, ">"),
    "ge": (True, ">="),
    "equ": (False, "=="),
    "neu": (False, "!="),
    "ltu": (False, "<"),
    "leu": (False, "<="),
    "gtu": (False, ">"),
    "geu": (False, ">="),
    "num": (True, "ord"),
    "nan": (False, "uno"),
}
_ICMP_U = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_ICMP_X = {"lo": "<", "ls": "<=", "hi": ">", "hs": ">="}


def _h_mov(k: KernelLowering, types, mods, ops) -> None:
    k.only(mods)
    t = k.one_type(types)
    if len(ops) == 2 and "vec" in (ops[0][0], ops[1][0]):
        mov_vector(k, t, ops[0], ops[1])  # pack / unpack
        return
    if len(ops) != 2 or ops[0][0] != "reg" or ops[1][0] in ("vec", "mem"):
        raise k.refuse("mov form")
    k.put(ops[0], t, k.get(ops[1], t))


def _int_binop(k: KernelLowering, name: str, t: PtxType, a, c):
    b = k.b
    if name == "add":
        return b.add(a, c)
    if name == "sub":
        return b.sub(a, c)
    if name in ("min", "max"):
        pred = {"min": "<", "max": ">"}[name]
        cmp = b.icmp_signed(pred, a, c) if t.kind == "s" else b.icmp_unsigned(pred, a, c)
        return b.select(cmp, a, c)
    if name in ("and", "or", "xor"):
        return {"and": b.and_, "or": b.or_, "xor": b.xor}[name](a, c)
    raise k.refuse(name)


def _arith(name: str):
    def h(k: KernelLowering, types, mods, ops) -> None:
        if is_half(types):
            lower_half(k, name, types, mods, ops)
            return
        t = k.one_type(types)
        if len(ops) != 3:
            raise k.refuse("operand count")
        if t.kind == "f":
            allowed: tuple[str, ...] = ()
            if name in ("add", "sub") or (name == "mul" and t.bits == 32):
                allowed = ("rn", *DIRECTED)
            elif name == "mul":
                allowed = ("rn",)
            if name == "div":
                allowed = ("rn", "approx", "full") if t.bits == 32 else ("rn",)
            sat = ("sat",) if name in ("add", "sub", "mul", "div") else ()
            k.only(mods, (*allowed, "ftz", *sat))
            if name == "div" and not mods_has(mods, ("rn", "approx", "full")):
                raise k.refuse("div.f without rounding")
            a, c = k.get(ops[1], t), k.get(ops[2], t)
            mode = next((m for m in mods if m in DIRECTED), None)

            def op(x, y):
                if mode is not None:
                    return binop_directed(k, name, x, y, mode)
                return float_binop(k, name, x, y)

            v = flushed(k, t, mods, op, a, c)
            if "sat" in mods:
                v = sat_float(k, v)
        else:
            if t.kind == "pred":
                raise k.refuse(f"{name}.pred")
            if name == "mul":
                _mul_int(k, t, mods, ops)
                return
            if name in ("add", "sub") and "cc" in mods:
                lower_addsub_carry(k, name == "sub", False, t, mods, ops)
                return
            if name in ("div", "rem"):
                k.only(mods)
                v = _divrem(k, t, k.get(ops[1], t), k.get(ops[2], t), name == "rem")
            else:
                k.only(mods)
                v = _int_binop(k, name, t, k.get(ops[1], t), k.get(ops[2], t))
        k.put(ops[0], t, v)

    return h


def mods_has(mods, names) -> bool:
    return any(m in names for m in mods)


def _mul_int(k: KernelLowering, t: PtxType, mods, ops) -> None:
    b = k.b
    mode = [m for m in mods if m in ("lo", "hi", "wide")]
    k.only(mods, ("lo", "hi", "wide"))
    if len(mode) != 1:
        raise k.refuse("mul without .lo/.hi/.wide")
    a, c = k.get(ops[1], t), k.get(ops[2], t)
    k.put(ops[0], *_mul_mode(k, t, mode[0], a, c))
    del b


def _mul_mode(k: KernelLowering, t: PtxType, mode: str, a, c):
    """(result type, value) of ``mul.<mode>`` on ``a``, ``c``."""
    b = k.b
    signed = t.kind == "s"
    if mode == "lo":
        return t, b.mul(a, c)
    wide = ity(2 * t.bits)
    ext = b.sext if signed else b.zext
    p = b.mul(ext(a, wide), ext(c, wide))
    if mode == "wide":
        if t.bits == 64:
            raise k.refuse("mul.wide.64")
        return TYPES[f"{t.kind if t.kind != 'b' else 'u'}{2 * t.bits}"], p
    return t, b.trunc(b.lshr(p, ir.Constant(wide, t.bits)), ity(t.bits))


def _divrem(k: KernelLowering, t: PtxType, a, c, rem: bool):
    """Integer div/rem as the interpreter: by zero → all ones (rem: the dividend); signed
    INT_MIN / -1 wraps (remainder 0); C truncation otherwise."""
    b = k.b
    ty = ity(t.bits)
    zero = b.icmp_unsigned("==", c, ir.Constant(ty, 0))
    safe = b.select(zero, ir.Constant(ty, 1), c)
    if t.kind == "s":
        m1 = b.icmp_signed("==", safe, ir.Constant(ty, -1))
        safe2 = b.select(m1, ir.Constant(ty, 1), safe)
        if rem:
            r = b.select(m1, ir.Constant(ty, 0), b.srem(a, safe2))
        else:
            r = b.select(m1, b.sub(ir.Constant(ty, 0), a), b.sdiv(a, safe2))
    else:
        r = b.urem(a, safe) if rem else b.udiv(a, safe)
    return b.select(zero, a if rem else ir.Constant(ty, (1 << t.bits) - 1), r)


def _h_mad(k: KernelLowering, types, mods, ops) -> None:
    t = k.one_type(types)
    b = k.b
    if len(ops) != 4:
        raise k.refuse("operand count")
    if t.kind == "f":
        k.only(mods, ("rn", *DIRECTED, "ftz", "sat"))
        if not mods_has(mods, ("rn", *DIRECTED)):
            raise k.refuse("mad.f without rounding (unfused legacy form)")
        _fma(k, t, ops, mods)
        return
    if "cc" in mods:
        lower_mad_carry(k, False, t, mods, ops, _mul_mode)
        return
    mode = [m for m in mods if m in ("lo", "hi", "wide")]
    k.only(mods, ("lo", "hi", "wide"))
    if len(mode) != 1:
        raise k.refuse("mad without .lo/.hi/.wide")
    rt, p = _mul_mode(k, t, mode[0], k.get(ops[1], t), k.get(ops[2], t))
    k.put(ops[0], rt, b.add(p, k.get(ops[3], rt)))


def _fma(k: KernelLowering, t: PtxType, ops, mods=()) -> None:
    vt = vty(t)
    f = k.intrinsic(f"llvm.fma.{k.fname(vt)}", vt, [vt, vt, vt])
    args = [k.get(o, t) for o in ops[1:4]]
    directed = [m for m in mods if m in DIRECTED]
    if directed and t.bits != 32:
        raise k.refuse(f"fma.{directed[0]}.{t.name}")

    def fma(a, c, d):
        return fma_directed_f32(k, a, c, d, directed[0]) if directed else k.b.call(f, [a, c, d])

    v = flushed(k, t, mods, fma, *args)  # (``.sat`` after the flush, as the interpreter)
    k.put(ops[0], t, sat_float(k, v) if "sat" in mods else v)


def _h_fma(k: KernelLowering, types, mods, ops) -> None:
    if is_half(types):
        lower_half(k, "fma", types, mods, ops)
        return
    t = k.one_type(types)
    k.only(mods, ("rn", *DIRECTED, "ftz", "sat"))
    if t.kind != "f" or not mods_has(mods, ("rn", *DIRECTED)) or len(ops) != 4:
        raise k.refuse("fma form")
    _fma(k, t, ops, mods)


def _h_unary(name: str):
    def h(k: KernelLowering, types, mods, ops) -> None:
        if is_half(types):
            lower_half(k, name, types, mods, ops)
            return
        t = k.one_type(types)
        b = k.b
        if len(ops) != 2:
            raise k.refuse("operand count")
        k.only(mods, ("ftz",) if t.kind == "f" else ())
        a = k.get(ops[1], t)
        if t.kind == "f":
            vt = vty(t)
            fabs = f"llvm.fabs.{k.fname(vt)}"
            op = b.fneg if name == "neg" else lambda x: b.call(k.intrinsic(fabs, vt, [vt]), [x])
            v = flushed(k, t, mods, op, a)
        elif t.kind == "s":
            zero = ir.Constant(a.type, 0)
            neg = b.sub(zero, a)
            v = neg if name == "neg" else b.select(b.icmp_signed("<", a, zero), neg, a)
        else:
            raise k.refuse(f"{name}.{t.name}")
        k.put(ops[0], t, v)

    return h


def _h_logic(name: str):
    def h(k: KernelLowering, types, mods, ops) -> None:
        t = k.one_type(types)
        k.only(mods)
        if t.kind == "f":
            raise k.refuse(f"{name}.{t.name}")
        b = k.b
        if name == "not":
            if len(ops) != 2:
                raise k.refuse("operand count")
            k.put(ops[0], t, b.not_(k.get(ops[1], t)))
            return
        if len(ops) != 3:
            raise k.refuse("operand count")
        k.put(ops[0], t, _int_binop(k, name, t, k.get(ops[1], t), k.get(ops[2], t)))

    return h


def _h_shift(left: bool):
    def h(k: KernelLowering, types, mods, ops) -> None:
        t = k.one_type(types)
        k.only(mods)
        if t.kind in ("f", "pred") or len(ops) != 3:
            raise k.refuse("shift form")
        b = k.b
        a = k.get(ops[1], t)
        n = k.get(ops[2], TYPES["u32"])
        ty = a.type
        big = b.icmp_unsigned(">=", n, ir.Constant(I32, t.bits))
        n_t = resize(b, b.select(big, ir.Constant(I32, 0), n), t.bits, signed=False)
        if left:
            v = b.select(big, ir.Constant(ty, 0), b.shl(a, n_t))
        elif t.kind == "s":
            v = b.select(big, b.ashr(a, ir.Constant(ty, t.bits - 1)), b.ashr(a, n_t))
        else:
            v = b.select(big, ir.Constant(ty, 0), b.lshr(a, n_t))
        k.put(ops[0], t, v)

    return h


def _cmp_mods(k: KernelLowering, t, mods, more=()) -> tuple[str, str | None]:
    """``setp``/``set``'s comparison and boolean operation (None without one). ``.ftz``:
    accepted on floats and not applied to float32, as the interpreter does (it changes only
    comparisons of subnormals, which it does not model); halves flush (:func:`_compare`)."""
    cmp = [m for m in mods if m in _FCMP or m in _ICMP_X]
    bop = [m for m in mods if m in ("and", "or", "xor")]
    ftz = ("ftz",) if t.kind in ("f", "h", "h2", "bh", "bh2") else ()
    k.only(mods, (*cmp, *bop, *ftz, *more))
    if len(cmp) != 1 or len(bop) > 1:
        raise k.refuse(f"{k.ins.opcode.split('.')[0]} form")
    return cmp[0], bop[0] if bop else None


def _compare(k: KernelLowering, t, c: str, ftz: bool, a_op, b_op) -> list:
    """The outcome (i1) of comparison ``c`` of two operands of type ``t``: one, or two for a
    pair of halves (low half first). Halves and bfloat16 are widened to float32 (exact; f16
    subnormals flushed under ``.ftz``, as the interpreter's comparisons)."""
    b = k.b
    if is_half([t]):
        if c not in _FCMP:
            raise k.refuse(f"comparison .{c} on halves")
        word = TYPES["b16"] if t.kind in ("h", "bh") else TYPES["b32"]
        xs, ys = (half_lanes(k, t, k.get(o, word), ftz) for o in (a_op, b_op))
        ordered, pred = _FCMP[c]
        cmp = b.fcmp_ordered if ordered else b.fcmp_unordered
        return [cmp(pred, x, y) for x, y in zip(xs, ys, strict=True)]
    x, y = k.get(a_op, t), k.get(b_op, t)
    if t.kind == "f":
        if c not in _FCMP:
            raise k.refuse(f"comparison .{c} on floats")
        ordered, pred = _FCMP[c]
        return [(b.fcmp_ordered if ordered else b.fcmp_unordered)(pred, x, y)]
    if t.kind == "pred":
        raise k.refuse("a comparison of predicates")
    if c in _ICMP_X:
        return [b.icmp_unsigned(_ICMP_X[c], x, y)]
    if c in _ICMP_U:
        return [(b.icmp_signed if t.kind == "s" else b.icmp_unsigned)(_ICMP_U[c], x, y)]
    raise k.refuse(f"comparison .{c} on integers")


def _with_bop(k: KernelLowering, bop: str | None, outs: list, ops, nops: int) -> list:
    """``outs`` combined with the predicate operand (``ops[nops]``) by ``bop``."""
    if len(ops) != nops + (1 if bop else 0):
        raise k.refuse("operand count")
    if bop is None:
        return outs
    b = k.b
    z = k.get(ops[nops], TYPES["pred"])
    f = {"and": b.and_, "or": b.or_, "xor": b.xor}[bop]
    return [f(v, z) for v in outs]


def _h_setp(k: KernelLowering, types, mods, ops) -> None:
    """``setp``: ``p`` (and ``q``: its negation, or for a pair of halves the high halves'
    outcome, ``setp.gt.f16x2 p|q``), each combined with the boolean operand."""
    t = types[0] if is_half(types) else k.one_type(types)
    c, bop = _cmp_mods(k, t, mods)
    res = _compare(k, t, c, "ftz" in mods, ops[1], ops[2])
    pair = len(res) == 2
    if pair and ops[0][0] != "pair":
        raise k.refuse("setp on a pair of halves with one destination")
    p, q = _with_bop(k, bop, res if pair else [res[0], k.b.not_(res[0])], ops, 3)
    pt = TYPES["pred"]
    d = ops[0]
    if d[0] == "pair":
        k.put(d[1], pt, p)
        k.put(d[2], pt, q)
    else:
        k.put(d, pt, p)


#: ``set``'s "true" in a half type (1.0)
_HALF_ONE = {"h": 0x3C00, "bh": 0x3F80, "h2": 0x3C00, "bh2": 0x3F80}


def _h_set(k: KernelLowering, types, mods, ops) -> None:
    """``set.CmpOp{.BoolOp}.dtype.stype d, a, b``: the outcome as a value, as the
    interpreter's ``_set_value``: 1.0 in a float or half destination, all ones in an integer
    one; a pair of halves gives each half its own (1.0 in the pair type, 0xffff in an
    integer)."""
    b = k.b
    if len(types) != 2:
        raise k.refuse("set form")
    dt, st = types
    c, bop = _cmp_mods(k, st, mods)
    packed = st.kind in ("h2", "bh2")
    if packed:
        ok = dt.kind == st.kind or (dt.kind in ("u", "s") and dt.bits == 32)
    elif dt.kind in ("h", "bh"):
        ok = True
    else:
        half = st.kind in ("h", "bh")
        ok = dt.kind in ("u", "s", "f") and (
            dt.bits == 32 or (half and dt.kind != "f" and dt.bits == 16)
        )
    if not ok:
        raise k.refuse(f"set.{dt.name}.{st.name}")
    res = _with_bop(k, bop, _compare(k, st, c, "ftz" in mods, ops[1], ops[2]), ops, 3)
    if packed:
        one = ir.Constant(I32, _HALF_ONE.get(dt.kind, 0xFFFF))
        lo = b.select(res[0], one, ir.Constant(I32, 0))
        hi = b.select(res[1], b.shl(one, ir.Constant(I32, 16)), ir.Constant(I32, 0))
        k.put(ops[0], TYPES["b32"], b.or_(lo, hi))
        return
    if dt.kind == "f":
        vt = vty(dt)
        k.put(ops[0], dt, b.select(res[0], ir.Constant(vt, 1.0), ir.Constant(vt, 0.0)))
        return
    it = ity(dt.bits)
    one = ir.Constant(it, _HALF_ONE[dt.kind] if dt.kind in ("h", "bh") else -1)
    word = TYPES["b16"] if dt.bits == 16 else TYPES[f"b{dt.bits}"]
    k.put(ops[0], word, b.select(res[0], one, ir.Constant(it, 0)))


def _h_selp(k: KernelLowering, types, mods, ops) -> None:
    t = k.one_type(types)
    k.only(mods)
    if len(ops) != 4:
        raise k.refuse("operand count")
    g = k.get(ops[3], TYPES["pred"])
    k.put(ops[0], t, k.b.select(g, k.get(ops[1], t), k.get(ops[2], t)))


def _h_cvt(k: KernelLowering, types, mods, ops) -> None:
    b = k.b
    if len(types) != 2 or len(ops) not in (2, 3):
        raise k.refuse("cvt form")
    dt, st = types
    rnd = [m for m in mods if m in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi")]
    r = rnd[0] if rnd else None
    if lower_cvt_half(k, dt, st, r, mods, ops):
        return
    if len(ops) != 2:
        raise k.refuse("cvt form")
    k.only(mods, (*rnd, "ftz", "sat"))
    if is_half([st]) and dt.kind in ("u", "s") and r in ("rni", "rzi", "rmi", "rpi"):
        # a half to an integer: its float32 value (exact) converted as a float32 one
        a = half_lanes(k, st, k.get(ops[1], TYPES["b16"]), False)[0]
        _float_to_int(k, dt, a, r, ops)
        return
    for t in (dt, st):
        if t.kind not in ("u", "s", "b", "f") or (t.bits == 8 and t is dt):
            raise k.refuse(f"cvt with .{t.name}")
    # ``.ftz`` flushes a float32 source (and a narrowed float32 result), as the interpreter's
    # cvt does; ``.sat`` only on conversions between floats of one width (others refused)
    f32 = (st.kind == "f" and st.bits == 32) or (dt.kind == "f" and dt.bits == 32)
    ftz = "ftz" in mods and f32
    if "sat" in mods and not (dt.kind == st.kind == "f" and dt.bits == st.bits):
        raise k.refuse("cvt.sat other than between floats of one width")
    if dt.kind != "f" and st.kind != "f":  # integer <-> integer
        if r is not None:
            raise k.refuse("rounding on an integer cvt")
        a = _cvt_src_int(k, ops[1], st)
        k.put(ops[0], dt, resize(b, a, dt.bits, signed=st.kind == "s"))
        return
    if st.kind != "f":  # integer -> float
        if r not in ("rn", *DIRECTED):
            raise k.refuse("integer to float cvt without .rn/.rz/.rm/.rp")
        a = _cvt_src_int(k, ops[1], st)
        vt = vty(dt)
        if r != "rn" and not (st.bits <= 32 and dt.bits == 64):  # else exact
            k.put(ops[0], dt, int_to_float_directed(k, a, st, vt, r))
            return
        k.put(ops[0], dt, b.sitofp(a, vt) if st.kind == "s" else b.uitofp(a, vt))
        return
    a = k.get(ops[1], st)
    if ftz and st.bits == 32:
        a = ftz32(k, a)
    if dt.kind == "f":  # float -> float
        if dt.bits > st.bits:
            if r is not None:
                raise k.refuse("rounding on a widening cvt")
            k.put(ops[0], dt, b.fpext(a, vty(dt)))
        elif dt.bits < st.bits:
            if r not in ("rn", *DIRECTED):
                raise k.refuse("narrowing float cvt without .rn/.rz/.rm/.rp")
            v = narrow_directed(k, a, r) if r != "rn" else b.fptrunc(a, vty(dt))
            k.put(ops[0], dt, ftz32(k, v) if ftz else v)
        else:
            if r is None and ("ftz" in mods or "sat" in mods):
                v = a  # cvt.ftz / cvt.sat of one width: the flush, the clamp
            elif r not in ("rni", "rzi", "rmi", "rpi"):
                raise k.refuse("float cvt of one width without integer rounding")
            else:
                v = _round_int(k, a, r)
            k.put(ops[0], dt, sat_float(k, v) if "sat" in mods else v)
        return
    if r not in ("rni", "rzi", "rmi", "rpi"):  # float -> integer: saturating, NaN -> 0
        raise k.refuse("float to integer cvt without integer rounding")
    _float_to_int(k, dt, a, r, ops)


def _float_to_int(k: KernelLowering, dt: PtxType, a, r: str, ops) -> None:
    """A float ``a`` rounded to an integer in mode ``r`` and converted, saturating (NaN to
    0), as the interpreter's ``_float_to_int``."""
    a = _round_int(k, a, r)
    it = ity(dt.bits)
    sat = "fptosi" if dt.kind == "s" else "fptoui"
    f = k.intrinsic(f"llvm.{sat}.sat.i{dt.bits}.{k.fname(a.type)}", it, [a.type])
    k.put(ops[0], dt, k.b.call(f, [a]))


def _cvt_src_int(k: KernelLowering, op, st: PtxType):
    """cvt's integer source: a register at least as wide as ``st`` (the low bits are used)."""
    b = k.b
    if op[0] == "reg" and op[1] not in SPECIAL_GEOM:
        r = k.regdecl(op[1])
        if r.type.kind in ("pred", "f") or storage_bits(r.type) < st.bits:
            raise k.refuse(f"cvt source {op[1]}")
        v = b.load(k.regs[r.uid])
        return resize(b, v, st.bits, signed=False)
    return k.get(op, st)


def _round_int(k: KernelLowering, a, r: str):
    name = {"rni": "roundeven", "rzi": "trunc", "rmi": "floor", "rpi": "ceil"}[r]
    f = k.intrinsic(f"llvm.{name}.{k.fname(a.type)}", a.type, [a.type])
    return k.b.call(f, [a])


def _h_cvta(k: KernelLowering, types, mods, ops) -> None:
    t = k.one_type(types)
    to = "to" in mods
    spaces = [m for m in mods if m in ("global", "shared", "local", "param", "const")]
    k.only(mods, ("to", *spaces))
    if len(spaces) != 1 or spaces[0] == "const" or t.bits != 64:
        raise k.refuse("cvta form")
    a = k.get(ops[1], t)
    if spaces[0] != "global":
        w = c64({"shared": SHARED_WINDOW, "local": LOCAL_WINDOW, "param": PARAM_WINDOW}[spaces[0]])
        a = k.b.sub(a, w) if to else k.b.add(a, w)
    k.put(ops[0], t, a)


def space_of(k: KernelLowering, mods) -> str:
    spaces = [m for m in mods if m in ("global", "shared", "local", "param", "const")]
    if len(spaces) > 1:
        raise k.refuse("two state spaces")
    return spaces[0] if spaces else "generic"


def _ldst(store: bool):
    def h(k: KernelLowering, types, mods, ops) -> None:
        b = k.b
        t = k.one_type(types, bytes_ok=True)
        if t.kind == "pred":
            raise k.refuse("ld/st of .pred")
        space = space_of(k, mods)
        order = access_ordering(k, mods, space, store)  # None: a plain access
        vec = [m for m in mods if m in ("v2", "v4")]
        k.only(mods, ("global", "shared", "param", "const", "local", *vec, *ORDER_MODS))
        n = int(vec[0][1]) if vec else 1
        if len(ops) != 2:
            raise k.refuse("operand count")
        mem_op, val_op = (ops[0], ops[1]) if store else (ops[1], ops[0])
        vals = val_op[1] if val_op[0] == "vec" else [val_op]
        if len(vals) != n:
            raise k.refuse("vector width")
        size = t.bits // 8
        total = size * n
        kind, addr = k.address(mem_op, space)
        if kind == "call":
            _call_arg(k, store, addr, vals, t)
            return
        if kind == "param":
            if store:
                raise k.refuse("st.param")
            if addr < 0 or addr + total > k.param_bytes or addr % total:
                raise k.refuse("a kernel parameter access outside the parameters")
            base = None
        elif space == "param":  # a parameter's address plus an offset
            if store:
                raise k.refuse("st.param through a register")
            if k.fast:
                b.store(ir.Constant(ir.IntType(1), 1), k.access_ok)
            base = param_ptr(k, addr, total, False)
            kind = "value"
        else:
            if k.fast:
                b.store(ir.Constant(ir.IntType(1), 1), k.access_ok)
            base = k.mem_ptr(space, addr, total, store)
        it = ity(t.bits)
        # the fast form: ordered accesses (:mod:`.ops_order`) are never run in it (the kernel
        # or region that has one is not vectorized) but are lowered as the plain form
        if k.fast and kind != "param":
            _ldst_predicated(k, base, vals, t, store)
            return
        for i, v in enumerate(vals):
            p = None if base is None else b.bitcast(b.gep(base, [c64(i * size)]), it.as_pointer())
            if store and order is not None:
                b.store_atomic(st_value(k, v, t), p, order, size)
            elif store:
                b.store(st_value(k, v, t), p)
            elif order is not None and kind != "param":
                x = b.load_atomic(p, order, size)  # also into `_`: it orders later accesses
                if not (v[0] == "reg" and v[1] == "_"):
                    ld_put(k, v, t, x)
            elif not (v[0] == "reg" and v[1] == "_"):
                x = k.param_load(addr + i * size, it) if kind == "param" else b.load(p)
                ld_put(k, v, t, x)

    return h


def _ldst_predicated(k: KernelLowering, base, vals, t: PtxType, store: bool) -> None:
    """The fast form's access: a load where its own checks passed (else 0: the lane runs
    again anyway) in the checking pass and where all of the lane's passed in the committing
    pass (the checks are not repeated there), a store in the committing pass only."""
    b = k.b
    it = ity(t.bits)
    size = t.bits // 8
    if store:
        srcs = [st_value(k, v, t) for v in vals]
        if not k.commit:  # the checking pass stores nothing
            return
    if not store and k.safe_ptr:  # valid whatever the checks said: loaded unconditionally
        for i, v in enumerate(vals):
            x = b.load(b.bitcast(b.gep(base, [c64(i * size)]), it.as_pointer()))
            if not (v[0] == "reg" and v[1] == "_"):
                ld_put(k, v, t, x)
        return
    go = k.step.append_basic_block("access")
    join = k.step.append_basic_block("accessed")
    came = b.block
    b.cbranch(b.load(k.lane_ok if k.commit else k.access_ok), go, join)
    b.position_at_end(go)
    loaded = []
    for i in range(len(vals)):
        p = b.bitcast(b.gep(base, [c64(i * size)]), it.as_pointer())
        if store:
            b.store(srcs[i], p)
        else:
            loaded.append(b.load(p))
    b.branch(join)
    b.position_at_end(join)
    if store:
        return
    phis = []
    for x in loaded:  # every phi first: they must open the block
        phi = b.phi(it)
        phi.add_incoming(x, go)
        phi.add_incoming(ir.Constant(it, 0), came)
        phis.append(phi)
    for v, phi in zip(vals, phis, strict=True):
        if not (v[0] == "reg" and v[1] == "_"):
            ld_put(k, v, t, phi)


def st_value(k: KernelLowering, op, t: PtxType):
    """A store's source: a register at least as wide as the type (truncated), or an
    immediate."""
    b = k.b
    if op[0] == "reg" and op[1] not in SPECIAL_GEOM:
        r = k.regdecl(op[1])
        if r.type.kind == "pred" or storage_bits(r.type) < t.bits:
            raise k.refuse(f"store source {op[1]}")
        return resize(b, b.load(k.regs[r.uid]), t.bits, signed=False)
    v = k.get(op, t)
    return b.bitcast(v, ity(t.bits)) if t.kind == "f" else v


def ld_put(k: KernelLowering, op, t: PtxType, x) -> None:
    """A load's destination: a register at least as wide as the type, sign-extended for
    signed types and zero-extended otherwise."""
    b = k.b
    if op[0] != "reg":
        raise k.refuse("load destination")
    r = k.regdecl(op[1])
    sw = storage_bits(r.type)
    if r.type.kind == "pred" or sw < t.bits:
        raise k.refuse(f"load destination {op[1]}")
    st = ity(sw)
    if sw > t.bits:
        x = b.sext(x, st) if t.kind == "s" else b.zext(x, st)
    k.write_reg(r.uid, x)


def _h_bra(k: KernelLowering, types, mods, ops) -> None:
    k.only(mods)
    b = k.b
    ins = k.ins
    if len(ops) != 1 or ops[0][0] != "name" or ops[0][1] not in k.labels:
        raise k.refuse("branch target")
    target = k.labels[ops[0][1]]
    back = _is_backward(k, ops[0][1])
    if back and not k.fast:  # loops check the launch's deadline flag (the fast form's
        # regions have no loop: a branch back from there leaves through a barrier first)
        stop = b.load_atomic(b.gep(k.ctx, [c64(L.STOP)]), "monotonic", 8)
        k.fault_if(b.icmp_unsigned("!=", stop, c64(0)), c64(0), L.KIND_TIMEOUT, 0, 0)
    if ins.guard is not None:
        g = k.guard(ins)
        fall = k.step.append_basic_block("fall")
        b.cbranch(g, target, fall)
        b.position_at_end(fall)
    else:
        b.branch(target)


def _is_backward(k: KernelLowering, label: str) -> bool:
    seen_label = False
    for s in k.fn.body or []:
        if s is k.ins:
            return seen_label
        if isinstance(s, Label) and s.name == label:
            seen_label = True
    return False


def _h_exit(k: KernelLowering, types, mods, ops) -> None:
    k.only(mods)
    k.ret_exited()


def _h_trap(k: KernelLowering, types, mods, ops) -> None:
    """``trap``: the launch fails with CUDA_ERROR_LAUNCH_FAILED naming the instruction, as the
    interpreter fails it (a lane that reaches it faults; ``@p trap`` is the guard's). Kernels
    carry one on paths that never run in a correct program (``__trap()`` in a library's bounds
    check, cooperative groups' grid sync outside a cooperative launch): refusing them sent the
    whole kernel to the interpreter."""
    k.only(mods)
    k.fault_if(ir.Constant(I1, 1), c64(0), L.KIND_TRAP, 0, 0)
    if not k.b.block.is_terminated:
        k.ret_exited()


def _call_arg(k: KernelLowering, store: bool, key: tuple[int, int], vals, t: PtxType) -> None:
    """``st.param``/``ld.param`` of a call's ``.param`` variable (an argument or a return
    value; inlined, :mod:`.inline`, also the callee's own parameters, which are the call
    site's): one per-lane cell per (variable, byte offset) and width, so a value stored on one
    path is read on another (a callee with several returns). A read of a cell no store
    before it (in the body's order) wrote, or at another width, is refused."""
    var_id, off = key
    size = t.bits // 8
    for i, v in enumerate(vals):
        at = (var_id, off + i * size)
        if store:
            k.b.store(st_value(k, v, t), k.param_cell(at, t.bits))
            continue
        cell = k.param_cells.get(at)
        if cell is None or cell[0] != t.bits:
            raise k.refuse("a call's parameter read before the call or callee wrote it")
        if not (v[0] == "reg" and v[1] == "_"):
            ld_put(k, v, t, k.b.load(cell[1]))


#: ``__assertfail``'s arguments: message, file, line, function, character size
_ASSERT_BITS = (64, 64, 32, 64, 64)


def _h_call(k: KernelLowering, types, mods, ops) -> None:
    """``call __assertfail`` (``assert(e)`` in device code, on the failing path only): the
    launch fails with CUDA_ERROR_ASSERT and the failing thread's line, worded as the
    interpreter's (``printf.h_assertfail``), from the message, file, line and function and
    the lane's %tid and %ctaid the exit leaves in the context words. Library kernels (a
    framework's index checks) carry one: refusing it sent the whole kernel to the
    interpreter. ``vprintf`` (``printf``) calls the launch's output (:func:`_vprintf`);
    other calls (device functions) are not taken."""
    k.only(mods, ("uni",))
    rets = ops[0][1] if ops and ops[0][0] == "list" else None
    i = 0 if rets is None else 1
    if len(ops) != i + 2 or ops[i][0] != "name" or ops[i + 1][0] != "list":
        raise k.refuse("this form of call")
    name, args = ops[i][1], ops[i + 1][1]
    if name not in ("__assertfail", "vprintf") or name not in k.externs:
        raise k.refuse(f"a call to {name}")
    b = k.b
    shape = _ASSERT_BITS if name == "__assertfail" else (64, 64)
    if len(args) != len(shape) or (rets and (name == "__assertfail" or len(rets) != 1)):
        raise k.refuse(f"{name}'s arguments")
    words = []
    for a, bits in zip(args, shape, strict=True):
        var = k.ins.scope.var(a[1]) if a[0] == "name" else None
        got = k.param_cells.get((id(var), 0)) if var is not None else None
        if got is None or got[0] != bits:
            raise k.refuse(f"{name}'s argument {a[1]} not stored before the call")
        v = b.load(got[1])
        words.append(b.zext(v, I64) if v.type.width < 64 else v)
    tid = _packed(b, k.tid, L.TID_SHIFTS)
    cta = _packed(b, k.ctaid, L.CTAID_SHIFTS)
    if name == "vprintf":
        _vprintf(k, words, tid, cta, rets)
        return
    more = (
        (L.ASSERT_MSG, words[0]),
        (L.ASSERT_FILE, words[1]),
        (L.ASSERT_LINE, words[2]),
        (L.ASSERT_FUNC, words[3]),
        (L.ASSERT_TID, tid),
        (L.ASSERT_CTAID, cta),
    )
    k.fault_if(ir.Constant(I1, 1), c64(0), L.KIND_ASSERT, 0, 0, more)


def _packed(b, vals, shifts):
    """Three i32 coordinates in one i64 (the runner unpacks them)."""
    out = c64(0)
    for v, sh in zip(vals, shifts, strict=True):
        out = b.or_(out, b.shl(b.zext(v, I64), c64(sh)))
    return out


def _vprintf(k: KernelLowering, words, tid, cta, rets) -> None:
    """``vprintf(fmt, args)``: a call to the launch's output (:mod:`.printing`) with the two
    generic addresses, the lane's local area and its coordinates; a failed read there fails
    the launch (KIND_PRINTF), else the return value is the arguments read."""
    b = k.b
    k.prints = True
    fnty = ir.FunctionType(I32, [k.ctx.type, I64, I64, I64, I64, I64])
    target = b.inttoptr(k.ctx_word(L.PRINTF_FN), fnty.as_pointer())
    local = b.ptrtoint(lane_base(k), I64) if k.uses_local else c64(0)
    r = b.call(target, [k.ctx, words[0], words[1], local, tid, cta])
    k.fault_if(b.icmp_signed("<", r, ir.Constant(I32, 0)), c64(0), L.KIND_PRINTF, 0, 0)
    if rets:
        var = k.ins.scope.var(rets[0][1]) if rets[0][0] == "name" else None
        if var is None:
            raise k.refuse("vprintf's return value")
        b.store(r, k.param_cell((id(var), 0), 32))


def _h_nanosleep(k: KernelLowering, types, mods, ops) -> None:
    """``nanosleep t``: no time at all, which the PTX ISA allows (a sleep in [0, 2t]); a
    lane here waits on others only in loops, which yield to them anyway (:mod:`.spin`).
    CUB's decoupled look-back (every Thrust scan, copy_if, unique) backs off with it."""
    k.only(mods)
    if len(types) > 1 or (types and types[0].bits != 32) or len(ops) != 1:
        raise k.refuse("nanosleep form")
    k.get(ops[0], TYPES["u32"])  # (a register operand must exist)


def _h_copysign(k: KernelLowering, types, mods, ops) -> None:
    """``copysign d, a, b``: the magnitude of ``b`` with the sign of ``a`` (as the
    interpreter's ``np.copysign(b, a)``; NaNs keep their payload, the sign bit is copied)."""
    t = k.one_type(types)
    k.only(mods)
    if t.kind != "f" or len(ops) != 3:
        raise k.refuse("copysign form")
    vt = vty(t)
    f = k.intrinsic(f"llvm.copysign.{k.fname(vt)}", vt, [vt, vt])
    k.put(ops[0], t, k.b.call(f, [k.get(ops[2], t), k.get(ops[1], t)]))


def _h_bar(k: KernelLowering, types, mods, ops) -> None:
    if "red" in mods:
        lower_bar_red(k, types, mods, ops, _stop)
        return
    k.only(mods, ("sync",))
    if "sync" not in mods or len(ops) != 1 or ops[0] != ("int", 0):
        raise k.refuse("barrier form (only bar.sync 0 / barrier.sync 0)")
    _stop(k, 0)


def _h_yield(k: KernelLowering, types, mods, ops) -> None:
    """The yield point :mod:`.spin` adds at a waiting loop's branch back: a stop like a
    barrier's, its resume word tagged YIELD so the block loop knows the lane waits on nobody."""
    _stop(k, YIELD)


def _stop(k: KernelLowering, tag: int, arrive=None) -> None:
    """The lane saves its live registers and returns its resume point (| ``tag``); the code
    after is the resume point's, which restores them. ``arrive()`` emits what the lane does
    as it leaves (on the path that returns, once)."""
    b = k.b
    saved, restored = k.save_at[id(k.ins)], k.restore_at[id(k.ins)]
    nxt = ir.Constant(I32, (len(k.resumes) + 1) | tag)
    if k.fast and not k.commit:  # checked up to the barrier: now the committing pass
        k.to_commit()
    if k.fast and arrive is None and not b.block.is_terminated:
        # a lane that failed a check (or that the round masks off) keeps its old save area:
        # it runs again. Written back unchanged, not branched around: the lane's code then
        # has no branch whose one side uses what the region loaded, into which LLVM sinks
        # the loads (and a load of the row's shared word becomes a gather)
        ok = b.load(k.lane_ok)
        k.save_regs(saved, ok)
        b.ret(b.select(ok, nxt, ir.Constant(I32, FAULTED)))
    elif k.fast and not b.block.is_terminated:
        ok = b.load(k.lane_ok)
        go = k.step.append_basic_block("save")
        no = k.step.append_basic_block("unsaved")
        b.cbranch(ok, go, no)
        b.position_at_end(no)
        b.ret(ir.Constant(I32, FAULTED))
        b.position_at_end(go)
        if arrive is not None:
            arrive()
        k.save_regs(saved)
        b.ret(nxt)
    elif not k.fast:
        if arrive is not None:
            arrive()
        k.save_regs(saved)
        b.ret(nxt)
    blk = k.step.append_basic_block(f"resume{len(k.resumes) + 1}")
    k.resumes.append(blk)
    b.position_at_end(blk)
    k.restore_regs(restored)


def _h_rcp(k: KernelLowering, types, mods, ops) -> None:
    t = k.one_type(types)
    k.only(mods, ("rn", "approx", "ftz"))
    if t.kind != "f" or len(ops) != 2 or not mods_has(mods, ("rn", "approx")):
        raise k.refuse("rcp form")
    vt = vty(t)
    v = flushed(k, t, mods, lambda a: k.b.fdiv(ir.Constant(vt, 1.0), a), k.get(ops[1], t))
    k.put(ops[0], t, v)


def _h_sqrt(k: KernelLowering, types, mods, ops) -> None:
    t = k.one_type(types)
    k.only(mods, ("rn", "approx", "ftz"))
    if t.kind != "f" or len(ops) != 2 or not mods_has(mods, ("rn", "approx")):
        raise k.refuse("sqrt form")
    vt = vty(t)
    f = k.intrinsic(f"llvm.sqrt.{k.fname(vt)}", vt, [vt])
    k.put(ops[0], t, flushed(k, t, mods, lambda a: k.b.call(f, [a]), k.get(ops[1], t)))


def _h_rsqrt(k: KernelLowering, types, mods, ops) -> None:
    t = k.one_type(types)
    k.only(mods, ("approx", "ftz"))
    if t.kind != "f" or len(ops) != 2 or "approx" not in mods:
        raise k.refuse("rsqrt form")
    b = k.b

    def rsqrt(a):
        a64 = b.fpext(a, F64) if t.bits == 32 else a
        s = b.call(k.intrinsic("llvm.sqrt.f64", F64, [F64]), [a64])
        r = b.fdiv(ir.Constant(F64, 1.0), s)
        return b.fptrunc(r, F32) if t.bits == 32 else r

    k.put(ops[0], t, flushed(k, t, mods, rsqrt, k.get(ops[1], t)))


HANDLERS = {
    "mov": _h_mov,
    "add": _arith("add"),
    "sub": _arith("sub"),
    "mul": _arith("mul"),
    "div": _arith("div"),
    "rem": _arith("rem"),
    "min": _arith("min"),
    "max": _arith("max"),
    "mad": _h_mad,
    "addc": lambda k, types, mods, ops: lower_addsub_carry(
        k, False, True, k.one_type(types), mods, ops
    ),
    "subc": lambda k, types, mods, ops: lower_addsub_carry(
        k, True, True, k.one_type(types), mods, ops
    ),
    "madc": lambda k, types, mods, ops: lower_mad_carry(
        k, True, k.one_type(types), mods, ops, _mul_mode
    ),
    "fma": _h_fma,
    "neg": _h_unary("neg"),
    "abs": _h_unary("abs"),
    "and": _h_logic("and"),
    "or": _h_logic("or"),
    "xor": _h_logic("xor"),
    "not": _h_logic("not"),
    "shl": _h_shift(True),
    "shr": _h_shift(False),
    "setp": _h_setp,
    "set": _h_set,
    "selp": _h_selp,
    "cvt": _h_cvt,
    "cvta": _h_cvta,
    "ld": _ldst(False),
    "st": _ldst(True),
    "bra": _h_bra,
    "ret": _h_exit,
    "exit": _h_exit,
    "trap": _h_trap,
    "nanosleep": _h_nanosleep,
    "call": _h_call,
    "copysign": _h_copysign,
    "bar": _h_bar,
    "barrier": _h_bar,
    YIELD_OP: _h_yield,
    "rcp": _h_rcp,
    "sqrt": _h_sqrt,
    "rsqrt": _h_rsqrt,
}
HANDLERS.update(ATOMIC_HANDLERS)
HANDLERS.update(SFU_HANDLERS)
HANDLERS.update(BIT_HANDLERS)
HANDLERS.update(ORDER_HANDLERS)
HANDLERS.update(CP_HANDLERS)
