"""Spin-waits on atomics, which the compiled schedule cannot run: found before lowering.

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
"""

from __future__ import annotations

from ..parser import Function, Instr, Label
from .liveness import dest_src

__all__ = ["spin_wait"]


def spin_wait(fn: Function) -> Instr | None:
    """The first ``atom`` of ``fn`` that a loop waits on (see the module), or None."""
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
            found = _waited_on(code, info, start, end)
            if found is not None:
                return found
    return None


def _waited_on(code: list[Instr], info: list, start: int, end: int) -> Instr | None:
    body = range(start, end + 1)
    for a in body:
        if code[a].opcode.split(".")[0] != "atom" or not info[a][0]:
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
