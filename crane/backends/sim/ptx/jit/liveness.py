"""Which registers are live across each barrier of a kernel.

A lane that reaches ``bar.sync`` returns to the block loop and later resumes after it; only the
registers it may still read must survive in the save area. Saving every register at every
barrier made a tiled matmul (a hundred registers, two barriers per tile) spend its time copying
registers, so the lowering saves and restores the live ones only.

Classic backward data flow over the instruction-level control-flow graph. A register is *used*
by any operand that is not the destination (a guard predicate included) and *defined* by the
destination of an unguarded instruction; a guarded definition may not happen, so it defines
nothing. Unknown operand shapes count as uses, which can only make the sets larger (safe).
"""

from __future__ import annotations

from ..parser import Function, Instr, Label

__all__ = ["dest_src", "live_after"]

#: opcodes with no destination operand: every register operand is a use
_NO_DEST = frozenset({"st", "bra", "bar", "barrier", "ret", "exit", "red", "prefetch"})


def reg_uids(op, scope, out: set[int]) -> None:
    """Register uids named anywhere in operand ``op``."""
    kind = op[0]
    if kind == "reg":
        r = scope.reg(op[1])
        if r is not None:
            out.add(r.uid)
    elif kind == "mem":
        reg_uids(op[1], scope, out)
    elif kind in ("vec", "list", "texref"):
        for x in op[1]:
            reg_uids(x, scope, out)
    elif kind == "not":
        reg_uids(op[1], scope, out)
    elif kind == "pair":
        reg_uids(op[1], scope, out)
        reg_uids(op[2], scope, out)


def dest_src(ins: Instr) -> tuple[set[int], set[int]]:
    """(registers ``ins`` writes, registers it reads, its guard included), whether or not the
    guard lets the write happen."""
    dst: set[int] = set()
    src: set[int] = set()
    ops = ins.operands if isinstance(ins.operands, list) else []
    if ins.guard is not None:
        r = ins.scope.reg(ins.guard[0])
        if r is not None:
            src.add(r.uid)
    op = ins.opcode.split(".")[0]
    if op in _NO_DEST or not ops:
        for o in ops:
            reg_uids(o, ins.scope, src)
        return dst, src
    dest = ops[0]
    for o in ops[1:]:
        reg_uids(o, ins.scope, src)
    reg_uids(dest, ins.scope, dst if dest[0] in ("reg", "vec", "pair") else src)
    return dst, src


def _use_def(ins: Instr) -> tuple[set[int], set[int]]:
    dst, src = dest_src(ins)
    if ins.guard is not None:  # a guarded definition may not happen: it defines nothing
        return src | dst, set()
    return src, dst


def live_after(fn: Function) -> dict[int, frozenset[int]]:
    """``id(instruction) -> uids of the registers live right after it``, for every
    instruction of ``fn``'s body."""
    body = fn.body or []
    code = [s for s in body if isinstance(s, Instr)]
    label_at: dict[str, int] = {}
    i = 0
    for s in body:
        if isinstance(s, Label):
            label_at[s.name] = i
        else:
            i += 1
    n = len(code)
    succ: list[list[int]] = []
    info = [_use_def(ins) for ins in code]
    for k, ins in enumerate(code):
        op = ins.opcode.split(".")[0]
        nxt = [k + 1] if k + 1 < n else []
        if op == "bra":
            ops = ins.operands if isinstance(ins.operands, list) else []
            tgt = [label_at[o[1]] for o in ops if o[0] == "name" and o[1] in label_at]
            tgt = [t for t in tgt if t < n]
            succ.append(tgt + nxt if ins.guard is not None else tgt)
        elif op in ("ret", "exit") and ins.guard is None:
            succ.append([])
        else:
            succ.append(nxt)
    live_in: list[frozenset[int]] = [frozenset()] * n
    live_out: list[frozenset[int]] = [frozenset()] * n
    changed = True
    while changed:
        changed = False
        for k in range(n - 1, -1, -1):
            out: set[int] = set()
            for s in succ[k]:
                out |= live_in[s]
            uses, defs = info[k]
            new_in = frozenset(uses | (out - defs))
            if new_in != live_in[k] or len(out) != len(live_out[k]):
                live_in[k] = new_in
                live_out[k] = frozenset(out)
                changed = True
    return {id(ins): live_out[k] for k, ins in enumerate(code)}
