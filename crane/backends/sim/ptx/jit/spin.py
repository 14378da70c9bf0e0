"""Spin-waits, found before lowering: on atomics refused, on ordered loads given yield points.

Why: compiled, the lanes of a block run one after another up to their next barrier (see
:mod:`.lower`), so a lane that loops until an atomic returns what a *later* lane of its own
block will store (a flag, a ticket, a lock held across the wait) loops for ever: the later
lane never runs. On a GPU (independent thread scheduling) and in the interpreter (lanes in
lockstep) the other lane makes progress and the loop ends. Such a kernel therefore runs
interpreted, with its reason logged, instead of timing out.

The test is syntactic and errs on the safe side: an ``atom`` inside a loop (the instructions
from a label to a later branch back to it) whose result reaches, through the loop's own
instructions, the guard of a branch in that loop. Atomics whose result only feeds addresses or
values (tickets, histograms, stream compaction) are not affected.

One shape is exempt, the compare-and-swap *retry* (``atomicCAS`` emulating an atomic the
hardware lacks: a float ``atomicMax``, a multiply, a 16-bit add through its word, a bfloat16
``atomicAdd`` before sm_90; PyTorch's ``gpuAtomicMax`` is one): a loop whose ``atom.cas``
compares against register ``R``, whose only way back is its last branch, taken when ``setp``
finds ``R`` and the CAS's result ``D`` unequal (compared before the loop changes ``R``), whose
other branches go forward inside it (a rounding step's if/else) and nothing enters its middle
from outside, and which sets ``R`` only from ``D`` (at its head, before any branch, or after
the comparison). Each retry then starts from the value the failed attempt saw, so the loop waits on
no other thread: it ends as soon as nobody else wrote the word between two of its attempts,
and lanes run one after another cannot starve it. A spin lock (``while (atomicCAS(lock, 0, 1)
!= 0)``: the compared value is fixed) is not that shape and stays refused.

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
    """The first ``atom`` of ``fn`` that a loop waits on (see the module), or None. A branch
    that gets a yield point (the back of a loop waiting on an ordered load) lets the lanes it
    waits on run, so an atomic's result reaching only such branches is no spin-wait: the
    shape of cooperative groups' grid.sync() (one ``atom.add.release`` arrival, then an
    ``ld.acquire`` loop comparing with what it returned) inside a loop of grid barriers."""
    yielding = frozenset(id(bra) for bra, _ in _waits(fn, waitable_load))
    for _, waited in _waits(fn, _is_atom, yielding):
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


def _waits(fn: Function, source, yielding: frozenset[int] = frozenset()):
    """(branch back, instruction) for each loop of ``fn`` that waits on an instruction
    ``source`` selects: the loop's branch guards depend on its result (the guards of the
    branches in ``yielding``, ids, not counted)."""
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
            found = _waited_on(code, info, start, end, source, label_at, yielding)
            if found is not None:
                yield ins, found
                break


def _waited_on(
    code: list[Instr],
    info: list,
    start: int,
    end: int,
    source,
    label_at: dict[str, int],
    yielding: frozenset[int] = frozenset(),
) -> Instr | None:
    """The instruction ``source`` selects in loop ``code[start..end]`` whose result reaches a
    branch guard in it (``label_at``: the function's labels' instruction indices; branches
    in ``yielding`` not counted)."""
    body = range(start, end + 1)
    for a in body:
        if not source(code[a]) or not info[a][0] or _cas_retry(code, info, start, end, a, label_at):
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
            if (
                ins.opcode.split(".")[0] == "bra"
                and ins.guard is not None
                and id(ins) not in yielding
            ):
                r = ins.scope.reg(ins.guard[0])
                if r is not None and r.uid in tainted:
                    return code[a]
    return None


def _reg(ins: Instr, op) -> int | None:
    """The uid of register operand ``op`` of ``ins`` (None: not a register)."""
    if op[0] != "reg":
        return None
    r = ins.scope.reg(op[1])
    return None if r is None else r.uid


def _targets(ins: Instr, label_at: dict[str, int]) -> list[int]:
    """The instruction indices branch ``ins`` may go to."""
    ops = ins.operands if isinstance(ins.operands, list) else []
    return [label_at.get(o[1], -1) for o in ops if o[0] == "name"]


def _forward_only(code: list[Instr], start: int, end: int, label_at: dict[str, int]) -> bool:
    """Whether the branches into loop ``code[start..end]``'s inside (past its head) are all
    forward branches of its own (the if/else of a rounding step), none leaves it but the back
    branch at ``end``, and none comes in from elsewhere."""
    for k, ins in enumerate(code):
        if ins.opcode.split(".")[0] != "bra" or k == end:
            continue
        for t in _targets(ins, label_at):
            inside = start <= k <= end
            if inside and not k < t <= end:
                return False  # backward, or out of the loop before its end
            if not inside and start < t <= end:
                return False  # into the loop's middle
    return True


def _cas_retry(
    code: list[Instr], info: list, start: int, end: int, a: int, label_at: dict[str, int]
) -> bool:
    """Whether ``code[a]`` is the compare-and-swap of a retry loop ``code[start..end]`` (see
    the module): its compared register R set only from the CAS's result D, after the
    comparison (the loop's tail) or at the loop's head before any branch or label (where the
    next attempt starts from what the last one saw); forward branches inside the loop (the
    rounding of a bfloat16 ``atomicAdd`` emulated with a 16-bit CAS) are allowed."""
    cas = code[a]
    parts = cas.opcode.split(".")
    ops = cas.operands if isinstance(cas.operands, list) else []
    if parts[0] != "atom" or "cas" not in parts or len(ops) != 4 or cas.guard is not None:
        return False
    d, r = _reg(cas, ops[0]), _reg(cas, ops[2])
    back = code[end]
    if d is None or r is None or d == r or back.guard is None:
        return False
    p = back.scope.reg(back.guard[0])
    if not _forward_only(code, start, end, label_at):
        return False
    inner = sorted(t for t in label_at.values() if start < t <= end)
    setp_at = None
    branched = False  # a forward branch seen (the head's straight line has ended)
    copied = False  # R := D seen: the next attempt compares against what this one saw
    for k in range(start, end + 1):
        ins, (dst, _src) = code[k], info[k]
        op = ins.opcode.split(".")[0]
        if op in ("ret", "exit"):
            return False
        if op == "bra" and k != end:
            branched = True
            continue
        if ins.guard is not None and k != end and dst & {r, d}:
            return False
        if r in dst:  # R is set only from D: at the head, or after the CAS and comparison
            iops = ins.operands if isinstance(ins.operands, list) else []
            if op != "mov" or len(iops) != 2 or _reg(ins, iops[1]) != d:
                return False
            head = k < a and not branched and not any(t <= k for t in inner)
            if not head and (setp_at is None or k < setp_at):
                return False
            copied = True
        if d in dst and k != a:
            return False
        if p is not None and p.uid in dst:
            if setp_at is not None or ins.guard is not None or not a < k:
                return False
            iops = ins.operands if isinstance(ins.operands, list) else []
            mods = set(ins.opcode.split(".")[1:])
            pair = {_reg(ins, o) for o in iops[1:3]} if len(iops) == 3 else set()
            taken_unequal = ("ne" in mods) != back.guard[1]  # @p with ne, @!p with eq
            if op != "setp" or pair != {r, d} or not ({"ne", "eq"} & mods) or not taken_unequal:
                return False
            setp_at = k
    return setp_at is not None and copied
