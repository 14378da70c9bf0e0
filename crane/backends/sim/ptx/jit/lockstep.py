"""Warp-synchronous ``.volatile`` shared accesses in compiled kernels: a stop before each.

Why: legacy warp-synchronous code (the ``if (tid < 32) { vs[tid] += vs[tid + 32]; ...}`` tail
of the classic shared-memory reduction, on a ``volatile`` array with no ``__syncwarp``) relies
on a warp's lanes running in lockstep: every lane's load of one step happens before any lane's
store of it, and every store before the next step's loads. Published programs are full of it
(reduction samples, older scans and histograms), and kernels holding it ran wholly
interpreted. Compiled, a block's lanes run one after another, so each such access gets a
*lockstep stop* in front of it: a warp-level stop with no operands and no result
(:mod:`.warp`'s ``lockstep`` site). The warp's settle runs the lanes at the lowest stop first,
each to its next stop, so the lanes of a warp make one ``.volatile`` access each, in lane
order, before any of them makes the next one; what they do between two such accesses touches
only their own registers (or memory the program does not share within the warp without
``volatile``, which CUDA leaves unordered). That is the interpreter's lockstep order for every
access the program marked ``volatile``.

Which accesses: ``ld``/``st`` with ``.volatile`` on ``.shared`` or on a generic address (which
may point into shared memory). ``.volatile`` on ``.global`` needs no stop: a warp-synchronous
array lives in shared memory, and global ``volatile`` is how blocks publish to each other
(:mod:`.ops_order`'s atomics, :mod:`.spin`'s yield points).

Each stop costs the lane a save and restore of its live registers (a few ns each), against
the whole kernel interpreted before.
"""

from __future__ import annotations

import dataclasses

from ..parser import Function, Instr

__all__ = ["LOCKSTEP_OP", "is_lockstep", "needs_lockstep", "with_lockstep"]

#: the added stop's opcode (no PTX instruction is called so)
LOCKSTEP_OP = "lockstep"
#: state spaces whose ``.volatile`` accesses need no stop
_OWN_SPACES = frozenset({"global", "local", "param", "const"})


def needs_lockstep(ins) -> bool:
    """Whether ``ins`` is a ``.volatile`` ld/st on shared memory or a generic address."""
    if not isinstance(ins, Instr):
        return False
    parts = ins.opcode.split(".")
    if parts[0] not in ("ld", "st") or "volatile" not in parts:
        return False
    return not _OWN_SPACES.intersection(parts)


def is_lockstep(ins) -> bool:
    return isinstance(ins, Instr) and ins.opcode == LOCKSTEP_OP


def with_lockstep(fn: Function) -> Function:
    """``fn``, or a copy with a lockstep stop right before each access :func:`needs_lockstep`
    (after any label in front of it, so a branch there stops too). The stop is unguarded: a
    guarded access's lanes all stop, as they all step past it in lockstep."""
    body = fn.body or []
    if not any(needs_lockstep(s) for s in body):
        return fn
    out: list = []
    for s in body:
        if needs_lockstep(s):
            out.append(Instr(s.line, None, LOCKSTEP_OP, [], s.scope, f"lockstep (`{s.text}`)"))
        out.append(s)
    return dataclasses.replace(fn, body=out)
