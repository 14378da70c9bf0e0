"""mbarrier instructions (memory class): ``mbarrier.init/inval/arrive/arrive_drop/expect_tx/
complete_tx/pending_count`` and the waits ``test_wait``/``try_wait`` (with a state or
``.parity``) on the object in shared memory described in :mod:`.mbarrier`, and
``cp.async.mbarrier.arrive{.noinc}``.

A wait whose phase has not completed *parks* its lanes (kind ``MWAIT``): the executor runs the
other lanes and retries the wait when nothing else can run, as it does for ``bar.sync``.
``try_wait`` may block by definition; parking ``test_wait`` too is a legal schedule (its thread
merely runs later) that lets a spin loop on it make progress under the interpreter's
lowest-PC-first scheduling. When only such waits remain and none can complete, they return
false (a ``try_wait`` time limit, a ``test_wait`` answer).

``cp.async.mbarrier.arrive``: every earlier ``cp.async`` of the thread has already completed
(the interpreter copies at issue), so the arrive-on happens at once; without ``.noinc`` the
pending count is raised by one first, so the pair leaves it unchanged.
"""

from __future__ import annotations

import numpy as np

from crane.backends.sim.memory import MemoryFault

from . import mbarrier as mb
from .instr import MWAIT
from .memspace import resolve
from .ops_common import Mods
from .ops_mem import lane_addresses
from .ptxtypes import TYPES

__all__ = [
    "SHARED_SPACES",
    "complete_bytes",
    "dec_cp_mbarrier_arrive",
    "dec_mbarrier",
    "per_lane",
    "word_index",
]

SHARED_SPACES = {"shared": "shared", "shared::cta": "shared", "shared::cluster": "shared"}
_SEM = ("release", "acquire", "relaxed")
_SCOPE = ("cta", "cluster")


# ---- the barrier word of each lane -------------------------------------------------------------


def word_index(st, addr_op, space: str, idx) -> np.ndarray:
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


def per_lane(src, st, idx, nl: int) -> np.ndarray:
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
    wi = word_index(st, ins.a, ins.x, idx)
    cnt = per_lane(ins.b, st, idx, wi.size)
    if ((cnt < 1) | (cnt > mb.MAX_COUNT)).any():
        raise MemoryFault(f"mbarrier.init count outside 1..{mb.MAX_COUNT}", 0, "illegal")
    v = st.view(st.shared, np.uint64)
    for w, lanes in _by_barrier(wi):
        v[w] = mb.init_word(int(cnt[lanes[-1]]))
    st.mbar_epoch += 1


def _h_inval(st, ins, idx) -> None:
    wi = word_index(st, ins.a, ins.x, idx)
    st.view(st.shared, np.uint64)[wi] = 0
    st.mbar_epoch += 1


def _h_arrive(st, ins, idx) -> None:
    space, drop, no_complete = ins.x
    wi = word_index(st, ins.a, space, idx)
    nl = wi.size
    cnt = per_lane(ins.b, st, idx, nl) if ins.b is not None else np.ones(nl, np.int64)
    txs = per_lane(ins.c, st, idx, nl) if ins.c is not None else None
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
    wi = word_index(st, ins.a, space, idx)
    d = per_lane(ins.b, st, idx, wi.size) * sign
    v = st.view(st.shared, np.uint64)
    for w, lanes in _by_barrier(wi):
        v[w] = mb.update_tx(int(v[w]), d[lanes])
    st.mbar_epoch += 1


def _ready(st, ins, idx) -> np.ndarray:
    """Whether each lane's awaited phase has completed (no side effects)."""
    space, parity = ins.x
    wi = word_index(st, ins.a, space, idx)
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
    sp = m.take(*SHARED_SPACES)
    return "generic" if sp is None else SHARED_SPACES[sp]


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
    word_index(st, ins.a, ins.x, idx)


def complete_bytes(st, mbar_op, space: str, idx, sizes: np.ndarray) -> None:
    """``.mbarrier::complete_tx::bytes``: each lane's bytes complete on its barrier."""
    wi = word_index(st, mbar_op, space, idx)
    v = st.view(st.shared, np.uint64)
    for w, lanes in _by_barrier(wi):
        v[w] = mb.update_tx(int(v[w]), -sizes[lanes])
    st.mbar_epoch += 1
