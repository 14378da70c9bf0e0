"""Kernel parameters read through a computed address: ``ld.param`` from a register holding a
parameter's ``.param`` offset, and generic addresses in the param window (``cvta.param``).

Why: nvcc indexes an array passed by value (a struct parameter with an array member, CUB's and
cuBLASLt's small tables) by taking the parameter's address and adding a lane-dependent offset,
which a compile-time check cannot bound. The access is checked at run time as the
interpreter's :func:`..memspace._param` does: inside the parameter buffer (its length less the
8 bytes of padding the launch appends), then aligned; a store faults (kernel parameters are
read-only) with the interpreter's wording, which the runner builds from the fault's space.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..memspace import PARAM_WINDOW
from ..parser import Instr
from . import layout as L
from .irtypes import I1, I8P, c64

if TYPE_CHECKING:
    from ..parser import Function
    from .lower import KernelLowering

__all__ = ["param_ptr", "uses_param_window"]


def uses_param_window(fn: Function) -> bool:
    """Whether the kernel makes generic addresses of its parameters (``cvta.param``): only
    then do generic accesses test for the param window."""
    return any(
        isinstance(s, Instr) and s.opcode.split(".")[0] == "cvta" and "param" in s.opcode
        for s in fn.body or []
    )


def param_ptr(k: KernelLowering, off, nbytes: int, write: bool):
    """A checked pointer into the kernel parameters at ``.param`` offset ``off`` (i64)."""
    b = k.b
    kp = k.inv[L.KPARAMS]
    if not (k.fast and k.commit):
        size = k.ctx_word(L.KPARAM_SIZE)
        out = b.or_(
            b.icmp_signed("<", off, c64(0)),
            b.icmp_signed(">", b.add(off, c64(nbytes)), size),
        )
        gen = b.add(off, c64(PARAM_WINDOW))
        space = L.SPACE_PARAM_STORE if write else L.SPACE_PARAM
        # a store faults in bounds too: the runner words it as the interpreter does
        k.fault_if(ir.Constant(I1, 1) if write else out, gen, L.KIND_ILLEGAL, nbytes, space)
        if nbytes > 1:
            mis = b.icmp_unsigned("!=", b.and_(off, c64(nbytes - 1)), c64(0))
            k.fault_if(mis, gen, L.KIND_MISALIGNED, nbytes, space)
    return b.gep(b.inttoptr(kp, I8P), [off])
