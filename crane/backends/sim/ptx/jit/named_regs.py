"""Registers written without ``%``, as the interpreter reads them: resolved before lowering.

Why: inline PTX in CUDA libraries declares registers inside a ``{ }`` block under plain names
(CUB: ``{ .reg .b32 lo, hi; mov.b64 {lo, hi}, %rd10; ... }``). The parser gives such an
operand as a name, and the interpreter looks a name up as a register first
(:meth:`crane.backends.sim.ptx.decode` ``src``/``dst``); the compiler took only ``%`` forms and
refused those kernels. Here every name operand that the instruction's scope declares as a
register becomes a register operand, on a copy of the function (the parsed one is the
interpreter's too).
"""

from __future__ import annotations

import dataclasses

from ..parser import Function, Instr

__all__ = ["resolve_named_regs"]

_NESTED = ("vec", "list", "texref")


def _op(op, scope):
    kind = op[0]
    if kind == "name" and op[1] != "_" and scope.reg(op[1]) is not None:
        return ("reg", op[1])
    if kind in _NESTED:
        items = [_op(x, scope) for x in op[1]]
        return (kind, items, *op[2:]) if items != op[1] else op
    if kind in ("mem", "not"):
        inner = _op(op[1], scope)
        return (kind, inner, *op[2:]) if inner is not op[1] else op
    if kind == "pair":
        a, b = _op(op[1], scope), _op(op[2], scope)
        return (kind, a, b, *op[3:]) if (a, b) != (op[1], op[2]) else op
    return op


def resolve_named_regs(fn: Function) -> Function:
    """``fn``, or a copy whose register names are register operands (see the module)."""
    body = fn.body or []
    out = []
    changed = False
    for s in body:
        if isinstance(s, Instr) and isinstance(s.operands, list):
            ops = [_op(o, s.scope) for o in s.operands]
            if any(a is not b for a, b in zip(ops, s.operands, strict=True)):
                s = dataclasses.replace(s, operands=ops)
                changed = True
        out.append(s)
    return dataclasses.replace(fn, body=out) if changed else fn
