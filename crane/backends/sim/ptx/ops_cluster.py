"""Thread-block cluster instructions: ``barrier.cluster.arrive/wait``, ``mapa`` and
``getctarank`` (distributed shared memory addressing; the accesses themselves are the ordinary
``ld/st/atom/red .shared::cluster`` routed by :mod:`.memspace`).

``barrier.cluster`` is a split barrier over every thread of the cluster: each thread's
``arrive`` counts one arrival (``State.carrive``); a ``wait`` completes once every thread of the
cluster that has not exited has arrived as often as the waiting thread (exited threads count
as arrived, as at ``bar.sync``). The wait is an executor wait (kind ``MWAIT``): its lanes park
until the other CTAs of the cluster, which run in the same batch, have arrived. Memory is
sequentially consistent in the interpreter, so ``.release``/``.relaxed``/``.acquire`` need no
more than this order. Outside cluster launches the cluster is the CTA itself.
"""

from __future__ import annotations

import numpy as np

from .instr import CLUSTER_WAIT, MWAIT
from .memspace import SHARED_WINDOW, WINDOW_SIZE, cluster_rank, map_cluster
from .ops_common import Mods
from .ops_mbarrier import complete_bytes
from .ops_mem import dec_red, dec_st, decode_space
from .ptxtypes import TYPES

__all__ = [
    "dec_barrier_cluster",
    "dec_getctarank",
    "dec_mapa",
    "dec_red_async",
    "dec_st_async",
    "uses_cluster_barrier",
]

_ALL_ARRIVED = np.uint32(0xFFFFFFFF)
_SH = np.uint64(SHARED_WINDOW)
_WS = np.uint64(WINDOW_SIZE)


def _arrive(st, ins, idx) -> None:
    if idx is None:
        st.carrive += np.uint32(1)
    else:
        st.carrive[idx] += np.uint32(1)
    st.mbar_epoch += 1  # a parked wait may complete now


def _complete(st, ins, idx) -> np.ndarray:
    """Which lanes' cluster-barrier phase has completed (every live thread of their cluster
    arrived at least as often as they did)."""
    counts = np.where(st.exited, _ALL_ARRIVED, st.carrive)
    least = counts.reshape(-1, st.csize * st.threads).min(axis=1)
    cl = st.block_of_lane // st.csize
    if idx is None:
        return least[cl] >= st.carrive
    return least[cl[idx]] >= st.carrive[idx]


def dec_barrier_cluster(ctx, m: Mods) -> None:
    """``barrier.cluster.arrive{.release,.relaxed}{.aligned}`` /
    ``barrier.cluster.wait{.acquire}{.aligned}`` (``cluster`` already taken)."""
    ins = ctx.ins
    if m.has("arrive"):
        m.take("release", "relaxed")
        m.take("aligned")
        m.done(frozenset())
        ctx.nops(0)
        ins.fn = _arrive
        return
    if m.has("wait"):
        m.take("acquire")
        m.take("aligned")
        m.done(frozenset())
        ctx.nops(0)
        ins.kind = MWAIT
        ins.fn = _complete
        ins.e = _complete
        ins.x = CLUSTER_WAIT
        return
    raise ctx.error("barrier.cluster is .arrive or .wait")


def _cluster_address_op(ctx, mods, nops: int):
    """The common head of mapa and getctarank: ``{.shared::cluster}.{u32,u64}`` (no state
    space: generic addresses), ``nops`` operands. Returns (generic, type)."""
    m = Mods(ctx, mods)
    space = decode_space(ctx, m)
    if space not in ("generic", "shared"):
        raise ctx.error(f"{ctx.pins.opcode} takes a shared::cluster or generic address")
    ty = m.one_type()
    m.done()
    if ty.name not in ("u32", "u64"):
        raise ctx.error(f"{ctx.pins.opcode} is .u32 or .u64")
    ctx.nops(nops)
    return space == "generic", ty


def dec_mapa(ctx, mods) -> None:
    """``mapa{.shared::cluster}.{u32,u64} d, a, rank``: the address of the variable at ``a``
    in the shared memory of the cluster's CTA ``rank`` (generic in, generic out without a
    state space). A rank outside the cluster yields an address whose accesses fault."""
    generic, ty = _cluster_address_op(ctx, mods, 3)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], ty)
    ins.a = ctx.src(ctx.ops[1], ty)
    ins.b = ctx.src(ctx.ops[2], TYPES["u32"])
    dtype = ty.dtype

    def h(st, ins, idx) -> None:
        a = np.asarray(ins.a.get(st, idx), np.uint64)
        rank = ins.b.get(st, idx)
        if generic:
            inside = (a >= _SH) & (a < _SH + _WS)
            mapped = map_cluster((a - _SH).astype(np.int64), rank).astype(np.uint64) + _SH
            out = np.where(inside, mapped, a)
        else:
            out = map_cluster(a.astype(np.int64), rank)
        ins.d.put(st, idx, _lanes(np.asarray(out).astype(dtype), idx, st))

    ins.fn = h


def dec_getctarank(ctx, mods) -> None:
    """``getctarank{.shared::cluster}.{u32,u64} d, a``: the rank of the CTA whose shared memory
    ``a`` names (a generic address outside shared memory names the executing CTA)."""
    generic, ty = _cluster_address_op(ctx, mods, 2)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], TYPES["u32"])
    ins.a = ctx.src(ctx.ops[1], ty)

    def h(st, ins, idx) -> None:
        a = np.asarray(ins.a.get(st, idx), np.uint64)
        if generic:
            inside = (a >= _SH) & (a < _SH + _WS)
            a = np.where(inside, a - _SH, np.uint64(0))
        ins.d.put(st, idx, cluster_rank(st, a.astype(np.int64), idx))

    ins.fn = h


def dec_st_async(ctx, mods) -> None:
    """``st.async{.weak}{.cluster}.shared::cluster.mbarrier::complete_tx::bytes{.v2,.v4}.type
    [addr], value, [mbar]``: a store into (another CTA's) shared memory that completes its
    bytes on the mbarrier at ``mbar`` (in the destination's CTA)."""
    _completing_on_mbarrier(ctx, mods, dec_st)


def dec_red_async(ctx, mods) -> None:
    """``red.async{.relaxed}{.cluster}.shared::cluster.mbarrier::complete_tx::bytes.op.type
    [addr], value, [mbar]``: a reduction on (another CTA's) shared memory completing its bytes
    on the mbarrier at ``mbar``."""
    _completing_on_mbarrier(ctx, mods, dec_red)


def _completing_on_mbarrier(ctx, mods, decode) -> None:
    """The ordinary store or reduction (``decode``), performed at issue as the bulk copies
    are, then its bytes completed on the mbarrier named by the third operand."""
    rest = [x for x in mods if x != "async"]
    if "mbarrier::complete_tx::bytes" not in rest or "shared::cluster" not in rest:
        raise ctx.unsupported(f"`{ctx.pins.opcode}` (async forms complete on an mbarrier)")
    rest.remove("mbarrier::complete_tx::bytes")
    if len(ctx.ops) != 3:
        raise ctx.error(f"{ctx.pins.opcode} takes an address, a value and an mbarrier")
    types = [TYPES[x] for x in rest if x in TYPES]
    if len(types) != 1:
        raise ctx.error("expected exactly one type modifier")
    nbytes = types[0].size * (4 if "v4" in rest else 2 if "v2" in rest else 1)
    mbar = ctx.address(ctx.ops[2])
    ctx.ops = ctx.ops[:2]
    decode(ctx, rest)
    ins = ctx.ins
    access = ins.fn

    def h(st, ins, idx) -> None:
        access(st, ins, idx)
        n = st.n if idx is None else idx.size
        complete_bytes(st, mbar, "shared", idx, np.full(n, nbytes, np.int64))

    ins.fn = h


def uses_cluster_barrier(code) -> bool:
    """Whether decoded ``code`` holds a cluster barrier (its launches then track exits)."""
    return any(ins.fn is _arrive or ins.x is CLUSTER_WAIT for ins in code)


def _lanes(v: np.ndarray, idx, st) -> np.ndarray:
    """A per-lane value for the lanes ``idx`` (a uniform result broadcast)."""
    if v.ndim:
        return v
    return np.broadcast_to(v, (st.n if idx is None else idx.size,))
