"""Which stop-delimited regions of a kernel can run as vector loops over a block's lanes.

A *stop* is an instruction at which a lane returns to the block loop and later resumes after
it: ``bar.sync`` and ``bar.red``, warp-level collectives (:mod:`.warp`) and yield points
(:mod:`.spin`). The code a lane runs from a resume point (the kernel's start, or just after a
stop) to its next stop or exit is a *region*. A region can run in the two-pass vectorizable
form (:mod:`.lower`) when what a lane may run there has no cycle and no load follows a store to
the same memory on any path: then deferring its stores to a committing pass changes nothing,
and a lane that failed a check has had no effect and can run the region again, scalar.

Why a module of its own: the question is about the kernel's code alone (no IR), and the
lowering asks it for every resume point; a change that adds stops (an iteration stop per loop
was tried in issue 18's fifth step) asks it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..parser import Instr, Label
from .liveness import dest_src
from .ops_atomic import is_atomic
from .ops_cpasync import is_async_copy
from .ops_order import is_ordered
from .spin import YIELD_OP
from .warp import WARP_OPS

__all__ = [
    "STOPS",
    "Block",
    "carried",
    "prints",
    "region_blocks",
    "region_loop_free",
    "spaces_of",
    "stop_indices",
    "successors",
]

#: instructions (opcode's first part) that end a lane's region
STOPS = frozenset({"bar", "barrier", YIELD_OP}) | WARP_OPS


def stop_indices(body) -> list[int]:
    """Indices in ``body`` of its stops, in order: stop number k (1-based) is resume point k."""
    return [
        i for i, s in enumerate(body) if isinstance(s, Instr) and s.opcode.split(".")[0] in STOPS
    ]


def successors(body, labels: dict, i: int) -> list[int] | None:
    """Where a lane goes after ``body[i]`` within its region: nowhere after a stop or an
    unguarded exit, the target (and the next instruction, if guarded) after a branch, else
    the next; None for a branch to no label of the body."""
    s = body[i]
    if not isinstance(s, Instr):
        return [i + 1]
    op = s.opcode.split(".")[0]
    if op in STOPS or (op in ("exit", "ret") and s.guard is None):
        return []
    if op != "bra":
        return [i + 1]
    ops = s.operands if isinstance(s.operands, list) else []
    target = labels.get(ops[0][1]) if ops and ops[0][0] == "name" else None
    if target is None:
        return None
    return [target] if s.guard is None else [target, i + 1]


def prints(s: Instr) -> bool:
    """A call to ``vprintf``: its output must come once per lane, so the two-pass vector
    forms (a checking pass, lanes run again) do not take it."""
    ops = s.operands if isinstance(s.operands, list) else []
    return s.opcode.split(".")[0] == "call" and ("name", "vprintf") in ops


def region_loop_free(body, labels: dict, start: int) -> tuple[bool, bool]:
    """Whether the instructions reachable from ``start`` before a stop or an exit form no
    cycle (a loop around a stop leaves its region: the branch back is fine), hold no atomic
    or ordered access, and no load is reachable from a store to the same memory; and
    whether the region stores at all."""
    succ: dict[int, list[int]] = {}
    kinds: dict[int, tuple[str, frozenset[str]]] = {}
    stack = [start]
    while stack:
        i = stack.pop()
        if i in succ or i >= len(body):
            continue
        s = body[i]
        nxt = successors(body, labels, i)
        if nxt is None:
            return False, False
        if isinstance(s, Instr):
            op = s.opcode.split(".")[0]
            if is_atomic(s) or is_ordered(s) or prints(s) or is_async_copy(s):  # scalar only
                return False, False
            if op in ("ld", "st") and ".param" not in s.opcode:
                kinds[i] = (op, spaces_of(s.opcode))
        succ[i] = [n for n in nxt if n < len(body)]
        stack.extend(succ[i])
    if _has_cycle(succ):
        return False, False
    # a load after a store to the same memory (global or shared) on some path
    for i, (op, spaces) in kinds.items():
        if op != "st":
            continue
        after: set[int] = set()
        todo = list(succ[i])
        while todo:
            n = todo.pop()
            if n in after:
                continue
            k = kinds.get(n)
            if k is not None and k[0] == "ld" and k[1] & spaces:
                return False, False
            after.add(n)
            todo.extend(succ.get(n, ()))
    return True, any(k[0] == "st" for k in kinds.values())


@dataclass
class Block:
    """A basic block of a region (:func:`region_blocks`): the body indices of its
    instructions, and where a lane that runs off its end goes (the next leader, or
    ``len(body)``: off the kernel's end, an exit)."""

    instrs: list[int]
    fall: int


def region_blocks(body, labels: dict, start: int) -> dict[int, Block] | None:
    """The basic blocks of what a lane may run from ``start`` to its next stop or exit, by
    leader (body index; body order is the order the vector form (:mod:`.simd`) schedules
    them in): a branch target, the instruction after a conditional branch, or ``start``.
    None where a branch's target is not a label of the body."""
    reach: set[int] = set()
    leaders = {start}
    stack = [start]
    while stack:
        i = stack.pop()
        if i in reach or i >= len(body):
            continue
        reach.add(i)
        nxt = successors(body, labels, i)
        if nxt is None:
            return None
        s = body[i]
        if isinstance(s, Instr) and s.opcode.split(".")[0] == "bra":
            leaders.update(nxt)  # the target, and after a conditional branch the next one
        stack.extend(nxt)
    out: dict[int, Block] = {}
    for lead in sorted(leaders & reach):
        i, instrs = lead, []
        while i < len(body) and (i == lead or i not in leaders):
            s = body[i]
            i += 1
            if isinstance(s, Instr):
                instrs.append(i - 1)
                op = s.opcode.split(".")[0]
                if op in ("bra", *STOPS) or (op in ("exit", "ret") and s.guard is None):
                    break
        out[lead] = Block(instrs, i)
    return out


def _has_cycle(succ: dict[int, list[int]]) -> bool:
    """Depth-first search with colours over the region's successor map."""
    state: dict[int, int] = {}
    for root in succ:
        if root in state:
            continue
        state[root] = 1
        path = [(root, iter(succ[root]))]
        while path:
            node, it = path[-1]
            n = next(it, None)
            if n is None:
                state[node] = 2
                path.pop()
            elif state.get(n) == 1:
                return True
            elif n not in state:
                state[n] = 1
                path.append((n, iter(succ[n])))
    return False


def spaces_of(opcode: str) -> frozenset[str]:
    """The memories an ld/st may touch: global (also .const, which lies in device memory),
    shared, or either for a generic address."""
    parts = opcode.split(".")
    if "shared" in parts:
        return frozenset({"shared"})
    if "local" in parts:
        return frozenset({"local"})
    if "global" in parts or "const" in parts:
        return frozenset({"global"})
    return frozenset({"global", "shared", "local"})


def carried(body, live: dict) -> tuple[dict[int, frozenset[int]], dict[int, frozenset[int]]]:
    """Which of the registers live across each stop (``live``: :func:`.liveness.live_after`)
    the stop saves and its resume point restores: ``({id(stop): saved}, {id(stop): restored})``.

    Why: a register no instruction of a region writes still holds, in the save area, the value
    the region started with, so a stop that region reaches need not save it again, and a
    region that neither reads nor writes it need not restore it. A tiled matmul's FMA region
    carried its tile pointers and counter through every round (restored, checked, saved)
    without touching them, and its load region the accumulator. The invariant kept: at every
    stop, the save area holds each register live after it. A stop saves a register if some
    region that reaches it writes it; a region restores a register if it reads or writes it or
    a stop it reaches saves it (the lane's own value is what is saved). The save area starts
    zeroed, as registers do, so the kernel's start needs nothing. Registers a stop itself reads
    or writes (a warp collective's, ``bar.red``'s predicate) count as the region's."""
    stops = stop_indices(body)
    labels = {s.name: i for i, s in enumerate(body) if isinstance(s, Label)}
    full = ({id(body[i]): live[id(body[i])] for i in stops},) * 2
    regions = []  # per resume point: (registers read or written, registers written, stops)
    for start in [0] + [i + 1 for i in stops]:
        seen: set[int] = set()
        touched: set[int] = set()
        written: set[int] = set()
        reached: set[int] = set()
        todo = [start]
        while todo:
            i = todo.pop()
            if i in seen or i >= len(body):
                continue
            seen.add(i)
            s = body[i]
            nxt = successors(body, labels, i)
            if nxt is None:  # a branch to no label: every register, as before
                return full
            if isinstance(s, Instr):
                dst, src = dest_src(s)
                touched |= dst | src
                written |= dst
                if s.opcode.split(".")[0] in STOPS:
                    reached.add(i)
            todo.extend(nxt)
        regions.append((touched, written, reached))
    saved = {}
    for i in stops:
        writers: set[int] = set()
        for _, written, reached in regions:
            if i in reached:
                writers |= written
        saved[i] = live[id(body[i])] & writers
    restored = {}
    for k, i in enumerate(stops, start=1):
        touched, _, reached = regions[k]
        need = set(touched)
        for j in reached:
            need |= saved[j]
        restored[id(body[i])] = live[id(body[i])] & need
    return {id(body[i]): frozenset(v) for i, v in saved.items()}, {
        k: frozenset(v) for k, v in restored.items()
    }
