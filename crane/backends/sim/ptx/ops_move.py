"""Data movement, conversion, comparison and selection: mov, cvt, setp, set, selp, slct.

``cvt`` follows PTX: float→integer conversions saturate (NaN → 0) after rounding with the
required ``.rni/.rzi/.rmi/.rpi``; integer→integer conversions truncate or extend (``.sat``
clamps); float→float conversions round with ``.rn/.rz/.rm/.rp`` through :mod:`.fp`;
``cvt.rni.f32.f32`` and friends round to an integral value. Half types are raw 16-bit patterns.
"""

from __future__ import annotations

import numpy as np

from . import fp
from .narrowfp import f16_relu, f16_satfinite
from .operands import Imm
from .ops_common import Mods, h_unary, set_binary
from .ops_cvt_narrow import NARROW_TYPES, dec_cvt_narrow
from .ops_float import HALF_KINDS, half_unpack
from .ptxtypes import TYPES, PtxType

__all__ = ["dec_cvt", "dec_mov", "dec_selp", "dec_set", "dec_setp", "dec_slct"]


# ---- mov ----------------------------------------------------------------------------------


def _h_mov(st, ins, idx) -> None:
    v = ins.a.get(st, idx)
    ins.d.put(st, idx, v)


def _h_pack(st, ins, idx) -> None:
    parts = [p.get(st, idx) for p in ins.a]
    bits = ins.x
    acc = None
    for k, p in enumerate(parts):
        v = np.asarray(p).astype(np.uint64) << np.uint64(bits * k)
        acc = v if acc is None else acc | v
    ins.d.put(st, idx, acc.astype(ins.t.dtype))


def _h_unpack(st, ins, idx) -> None:
    v = np.asarray(ins.a.get(st, idx)).astype(np.uint64)
    bits = ins.x
    mask = np.uint64((1 << bits) - 1)
    for k, d in enumerate(ins.d):
        d.put(st, idx, ((v >> np.uint64(bits * k)) & mask).astype(np.dtype(f"u{bits // 8}")))


def dec_mov(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    ctx.nops(2)
    ins = ctx.ins
    dst, src = ctx.ops
    if dst[0] == "vec":  # unpack: mov.b32 {lo, hi}, %r
        n = len(dst[1])
        bits = ty.bits // n
        ins.d = [ctx.dst(op, TYPES[f"b{bits}"]) for op in dst[1]]
        ins.a = ctx.src(src, TYPES[f"b{ty.bits}"])
        ins.x = bits
        ins.fn = _h_unpack
        return
    if src[0] == "vec":  # pack: mov.b32 %r, {lo, hi}
        n = len(src[1])
        bits = ty.bits // n
        ins.a = [ctx.src(op, TYPES[f"b{bits}"]) for op in src[1]]
        ins.d = ctx.dst(dst, ty)
        ins.x = bits
        ins.t = ty
        ins.fn = _h_pack
        return
    if src[0] == "not":
        raise ctx.unsupported("negated mov source")
    ins.d = ctx.dst(dst, ty)
    ins.a = ctx.src(src, ty)
    ins.fn = _h_mov


# ---- cvt ----------------------------------------------------------------------------------

_INT_LIMITS = {
    t: (int(np.iinfo(TYPES[t].dtype).min), int(np.iinfo(TYPES[t].dtype).max))
    for t in ("u8", "u16", "u32", "u64", "s8", "s16", "s32", "s64")
}


def _round_int(x: np.ndarray, irnd: str | None) -> np.ndarray:
    if irnd in (None, "rzi"):
        return np.trunc(x)
    if irnd == "rni":
        return np.rint(x)
    if irnd == "rmi":
        return np.floor(x)
    return np.ceil(x)


def _float_to_int(x, dt: PtxType, irnd: str | None) -> np.ndarray:
    x = np.asarray(x, np.float64)
    lo, hi = _INT_LIMITS[dt.name]
    r = _round_int(x, irnd)
    nan = np.isnan(r)
    r = np.where(nan, 0.0, r)
    if dt.bits < 64:
        return np.clip(r, lo, hi).astype(dt.dtype)
    over = r >= float(hi) + 1.0 if dt.kind == "s" else r >= 2.0**64
    under = r < float(lo)
    safe = np.clip(r, float(lo), 2.0**63 - 1024 if dt.kind == "s" else 2.0**64 - 2048)
    out = safe.astype(dt.dtype)
    out = np.where(over, dt.dtype.type(hi), out)
    return np.where(under, dt.dtype.type(lo), out).astype(dt.dtype)


def _int_to_float(x, st: PtxType, dt: PtxType, mode: str) -> np.ndarray:
    x = np.asarray(x)
    if mode == "rn" or (st.bits <= 32 and dt.bits == 64):
        return x.astype(dt.dtype)
    # directed: exact value as hi + lo (two float64s), then round once
    if st.bits <= 32:
        hi = x.astype(np.float64)
        lo = np.zeros_like(hi)
    else:
        u = x.astype(np.uint64) if st.kind == "u" else x.astype(np.int64)
        if st.kind == "u":
            xh = (u >> np.uint64(32)).astype(np.float64) * 2.0**32
        else:
            xh = (u >> np.int64(32)).astype(np.float64) * 2.0**32
        xl = (u & type(u.flat[0])(0xFFFFFFFF) if u.ndim else u & 0xFFFFFFFF).astype(np.float64)
        hi, lo = fp.two_sum(xh, xl)
    if dt.bits == 32:
        return fp.round_f32(hi, lo, mode)
    return fp.round_f64(hi, lo, mode)


def _cvt_fn(ctx, dt: PtxType, st: PtxType, rnd: str | None, ftz: bool, sat: bool, relu: bool):
    irnd = rnd if rnd in ("rni", "rzi", "rmi", "rpi") else None
    frnd = rnd if rnd in ("rn", "rz", "rm", "rp") else None
    d_int = dt.kind in ("u", "s", "b")
    s_int = st.kind in ("u", "s", "b")

    def src_float(a):
        """Source value as float (f16/bf16 decoded) — float64 for exactness."""
        if st.kind in ("h", "bh"):
            return half_unpack(a, st.kind)[0]
        a = np.asarray(a)
        if ftz and st.bits == 32:
            a = fp.ftz(a)
        return a.astype(np.float64)

    if d_int and s_int:
        if rnd is not None:
            raise ctx.unsupported(f"rounding .{rnd} on an integer conversion")
        if sat:
            lo, hi = _INT_LIMITS[dt.name if dt.kind != "b" else f"u{dt.bits}"]

            def f(a):
                a = np.asarray(a)
                wide = a.astype(np.int64) if a.dtype.kind == "i" else a.astype(np.uint64)
                if a.dtype.kind == "u":
                    return np.minimum(wide, np.uint64(max(hi, 0))).astype(dt.dtype)
                return np.clip(wide, max(lo, -(2**63)), min(hi, 2**63 - 1)).astype(dt.dtype)

            return f
        return lambda a: np.asarray(a).astype(dt.dtype)
    if d_int:  # float → int
        if frnd is not None or irnd is None:
            if st.kind in ("h", "bh") and irnd is None and frnd is None:
                pass
            elif irnd is None:
                raise ctx.unsupported("float→int cvt without an integer rounding mode")
        return lambda a: _float_to_int(src_float(a), dt, irnd)
    if s_int:  # int → float
        if irnd is not None:
            raise ctx.unsupported(f".{irnd} on an int→float conversion")
        mode = frnd or "rn"
        if dt.kind in ("h", "bh"):

            def g(a):
                v = np.asarray(a).astype(np.float64)
                return fp.f64_to_f16(v, mode) if dt.kind == "h" else fp.f64_to_bf16(v, mode)

            return g
        f = lambda a: _int_to_float(a, st, dt, mode)  # noqa: E731
        if sat:
            f = lambda a, f=f: _sat(f(a))  # noqa: E731
        return f
    # float → float
    if irnd is not None:
        if dt.name != st.name or dt.kind != "f":
            raise ctx.unsupported(f".{irnd} on a conversion between different float types")

        def h(a):
            a = np.asarray(a)
            if ftz and dt.bits == 32:
                a = fp.ftz(a)
            r = _round_int(a, irnd).astype(dt.dtype)
            return _sat(r) if sat else r

        return h
    mode = frnd or "rn"

    def k(a):
        v = src_float(a)
        if relu:
            v = np.where(np.isnan(v), v, np.maximum(v, 0.0))
        if sat:
            v = _sat(v)
        if dt.kind == "h":
            return fp.f64_to_f16(v, mode)
        if dt.kind == "bh":
            return fp.f64_to_bf16(v, mode)
        if dt.bits == 32:
            if st.kind == "f" and st.bits == 32:
                r = np.asarray(a)
                r = fp.ftz(r) if ftz else r
                return _sat(r) if sat else r.copy() if isinstance(r, np.ndarray) else r
            r = fp.f64_to_f32(v, mode)
            return fp.ftz(r) if ftz else r
        return v

    return k


def _sat(x):
    x = np.asarray(x)
    return np.where(np.isnan(x), x.dtype.type(0), np.clip(x, 0, 1)).astype(x.dtype)


def _h_cvt_pack(st, ins, idx) -> None:
    a = ins.a.get(st, idx)
    b = ins.b.get(st, idx)
    hi = ins.x(a)
    lo = ins.x(b)
    out = (np.asarray(hi).astype(np.uint32) << np.uint32(16)) | np.asarray(lo).astype(np.uint32)
    ins.d.put(st, idx, out)


def dec_cvt(ctx, mods) -> None:
    if any(x in NARROW_TYPES for x in mods):
        dec_cvt_narrow(ctx, mods)
        return
    m = Mods(ctx, mods)
    rnd = m.take("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi", "rna", "rs")
    ftz = m.has("ftz")
    sat = m.has("sat")
    relu = m.has("relu")
    satfinite = m.has("satfinite")
    if m.has("pack"):
        raise ctx.unsupported("cvt.pack")
    ts = m.types()
    m.done()
    if rnd in ("rna", "rs"):
        raise ctx.unsupported(f"cvt.{rnd}")
    if len(ts) != 2:
        raise ctx.error("cvt needs a destination and a source type")
    dt, st = ts
    if satfinite and (dt.kind not in ("h", "bh", "h2", "bh2") or st.name != "f32"):
        raise ctx.unsupported(f"cvt.satfinite.{dt.name}.{st.name}")
    ins = ctx.ins
    if dt.kind in ("h2", "bh2"):
        # cvt.rn.f16x2.f32 d, a, b: a → upper half, b → lower half
        if st.name != "f32":
            raise ctx.unsupported(f"cvt.{dt.name}.{st.name}")
        ctx.nops(3)
        half = TYPES["f16" if dt.kind == "h2" else "bf16"]
        ins.d = ctx.dst(ctx.ops[0], dt)
        ins.a = ctx.src(ctx.ops[1], st)
        ins.b = ctx.src(ctx.ops[2], st)
        ins.x = _half_fn(ctx, half, st, rnd, ftz, sat, relu, satfinite)
        ins.fn = _h_cvt_pack
        return
    if st.kind in ("h2", "bh2") or dt.kind == "pred" or st.kind == "pred":
        raise ctx.unsupported(f"cvt.{dt.name}.{st.name}")
    ctx.nops(2)
    ins.d = ctx.dst(ctx.ops[0], dt)
    ins.a = ctx.src(ctx.ops[1], st)
    if isinstance(ins.a, Imm) and st.kind == "f":
        ins.a = Imm(st.dtype.type(ins.a.val))
    ins.x = _half_fn(ctx, dt, st, rnd, ftz, sat, relu, satfinite)
    ins.fn = h_unary


def _half_fn(ctx, dt: PtxType, st: PtxType, rnd, ftz, sat, relu, satfinite: bool):
    """The conversion function, with ``.relu`` (NaN → canonical NaN) and ``.satfinite``
    (f16/bf16 results: infinity → the largest finite value of its sign) applied after
    rounding."""
    f = _cvt_fn(ctx, dt, st, rnd, ftz, sat, relu)
    half = dt.kind[:-1] if dt.kind in ("h2", "bh2") else dt.kind
    if relu and half in ("h", "bh"):  # .relu: a NaN result is the canonical NaN
        f = lambda a, f=f: f16_relu(f(a), half)  # noqa: E731
    if not satfinite:
        return f
    return lambda a: f16_satfinite(f(a), half)


# ---- comparisons --------------------------------------------------------------------------


#: Float comparisons on unpacked values; the "u" forms are also true when either is NaN.
_FLOAT_CMP = {
    "eq": np.equal,
    "ne": lambda a, b: np.less(a, b) | np.greater(a, b),
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "equ": lambda a, b: ~(np.less(a, b) | np.greater(a, b)),
    "neu": np.not_equal,
    "ltu": lambda a, b: ~np.greater_equal(a, b),
    "leu": lambda a, b: ~np.greater(a, b),
    "gtu": lambda a, b: ~np.less_equal(a, b),
    "geu": lambda a, b: ~np.less(a, b),
    "num": lambda a, b: ~(np.isnan(a) | np.isnan(b)),
    "nan": lambda a, b: np.isnan(a) | np.isnan(b),
}
_INT_CMP = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}
#: Smallest normal f16: ``.ftz`` flushes smaller magnitudes to (signed) zero before comparing.
_F16_MIN_NORMAL = 2.0**-14


def _halves(x, kind: str, ftz: bool) -> list[np.ndarray]:
    """A half or packed-half operand as float64 lanes (low half first), flushed for .ftz."""
    parts = half_unpack(x, kind)
    if ftz and kind in ("h", "h2"):
        parts = [np.where(np.abs(v) < _F16_MIN_NORMAL, 0.0, v) for v in parts]
    return parts


def _cmp(op: str, ty: PtxType, ctx, ftz: bool = False):
    """The comparison of ``setp``/``set`` on two raw operands of type ``ty``. A packed-half
    type compares each half and returns the pair (low half, high half)."""
    if ty.kind not in ("f", *HALF_KINDS):
        unsigned_ops = {"lo": "lt", "ls": "le", "hi": "gt", "hs": "ge"}
        op = unsigned_ops.get(op, op)  # the operands are read through the unsigned view already
        if op not in _INT_CMP:
            raise ctx.unsupported(f"comparison .{op} on integers")
        return _INT_CMP[op]
    g = _FLOAT_CMP.get(op)
    if g is None:
        raise ctx.unsupported(f"comparison .{op} on floats")
    kind = ty.kind
    if kind == "f":
        return g
    if kind in ("h", "bh"):
        return lambda a, b: g(_halves(a, kind, ftz)[0], _halves(b, kind, ftz)[0])
    return lambda a, b: tuple(
        g(x, y) for x, y in zip(_halves(a, kind, ftz), _halves(b, kind, ftz), strict=True)
    )


_CMP_OPS = (
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "lo",
    "ls",
    "hi",
    "hs",
    "equ",
    "neu",
    "ltu",
    "leu",
    "gtu",
    "geu",
    "num",
    "nan",
)
_BOOL_OPS = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def _cmp_type(ty: PtxType, op: str) -> PtxType:
    """Integer comparisons read through the signed or unsigned view they need."""
    if ty.kind == "b" or (ty.kind == "s" and op in ("lo", "ls", "hi", "hs")):
        return TYPES[f"u{ty.bits}"]
    return ty


def _h_setp(st, ins, idx) -> None:
    r = ins.x(ins.a.get(st, idx), ins.b.get(st, idx))
    boolop, c = ins.e
    if boolop is not None:
        cv = c.get(st, idx)
        r1 = boolop(r, cv)
        r2 = boolop(~r, cv)
    else:
        r1 = r
        r2 = ~r if ins.d2 is not None else None
    ins.d.put(st, idx, r1)
    if ins.d2 is not None:
        ins.d2.put(st, idx, r2)


def _h_setp_x2(st, ins, idx) -> None:
    """Packed halves: ``p`` gets the low halves' result, ``q`` the high halves'."""
    t0, t1 = ins.x(ins.a.get(st, idx), ins.b.get(st, idx))
    boolop, c = ins.e
    if boolop is not None:
        cv = c.get(st, idx)
        t0, t1 = boolop(t0, cv), boolop(t1, cv)
    ins.d.put(st, idx, t0)
    ins.d2.put(st, idx, t1)


class _NotPred:
    __slots__ = ("neg", "r")

    def __init__(self, r, neg: bool) -> None:
        self.r, self.neg = r, neg

    def get(self, st, idx):
        v = self.r.get(st, idx)
        return ~v if self.neg else v


def dec_setp(ctx, mods) -> None:
    m = Mods(ctx, mods)
    op = m.take(*_CMP_OPS)
    boolop = m.take("and", "or", "xor")
    ftz = m.has("ftz")  # f32: flushing changes only comparisons of subnormals (not modelled)
    ty = m.one_type()
    m.done()
    if op is None:
        raise ctx.error("setp needs a comparison")
    ins = ctx.ins
    ctx.nops(3, 4)
    d = ctx.ops[0]
    pred = TYPES["pred"]
    packed = ty.kind in ("h2", "bh2")
    if d[0] == "pair":
        ins.d = ctx.dst(d[1], pred)
        ins.d2 = ctx.dst(d[2], pred)
    elif packed:
        raise ctx.error(f"setp.{ty.name} writes two predicates (p|q)")
    else:
        ins.d = ctx.dst(d, pred)
    cty = _cmp_type(ty, op)
    ins.a = ctx.src(ctx.ops[1], cty)
    ins.b = ctx.src(ctx.ops[2], cty)
    ins.x = _cmp(op, ty, ctx, ftz)
    if boolop is not None:
        if len(ctx.ops) != 4:
            raise ctx.error("setp with a boolean operation needs a predicate operand")
        ins.e = (_BOOL_OPS[boolop], _NotPred(*ctx.pred(ctx.ops[3])))
    else:
        if len(ctx.ops) == 4:
            raise ctx.error("setp without a boolean operation takes 3 operands")
        ins.e = (None, None)
    ins.fn = _h_setp_x2 if packed else _h_setp


#: What ``set`` writes for true into a half-typed destination (each half of a packed one).
_HALF_ONE = {"h": 0x3C00, "bh": 0x3F80, "h2": 0x3C00, "bh2": 0x3F80}


def _set_value(dt: PtxType, r):
    """``set``'s result for the outcomes ``r``: 1.0 in a float type, all ones in an integer."""
    if dt.kind == "f":
        return np.where(r, dt.dtype.type(1.0), dt.dtype.type(0.0))
    if dt.kind in ("h", "bh"):
        return np.where(r, np.uint16(_HALF_ONE[dt.kind]), np.uint16(0))
    return np.where(r, dt.dtype.type(-1) if dt.kind == "s" else ~dt.dtype.type(0), dt.dtype.type(0))


def _h_set(st, ins, idx) -> None:
    r = ins.x(ins.a.get(st, idx), ins.b.get(st, idx))
    boolop, c = ins.e
    if boolop is not None:
        r = boolop(r, c.get(st, idx))
    ins.d.put(st, idx, _set_value(ins.t, r))


def _h_set_x2(st, ins, idx) -> None:
    """Packed halves: each half of ``d`` gets its own result (1.0 in the packed float type,
    0xffff in a .u32/.s32 destination)."""
    t0, t1 = ins.x(ins.a.get(st, idx), ins.b.get(st, idx))
    boolop, c = ins.e
    if boolop is not None:
        cv = c.get(st, idx)
        t0, t1 = boolop(t0, cv), boolop(t1, cv)
    one = np.uint32(_HALF_ONE.get(ins.t.kind, 0xFFFF))
    lo = np.where(t0, one, np.uint32(0))
    hi = np.where(t1, one, np.uint32(0)) << np.uint32(16)
    ins.d.put(st, idx, np.asarray(lo | hi, np.uint32).view(ins.t.dtype))


def dec_set(ctx, mods) -> None:
    """``set.CmpOp{.BoolOp}{.ftz}.dtype.stype``: destinations .u32/.s32/.f32 for any source;
    .u16/.s16/.f16/.bf16 for a half source or destination; .f16x2/.bf16x2/.u32/.s32 for a
    packed-half source (the PTX ISA's half precision ``set``)."""
    m = Mods(ctx, mods)
    op = m.take(*_CMP_OPS)
    boolop = m.take("and", "or", "xor")
    ftz = m.has("ftz")
    ts = m.types()
    m.done()
    if op is None or len(ts) != 2:
        raise ctx.error("set needs a comparison and two types")
    dt, sty = ts
    packed = sty.kind in ("h2", "bh2")
    half = sty.kind in ("h", "bh") or dt.kind in ("h", "bh")
    if packed:
        ok = dt.kind == sty.kind or (dt.kind in ("u", "s") and dt.bits == 32)
    elif dt.kind in ("h", "bh"):
        ok = True
    else:
        ok = dt.kind in ("u", "s", "f") and (
            dt.bits == 32 or (half and dt.kind != "f" and dt.bits == 16)
        )
    if not ok:
        raise ctx.unsupported(f"set.{dt.name}.{sty.name}")
    ins = ctx.ins
    ctx.nops(3, 4)
    ins.d = ctx.dst(ctx.ops[0], dt)
    cty = _cmp_type(sty, op)
    ins.a = ctx.src(ctx.ops[1], cty)
    ins.b = ctx.src(ctx.ops[2], cty)
    ins.x = _cmp(op, sty, ctx, ftz)
    ins.e = (_BOOL_OPS[boolop], _NotPred(*ctx.pred(ctx.ops[3]))) if boolop else (None, None)
    ins.t = dt
    ins.fn = _h_set_x2 if packed else _h_set


def _h_selp(st, ins, idx) -> None:
    c = ins.c.get(st, idx)
    ins.d.put(st, idx, np.where(c, ins.a.get(st, idx), ins.b.get(st, idx)).astype(ins.t.dtype))


def dec_selp(ctx, mods) -> None:
    m = Mods(ctx, mods)
    ty = m.one_type()
    m.done()
    ctx.nops(4)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], ty)
    ins.a = ctx.src(ctx.ops[1], ty)
    ins.b = ctx.src(ctx.ops[2], ty)
    ins.c = _NotPred(*ctx.pred(ctx.ops[3]))
    ins.t = ty
    ins.fn = _h_selp


def dec_slct(ctx, mods) -> None:
    m = Mods(ctx, mods)
    m.has("ftz")
    ts = m.types()
    m.done()
    if len(ts) != 2:
        raise ctx.error("slct needs two types")
    dt, ct = ts
    set_binary(ctx, dt, None)
    ins = ctx.ins
    ins.c = ctx.src(ctx.ops[3], ct) if len(ctx.ops) == 4 else None
    if ins.c is None:
        raise ctx.error("slct takes 4 operands")

    def f(st, ins, idx):
        c = ins.c.get(st, idx)
        ins.d.put(st, idx, np.where(np.asarray(c) >= 0, ins.a.get(st, idx), ins.b.get(st, idx)))

    ins.fn = f


_ = HALF_KINDS
