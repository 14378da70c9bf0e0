"""Local memory in compiled kernels: each lane's ``.local`` area (nvcc's ``__local_depot``
frames: local arrays, register spills, the slow paths of ``sinf``/``cosf``).

Why the layout: the interpreter gives every lane ``local_stride`` zeroed bytes (its variables at
the offsets of :mod:`..program`, which the lowering reads from the launch's symbol values like
any other variable address), checked per access against that stride. The compiled code does the
same: the runner hands a buffer of ``threads x local_stride`` bytes, the driver zeroes it when
a block starts (a lane's area then outlives its barriers), and lane ``t`` (its linear thread id)
owns bytes ``[t * stride, (t + 1) * stride)``. Generic addresses in the local window
(``cvta.local``) route here as in :func:`..memspace.resolve`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..memspace import LOCAL_WINDOW
from ..parser import Instr
from . import layout as L
from .irtypes import I64, c64

if TYPE_CHECKING:
    from ..parser import Function
    from .lower import KernelLowering

__all__ = ["LOCAL_SPACES", "lane_base", "local_ptr", "uses_local"]

#: the modifier naming the local state space on ld/st/cvta
LOCAL_SPACES = ("local",)


def uses_local(fn: Function) -> bool:
    """Whether the kernel has local memory to give its lanes: it declares ``.local``
    variables or names the space in an instruction. (A kernel that does neither keeps the
    old routing of generic addresses: nothing it computed can point into a local area.)"""
    if fn.locals:
        return True
    return any(isinstance(s, Instr) and "local" in s.opcode.split(".")[1:] for s in fn.body or [])


def lane_base(k: KernelLowering):
    """The lane's local area (an i8*), computed once in the lane's entry block."""
    got = getattr(k, "_local_base", None)
    if got is not None and got[0] is k.step:
        return got[1]
    eb = ir.IRBuilder(k.entry)
    eb.position_before(k.entry.terminator)
    tx, ty, tz = (eb.zext(v, I64) for v in k.tid)
    nx, ny = (eb.zext(v, I64) for v in k.ntid[:2])
    lin = eb.add(tx, eb.mul(nx, eb.add(ty, eb.mul(ny, tz))))
    stride = k.inv[L.LOCAL_SIZE]
    buf = eb.inttoptr(k.inv[L.LOCAL], ir.IntType(8).as_pointer())
    p = eb.gep(buf, [eb.mul(lin, stride)])
    k._local_base = (k.step, p)
    return p


def local_ptr(k: KernelLowering, off, nbytes: int):
    """Check a local access at local offset ``off`` (i64) as the interpreter's local window:
    inside the lane's stride (as a signed offset), then aligned; the fault carries the
    generic address, as the interpreter's does."""
    b = k.b
    size = k.inv[L.LOCAL_SIZE]
    if not (k.fast and k.commit):  # the fast form's committing pass was checked before
        out = b.or_(
            b.icmp_signed("<", off, c64(0)),
            b.icmp_signed(">", b.add(off, c64(nbytes)), size),
        )
        gen = b.add(off, c64(LOCAL_WINDOW))
        k.fault_if(out, gen, L.KIND_ILLEGAL, nbytes, L.SPACE_LOCAL)
        if nbytes > 1:
            mis = b.icmp_unsigned("!=", b.and_(off, c64(nbytes - 1)), c64(0))
            k.fault_if(mis, gen, L.KIND_MISALIGNED, nbytes, L.SPACE_LOCAL)
    return b.gep(lane_base(k), [off])


def zero_block_locals(b: ir.IRBuilder, memset, word, nthreads) -> None:
    """At a block's start: every lane's local area to zero (the interpreter's fresh state)."""
    buf = b.inttoptr(word(L.LOCAL), ir.IntType(8).as_pointer())
    n = b.mul(nthreads, word(L.LOCAL_SIZE))
    b.call(memset, [buf, ir.Constant(ir.IntType(8), 0), n, ir.Constant(ir.IntType(1), 0)])
