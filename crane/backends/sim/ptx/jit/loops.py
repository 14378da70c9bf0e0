"""Iteration stops: loops inside a region run one iteration per round, vectorized over the lanes.

Why: a block's lanes run their region one after another (:mod:`.lower`), and a region's
vectorizable form needs loop-free code, so a loop that does not go around a barrier (a
grid-stride loop, a dot product, a per-thread tile loop) ran lane by lane: one scalar chain of
loads and adds per lane, its accesses gathered by no vector unit. Here the branch back of such
a loop goes through an added yield point (the :mod:`.spin` stop, tagged as a yield: the lane
waits on nobody) at an added label at the kernel's end, ``yield; bra <loop head>``. That cuts
the loop's cycle: the code from the yield's resume point (the loop's next iteration, or its
exit on to the next stop) is loop-free, and so is the code of the region the loop lies in. The
block loop then runs, round after round, every lane stopped at the loop's yield through its
next iteration, as one vectorized loop over those lanes (the lanes waiting elsewhere, at a
barrier or gone, are masked off), with the loop-carried registers in the register-major save
area (contiguous vector loads and stores), instead of each lane's whole loop in turn.

The schedule changes, not the meaning: lanes between barriers may interleave at any point in a
race-free program (on a GPU they run in lockstep, as the interpreter's lanes do; the stops make
the compiled order closer to theirs), and rounds after a yield run only yielded lanes, so no
lane passes a barrier early. A loop gets the stop only if the region after it can take the
vector form (:func:`.regions.region_loop_free`: no atomic, no ordered access, no load after a
store to the same memory, no further cycle); another loop keeps running inside its lane, as
before, since a stop per iteration would only add a save and a restore. Kernels with warp-level
instructions run their rounds scalar (:mod:`.warp`) and get no iteration stops.
"""

from __future__ import annotations

import dataclasses

from ..parser import Function, Instr, Label
from .regions import STOPS, region_loop_free
from .spin import YIELD_OP
from .warp import is_warp_stop

__all__ = ["ITERATION_LABEL", "with_iteration_stops"]

#: the added labels' prefix (one per cut loop)
ITERATION_LABEL = "$__crane_iter_"


def with_iteration_stops(fn: Function) -> Function:
    """``fn``, or a copy in which the branch back of every loop whose iteration region can
    be vectorized goes through an added ``yield`` (see the module)."""
    body = fn.body or []
    if any(isinstance(s, Instr) and is_warp_stop(s) for s in body):
        return fn
    cands = _loops_without_stops(body)
    while cands:
        out, starts = _cut(fn, body, cands)
        labels = {s.name: i for i, s in enumerate(out) if isinstance(s, Label)}
        keep = [
            c for c, at in zip(cands, starts, strict=True) if region_loop_free(out, labels, at)[0]
        ]
        if len(keep) == len(cands):
            return dataclasses.replace(fn, body=out)
        cands = keep  # a loop left uncut may make another's region cyclic: check again
    return fn


def _loops_without_stops(body) -> list[int]:
    """Indices of the branches back (to a label at or before them) whose loop span (from
    the label to the branch) holds no stop: loops around a barrier are cut already."""
    label_at = {s.name: i for i, s in enumerate(body) if isinstance(s, Label)}
    out = []
    for i, s in enumerate(body):
        if not isinstance(s, Instr) or s.opcode.split(".")[0] != "bra":
            continue
        ops = s.operands if isinstance(s.operands, list) else []
        if not ops or ops[0][0] != "name" or ops[0][1] not in label_at:
            continue
        head = label_at[ops[0][1]]
        if head > i:
            continue
        span = body[head : i + 1]
        if any(isinstance(x, Instr) and x.opcode.split(".")[0] in STOPS for x in span):
            continue
        out.append(i)
    return out


def _cut(fn: Function, body, branches: list[int]) -> tuple[list, list[int]]:
    """``body`` with each branch of ``branches`` retargeted to an added ``label: yield; bra
    <its loop head>`` at the end; and the index (in the new body) where each yield's region
    starts (its ``bra``)."""
    out = list(body)
    starts = []
    for n, i in enumerate(branches):
        s = body[i]
        head = s.operands[0][1]
        name = f"{ITERATION_LABEL}{n}"
        out[i] = dataclasses.replace(s, operands=[("name", name)])
        y = Instr(s.line, None, YIELD_OP, [], s.scope, f"{YIELD_OP} (next iteration of {head})")
        back = Instr(s.line, None, "bra", [("name", head)], s.scope, f"bra {head}")
        out += [Label(name, s.line), y]
        starts.append(len(out))
        out.append(back)
    return out, starts
