"""``bar.red`` (``__syncthreads_or``/``_and``/``_count``) in compiled kernels.

Why this shape: compiled, a block's lanes run one after another up to the barrier (the
regions of :mod:`.lower`), so no lane can see the others' predicates when it arrives. Each lane
writes its predicate to a scratch word of its save area as it stops, and computes the
reduction over the block's scratch words when it resumes — by then every lane of the block has
arrived (or exited). Which words belong to this barrier: each lane counts its arrivals (an
epoch word) and writes the slot of its epoch's parity; a lane that already went on to the next
``bar.red`` writes the other slot and cannot get further before this lane arrives there too,
so the words of lanes whose epoch reached this lane's are this barrier's, and lanes that
exited before it (their epoch lower) do not count — the interpreter reduces over the lanes
released from the barrier (ops_control._finish_red): ``popc`` counts the true predicates,
``and`` is whether all are true, ``or`` whether any is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ptxtypes import TYPES
from .irtypes import I32, I64, c64

if TYPE_CHECKING:
    from .lower import KernelLowering

__all__ = ["NRED", "is_bar_red", "lower_bar_red"]

#: scratch words per lane: the epoch, the predicate slots of even and odd epochs
NRED = 3
EPOCH, SLOT0 = 0, 1


def is_bar_red(s) -> bool:
    parts = getattr(s, "opcode", "").split(".")
    return parts[0] in ("bar", "barrier") and "red" in parts


def _word(k: KernelLowering, j, lane_delta=None):
    """Scratch word ``j`` (i64 index from the first scratch word) of this lane, or of the lane
    ``lane_delta`` places from it."""
    b = k.b
    nthreads = b.zext(b.mul(b.mul(k.ntid[0], k.ntid[1]), k.ntid[2]), I64)
    off = b.mul(nthreads, b.add(c64(k.red_base), j))
    if lane_delta is not None:
        off = b.add(off, lane_delta)
    return b.gep(k.save, [off])


def lower_bar_red(k: KernelLowering, types, mods, ops, stop) -> None:
    """Lower ``bar.red.{popc.u32,and.pred,or.pred} d, 0, {!}p`` with ``stop(k, tag, arrive)``
    (the barrier's stop; ``arrive`` runs on the lane's way out)."""
    op = [m for m in mods if m in ("popc", "and", "or")]
    k.only(mods, ("red", "sync", "aligned", *op))
    if len(op) != 1 or len(ops) != 3 or ops[1] != ("int", 0):
        raise k.refuse("bar.red form (only bar.red.{popc,and,or} d, 0, p)")
    op = op[0]
    dty = TYPES["u32"] if op == "popc" else TYPES["pred"]
    b = k.b

    def arrive() -> None:
        p = k.get(ops[2], TYPES["pred"])
        ep = _word(k, c64(EPOCH))
        e = b.load(ep)
        b.store(b.zext(p, I64), _word(k, b.add(c64(SLOT0), b.and_(e, c64(1)))))
        b.store(b.add(e, c64(1)), ep)

    stop(k, 0, arrive)
    # resumed: every lane of the block arrived or exited
    e = b.load(_word(k, c64(EPOCH)))  # this barrier's epoch + 1
    slot = b.add(c64(SLOT0), b.and_(b.sub(e, c64(1)), c64(1)))
    tx, ty, tz = (b.zext(v, I64) for v in k.tid)
    nx, ny, nz = (b.zext(v, I64) for v in k.ntid)
    me = b.add(tx, b.mul(nx, b.add(ty, b.mul(ny, tz))))
    n = b.mul(b.mul(nx, ny), nz)
    start = b.block
    head, body, done = (k.step.append_basic_block(x) for x in ("red", "red_lane", "reduced"))
    b.branch(head)
    b.position_at_end(head)
    u, cnt, tot = b.phi(I64), b.phi(I64), b.phi(I64)
    u.add_incoming(c64(0), start)
    cnt.add_incoming(c64(0), start)
    tot.add_incoming(c64(0), start)
    b.cbranch(b.icmp_unsigned("<", u, n), body, done)
    b.position_at_end(body)
    d = b.sub(u, me)
    here = b.icmp_unsigned(">=", b.load(_word(k, c64(EPOCH), d)), e)
    v = b.load(_word(k, slot, d))
    cnt.add_incoming(b.add(cnt, b.select(here, v, c64(0))), body)
    tot.add_incoming(b.add(tot, b.zext(here, I64)), body)
    u.add_incoming(b.add(u, c64(1)), body)
    b.branch(head)
    b.position_at_end(done)
    if op == "popc":
        k.put(ops[0], dty, b.trunc(cnt, I32))
    elif op == "and":
        k.put(ops[0], dty, b.icmp_unsigned("==", cnt, tot))
    else:
        k.put(ops[0], dty, b.icmp_unsigned("!=", cnt, c64(0)))
