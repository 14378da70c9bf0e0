"""mbarrier and the bulk asynchronous copies that signal one (memory class).

* ``mbarrier.init/inval/arrive/arrive_drop/expect_tx/complete_tx/pending_count`` and the
  waits ``test_wait``/``try_wait`` (with a state or ``.parity``) on the object in shared memory
  described in :mod:`.mbarrier`. A wait whose phase has not completed *parks* its lanes (kind
  ``MWAIT``): the executor runs the other lanes and retries the wait when nothing else can run,
  as it does for ``bar.sync``. ``try_wait`` may block by definition; parking ``test_wait`` too
  is a legal schedule (its thread merely runs later) that lets a spin loop on it make progress
  under the interpreter's lowest-PC-first scheduling. When only such waits remain and none can
  complete, they return false (a ``try_wait`` time limit, a ``test_wait`` answer).
* ``cp.async.mbarrier.arrive{.noinc}``: every earlier ``cp.async`` of the thread has already
  completed (the interpreter copies at issue), so the arrive-on happens at once; without
  ``.noinc`` the pending count is raised by one first, so the pair leaves it unchanged.
* ``cp.async.bulk`` global→shared and shared→shared (``.shared::cluster`` destinations name the
  own CTA: the simulator launches no clusters) with ``.mbarrier::complete_tx::bytes``,
  shared→global with ``.bulk_group``, ``cp.reduce.async.bulk`` shared→global (bulk group) and
  shared→shared (completing an mbarrier's transactions), and the bulk
  groups' ``commit_group``/``wait_group{.read}``: copies and reductions happen at issue, so
  the groups are always complete.
"""

from __future__ import annotations

import numpy as np

from crane.backends.sim.memory import MemoryFault

from . import mbarrier as mb
from .atomics import apply_atomic
from .instr import MWAIT
from .memspace import resolve
from .ops_common import Mods, h_nop
from .ops_mem import dec_cp as dec_cp_thread
from .ops_mem import lane_addresses
from .ptxtypes import TYPES

__all__ = ["dec_cp", "dec_mbarrier"]

_SHARED_SPACES = {"shared": "shared", "shared::cta": "shared", "shared::cluster": "shared"}
_SEM = ("release", "acquire", "relaxed")
_SCOPE = ("cta", "cluster")


# ---- the barrier word of each lane -------------------------------------------------------------


def _word_index(st, addr_op, space: str, idx) -> np.ndarray:
    """Index into shared memory viewed as uint64 of each lane's barrier (aligned to 8)."""
    addr = lane_addresses(st, addr_op, idx)
    nl = st.n if idx is None else idx.size
    out = np.empty(nl, np.int64)
    for sel, buf, off in resolve(st, space, addr, 8, idx, write=True):
        if buf is not st.shared:
            a = int(np.asarray(addr).flat[0])
            raise MemoryFault(f"mbarrier address {a:#x} is not in shared memory", a, "illegal")
        off = np.broadcast_to(np.asarray(off, np.int64), (nl if sel is None else sel.size,))
        if (off & 7).any():
            raise MemoryFault("mbarrier address not 8-byte aligned", int(off[0]), "misaligned")
        if sel is None:
            out[:] = off >> 3
        else:
            out[sel] = off >> 3
    return out


def _per_lane(src, st, idx, nl: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(src.get(st, idx), np.int64), (nl,))


def _by_barrier(wi: np.ndarray):
    """(barrier word, lane positions in lane order) for each distinct barrier."""
    if wi.size and (wi == wi[0]).all():
        yield int(wi[0]), np.arange(wi.size)
        return
    uniq, inv = np.unique(wi, return_inverse=True)
    for k, u in enumerate(uniq):
        yield int(u), np.flatnonzero(inv == k)


# ---- handlers --------------------------------------------------------------------------------


def _h_init(st, ins, idx) -> None:
    wi = _word_index(st, ins.a, ins.x, idx)
    cnt = _per_lane(ins.b, st, idx, wi.size)
    if ((cnt < 1) | (cnt > mb.MAX_COUNT)).any():
        raise MemoryFault(f"mbarrier.init count outside 1..{mb.MAX_COUNT}", 0, "illegal")
    v = st.view(st.shared, np.uint64)
    for w, lanes in _by_barrier(wi):
        v[w] = mb.init_word(int(cnt[lanes[-1]]))
    st.mbar_epoch += 1


def _h_inval(st, ins, idx) -> None:
    wi = _word_index(st, ins.a, ins.x, idx)
    st.view(st.shared, np.uint64)[wi] = 0
    st.mbar_epoch += 1


def _h_arrive(st, ins, idx) -> None:
    space, drop, no_complete = ins.x
    wi = _word_index(st, ins.a, space, idx)
    nl = wi.size
    cnt = _per_lane(ins.b, st, idx, nl) if ins.b is not None else np.ones(nl, np.int64)
    txs = _per_lane(ins.c, st, idx, nl) if ins.c is not None else None
    v = st.view(st.shared, np.uint64)
    states = np.empty(nl, np.uint64)
    for w, lanes in _by_barrier(wi):
        tx = txs[lanes] if txs is not None else None
        v[w], states[lanes] = mb.arrive(int(v[w]), cnt[lanes], drop, no_complete, tx)
    st.mbar_epoch += 1
    if ins.d is not None:
        ins.d.put(st, idx, states)


def _h_tx(st, ins, idx) -> None:
    space, sign = ins.x
    wi = _word_index(st, ins.a, space, idx)
    d = _per_lane(ins.b, st, idx, wi.size) * sign
    v = st.view(st.shared, np.uint64)
    for w, lanes in _by_barrier(wi):
        v[w] = mb.update_tx(int(v[w]), d[lanes])
    st.mbar_epoch += 1


def _ready(st, ins, idx) -> np.ndarray:
    """Whether each lane's awaited phase has completed (no side effects)."""
    space, parity = ins.x
    wi = _word_index(st, ins.a, space, idx)
    ph = mb.phase_of(st.view(st.shared, np.uint64)[wi])
    if parity:
        want = np.asarray(ins.b.get(st, idx)).astype(np.uint32) & np.uint32(1)
        return (ph & np.uint32(1)) != want
    return ph != mb.phase_of(ins.b.get(st, idx))


def _h_wait(st, ins, idx) -> np.ndarray:
    done = _ready(st, ins, idx)
    ins.d.put(st, idx, done)
    return done


def _h_pending(st, ins, idx) -> None:
    ins.d.put(st, idx, mb.pending_of(ins.a.get(st, idx)))


# ---- decoders --------------------------------------------------------------------------------


def _space(ctx, m: Mods) -> str:
    sp = m.take(*_SHARED_SPACES)
    return "generic" if sp is None else _SHARED_SPACES[sp]


def _strip_order(m: Mods) -> None:
    m.take(*_SEM)
    m.take(*_SCOPE)


def dec_mbarrier(ctx, mods) -> None:
    m = Mods(ctx, mods)
    op = m.take(
        "init", "inval", "arrive", "arrive_drop", "expect_tx", "complete_tx", "test_wait",
        "try_wait", "pending_count",
    )  # fmt: skip
    ins = ctx.ins
    ops = ctx.ops
    b64 = TYPES["b64"]
    if op is None:
        raise ctx.unsupported(f"`{ctx.pins.opcode}`")
    if op == "pending_count":
        m.take("b64")
        m.done()
        ctx.nops(2)
        ins.d = ctx.dst(ops[0], TYPES["u32"])
        ins.a = ctx.src(ops[1], b64)
        ins.fn = _h_pending
        return
    if op in ("init", "inval"):
        space = _space(ctx, m)
        m.take("b64")
        m.done()
        ctx.nops(2 if op == "init" else 1)
        ins.a = ctx.address(ops[0])
        ins.x = space
        if op == "init":
            ins.b = ctx.src(ops[1], TYPES["u32"])
            ins.fn = _h_init
        else:
            ins.fn = _h_inval
        return
    if op in ("expect_tx", "complete_tx"):
        _strip_order(m)
        space = _space(ctx, m)
        m.take("b64")
        m.done()
        ctx.nops(2)
        ins.a = ctx.address(ops[0])
        ins.b = ctx.src(ops[1], TYPES["u32"])
        ins.x = (space, 1 if op == "expect_tx" else -1)
        ins.fn = _h_tx
        return
    if op in ("arrive", "arrive_drop"):
        expect_tx = m.has("expect_tx")
        no_complete = m.has("noComplete")
        _strip_order(m)
        space = _space(ctx, m)
        m.take("b64")
        m.done()
        ctx.nops(2, 3)
        ins.d = ctx.dst(ops[0], b64)
        ins.a = ctx.address(ops[1])
        if expect_tx:
            if len(ops) != 3:
                raise ctx.error("arrive.expect_tx takes a transaction count")
            ins.c = ctx.src(ops[2], TYPES["u32"])
        elif len(ops) == 3:
            ins.b = ctx.src(ops[2], TYPES["u32"])
        elif no_complete:
            raise ctx.error(".noComplete takes an arrival count")
        ins.x = (space, op == "arrive_drop", no_complete)
        ins.fn = _h_arrive
        return
    # test_wait / try_wait
    parity = m.has("parity")
    _strip_order(m)
    space = _space(ctx, m)
    m.take("b64")
    m.done()
    ctx.nops(3, 4) if op == "try_wait" else ctx.nops(3)
    ins.d = ctx.dst(ops[0], TYPES["pred"])
    ins.a = ctx.address(ops[1])
    ins.b = ctx.src(ops[2], TYPES["u32"] if parity else b64)
    # ops[3] (try_wait's suspend-time hint) bounds a real wait; the interpreter's wait ends
    # when the phase completes or when nothing else can run
    ins.x = (space, parity)
    ins.kind = MWAIT
    ins.fn = _h_wait
    ins.e = _ready


def dec_cp_mbarrier_arrive(ctx, m: Mods) -> None:
    """``cp.async.mbarrier.arrive{.noinc}{.shared{::cta}}.b64 [addr]`` (``async``, ``mbarrier``
    and ``arrive`` already taken)."""
    noinc = m.has("noinc")
    space = _space(ctx, m)
    m.take("b64")
    m.done()
    ctx.nops(1)
    ins = ctx.ins
    ins.a = ctx.address(ctx.ops[0])
    ins.d = None
    if noinc:
        ins.x = (space, False, False)
        ins.fn = _h_arrive
    else:  # +1 pending, then the arrive-on: the count is unchanged; the address is checked
        ins.x = space
        ins.fn = _h_check_barrier


def _h_check_barrier(st, ins, idx) -> None:
    _word_index(st, ins.a, ins.x, idx)


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
    sizes = _per_lane(ins.c, st, idx, st.n if idx is None else idx.size)
    if (sizes % 16).any() or (sizes < 0).any():
        raise MemoryFault("cp.async.bulk size is not a multiple of 16", 0, "misaligned")
    src = _lane_ranges(st, sspace, ins.a, sizes, idx, False)
    dst = _lane_ranges(st, dspace, ins.d, sizes, idx, True)
    for (sb, so), (db, do), n in zip(src, dst, sizes.tolist(), strict=True):
        db[do : do + n] = sb[so : so + n]
    if mbar is not None:
        _complete_bytes(st, ins.b, mbar, idx, sizes)


def _complete_bytes(st, mbar_op, space: str, idx, sizes: np.ndarray) -> None:
    """``.mbarrier::complete_tx::bytes``: each lane's bytes complete on its barrier."""
    wi = _word_index(st, mbar_op, space, idx)
    v = st.view(st.shared, np.uint64)
    for w, lanes in _by_barrier(wi):
        v[w] = mb.update_tx(int(v[w]), -sizes[lanes])
    st.mbar_epoch += 1


def _h_reduce(st, ins, idx) -> None:
    dspace, sspace, op, kind, dtype, esize, mbar = ins.x
    sizes = _per_lane(ins.c, st, idx, st.n if idx is None else idx.size)
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
        _complete_bytes(st, ins.b, mbar, idx, sizes)


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
    if m.take("tensor") or m.has("multicast::cluster") or m.has("cp_mask"):
        raise ctx.unsupported(f"`{ctx.pins.opcode}` (tensor maps, multicast, byte masks)")
    dst, src = _two_spaces(ctx, m)
    mbar = m.has("mbarrier::complete_tx::bytes")
    group = m.has("bulk_group")
    _cache_hint(ctx, m)
    m.done()
    _check_direction(ctx, dst, src, mbar, group)
    ctx.nops(4 if mbar else 3)
    ins.d = ctx.address(ctx.ops[0])
    ins.a = ctx.address(ctx.ops[1])
    ins.c = ctx.src(ctx.ops[2], TYPES["u32"])
    ins.b = ctx.address(ctx.ops[3]) if mbar else None
    ins.x = (dst, src, "shared" if mbar else None)
    ins.fn = _h_bulk


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
    spaces = [x for x in m.rest if x in ("global", *_SHARED_SPACES)]
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
