"""A yield point where a loop around barriers is left, so its exit path is a region of its own.

Why: the vector rounds (:mod:`.lower`) run a region's code for every lane with both sides of
each branch if-converted. The region after a tiled matmul's second barrier ends either at the
first barrier again (the next tile) or, in the last round only, in the exit path that stores
``C[...] = acc``; the reduction's tree rounds likewise end at their barrier or, once, in
``if (tid == 0) partial[bid] = s[0]``. That exit path's address, checks and masked store
(the reduction's: a gather and a scalar store per lane) ran in every round. With a ``yield``
(:mod:`.spin`'s stop that waits on nobody) on the loop's way out, the exit path is a region
run once per block, and the loop's rounds no longer carry it.

A yield changes only when the lanes that leave the loop run their exit path relative to the
block's other lanes: no barrier separates them, so any order is one CUDA allows (a race-free
kernel gives the same results; the PTX suite's diff mode checks them against the
interpreter). Where lanes leave in different rounds (a divergent exit: the others go round
again to the barrier, which on CUDA no longer waits for lanes that exited), the yielded
lanes run their exit path in the next round, before the lanes at the barrier go on (rounds
after a yield run only yielded lanes): the order the code had without the yield, one round
later. Added only where the exit path accesses memory (a ``ret`` alone would cost a round
for nothing), and in no kernel with warp-level instructions: their stops settle a warp's
lanes together, and a yield would split a warp's lanes across rounds where the kernel may
expect them to meet at a collective.
"""

from __future__ import annotations

import dataclasses

from ..parser import Function, Instr, Label
from .regions import STOPS
from .spin import YIELD_OP
from .warp import is_warp_stop

__all__ = ["with_exit_yields"]


def with_exit_yields(fn: Function) -> Function:
    """``fn``, or a copy with a ``yield`` after each conditional branch back of a loop that
    holds a barrier, where the code the branch falls through to reaches a load or store
    before a stop or an exit."""
    body = fn.body or []
    if any(isinstance(s, Instr) and is_warp_stop(s) for s in body):
        return fn
    labels = {s.name: i for i, s in enumerate(body) if isinstance(s, Label)}
    at: set[int] = set()
    for i, s in enumerate(body):
        if not isinstance(s, Instr) or s.guard is None or s.opcode.split(".")[0] != "bra":
            continue
        ops = s.operands if isinstance(s.operands, list) else []
        head = labels.get(ops[0][1]) if ops and ops[0][0] == "name" else None
        if head is None or head > i or not _has_barrier(body[head:i]):
            continue
        if _reaches_memory(body, i + 1):
            at.add(i)
    if not at:
        return fn
    out: list = []
    for i, s in enumerate(body):
        out.append(s)
        if i in at:
            out.append(Instr(s.line, None, YIELD_OP, [], s.scope, f"{YIELD_OP} (loop exit)"))
    return dataclasses.replace(fn, body=out)


def _has_barrier(code) -> bool:
    return any(isinstance(s, Instr) and s.opcode.split(".")[0] in ("bar", "barrier") for s in code)


def _reaches_memory(body, start: int) -> bool:
    """Whether the code from ``start`` that falls through (labels and conditional branches
    passed, up to an unconditional branch, a stop or an exit) holds a load or store."""
    for s in body[start:]:
        if not isinstance(s, Instr):
            continue
        op = s.opcode.split(".")[0]
        if op in ("ld", "st"):
            return True
        if op in STOPS or (op in ("bra", "ret", "exit") and s.guard is None):
            return False
    return False
