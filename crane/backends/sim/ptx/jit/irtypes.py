"""Shared pieces of the PTX→LLVM lowering: LLVM types, the lanes' return codes, the refusal,
and small value helpers used by both the kernel lowering (:mod:`.lower`) and the instruction
handlers (:mod:`.ops`)."""

from __future__ import annotations

import struct

from llvmlite import ir

from ..ptxtypes import PtxType
from .refusal import Refusal

__all__ = [
    "EXITED",
    "F32",
    "F64",
    "FAULTED",
    "I1",
    "I8",
    "I8P",
    "I16",
    "I32",
    "I64",
    "I64P",
    "SPECIAL_GEOM",
    "Refusal",
    "alloc_hit",
    "c64",
    "counted_loop",
    "float_of",
    "ity",
    "lane_type",
    "resize",
    "sanitize",
    "site_cache_locals",
    "storage_bits",
    "vty",
]

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F32, F64 = ir.FloatType(), ir.DoubleType()
I64P = I64.as_pointer()
I8P = I8.as_pointer()
#: what a lane's code returns: done, or stopped by a failed check (>= 0: the resume point
#: after that barrier)
EXITED, FAULTED = -1, -2
#: special registers the compiled code knows (the launch geometry and the lane's place in it)
SPECIAL_GEOM = {
    "%tid.x",
    "%tid.y",
    "%tid.z",
    "%ntid.x",
    "%ntid.y",
    "%ntid.z",
    "%ctaid.x",
    "%ctaid.y",
    "%ctaid.z",
    "%nctaid.x",
    "%nctaid.y",
    "%nctaid.z",
    "%laneid",
    "%warpid",
    "%lanemask_eq",
    "%lanemask_lt",
    "%lanemask_le",
    "%lanemask_ge",
    "%lanemask_gt",
}


def storage_bits(t: PtxType) -> int:
    return 1 if t.kind == "pred" else max(t.bits, 16)


def ity(bits: int) -> ir.IntType:
    return ir.IntType(bits)


def vty(t: PtxType):
    """The LLVM type values of PTX type ``t`` are computed in."""
    if t.kind == "pred":
        return I1
    if t.kind == "f":
        return F32 if t.bits == 32 else F64
    return ity(t.bits)


def c64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def sanitize(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def float_of(op) -> float:
    if op[0] == "f32":
        return struct.unpack("<f", struct.pack("<I", op[1]))[0]
    return struct.unpack("<d", struct.pack("<Q", op[1]))[0]


def lane_type(ty):
    """``ty``, or its element type when it is a vector (one lane's value in the vector form)."""
    return ty.element if isinstance(ty, ir.VectorType) else ty


def resize(b: ir.IRBuilder, v, bits: int, signed: bool):
    """``v`` (an integer, or a vector of them) truncated or extended to ``bits`` per lane; the
    vector form's builder (:mod:`.vecbuild`) makes the target type a vector."""
    w = lane_type(v.type).width
    if w == bits:
        return v
    if w > bits:
        return b.trunc(v, ity(bits))
    return b.sext(v, ity(bits)) if signed else b.zext(v, ity(bits))


def alloc_hit(b: ir.IRBuilder, addr, lo, hi, nbytes):
    """Whether an access of ``nbytes`` at ``addr`` lies inside ``[lo, hi)`` (unsigned, ``lo <=
    hi``; the operands scalars or vectors alike): the allocation checks' test.

    One comparison per address, ``addr - lo < room``, where ``room`` (``hi - lo - nbytes +
    1``, or 0 when nothing of that size fits) depends on the bounds alone, so a lane loop
    whose bounds are invariant (the vectorized lane loops' cached allocations) computes it
    once: per address a subtraction and a comparison, where the three comparisons of
    ``lo <= addr < hi``, ``hi - addr >= nbytes`` and their conjunction took five vector
    operations (a 1M-thread saxpy's three accesses: about half its lane loop). Exact: below
    ``lo``, ``addr - lo`` wraps to at least ``2**64 - lo``, above any room (``<= hi - lo``)."""
    span = b.sub(hi, lo)
    fits = b.icmp_unsigned(">=", span, nbytes)
    one, zero = ir.Constant(span.type, 1), ir.Constant(span.type, 0)
    room = b.select(fits, b.add(b.sub(span, nbytes), one), zero)
    return b.icmp_unsigned("<", b.sub(addr, lo), room)


def counted_loop(b: ir.IRBuilder, f: ir.Function, n, body, step: int = 1) -> None:
    """``for j in range(0, n, step): body(j)`` (``j``: i64) from the builder's block; ``body``
    may add blocks; the builder is left after the loop."""
    pre = b.block
    head, blk, done = (f.append_basic_block(x) for x in ("lh", "lb", "ld"))
    b.branch(head)
    b.position_at_end(head)
    j = b.phi(I64)
    j.add_incoming(c64(0), pre)
    b.cbranch(b.icmp_unsigned("<", j, n), blk, done)
    b.position_at_end(blk)
    body(j)
    j.add_incoming(b.add(j, c64(step)), b.block)
    b.branch(head)
    b.position_at_end(done)


def site_cache_locals(eb: ir.IRBuilder, ctx, site: int) -> list:
    """Locals (allocas) holding global access site ``site``'s cached allocation ``[start,
    end)``, loaded from the context where ``eb`` is (a function's entry block): the hit test
    in a loop then compares against values LLVM keeps in registers instead of reloading them
    after every possible lookup (which writes the context)."""
    from .layout import FIXED

    out = []
    for slot in (FIXED + 2 * site, FIXED + 2 * site + 1):
        p = eb.alloca(I64)
        eb.store(eb.load(eb.gep(ctx, [c64(slot)])), p)
        out.append(p)
    return out
