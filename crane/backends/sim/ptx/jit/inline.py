"""Device-function calls in compiled kernels: each direct call replaced by the callee's body.

Why: nvcc keeps some functions out of line even at -O3, and they are everywhere in real
code: CUDA's own double-precision math (``sin``/``cos`` reach ``__internal_trig_reduction_
slowpathd``, ``pow`` ``__internal_accurate_pow``, ``lgamma`` ``__internal_lgamma_pos``),
``__noinline__`` helpers, large functions called from several places. A kernel holding one
such call ran wholly interpreted. Inlining at the PTX level, before lowering, leaves one flat
body, so every other part of the compiler (regions and stops, liveness, the vector forms,
bounds checks and faults with their PTX lines) sees ordinary code.

An inlined copy gets registers of its own (a function's register ids are unique only within
it, so each copy's are renumbered above the caller's), its labels renamed, ``ret`` turned
into a branch to the end of the copy, and its ``.param`` parameters and return values
resolved to the call site's ``.param`` variables: the callee's ``ld.param [f_param_0]`` reads
what the caller's ``st.param [param0]`` stored, its ``st.param [func_retval0]`` writes what
the caller's ``ld.param [retval0]`` reads (:mod:`.ops` keeps those variables as per-lane
cells). The callee's ``.local`` frame keeps its own offset in the lane's local area (the
interpreter's layout: every reachable function's frame has a fixed place), so its addresses
and bounds checks are the interpreter's.

Not taken (the kernel runs interpreted, the refusal says why): recursion (direct or mutual),
calls through a register (virtual functions, function pointers), and kernels that would grow
past :data:`MAX_INSTRUCTIONS` instructions inlined.
"""

from __future__ import annotations

import dataclasses
import itertools

from ..parser import Function, Instr, Label, RegDecl, Scope, VarDecl
from .lockstep import needs_lockstep
from .ops_order import waitable_load
from .refusal import Refusal
from .warp import WARP_OPS

__all__ = ["MAX_INSTRUCTIONS", "inline_calls"]

#: the most instructions a kernel may have with its calls inlined (its compile time grows with
#: it: about 4 ms an instruction; the interpreter runs anything bigger)
MAX_INSTRUCTIONS = 20_000


def _call_parts(ins: Instr) -> tuple[list, str, list] | None:
    """(return value operands, callee name, argument operands) of a direct ``call``, or None
    for another form (a call through a register: ``call (r), %rd, (a), prototype``)."""
    ops = ins.operands if isinstance(ins.operands, list) else []
    rets: list = []
    i = 0
    if ops and ops[0][0] == "list":
        rets, i = ops[0][1], 1
    if len(ops) < i + 1 or ops[i][0] != "name":
        return None
    args = ops[i + 1][1] if len(ops) > i + 1 and ops[i + 1][0] == "list" else []
    if len(ops) > i + 2:
        return None
    return rets, ops[i][1], args


class _Inliner:
    def __init__(self, funcs: dict[str, Function], fn: Function) -> None:
        self.funcs = funcs
        self.count = itertools.count()
        self.flat: dict[str, tuple[list, list, list, list]] = {}
        self.module_scope = fn.scope.parent if fn.scope is not None else None

    def flatten(self, f: Function, stack: tuple[str, ...]) -> tuple[list, list, list, list]:
        """(body, regs, locals, shared) of ``f`` with its calls inlined; register ids unique
        within the result."""
        got = self.flat.get(f.name)
        if got is not None:
            return got
        body: list = []
        regs = list(f.regs)
        locals_ = list(f.locals)
        shared = list(f.shared)
        next_uid = max((r.uid for r in regs), default=-1) + 1
        total = 0
        for s in f.body or []:
            callee = self._callee(s, f, stack)
            if callee is None:
                body.append(s)
                total += isinstance(s, Instr)
                continue
            cbody, cregs, clocals, cshared = self.flatten(callee, (*stack, callee.name))
            stop = next((x for x in cbody if _stops(x)), None)
            if stop is not None:
                raise Refusal(
                    f"a call to {callee.name}, which holds `{_one_line(stop)}` (a lane stops "
                    "there: the call's parameters would not survive it)",
                    s.line,
                )
            copy, new_regs = self.instance(s, callee, cbody, cregs, next_uid)
            next_uid += max((r.uid for r in cregs), default=-1) + 1
            body.extend(copy)
            regs.extend(new_regs)
            locals_.extend(v for v in clocals if all(v is not w for w in locals_))
            shared.extend(v for v in cshared if all(v is not w for w in shared))
            total += sum(isinstance(x, Instr) for x in copy)
            if total > MAX_INSTRUCTIONS:
                raise Refusal(
                    f"{f.name} with its calls inlined (more than {MAX_INSTRUCTIONS} instructions)",
                    f.line,
                )
        got = self.flat[f.name] = (body, regs, locals_, shared)
        return got

    def _callee(self, s, f: Function, stack: tuple[str, ...]) -> Function | None:
        """The function ``s`` calls when it is a call to inline, else None; refuses the calls
        that cannot be."""
        if not isinstance(s, Instr) or s.opcode.split(".")[0] != "call":
            return None
        parts = _call_parts(s)
        if parts is None:
            raise Refusal(f"an indirect call in {f.name} (`{_one_line(s)}`)", s.line)
        callee = self.funcs.get(parts[1])
        if callee is None:
            return None  # an extern (vprintf, __assertfail, malloc): the lowering's
        if callee.name in stack:
            raise Refusal(f"a recursive call to {callee.name} (`{_one_line(s)}`)", s.line)
        if len(parts[2]) != len(callee.params) or len(parts[0]) != len(callee.rets):
            raise Refusal(f"a call to {callee.name} with the wrong arguments", s.line)
        return callee

    def instance(self, call: Instr, callee: Function, body: list, regs: list, base: int):
        """The copy of ``callee``'s flattened ``body`` for ``call``: (statements, registers)."""
        n = next(self.count)
        rets, _, args = _call_parts(call)  # type: ignore[misc]
        at = call.scope
        binds: dict[str, tuple[VarDecl, VarDecl]] = {}
        for decl, op in [
            *zip(callee.params, args, strict=True),
            *zip(callee.rets, rets, strict=True),
        ]:
            v = at.var(op[1]) if op[0] == "name" else None
            if v is None or v.space != "param":
                raise Refusal(f"a call's argument {op!r} that is no .param variable", call.line)
            binds[decl.name] = (decl, v)
        new_regs = {r.uid: RegDecl(r.name, r.type, base + r.uid) for r in regs}
        scopes: dict[int, Scope] = {}

        def scope_of(sc: Scope) -> Scope:
            got = scopes.get(id(sc))
            if got is not None:
                return got
            out = Scope(self.module_scope)
            chain = []
            s: Scope | None = sc
            while s is not None and s is not self.module_scope:
                chain.append(s)
                s = s.parent
            for c in reversed(chain):  # outer first: inner declarations shadow them
                for name, r in c.regs.items():
                    out.regs[name] = new_regs.get(r.uid, r)
                out.vars.update(c.vars)
            for name, (decl, v) in binds.items():
                if sc.var(name) is decl:
                    out.vars[name] = v
            scopes[id(sc)] = out
            return out

        labels = {s.name for s in body if isinstance(s, Label)}
        end = f"$__crane_inl{n}_end"

        def rename(op):
            if op[0] == "name" and op[1] in labels:
                return ("name", f"{op[1]}$inl{n}")
            return op

        out: list = []
        for s in body:
            if isinstance(s, Label):
                out.append(Label(f"{s.name}$inl{n}", s.line))
                continue
            sc = scope_of(s.scope)
            if s.opcode.split(".")[0] == "ret":
                out.append(
                    Instr(s.line, s.guard, "bra", [("name", end)], sc, f"bra {end} ({s.text})")
                )
                continue
            ops = s.operands
            if s.opcode.split(".")[0] == "bra" and isinstance(ops, list):
                ops = [rename(o) for o in ops]
            out.append(dataclasses.replace(s, operands=ops, scope=sc))
        out.append(Label(end, call.line))
        return out, list(new_regs.values())


def inline_calls(fn: Function, funcs: dict[str, Function]) -> Function:
    """``fn``, or a copy with every direct call to a function of ``funcs`` (those with a body)
    replaced by the callee's body (see the module); raises :class:`Refusal` for the calls
    that cannot be."""
    body = fn.body or []
    if not any(
        isinstance(s, Instr) and s.opcode.split(".")[0] == "call" and _needs(s, funcs) for s in body
    ):
        return fn
    flat_body, regs, locals_, shared = _Inliner(funcs, fn).flatten(fn, (fn.name,))
    return dataclasses.replace(fn, body=flat_body, regs=regs, locals=locals_, shared=shared)


def _needs(s, funcs: dict[str, Function]) -> bool:
    """Whether ``s`` is a call this module inlines or refuses (not one to an extern)."""
    if not isinstance(s, Instr) or s.opcode.split(".")[0] != "call":
        return False
    parts = _call_parts(s)
    return parts is None or parts[1] in funcs


def _stops(s) -> bool:
    """Whether ``s`` is or may become a stop of the lane (a barrier, a warp-level
    instruction, a lockstep access, an ordered load a waiting loop yields on)."""
    if not isinstance(s, Instr):
        return False
    op = s.opcode.split(".")[0]
    return op in ("bar", "barrier") or op in WARP_OPS or needs_lockstep(s) or waitable_load(s)


def _one_line(s: Instr) -> str:
    """The instruction's text on one line (a call's spreads over several)."""
    return " ".join(s.text.split())
