"""``cp.async`` (global → shared, 4, 8 or 16 bytes a thread) in compiled kernels, made at once.

Why at once: the interpreter performs each copy when the instruction runs
(:func:`..ops_mem._h_cp_async`) and makes ``cp.async.commit_group``/``wait_group``/``wait_all``
no-ops; a copy that completes before the wait is one schedule CUDA allows, and a program that
reads the destination before waiting has a race either way. The forms are the interpreter's:
an immediate ``src-size`` (the source checked for the whole copy, the bytes past ``src-size``
zero), a register ``src-size`` (capped at the copy's size; cuBLAS and CUTLASS zero-fill a
tile's rows past the matrix so) and an ``ignore-src`` predicate (true: read nothing), where
only the bytes a lane reads are checked: the source aligned to the copy's size, then its last
and its first byte (a lane reading 0 bytes may hold any address). The destination is checked
first, for the whole copy. A kernel or region with ``cp.async`` runs in the scalar form (the
two-pass vector forms defer stores; a copy is a load and a store at once): the copy of it in
the two-pass form's lane function (which holds every region's code) is never run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..ptxtypes import TYPES
from . import layout as L
from .irtypes import I1, I8P, I32, I64, c64

if TYPE_CHECKING:
    from .lower import KernelLowering

__all__ = ["CP_HANDLERS", "is_async_copy"]

#: the groups' bookkeeping: every copy is complete when issued
_WAITS = ("commit_group", "wait_group", "wait_all")
#: cache and prefetch hints, which change nothing here
_HINTS = ("ca", "cg", "L2::64B", "L2::128B", "L2::256B")


def is_async_copy(ins) -> bool:
    """Whether ``ins`` is a ``cp.async`` copy (scalar form only)."""
    parts = getattr(ins, "opcode", "").split(".")
    return parts[0] == "cp" and not set(parts[1:]) & set(_WAITS)


def _h_cp(k: KernelLowering, types, mods, ops) -> None:
    if "async" not in mods or "bulk" in mods or "mbarrier" in mods:
        raise k.refuse("cp form")
    if set(mods) & set(_WAITS):
        k.only(mods, ("async", *_WAITS))
        return
    k.only(mods, ("async", "shared", "shared::cta", "global", *_HINTS))
    if len(ops) not in (3, 4) or ops[2][0] != "int" or ops[2][1] not in (4, 8, 16):
        raise k.refuse("cp.async form")
    size = ops[2][1]
    b = k.b
    it = ir.IntType(8 * size)
    _, dst = k.address(ops[0], "shared")
    dptr = b.bitcast(k.mem_ptr("shared", dst, size, True), it.as_pointer())
    _, src = k.address(ops[1], "global")
    want = None  # bytes a lane reads, when a register or predicate says
    if len(ops) == 4:
        last = ops[3]
        decl = k.ins.scope.reg(last[1]) if last[0] == "reg" else None
        if last[0] == "not" or (decl is not None and decl.type.kind == "pred"):
            ignore = k.get(last, TYPES["pred"])  # true: read nothing
            want = b.select(ignore, ir.Constant(I32, 0), ir.Constant(I32, size))
        elif last[0] == "int":
            if not 0 <= last[1] <= size:
                raise k.refuse("cp.async src-size beyond the copy")
            if last[1] < size:
                _partial_immediate(k, dptr, src, size, last[1], it)
                return
        else:
            v = k.get(last, TYPES["u32"])
            cap = ir.Constant(I32, size)
            want = b.select(b.icmp_unsigned("<", v, cap), v, cap)
    if want is None:
        sptr = b.bitcast(k.mem_ptr("global", src, size, False), it.as_pointer())
        b.store(b.load(sptr), dptr)
        return
    _per_lane(k, dptr, src, size, want, it)


def _partial_immediate(k: KernelLowering, dptr, src, size: int, n: int, it) -> None:
    """An immediate ``src-size`` below the copy's: the source checked for the whole copy, its
    first ``n`` bytes copied, the rest zero."""
    b = k.b
    sptr = k.mem_ptr("global", src, size, False)
    b.store(ir.Constant(it, 0), dptr)
    if n:
        _memcpy(k, b.bitcast(dptr, I8P), sptr, c64(n))


def _per_lane(k: KernelLowering, dptr, src, size: int, want, it) -> None:
    """A register ``src-size`` or an ``ignore-src`` predicate: the destination zeroed, then
    ``want`` bytes read (all of them: checked as a whole copy; some: aligned, last and first
    byte checked; none: no check)."""
    b = k.b
    b.store(ir.Constant(it, 0), dptr)
    whole, part, done = (k.step.append_basic_block(x) for x in ("cp_whole", "cp_part", "cp_done"))
    some = k.step.append_basic_block("cp_some")
    b.cbranch(b.icmp_unsigned("==", want, ir.Constant(I32, size)), whole, some)
    b.position_at_end(whole)
    sptr = b.bitcast(k.mem_ptr("global", src, size, False), it.as_pointer())
    b.store(b.load(sptr), dptr)
    b.branch(done)
    b.position_at_end(some)
    b.cbranch(b.icmp_unsigned("!=", want, ir.Constant(I32, 0)), part, done)
    b.position_at_end(part)
    mis = b.icmp_unsigned("!=", b.and_(src, c64(size - 1)), c64(0))
    k.fault_if(mis, src, L.KIND_MISALIGNED, size, L.SPACE_GLOBAL)
    n = b.zext(want, I64)
    k.mem_ptr("global", b.add(src, b.sub(n, c64(1))), 1, False)
    first = k.mem_ptr("global", src, 1, False)
    _memcpy(k, b.bitcast(dptr, I8P), first, n)
    b.branch(done)
    b.position_at_end(done)


def _memcpy(k: KernelLowering, dst, src, n) -> None:
    fn = k.intrinsic("llvm.memcpy.p0.p0.i64", ir.VoidType(), [I8P, I8P, I64, I1])
    k.b.call(fn, [dst, k.b.bitcast(src, I8P), n, ir.Constant(I1, 0)])


CP_HANDLERS = {"cp": _h_cp}
