"""Bulk asynchronous copies (memory class): ``cp.async.bulk`` global→shared and shared→shared
(``.shared::cluster`` destinations and mbarriers may be another CTA's of the cluster: mapa
addresses, routed by :mod:`.memspace`; ``.multicast::cluster`` copies to every CTA of a mask)
with
``.mbarrier::complete_tx::bytes``, shared→global with ``.bulk_group``,
``cp.reduce.async.bulk`` shared→global (bulk group) and shared→shared (completing an
mbarrier's transactions), and the bulk groups' ``commit_group``/``wait_group{.read}``: copies
and reductions happen at issue, so the groups are always complete. :func:`dec_cp` routes every
``cp`` form: these here, ``cp.async.mbarrier.arrive`` to :mod:`.ops_mbarrier`, the per-thread
``cp.async`` to :mod:`.ops_mem`.
"""

from __future__ import annotations

import numpy as np

from crane.backends.sim.memory import MemoryFault

from . import mbarrier as mb
from .atomics import apply_atomic
from .memspace import map_cluster, resolve
from .ops_common import Mods, h_nop
from .ops_mbarrier import SHARED_SPACES, complete_bytes, dec_cp_mbarrier_arrive, per_lane
from .ops_mem import dec_cp as dec_cp_thread
from .ops_mem import lane_addresses
from .ptxtypes import TYPES

__all__ = ["dec_cp"]

# ---- bulk copies ----------------------------------------------------------------------------


def _lane_ranges(st, space: str, addr_op, sizes: np.ndarray, idx, write: bool):
    """(buffer, byte offset) of each lane's ``sizes[k]``-byte range: 16-byte aligned, inside
    one allocation (global) or the block's shared memory."""
    nl = sizes.size
    addr = np.broadcast_to(np.asarray(lane_addresses(st, addr_op, idx)), (nl,)).astype(np.uint64)
    lanes = np.arange(nl) if idx is None else idx
    out = []
    for k in range(nl):
        n = int(sizes[k])
        lane = lanes[k : k + 1]
        first = resolve(st, space, addr[k : k + 1], 16, lane, write)[0]
        buf, off = first[1], int(np.asarray(first[2]).flat[0])
        if n > 16:
            end = addr[k : k + 1] + np.uint64(n - 16)
            last = resolve(st, space, end, 16, lane, write)[0]
            if last[1] is not buf or int(np.asarray(last[2]).flat[0]) != off + n - 16:
                a = int(addr[k])
                raise MemoryFault(f"bulk copy range {a:#x}+{n:#x} is not contiguous", a, "illegal")
            if buf is st.mem.buf:
                try:
                    st.mem.check_range(int(addr[k]), n)
                except MemoryFault as e:
                    raise MemoryFault(str(e), int(addr[k]), "illegal") from None
        out.append((buf, off))
    return out


def _h_bulk(st, ins, idx) -> None:
    dspace, sspace, mbar = ins.x
    sizes = per_lane(ins.c, st, idx, st.n if idx is None else idx.size)
    if (sizes % 16).any() or (sizes < 0).any():
        raise MemoryFault("cp.async.bulk size is not a multiple of 16", 0, "misaligned")
    src = _lane_ranges(st, sspace, ins.a, sizes, idx, False)
    dst = _lane_ranges(st, dspace, ins.d, sizes, idx, True)
    for (sb, so), (db, do), n in zip(src, dst, sizes.tolist(), strict=True):
        db[do : do + n] = sb[so : so + n]
    if mbar is not None:
        complete_bytes(st, ins.b, mbar, idx, sizes)


def _h_reduce(st, ins, idx) -> None:
    dspace, sspace, op, kind, dtype, esize, mbar = ins.x
    sizes = per_lane(ins.c, st, idx, st.n if idx is None else idx.size)
    if (sizes % 16).any():
        raise MemoryFault("cp.reduce.async.bulk size is not a multiple of 16", 0, "misaligned")
    src = _lane_ranges(st, sspace, ins.a, sizes, idx, False)
    dst = _lane_ranges(st, dspace, ins.d, sizes, idx, True)
    for (sb, so), (db, do), n in zip(src, dst, sizes.tolist(), strict=True):
        if do % esize:
            raise MemoryFault("cp.reduce.async.bulk destination misaligned", do, "misaligned")
        vals = sb[so : so + n].view(dtype)
        ei = do // esize + np.arange(n // esize)
        apply_atomic(st.view(db, dtype), ei, op, kind, vals)
    if mbar is not None:
        complete_bytes(st, ins.b, mbar, idx, sizes)


def dec_cp_async_bulk(ctx, m: Mods) -> None:
    """``cp.async.bulk.*`` (``async`` and ``bulk`` already taken)."""
    ins = ctx.ins
    if m.take("commit_group") or m.take("wait_group"):
        m.take("read")
        m.done()
        ins.fn = h_nop  # every bulk copy completed at issue
        return
    if m.has("prefetch"):
        m.take("L2")
        m.take("global")
        _cache_hint(ctx, m)
        m.done()
        ins.fn = h_nop
        return
    if m.take("tensor") or m.has("cp_mask"):
        raise ctx.unsupported(f"`{ctx.pins.opcode}` (tensor maps, byte masks)")
    multicast = m.has("multicast::cluster")
    dst, src = _two_spaces(ctx, m)
    mbar = m.has("mbarrier::complete_tx::bytes")
    group = m.has("bulk_group")
    _cache_hint(ctx, m)
    m.done()
    _check_direction(ctx, dst, src, mbar, group)
    if multicast:
        if src != "global" or dst != "shared":
            raise ctx.error("a multicast bulk copy is global -> shared::cluster")
        ctx.nops(5)
        ins.d = ctx.address(ctx.ops[0])
        ins.a = ctx.address(ctx.ops[1])
        ins.c = ctx.src(ctx.ops[2], TYPES["u32"])
        ins.b = ctx.address(ctx.ops[3])
        ins.e = ctx.src(ctx.ops[4], TYPES["u16"])
        ins.fn = _h_bulk_multicast
        return
    ctx.nops(4 if mbar else 3)
    ins.d = ctx.address(ctx.ops[0])
    ins.a = ctx.address(ctx.ops[1])
    ins.c = ctx.src(ctx.ops[2], TYPES["u32"])
    ins.b = ctx.address(ctx.ops[3]) if mbar else None
    ins.x = (dst, src, "shared" if mbar else None)
    ins.fn = _h_bulk


def _h_bulk_multicast(st, ins, idx) -> None:
    """``.multicast::cluster``: each lane's copy lands at the same CTA-relative offset in the
    shared memory of every CTA of its 16-bit ``ctaMask``, and completes its bytes on the
    mbarrier at the same CTA-relative offset in each of them."""
    nl = st.n if idx is None else idx.size
    sizes = per_lane(ins.c, st, idx, nl)
    if (sizes % 16).any() or (sizes < 0).any():
        raise MemoryFault("cp.async.bulk size is not a multiple of 16", 0, "misaligned")
    masks = per_lane(ins.e, st, idx, nl) & 0xFFFF
    src = _lane_ranges(st, "global", ins.a, sizes, idx, False)
    dst = np.broadcast_to(np.asarray(lane_addresses(st, ins.d, idx), np.int64), (nl,))
    bar = np.broadcast_to(np.asarray(lane_addresses(st, ins.b, idx), np.int64), (nl,))
    lanes = np.arange(nl) if idx is None else idx
    words = st.view(st.shared, np.uint64)
    for k in range(nl):
        (sb, so), n, lane = src[k], int(sizes[k]), lanes[k : k + 1]
        for rank in (r for r in range(16) if int(masks[k]) >> r & 1):
            d = map_cluster(dst[k : k + 1], rank)
            ((_, db, doff),) = resolve(st, "shared", d, 16, lane, True)
            if n > 16:  # the last 16 bytes: the range must stay inside that CTA's memory
                resolve(st, "shared", d + (n - 16), 16, lane, True)
            do = int(np.asarray(doff).flat[0])
            db[do : do + n] = sb[so : so + n]
            b = map_cluster(bar[k : k + 1], rank)
            ((_, _, boff),) = resolve(st, "shared", b, 8, lane, True)
            w = int(np.asarray(boff).flat[0]) >> 3
            words[w] = mb.update_tx(int(words[w]), np.array([-n]))
    st.mbar_epoch += 1


_REDUCE_OPS = ("add", "min", "max", "inc", "dec", "and", "or", "xor")


def dec_cp_reduce(ctx, m: Mods) -> None:
    """``cp.reduce.async.bulk.*`` without a tensor map (``reduce``, ``async`` and ``bulk``
    already taken)."""
    if m.take("tensor"):
        raise ctx.unsupported(f"`{ctx.pins.opcode}` (tensor maps)")
    dst, src = _two_spaces(ctx, m)
    mbar = m.has("mbarrier::complete_tx::bytes")
    group = m.has("bulk_group")
    op = m.take(*_REDUCE_OPS)
    m.take("noftz")
    _cache_hint(ctx, m)
    ty = m.one_type()
    m.done()
    _check_direction(ctx, dst, src, mbar, group)
    if src != "shared":
        raise ctx.error("bulk reductions read shared memory")
    if op is None:
        raise ctx.error("cp.reduce.async.bulk needs a reduction operation")
    if (ty.kind in ("h", "bh", "f") and op != "add") or ty.kind in ("h2", "bh2") or ty.bits == 8:
        raise ctx.unsupported(f"cp.reduce.async.bulk .{op}.{ty.name}")
    if op in ("inc", "dec") and ty.name != "u32":
        raise ctx.unsupported(f"cp.reduce.async.bulk .{op}.{ty.name}")
    vty = ty if ty.kind in ("u", "s", "f") else TYPES[f"u{ty.bits}"]
    ctx.nops(4 if mbar else 3)
    ins = ctx.ins
    ins.d = ctx.address(ctx.ops[0])
    ins.a = ctx.address(ctx.ops[1])
    ins.c = ctx.src(ctx.ops[2], TYPES["u32"])
    ins.b = ctx.address(ctx.ops[3]) if mbar else None
    ins.x = (dst, src, op, ty.name, vty.dtype, ty.size, "shared" if mbar else None)
    ins.fn = _h_reduce


def _two_spaces(ctx, m: Mods) -> tuple[str, str]:
    spaces = [x for x in m.rest if x in ("global", *SHARED_SPACES)]
    if len(spaces) != 2:
        raise ctx.error("bulk copies name a destination and a source state space")
    for s in spaces:
        m.rest.remove(s)
    return tuple("global" if s == "global" else "shared" for s in spaces)  # type: ignore[return-value]


def _check_direction(ctx, dst: str, src: str, mbar: bool, group: bool) -> None:
    if dst == "shared" and not mbar:
        raise ctx.error("a bulk copy into shared memory completes through an mbarrier")
    if dst == "global" and (src != "shared" or not group):
        raise ctx.error("a bulk copy to global memory is from shared memory, in a bulk group")


def _cache_hint(ctx, m: Mods) -> None:
    if m.has("L2::cache_hint"):
        ctx.ops = ctx.ops[:-1]


def dec_cp(ctx, mods) -> None:
    """``cp.*``: the bulk copies and reductions and ``cp.async.mbarrier.arrive`` here, the
    per-thread ``cp.async`` forms in :func:`.ops_mem.dec_cp`."""
    if "bulk" not in mods and "mbarrier" not in mods and "reduce" not in mods:
        dec_cp_thread(ctx, mods)
        return
    m = Mods(ctx, mods)
    reduce = m.has("reduce")
    if not m.has("async"):
        raise ctx.unsupported(f"`{ctx.pins.opcode}`")
    if m.has("bulk"):
        if reduce:
            dec_cp_reduce(ctx, m)
        else:
            dec_cp_async_bulk(ctx, m)
        return
    if reduce or not m.has("mbarrier") or not m.has("arrive"):
        raise ctx.unsupported(f"`{ctx.pins.opcode}`")
    dec_cp_mbarrier_arrive(ctx, m)
