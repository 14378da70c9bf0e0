"""Shared-memory accesses of the two-pass vector regions proven in bounds once per block.

Why: a tiled matmul's FMA region reads 32 shared words per lane per tile through addresses
that depend on nothing but the lane's geometry (``As + 64 * tid.y + 4 * k``, ``Bs + 4 * tid.x
+ 64 * k``), and the two-pass form (:mod:`.lower`) checked each one per lane and per round
(bounds, alignment, the load predicated on its check): more instructions than the FMAs. Those
addresses are the same in every round of a block, so their checks are done once, before the
block's first round, for every lane of the block; the vector rounds then access them without
a check or a condition, and a block where some lane's address fails runs its rounds in the
scalar form, whose checks are exact (the fault, if a lane gets there, is the interpreter's).

Which accesses (:func:`static_accesses`): a ``.shared`` ``ld``/``st`` without a guard in the
first basic block of a vector region (every lane that runs the region runs it, so a failing
lane would fault there anyway and the scalar fallback costs nothing that matters), and in no
other block of one, whose address is a symbol, an immediate, or a register computed again
after stops (:func:`.lower.rematerializable`: defined once, from parameters, geometry,
symbols and immediates) whose definition dominates the access. The proof
(:func:`build_proof`) computes those registers per lane as the lane's code does, and checks
each group of accesses through one 32-bit register at its lowest and highest offset (the
register is zero-extended, so the offsets cannot wrap), alignment once per group where the
offsets agree modulo the access size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..parser import Instr, Label
from . import layout as L
from .irtypes import I1, I8, I32, I64, I64P, c64, counted_loop, ity, storage_bits
from .regions import region_blocks, stop_indices

if TYPE_CHECKING:
    from .lower import KernelLowering, _Driver

__all__ = ["build_proof", "emit_proof", "static_accesses"]


def static_accesses(k: KernelLowering) -> frozenset[int]:
    """``id()`` of the accesses the vector regions take unchecked (the module's docstring)."""
    from .lower import _Dominance

    body = k.fn.body or []
    if not k.vec_regions:
        return frozenset()
    labels = {s.name: i for i, s in enumerate(body) if isinstance(s, Label)}
    stops = stop_indices(body)
    index = {id(s): i for i, s in enumerate(body)}
    def_at = {uid: index[id(ins)] for ins, uid in k.prefix}
    dom = _Dominance(body)
    taken: set[int] = set()
    other: set[int] = set()
    for r in k.vec_regions:
        start = 0 if r == 0 else stops[r - 1] + 1
        blocks = region_blocks(body, labels, start)
        if blocks is None:
            return frozenset()
        first = blocks[start].instrs if start in blocks else []
        for lead, blk in blocks.items():
            for i in blk.instrs:
                if lead == start and i in first and _static(body[i], i, def_at, dom):
                    taken.add(i)
                else:
                    other.add(i)
    return frozenset(id(body[i]) for i in taken - other)


def _static(s, i: int, def_at: dict, dom) -> bool:
    if not isinstance(s, Instr) or s.guard is not None or not isinstance(s.operands, list):
        return False
    parts = s.opcode.split(".")
    if parts[0] not in ("ld", "st") or "shared" not in parts[1:]:
        return False
    mem = s.operands[0] if parts[0] == "st" else (s.operands[1] if len(s.operands) > 1 else None)
    if not isinstance(mem, tuple) or mem[0] != "mem" or not isinstance(mem[1], tuple):
        return False
    base = mem[1]
    if base[0] == "int":
        return True
    if base[0] == "name":
        var = s.scope.var(base[1]) if s.scope is not None else None
        return var is not None and var.space == "shared"
    if base[0] != "reg" or s.scope is None:
        return False
    r = s.scope.reg(base[1])
    return r is not None and r.uid in def_at and dom.dominates(def_at[r.uid], i)


def _access_bytes(k: KernelLowering, s: Instr) -> int:
    from .operands import split_opcode

    _, types, mods = split_opcode(s.opcode)
    t = k.one_type(types, bytes_ok=True)
    n = int(next((m[1] for m in mods if m in ("v2", "v4")), "1"))
    return t.bits // 8 * n


def build_proof(k: KernelLowering) -> ir.Function:
    """``i1 proof(ctx, tid.x, tid.y, tid.z, ctaid.x/y/z, invariant words..., symbols...)``:
    whether every access of ``k.static_ids`` is inside the block's shared memory and aligned
    for this lane. Lowered with ``k``'s own operand rules (the step's state is put back)."""
    body = k.fn.body or []
    statics = [s for s in body if id(s) in k.static_ids]
    nsym = len(k.sym_slots)
    fty = ir.FunctionType(I1, [I64P] + [I32] * 6 + [I64] * (len(L.INVARIANT) + nsym))
    f = ir.Function(k.mod, fty, "shared_proof")
    f.linkage = "internal"
    f.attributes.add("alwaysinline")
    keep = {a: getattr(k, a) for a in _STATE}
    try:
        k.step = f
        k.ctx = f.args[0]
        k.tid, k.ctaid = tuple(f.args[1:4]), tuple(f.args[4:7])
        ninv = 7 + len(L.INVARIANT)
        k.inv = dict(zip(L.INVARIANT, f.args[7:ninv], strict=True))
        k.sym_args = dict(zip(k.sym_slots, f.args[ninv:], strict=True))
        k.entry = f.append_basic_block("entry")
        k.b = b = ir.IRBuilder(k.entry)
        k.fast = k.commit = False
        k._params, k._syms, k.param_cells, k.carry = {}, {}, {}, None
        k.regs = {}
        for r in k.fn.regs:
            k.regs[r.uid] = b.alloca(ity(storage_bits(r.type)))
        k.ntid = tuple(k.ctx_word(L.NTID + i, I32) for i in range(3))
        k.nctaid = tuple(k.ctx_word(L.GRID + i, I32) for i in range(3))
        run = f.append_basic_block("run")
        b.branch(run)  # the entry block keeps the allocas and the parameter loads
        b.position_at_end(run)
        need: set[int] = set()
        for s in statics:
            base = (s.operands[0] if s.opcode.startswith("st") else s.operands[1])[1]
            if base[0] == "reg":
                uid = s.scope.reg(base[1]).uid
                need |= {uid} | k.remat[uid]
        for ins, uid in k.prefix:
            if uid in need:
                k.ins = ins
                k.lower(ins)
        ok = _checks(k, statics)
        k.ins = None
        b.ret(ok)
    finally:
        for a, v in keep.items():
            setattr(k, a, v)
    return f


#: the lowering state :func:`build_proof` borrows and puts back
_STATE = (
    "step", "ctx", "tid", "ctaid", "inv", "sym_args", "entry", "b", "fast", "commit",
    "_params", "_syms", "param_cells", "carry", "regs", "ntid", "nctaid", "ins",
)  # fmt: skip


def _checks(k: KernelLowering, statics: list):
    """The lane's accesses in bounds and aligned: per group of accesses through one 32-bit
    register with one size and offsets equal modulo it, the lowest and highest offset only;
    any other access alone."""
    b = k.b
    size = k.ctx_word(L.SHARED_SIZE)
    groups: dict[tuple, list] = {}
    for s in statics:
        k.ins = s
        mem = s.operands[0] if s.opcode.startswith("st") else s.operands[1]
        n = _access_bytes(k, s)
        base, off = mem[1], mem[2]
        r = k.regdecl(base[1]) if base[0] == "reg" else None
        if r is not None and storage_bits(r.type) <= 32:
            key: tuple = (r.uid, n, off % n)
        else:
            key = (id(s),)
        groups.setdefault(key, []).append((s, mem, n))
    ok = ir.Constant(I1, 1)
    for members in groups.values():
        lo = min(members, key=lambda m: m[1][2])
        hi = max(members, key=lambda m: m[1][2] + m[2])
        k.ins = lo[0]
        _, a_lo = k.address(lo[1], "shared")
        k.ins = hi[0]
        _, a_hi = k.address(hi[1], "shared")
        bad = b.or_(
            b.icmp_signed("<", a_lo, c64(0)),
            b.icmp_signed(">", b.add(a_hi, c64(hi[2])), size),
        )
        n = lo[2]
        if n > 1:
            bad = b.or_(bad, b.icmp_unsigned("!=", b.and_(a_lo, c64(n - 1)), c64(0)))
        ok = b.and_(ok, b.not_(bad))
    return ok


def emit_proof(k: KernelLowering, d: _Driver, nthreads):
    """In the driver, before a block's first round: whether ``k.proof`` holds for every lane
    of the block (an ``i1``)."""
    b, f = d.b, d.f
    with b.goto_entry_block():
        acc = b.alloca(I8, name="proven")
    b.store(ir.Constant(I8, 1), acc)
    bx, by, bz = d.ntid

    def lane(x, y, z) -> None:
        tid = [b.trunc(v, I32) for v in (x, y, z)]
        r = b.call(k.proof, [d.ctx, *tid, *d.ctaid, *d.inv])
        b.store(b.and_(b.load(acc), b.zext(r, I8)), acc)

    counted_loop(
        b, f, bz, lambda z: counted_loop(b, f, by, lambda y: counted_loop(
            b, f, bx, lambda x: lane(x, y, z))))  # fmt: skip
    return b.icmp_unsigned("!=", b.load(acc), ir.Constant(I8, 0))
