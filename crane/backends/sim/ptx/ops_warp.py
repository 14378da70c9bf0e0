"""Warp-level instructions: shfl.sync, vote.sync, activemask, redux.sync, match.sync,
elect.sync (warp class).

A warp is 32 consecutive lanes of one block (linear thread id / 32). The lanes taking part
in a warp instruction are those at this instruction now (the executing group, after the guard)
and named in the member mask. Lanes of one warp may reach one instruction with different
masks (a warp split into partitions, as cooperative groups' ``tiled_partition`` and
``labeled_partition`` do): each lane's result is over the lanes of *its* mask, so lanes are
grouped by (warp, mask) (:class:`_Groups`) and each group reduces on its own; when every warp
has one mask, its lanes are a contiguous run and the groups are ``reduceat`` runs. ``shfl``
reads its source lane's register even if that lane is elsewhere (on hardware that is undefined
unless the lane participates); its mask selects no data, so it needs no grouping.
"""

from __future__ import annotations

import numpy as np

from .ops_common import Mods
from .ptxtypes import TYPES

__all__ = ["dec_activemask", "dec_elect", "dec_match", "dec_redux", "dec_shfl", "dec_vote"]


def _lanes(st, idx) -> np.ndarray:
    return np.arange(st.n) if idx is None else idx


def _in_mask(st, lanes: np.ndarray, mask) -> np.ndarray:
    lid = st.special["%laneid"][lanes].astype(np.uint64)
    m = np.asarray(mask).astype(np.uint64)
    return ((m >> lid) & np.uint64(1)).astype(np.bool_)


class _Groups:
    """Lanes grouped by warp and member mask: each group's lanes contiguous after ``order``
    (None: they already are), ``starts`` the first position of each group, ``seg`` the group
    of each position."""

    def __init__(self, st, lanes: np.ndarray, mask) -> None:
        m = np.broadcast_to(np.asarray(mask, np.uint64), lanes.shape)
        key = (st.warp_base[lanes].astype(np.uint64) << np.uint64(32)) | m
        self.order = None
        if key.size > 1 and not (key[1:] >= key[:-1]).all():  # masks differ within a warp
            self.order = np.argsort(key, kind="stable")
            key = key[self.order]
        start = np.empty(key.size, np.bool_)
        if key.size:
            start[0] = True
            np.not_equal(key[1:], key[:-1], out=start[1:])
        self.starts = np.flatnonzero(start)
        self.seg = np.cumsum(start) - 1

    def reduce(self, uf, values: np.ndarray, dtype=None) -> np.ndarray:
        """``uf`` over each group, the group's result at every one of its lanes."""
        if values.size == 0:
            return values
        v = values if self.order is None else values[self.order]
        per = uf.reduceat(v, self.starts, dtype=dtype)[self.seg]
        if self.order is None:
            return per
        out = np.empty_like(per)
        out[self.order] = per
        return out


# ---- shfl ---------------------------------------------------------------------------------


def _h_shfl(st, ins, idx) -> None:
    mode = ins.x
    lanes = _lanes(st, idx)
    lane = st.special["%laneid"][lanes].astype(np.int64)
    b = np.asarray(ins.b.get(st, idx)).astype(np.int64) & 31
    c = np.asarray(ins.c.get(st, idx)).astype(np.int64)
    cval = c & 31
    segmask = (c >> 8) & 31
    max_lane = (lane & segmask) | (cval & ~segmask)
    min_lane = lane & segmask
    if mode == "up":
        j = lane - b
        p = j >= max_lane
    elif mode == "down":
        j = lane + b
        p = j <= max_lane
    elif mode == "bfly":
        j = lane ^ b
        p = j <= max_lane
    else:
        j = min_lane | (b & ~segmask)
        p = j <= max_lane
    src = st.warp_base[lanes] + np.where(p, j, lane)
    exists = src < st.block_end[lanes]
    p = p & exists
    src = np.where(exists, src, lanes)
    a = ins.a
    if hasattr(a, "row"):
        val = a.row(st)[src]
    else:
        val = a.get(st, None)
        if np.ndim(val):
            val = val[src]
    ins.d.put(st, idx, val)
    if ins.d2 is not None:
        ins.d2.put(st, idx, p)


def dec_shfl(ctx, mods) -> None:
    m = Mods(ctx, mods)
    sync = m.has("sync")
    mode = m.take("up", "down", "bfly", "idx")
    ty = m.one_type()
    m.done()
    if mode is None or ty.bits != 32:
        raise ctx.unsupported("shfl form")
    ops = ctx.ops
    if len(ops) != (5 if sync else 4):
        raise ctx.error("wrong number of shfl operands")
    ins = ctx.ins
    if ops[0][0] == "pair":
        ins.d = ctx.dst(ops[0][1], TYPES["b32"])
        ins.d2 = ctx.dst(ops[0][2], TYPES["pred"])
    else:
        ins.d = ctx.dst(ops[0], TYPES["b32"])
    ins.a = ctx.src(ops[1], TYPES["b32"])
    ins.b = ctx.src(ops[2], TYPES["u32"])
    ins.c = ctx.src(ops[3], TYPES["u32"])
    ins.x = mode
    ins.fn = _h_shfl


# ---- vote / activemask --------------------------------------------------------------------


def _ballot(st, lanes, pred, inmask, g: _Groups):
    lid = st.special["%laneid"][lanes].astype(np.uint64)
    bits = np.where(pred & inmask, np.uint64(1) << lid, np.uint64(0))
    if lanes.size == 0:
        return np.zeros(0, np.uint32)
    return g.reduce(np.bitwise_or, bits).astype(np.uint32)


def _h_vote(st, ins, idx) -> None:
    mode = ins.x
    lanes = _lanes(st, idx)
    pred = np.broadcast_to(np.asarray(ins.a.get(st, idx)), lanes.shape)
    if ins.e:
        pred = ~pred
    mask = ins.c.get(st, idx) if ins.c is not None else np.uint32(0xFFFFFFFF)
    inmask = np.broadcast_to(_in_mask(st, lanes, mask), lanes.shape)
    g = _Groups(st, lanes, mask)
    if mode == "ballot":
        ins.d.put(st, idx, _ballot(st, lanes, pred, inmask, g))
        return
    if mode == "all":
        bad = g.reduce(np.add, (inmask & ~pred).astype(np.int64))
        ins.d.put(st, idx, bad == 0)
    elif mode == "any":
        good = g.reduce(np.add, (inmask & pred).astype(np.int64))
        ins.d.put(st, idx, good > 0)
    else:  # uni
        t = g.reduce(np.add, (inmask & pred).astype(np.int64))
        tot = g.reduce(np.add, inmask.astype(np.int64))
        ins.d.put(st, idx, (t == 0) | (t == tot))


def dec_vote(ctx, mods) -> None:
    m = Mods(ctx, mods)
    sync = m.has("sync")
    mode = m.take("all", "any", "uni", "ballot")
    ty = m.one_type()
    m.done()
    if mode is None:
        raise ctx.error("vote needs a mode")
    ops = ctx.ops
    if len(ops) != (3 if sync else 2):
        raise ctx.error("wrong number of vote operands")
    ins = ctx.ins
    ins.d = ctx.dst(ops[0], TYPES["b32"] if mode == "ballot" else TYPES["pred"])
    ins.a, ins.e = ctx.pred(ops[1])
    ins.c = ctx.src(ops[2], TYPES["u32"]) if sync else None
    ins.x = mode
    ins.fn = _h_vote
    _ = ty


def _h_activemask(st, ins, idx) -> None:
    lanes = _lanes(st, idx)
    t = np.ones(lanes.size, np.bool_)
    ins.d.put(st, idx, _ballot(st, lanes, t, t, _Groups(st, lanes, np.uint32(0xFFFFFFFF))))


def dec_activemask(ctx, mods) -> None:
    m = Mods(ctx, mods)
    m.types()
    m.done()
    ctx.nops(1)
    ctx.ins.d = ctx.dst(ctx.ops[0], TYPES["b32"])
    ctx.ins.fn = _h_activemask


# ---- redux / match / elect ----------------------------------------------------------------


def _h_redux(st, ins, idx) -> None:
    op, dt = ins.x
    lanes = _lanes(st, idx)
    v = np.broadcast_to(np.asarray(ins.a.get(st, idx), dt), lanes.shape)
    mask = ins.c.get(st, idx)
    inmask = np.broadcast_to(_in_mask(st, lanes, mask), lanes.shape)
    if op == "add":
        ident, uf = dt.type(0), np.add
    elif op == "min":
        ident, uf = np.iinfo(dt).max, np.minimum
    elif op == "max":
        ident, uf = np.iinfo(dt).min, np.maximum
    elif op == "and":
        ident, uf = ~dt.type(0), np.bitwise_and
    elif op == "or":
        ident, uf = dt.type(0), np.bitwise_or
    else:
        ident, uf = dt.type(0), np.bitwise_xor
    v = np.where(inmask, v, dt.type(ident))
    ins.d.put(st, idx, _Groups(st, lanes, mask).reduce(uf, v, dtype=dt))


def dec_redux(ctx, mods) -> None:
    m = Mods(ctx, mods)
    m.take("sync")
    op = m.take("add", "min", "max", "and", "or", "xor")
    m.take("abs")
    m.take("NaN")
    ty = m.one_type()
    m.done()
    if op is None or ty.kind == "f":
        raise ctx.unsupported("redux form")
    ctx.nops(3)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], ty)
    ins.a = ctx.src(ctx.ops[1], ty)
    ins.c = ctx.src(ctx.ops[2], TYPES["u32"])
    ins.x = (op, ty.dtype)
    ins.fn = _h_redux


def _h_match(st, ins, idx) -> None:
    mode = ins.x
    lanes = _lanes(st, idx)
    v = np.broadcast_to(np.asarray(ins.a.get(st, idx)), lanes.shape)
    mask = np.broadcast_to(np.asarray(ins.c.get(st, idx), np.uint32), lanes.shape)
    here = np.zeros(st.n, np.bool_)  # lanes at this instruction
    here[lanes] = True
    vals = np.zeros(st.n, v.dtype)
    vals[lanes] = v
    base = st.warp_base[lanes]
    out = np.zeros(lanes.size, np.uint32)
    members = np.zeros(lanes.size, np.uint32)  # this lane's mask, lanes here only
    for k in range(32):
        src = base + k
        bit = np.uint32(1 << k)
        ok = (src < st.block_end[lanes]) & ((mask & bit) != 0)  # lane k is in MY mask
        srcc = np.where(ok, src, 0)
        ok &= here[srcc]
        members |= np.where(ok, bit, np.uint32(0))
        out |= np.where(ok & (vals[srcc] == v), bit, np.uint32(0))
    if mode == "any":
        ins.d.put(st, idx, out)
        return
    alleq = out == members
    ins.d.put(st, idx, np.where(alleq, out, np.uint32(0)))
    if ins.d2 is not None:
        ins.d2.put(st, idx, alleq)


def dec_match(ctx, mods) -> None:
    m = Mods(ctx, mods)
    mode = m.take("any", "all")
    m.take("sync")
    ty = m.one_type()
    m.done()
    if mode is None:
        raise ctx.error("match needs .any or .all")
    ctx.nops(3)
    ins = ctx.ins
    d = ctx.ops[0]
    if d[0] == "pair":
        ins.d = ctx.dst(d[1], TYPES["b32"])
        ins.d2 = ctx.dst(d[2], TYPES["pred"])
    else:
        ins.d = ctx.dst(d, TYPES["b32"])
    ins.a = ctx.src(ctx.ops[1], ty)
    ins.c = ctx.src(ctx.ops[2], TYPES["u32"])
    ins.x = mode
    ins.fn = _h_match


def _h_elect(st, ins, idx) -> None:
    lanes = _lanes(st, idx)
    mask = ins.c.get(st, idx)
    inmask = np.broadcast_to(_in_mask(st, lanes, mask), lanes.shape)
    lid = st.special["%laneid"][lanes].astype(np.int64)
    cand = np.where(inmask, lid, 99)
    leader = _Groups(st, lanes, mask).reduce(np.minimum, cand)
    ins.d.put(st, idx, np.where(leader == 99, 0, leader).astype(np.uint32))
    if ins.d2 is not None:
        ins.d2.put(st, idx, lid == leader)


def dec_elect(ctx, mods) -> None:
    m = Mods(ctx, mods)
    m.take("sync")
    m.done()
    ctx.nops(2)
    ins = ctx.ins
    d = ctx.ops[0]
    if d[0] == "pair":
        ins.d = ctx.dst(d[1], TYPES["b32"])
        ins.d2 = ctx.dst(d[2], TYPES["pred"])
    else:
        ins.d = ctx.dst(d, TYPES["b32"])
    ins.c = ctx.src(ctx.ops[1], TYPES["u32"])
    ins.fn = _h_elect
