"""Memory instructions: ld, ldu, st, cvta, isspacep, prefetch, cp.async (memory class).

Addresses: a decoded address is ``(kind, base, offset)`` from :meth:`~.decode.Ctx.address`;
:func:`lane_addresses` turns it into per-lane (or one uniform) address values, and
:func:`.memspace.resolve` validates them and finds the bytes. Vector accesses (``.v2``/``.v4``)
are one access of the whole vector's size, so they need its alignment, as on hardware.

Parameter space: kernel parameters are one byte string shared by every lane (a ``ld.param`` of
a kernel parameter is a scalar broadcast); ``.func`` parameters and call-site ``.param``
variables live in each function's per-lane parameter area.
"""

from __future__ import annotations

import numpy as np

from ..memory import MemoryFault
from .atomics import apply_atomic
from .memspace import from_generic, in_own_cta, is_space, resolve, to_generic
from .ops_common import Mods, h_nop
from .ptxtypes import TYPES, PtxType

__all__ = [
    "dec_atom",
    "dec_cp",
    "dec_cvta",
    "dec_isspacep",
    "dec_ld",
    "dec_prefetch",
    "dec_red",
    "dec_st",
    "decode_space",
    "lane_addresses",
]

_SPACES = (
    "global",
    "shared",
    "local",
    "param",
    "const",
    "shared::cta",
    "param::entry",
    "param::func",
)


def decode_space(ctx, m: Mods) -> str:
    sp = m.take(*_SPACES, "shared::cluster", "tex") or "generic"
    if sp == "tex":
        raise ctx.unsupported(".tex state space")
    # a .shared::cluster address is a shared address whose high bits may name another CTA of
    # the cluster (memspace routes it); a .shared::cta address is one naming the own CTA
    return {
        "shared::cta": "shared",
        "shared::cluster": "shared",
        "param::entry": "param",
        "param::func": "param",
    }.get(sp, sp)


def lane_addresses(st, addr, idx):
    """The address operand's value for the lanes ``idx`` (array) or for all (scalar)."""
    kind, base, off = addr
    if kind == "reg":
        a = base.get(st, idx)
        if off:
            a = a + a.dtype.type(off & ((1 << (8 * a.dtype.itemsize)) - 1))
        return a
    if kind == "sym":
        return np.uint64((int(base.get(st, idx)) + off) & (2**64 - 1))
    return np.uint64((int(base) + off) & (2**64 - 1))


def _vec_and_type(ctx, m: Mods) -> tuple[int, PtxType]:
    v = m.take("v2", "v4", "v8")
    nvec = int(v[1:]) if v else 1
    ty = m.one_type()
    if ty.kind == "pred":
        raise ctx.unsupported("ld/st of .pred")
    if ty.bits == 128:
        raise ctx.unsupported(".b128 accesses")
    return nvec, ty


def _strip_cache_policy(ctx, m: Mods) -> None:
    if m.has("L2::cache_hint"):
        if len(ctx.ops) < 3:
            raise ctx.error("L2::cache_hint needs a cache-policy operand")
        ctx.ops = ctx.ops[:-1]


def _dst_list(ctx, op, ty: PtxType) -> list:
    if op[0] == "vec":
        return [ctx.dst(x, ty) for x in op[1]]
    return [ctx.dst(op, ty)]


def _src_list(ctx, op, ty: PtxType) -> list:
    if op[0] == "vec":
        return [ctx.src(x, ty) for x in op[1]]
    return [ctx.src(op, ty)]


# ---- ld -----------------------------------------------------------------------------------


def _h_ld(st, ins, idx) -> None:
    space, dtype, esize, shift = ins.x
    dsts = ins.d
    nvec = len(dsts)
    addr = lane_addresses(st, ins.a, idx)
    for sel, buf, off in resolve(st, space, addr, esize * nvec, idx):
        view = st.view(buf, dtype)
        ei = off >> shift if shift else off
        lanes = idx if sel is None else (sel if idx is None else idx[sel])
        for k, d in enumerate(dsts):
            d.put(st, lanes, view[ei + k] if k else view[ei])


def _h_ld_kparam(st, ins, idx) -> None:
    dtype, offsets = ins.x
    kp = st.kparams
    for d, o in zip(ins.d, offsets, strict=True):
        v = kp[o : o + dtype.itemsize].view(dtype)[0]
        d.put(st, idx, v)


def _h_ld_pm(st, ins, idx) -> None:
    dtype, offsets = ins.x
    pm = st.pm[ins.fid]
    size = dtype.itemsize
    for d, o in zip(ins.d, offsets, strict=True):
        raw = pm[:, o : o + size] if idx is None else pm[idx, o : o + size]
        d.put(st, idx, np.ascontiguousarray(raw).view(dtype).reshape(-1))


def dec_ld(ctx, mods) -> None:
    _dec_access(ctx, mods, load=True)


def _dec_access(ctx, mods, load: bool) -> None:
    """``ld [addr] -> regs`` / ``st [addr], values``: the same modifiers and address forms,
    operands in opposite order."""
    m = Mods(ctx, mods)
    space = decode_space(ctx, m)
    _strip_cache_policy(ctx, m)
    nvec, ty = _vec_and_type(ctx, m)
    m.done()
    ctx.nops(2)
    ins = ctx.ins
    if load:
        ins.d = _dst_list(ctx, ctx.ops[0], ty)
        if len(ins.d) != nvec:
            raise ctx.error(f"expected {nvec} destination registers")
    else:
        ins.b = _src_list(ctx, ctx.ops[1], ty)
        if len(ins.b) != nvec:
            raise ctx.error(f"expected {nvec} source operands")
    addr = ctx.address(ctx.ops[1] if load else ctx.ops[0])
    _set_access(ctx, space, addr, ty, nvec, load=load)


def _set_access(ctx, space: str, addr, ty: PtxType, nvec: int, load: bool) -> None:
    ins = ctx.ins
    size = ty.size
    if addr[0] == "param":
        where, poff = addr[1]
        if space not in ("param", "generic"):
            raise ctx.error(f"a .param variable accessed as .{space}")
        offsets = [poff + addr[2] + k * size for k in range(nvec)]
        ins.a = None
        if where == "kparam":
            if not load:
                raise ctx.unsupported("st.param to a kernel parameter")
            ins.x = (ty.dtype, offsets)
            ins.fn = _h_ld_kparam
        else:
            ins.x = (ty.dtype, offsets)
            ins.fn = _h_ld_pm if load else _h_st_pm
        return
    if space == "param" and not load:
        raise ctx.unsupported("st.param through a register (kernel parameters are read-only)")
    ins.a = addr
    shift = {1: 0, 2: 1, 4: 2, 8: 3}[size]
    ins.x = (space, ty.dtype, size, shift)
    ins.fn = _h_ld if load else _h_st


# ---- st -----------------------------------------------------------------------------------


def _h_st(st, ins, idx) -> None:
    """Store; a uniform address (``[sym]``, ``[imm]`` in global memory resolves to one scalar
    offset for every lane) with per-lane values keeps the highest lane's value: PTX lets any
    one writer win, and this is the choice the per-lane path makes for lanes that collide."""
    space, dtype, esize, shift = ins.x
    srcs = ins.b
    nvec = len(srcs)
    addr = lane_addresses(st, ins.a, idx)
    vals = [s.get(st, idx) for s in srcs]
    for sel, buf, off in resolve(st, space, addr, esize * nvec, idx, write=True):
        view = st.view(buf, dtype)
        ei = off >> shift if shift else off
        uniform = not np.ndim(ei)
        for k, v in enumerate(vals):
            if sel is not None and np.ndim(v):
                v = v[sel]
            if uniform and np.ndim(v):
                if not np.size(v):
                    continue
                v = np.ravel(v)[-1]
            view[ei + k if k else ei] = v


def _h_st_pm(st, ins, idx) -> None:
    dtype, offsets = ins.x
    pm = st.pm[ins.fid]
    size = dtype.itemsize
    for s, o in zip(ins.b, offsets, strict=True):
        v = np.asarray(s.get(st, idx)).astype(dtype)
        raw = np.ascontiguousarray(v).reshape(-1).view(np.uint8).reshape(-1, size)
        if idx is None:
            pm[:, o : o + size] = raw
        else:
            pm[idx, o : o + size] = raw


def dec_st(ctx, mods) -> None:
    _dec_access(ctx, mods, load=False)


# ---- address conversion -------------------------------------------------------------------


def _h_cvta(st, ins, idx) -> None:
    a = ins.a.get(st, idx)
    space, to, dt = ins.x
    r = from_generic(space, a) if to else to_generic(space, a)
    ins.d.put(
        st,
        idx,
        np.asarray(r).astype(dt)
        if np.ndim(r)
        else dt.type(int(r) & ((1 << (8 * dt.itemsize)) - 1)),
    )


def dec_cvta(ctx, mods) -> None:
    m = Mods(ctx, mods)
    to = m.has("to")
    space = decode_space(ctx, m)
    ty = m.one_type()
    m.done()
    if space == "generic":
        raise ctx.error("cvta needs a state space")
    ctx.nops(2)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], ty)
    src = ctx.ops[1]
    if src[0] == "name" and ctx.regdecl(src[1]) is None:
        ins.a = ctx.src(src, TYPES["u64"])  # cvta of a variable's address
    else:
        ins.a = ctx.src(src, ty)
    ins.x = (space, to, ty.dtype)
    ins.fn = _h_cvta


def dec_isspacep(ctx, mods) -> None:
    # .shared / .shared::cta: the executing CTA's shared memory only; .shared::cluster: any
    # CTA's of the cluster (decode_space names both "shared")
    own_cta = "shared" in mods or "shared::cta" in mods
    m = Mods(ctx, mods)
    space = decode_space(ctx, m)
    m.done()
    ctx.nops(2)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], TYPES["pred"])
    ins.a = ctx.src(ctx.ops[1], TYPES["u64"])

    def h(st, ins, idx):
        a = ins.a.get(st, idx)
        r = is_space(space, a, st)
        if own_cta:
            r = r & in_own_cta(st, a, idx)
        ins.d.put(
            st,
            idx,
            r if idx is None or np.ndim(a) else np.broadcast_to(r, idx.shape),
        )

    ins.fn = h


def dec_prefetch(ctx, mods) -> None:
    ctx.ins.fn = h_nop


# ---- cp.async: performed synchronously --------------------------------------------------


def _h_cp_async(st, ins, idx) -> None:
    """cp.async, performed at once: ``size`` bytes global → shared, zero-filled past src_size."""
    size, src_size, _ = ins.x
    if ins.b is not None:
        _cp_async_per_lane(st, ins, idx)
        return
    dst = lane_addresses(st, ins.d, idx)
    ((_, dbuf, doff),) = resolve(st, "shared", dst, size, idx)
    if src_size:
        src = lane_addresses(st, ins.a, idx)
        ((_, sbuf, soff),) = resolve(st, "global", src, size, idx)
    for k in range(size):
        dbuf[doff + k] = sbuf[soff + k] if k < src_size else 0


def _cp_async_per_lane(st, ins, idx) -> None:
    """cp.async whose source byte count is a register (``src-size``, capped at the copy size;
    cuBLAS zero-fills a tile's out-of-range rows with 0) or an ``ignore-src`` predicate (true:
    read nothing). Only the bytes a lane reads are checked, so a lane reading 0 bytes may hold
    any address."""
    size, _, ignore_when = ins.x
    n_lanes = st.n if idx is None else idx.size
    if ignore_when is not None:  # ignore-src predicate
        p = np.broadcast_to(np.asarray(ins.b.get(st, idx), bool), (n_lanes,))
        want = np.where(p == ignore_when, 0, size).astype(np.int64)
    else:
        want = np.asarray(ins.b.get(st, idx)).astype(np.int64)
        want = np.minimum(np.broadcast_to(want, (n_lanes,)), size)
    dst = lane_addresses(st, ins.d, idx)
    ((_, dbuf, doff),) = resolve(st, "shared", dst, size, idx)
    doff = np.broadcast_to(np.asarray(doff, np.int64), (n_lanes,))
    src = np.broadcast_to(np.asarray(lane_addresses(st, ins.a, idx), np.uint64), (n_lanes,))
    for k in range(size):
        dbuf[doff + k] = 0
    for n in np.unique(want[want > 0]):
        sel = np.nonzero(want == n)[0]
        lanes = sel if idx is None else idx[sel]
        # the source is aligned to the copy size and its first and last byte are mapped (an
        # aligned run of at most 16 bytes lies in one chunk of device memory)
        ((_, sbuf, soff),) = (
            resolve(st, "global", src[sel], size, lanes)
            if n == size
            else (_read_run(st, src[sel], int(n), size, lanes))
        )
        soff = np.broadcast_to(np.asarray(soff, np.int64), (sel.size,))
        for k in range(int(n)):
            dbuf[doff[sel] + k] = sbuf[soff + k]


def _read_run(st, src, n: int, align: int, lanes) -> list[tuple]:
    """resolve() for ``n`` bytes at ``src`` that must be ``align``-aligned (n need not be a
    power of two, which resolve's own alignment check assumes)."""
    bad = src % np.uint64(align) != 0
    if bad.any():
        first = int(src[np.argmax(bad)])
        msg = f"misaligned {align}-byte cp.async source {first:#x}"
        raise MemoryFault(msg, first, "misaligned")
    resolve(st, "global", src + np.uint64(n - 1), 1, lanes)
    return resolve(st, "global", src, 1, lanes)


def dec_cp(ctx, mods) -> None:
    m = Mods(ctx, mods)
    if not m.has("async"):
        raise ctx.unsupported("cp without .async")
    if m.take("commit_group", "wait_group", "wait_all") is not None:
        m.done()
        ctx.ins.fn = h_nop
        return
    if m.has("bulk"):
        raise ctx.unsupported("cp.async.bulk (TMA)")
    m.take("ca", "cg")
    m.take("shared", "shared::cta")
    m.take("global")
    m.done()
    ins = ctx.ins
    if len(ctx.ops) not in (3, 4):
        raise ctx.error("cp.async takes 3 or 4 operands")
    ins.d = ctx.address(ctx.ops[0])
    ins.a = ctx.address(ctx.ops[1])
    if ctx.ops[2][0] != "int":
        raise ctx.unsupported("cp.async with a non-immediate size")
    size = ctx.ops[2][1]
    src_size = None
    ins.b, ignore_when = None, None
    if len(ctx.ops) == 4:
        last = ctx.ops[3]
        decl = ctx.regdecl(last[1]) if last[0] in ("reg", "name") else None
        if last[0] == "not" or (decl is not None and decl.type.kind == "pred"):
            ins.b, negated = ctx.pred(last)  # ignore-src: read nothing where true
            ignore_when = not negated
        elif last[0] == "int":
            src_size = last[1]
        else:
            ins.b = ctx.src(last, TYPES["u32"])
    ins.x = (size, src_size if src_size is not None else size, ignore_when)
    ins.fn = _h_cp_async


# ---- atom / red -----------------------------------------------------------------------------

_ATOM_OPS = ("and", "or", "xor", "cas", "exch", "add", "inc", "dec", "min", "max")


def _h_atom(st, ins, idx) -> None:
    space, op, kind, dtype, size = ins.x
    addr = lane_addresses(st, ins.a, idx)
    nl = st.n if idx is None else idx.size
    b = ins.b.get(st, idx)
    c = ins.c.get(st, idx) if ins.c is not None else None
    for sel, buf, off in resolve(st, space, addr, size, idx, write=True):
        view = st.view(buf, dtype)
        ei = np.asarray(off) // size
        cnt = nl if sel is None else sel.size
        if ei.ndim == 0:
            ei = np.full(cnt, int(ei), np.int64)
        bb = b if sel is None or not np.ndim(b) else b[sel]
        cc = c if (c is None or sel is None or not np.ndim(c)) else c[sel]
        old = apply_atomic(view, ei, op, kind, bb, cc)
        if ins.d is not None:
            lanes = idx if sel is None else (sel if idx is None else idx[sel])
            ins.d.put(st, lanes, old)


def _dec_atomic(ctx, mods, has_dst: bool) -> None:
    m = Mods(ctx, mods)
    space = decode_space(ctx, m)
    op = m.take(*_ATOM_OPS)
    m.take("noftz")
    _strip_cache_policy(ctx, m)
    if m.take("v2", "v4", "v8"):
        raise ctx.unsupported("vector atomics")
    ty = m.one_type()
    m.done()
    if op is None:
        raise ctx.error("atom/red needs an operation")
    if space in ("param", "const", "local"):
        raise ctx.unsupported(f"atomics on .{space}")
    kind = ty.name
    if ty.kind in ("h", "bh", "h2", "bh2"):
        if op != "add":
            raise ctx.unsupported(f"{op}.{ty.name}")
    elif ty.kind == "f" and op not in ("add", "exch", "min", "max"):
        raise ctx.unsupported(f"{op}.{ty.name}")
    if op in ("inc", "dec") and ty.name != "u32":
        raise ctx.unsupported(f"{op}.{ty.name}")
    if ty.bits == 128 or ty.bits == 8:
        raise ctx.unsupported(f"{ty.bits}-bit atomics")
    # the view type: b32/b64 and half types operate on raw unsigned bits
    vty = ty if ty.kind in ("u", "s", "f") else TYPES[f"u{ty.bits}"]
    ins = ctx.ins
    ops = ctx.ops
    n_src = 2 if op == "cas" else 1
    expect = n_src + (2 if has_dst else 1)
    ctx.nops(expect)
    k = 0
    if has_dst:
        ins.d = ctx.dst(ops[0], vty)
        k = 1
    ins.a = ctx.address(ops[k])
    if ins.a[0] == "param":
        raise ctx.unsupported("atomics on .param")
    ins.b = ctx.src(ops[k + 1], vty)
    ins.c = ctx.src(ops[k + 2], vty) if op == "cas" else None
    ins.x = (space, op, kind, vty.dtype, ty.size)
    ins.fn = _h_atom


def dec_atom(ctx, mods) -> None:
    _dec_atomic(ctx, mods, True)


def dec_red(ctx, mods) -> None:
    _dec_atomic(ctx, mods, False)
