"""Extended-precision integer arithmetic in compiled kernels: the carry flag.

Why: ``add.cc``/``addc``, ``sub.cc``/``subc`` and ``mad.cc``/``madc`` chain 32- or 64-bit
words through the condition code's carry flag (CC.CF): multi-word integers, and CUDA's own
double-precision argument reduction (``sin``/``cos`` of large doubles reach
``__internal_trig_reduction_slowpathd``, a chain of ``mad.lo.cc``/``madc.hi.cc``). A kernel
holding one ran wholly interpreted.

The flag is one bit per lane, a cell in the lane's step function (zero when a lane starts, as
the interpreter's); the adder is the interpreter's (``ops_int._carry_sum``): the sum of the
operands and the carry in, modulo 2**bits, and its carry out; subtraction adds the complement
and keeps a *borrow* (``sub.cc``: a - b = a + ~b + 1, CF = 1 - carry; ``subc``: a - (b + CF)).
Only forms with ``.cc`` write the flag. Nothing keeps it across a lane's stop (a barrier or a
warp-level instruction): compilers end a carry chain before one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..ptxtypes import PtxType
from .irtypes import I1

if TYPE_CHECKING:
    from .lower import KernelLowering

__all__ = ["lower_addsub_carry", "lower_mad_carry"]


def _adder(k: KernelLowering, bits: int, a, c, cin):
    """(``(a + c + cin) mod 2**bits``, carry out) for ``bits``-wide ``a``, ``c``, an i1 ``cin``."""
    b = k.b
    w = ir.IntType(bits + 1)
    s = b.add(b.add(b.zext(a, w), b.zext(c, w)), b.zext(cin, w))
    return b.trunc(s, ir.IntType(bits)), b.trunc(b.lshr(s, ir.Constant(w, bits)), I1)


def _checked(k: KernelLowering, t: PtxType) -> None:
    if t.kind not in ("u", "s", "b") or t.bits not in (32, 64):
        raise k.refuse(f"carry arithmetic on .{t.name}")


def lower_addsub_carry(k: KernelLowering, sub: bool, carry_in: bool, t: PtxType, mods, ops) -> None:
    """``add.cc``, ``addc{.cc}``, ``sub.cc``, ``subc{.cc}``."""
    k.only(mods, ("cc",))
    _checked(k, t)
    if len(ops) != 3:
        raise k.refuse("operand count")
    b = k.b
    a, c = k.get(ops[1], t), k.get(ops[2], t)
    flag = k.carry_flag()
    cin = b.load(flag) if carry_in else ir.Constant(I1, 0)
    if sub:
        c = b.not_(c)
        cin = b.not_(cin) if carry_in else ir.Constant(I1, 1)
    s, cout = _adder(k, t.bits, a, c, cin)
    if "cc" in mods:
        b.store(b.not_(cout) if sub else cout, flag)
    k.put(ops[0], t, s)


def lower_mad_carry(k: KernelLowering, carry_in: bool, t: PtxType, mods, ops, mul_mode) -> None:
    """``mad{.lo,.hi}.cc`` and ``madc{.lo,.hi}{.cc}``: the product's low or high half plus
    ``c`` (and the carry in); ``mul_mode(k, t, mode, a, b)`` is ``mul``'s half."""
    k.only(mods, ("lo", "hi", "cc"))
    _checked(k, t)
    if len(ops) != 4:
        raise k.refuse("operand count")
    mode = "hi" if "hi" in mods else "lo"
    b = k.b
    _, p = mul_mode(k, t, mode, k.get(ops[1], t), k.get(ops[2], t))
    flag = k.carry_flag()
    cin = b.load(flag) if carry_in else ir.Constant(I1, 0)
    s, cout = _adder(k, t.bits, p, k.get(ops[3], t), cin)
    if "cc" in mods:
        b.store(cout, flag)
    k.put(ops[0], t, s)
