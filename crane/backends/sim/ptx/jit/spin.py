"""Spin-waits, found before lowering: on atomics refused, on ordered loads given yield points.

Why: compiled, the lanes of a block run one after another up to their next barrier (see
:mod:`.lower`), so a lane that loops until an atomic returns what a *later* lane of its own
block will store (a flag, a ticket, a lock held across the wait) loops for ever: the later
lane never runs. On a GPU (independent thread scheduling) and in the interpreter (lanes in
lockstep) the other lane makes progress and the loop ends. Such a kernel therefore runs
interpreted, with its reason logged, instead of timing out.

The test is syntactic and errs on the safe side: an ``atom`` inside a loop (the instructions
from a label to a later branch back to it) whose result reaches, through the loop's own
instructions, the guard of a branch in that loop. That also takes compare-and-swap retry loops
(``atomicCAS`` emulating an atomic on a type without one), which would have run correctly:
they run interpreted too. Atomics whose result only feeds addresses or values (tickets,
histograms, stream compaction) are not affected.

Loops waiting on a ``.volatile``/``.relaxed``/``.acquire`` load (:mod:`.ops_order`) are
compiled instead, with a *yield point* on their branch back (:func:`with_yields`): CUB's
decoupled look-back (onesweep radix sort, scans) spins so on the counts an *earlier* block
publishes, and running it interpreted costs the whole sort. Whether the producer is an earlier
block (which has finished, or runs on another core and only waits on blocks before it) or a
later lane of the same block cannot be told from the code, so the branch back of such a loop
(found as above, with the load in place of the atom) goes through an added ``yield`` that
stops the lane like a barrier stops it: it saves its live registers and returns to the block
loop, which then runs the block's other lanes up to their next stop (lanes waiting at a
barrier or a warp collective wait on: rounds after a yield run only the yielded lanes, and a
warp with a yielded lane is not settled, :mod:`.warp`), and the lane goes on from the loop's
head in the next round. A producer in the same block therefore runs; one in another block is
waited for round after round, the branch back checking the launch's stop flag (a launch with
a time limit ends with CUDA_ERROR_LAUNCH_TIMEOUT, as interpreted, if nothing ever comes).
Atomics keep the refusal above (their loops could take yield points the same way; not done:
the suite's compare-and-swap retry loops are checked against the interpreter's lane order,
which the yields' rounds would change).
"""

from __future__ import annotations

import dataclasses

from ..parser import Function, Instr, Label
from .liveness import dest_src
from .ops_order import waitable_load

__all__ = ["YIELD_OP", "spin_wait", "with_yields"]

#: the added instruction at a waiting loop's branch back (no operands; lowered as a stop)
YIELD_OP = "yield"


def spin_wait(fn: Function) -> Instr | None:
    """The first ``atom`` of ``fn`` that a loop waits on (see the module), or None."""
    for _, waited in _waits(fn, _is_atom):
        return waited
    return None


def with_yields(fn: Function) -> Function:
    """``fn``, or a copy in which every branch back of a loop that waits on an ordered load
    jumps to an added ``yield; bra <loop head>`` at the end of the body (see the module)."""
    backs = {id(bra) for bra, _ in _waits(fn, waitable_load)}
    if not backs:
        return fn
    out: list = []
    tail: list = []
    for s in fn.body or []:
        if isinstance(s, Instr) and id(s) in backs:
            head = s.operands[0][1]
            name = f"$__crane_yield_{len(tail) // 3}"
            out.append(dataclasses.replace(s, operands=[("name", name)]))
            y = Instr(s.line, None, YIELD_OP, [], s.scope, f"{YIELD_OP} (back to {head})")
            back = Instr(s.line, None, "bra", [("name", head)], s.scope, f"bra {head}")
            tail += [Label(name, s.line), y, back]
        else:
            out.append(s)
    return dataclasses.replace(fn, body=out + tail)


def _is_atom(ins: Instr) -> bool:
    return ins.opcode.split(".")[0] == "atom"


def _waits(fn: Function, source):
    """(branch back, instruction) for each loop of ``fn`` that waits on an instruction
    ``source`` selects: the loop's branch guards depend on its result."""
    code = [s for s in fn.body or [] if isinstance(s, Instr)]
    label_at: dict[str, int] = {}
    i = 0
    for s in fn.body or []:
        if isinstance(s, Label):
            label_at[s.name] = i
        else:
            i += 1
    info = [dest_src(ins) for ins in code]
    for end, ins in enumerate(code):
        if ins.opcode.split(".")[0] != "bra":
            continue
        ops = ins.operands if isinstance(ins.operands, list) else []
        starts = [
            label_at[o[1]] for o in ops if o[0] == "name" and label_at.get(o[1], end + 1) <= end
        ]
        for start in starts:
            found = _waited_on(code, info, start, end, source)
            if found is not None:
                yield ins, found
                break


def _waited_on(code: list[Instr], info: list, start: int, end: int, source) -> Instr | None:
    body = range(start, end + 1)
    for a in body:
        if not source(code[a]) or not info[a][0]:
            continue
        tainted = set(info[a][0])
        grew = True
        while grew:  # around the loop until nothing new is tainted
            grew = False
            for k in body:
                dst, src = info[k]
                if src & tainted and not dst <= tainted:
                    tainted |= dst
                    grew = True
        for k in body:
            ins = code[k]
            if ins.opcode.split(".")[0] == "bra" and ins.guard is not None:
                r = ins.scope.reg(ins.guard[0])
                if r is not None and r.uid in tainted:
                    return code[a]
    return None
