"""Special-function instructions (``ex2``, ``lg2``, ``sin``, ``cos``, ``tanh``), ``.ftz`` and
float ``.sat``, lowered as the interpreter computes them (``ptx/ops_sfu.py``, ``ptx/fp.py``,
``ptx/ops_float.py``).

Why: nvcc's ``expf``, ``logf``, ``powf``, ``tanhf`` and the fast-math intrinsics compile to
``ex2.approx.ftz.f32`` and ``lg2.approx.ftz.f32`` (libdevice), and ``-use_fast_math`` puts
``.ftz`` on every float32 instruction, so any kernel with a softmax, a sigmoid, a GELU or an
option-pricing formula ran interpreted. The interpreter computes an ``.approx`` function in
float64 and rounds it to float32 (more accurate than the hardware's unit, within its ~2 ulp);
here the same: the float64 function (LLVM's intrinsic: the C library's ``exp2``, ``log2``,
``sin``, ``cos``, ``tanh``), then one rounding. ``.ftz`` flushes float32 subnormal operands and
results to a zero of their sign, as ``fp.ftz`` does; ``.sat`` clamps a float result to
[0, 1] (``__saturatef``, ``cvt.sat.f32.f32``), NaN to +0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..exp2poly import COEFFS, LIMIT, MAGIC
from .irtypes import F32, F64, I64, lane_type

if TYPE_CHECKING:
    from .lower import KernelLowering

__all__ = ["SFU_HANDLERS", "float_binop", "flushed", "ftz32", "ftz_f32", "sat_float"]

#: the smallest normal float32 (2**-126): below it in magnitude, ``.ftz`` flushes
F32_TINY = 2.0**-126


def ftz32(k: KernelLowering, x):
    """Flush a float32 subnormal (scalar or the lanes of a vector) to a zero of its sign (the
    interpreter's ``fp.ftz``); NaNs, zeros and normal values pass unchanged."""
    b = k.b
    fabs = k.intrinsic("llvm.fabs.f32", F32, [F32])
    tiny = b.fcmp_ordered("<", b.call(fabs, [x]), ir.Constant(F32, F32_TINY))
    cs = k.intrinsic("llvm.copysign.f32", F32, [F32, F32])
    return b.select(tiny, b.call(cs, [ir.Constant(F32, 0.0), x]), x)


def ftz_f32(k: KernelLowering, t, mods) -> bool:
    """Whether an instruction of type ``t`` with ``mods`` flushes (``.ftz`` on float32; the
    interpreter ignores it on other types, as PTX defines it only for .f32)."""
    return "ftz" in mods and t.kind == "f" and t.bits == 32


def flushed(k: KernelLowering, t, mods, f, *args):
    """``f(*args)`` as an instruction of type ``t`` with ``mods`` computes it: under ``.ftz``
    on float32, its operands and its result flushed (the interpreter's
    ``fp.ftz(f(fp.ftz(a), ...))``); otherwise unchanged."""
    if not ftz_f32(k, t, mods):
        return f(*args)
    return ftz32(k, f(*(ftz32(k, a) for a in args)))


def float_binop(k: KernelLowering, name: str, a, c):
    """``add``, ``sub``, ``mul``, ``div``, ``min`` or ``max`` of two floats (of one width,
    scalars or vectors), rounded to nearest by the type's own arithmetic. ``min``/``max`` are
    NumPy's ``fmin``/``fmax`` on arrays, which the interpreter uses: the non-NaN operand,
    else the first when it is strictly smaller (larger), else the second."""
    b = k.b
    if name == "add":
        return b.fadd(a, c)
    if name == "sub":
        return b.fsub(a, c)
    if name == "mul":
        return b.fmul(a, c)
    if name == "div":
        return b.fdiv(a, c)
    pred = "olt" if name == "min" else "ogt"
    take_a = b.or_(b.fcmp_ordered(pred, a, c), b.fcmp_unordered("uno", c, c))
    return b.select(take_a, a, c)


def sat_float(k: KernelLowering, v):
    """The interpreter's ``_sat`` of a float (scalar or vector): NaN and values below 0 give
    +0, values above 1 give 1, the rest (-0.0 included) pass unchanged."""
    b = k.b
    ty = lane_type(v.type)
    zero, one = ir.Constant(ty, 0.0), ir.Constant(ty, 1.0)
    r = b.select(b.fcmp_ordered(">", v, one), one, v)
    r = b.select(b.fcmp_ordered("<", v, zero), zero, r)
    return b.select(b.fcmp_unordered("uno", v, v), zero, r)


def exp2_f64(k: KernelLowering, x):
    """``ptx/exp2poly.py``'s ``exp2_f64`` of a float64 (scalar or vector), its operations in
    the same order (the interpreter rounds the same value on the lanes where NumPy's ``exp2``
    could round otherwise). No libm call: LLVM vectorizes it with the lane loop."""
    b = k.b
    ty = lane_type(x.type)
    lim = ir.Constant(ty, LIMIT)
    x = b.select(b.fcmp_ordered(">", x, lim), lim, x)
    x = b.select(b.fcmp_ordered("<", x, ir.Constant(ty, -LIMIT)), ir.Constant(ty, -LIMIT), x)
    n = b.call(k.intrinsic("llvm.rint.f64", F64, [F64]), [x])
    f = b.fsub(x, n)
    p = ir.Constant(ty, COEFFS[0])
    for c in COEFFS[1:]:
        p = b.fadd(b.fmul(p, f), ir.Constant(ty, c))
    n0 = b.select(b.fcmp_unordered("uno", n, n), ir.Constant(ty, 0.0), n)
    bits = b.add(b.bitcast(b.fadd(n0, ir.Constant(ty, MAGIC)), I64), ir.Constant(I64, 1023))
    scale = b.bitcast(b.shl(bits, ir.Constant(I64, 52)), F64)
    return b.fmul(p, scale)


#: the float64 function each instruction is computed with (an LLVM intrinsic: a call into the
#: C library, per lane in a vector form; ex2's is :func:`exp2_f64`)
_F64 = {
    "ex2": "",
    "lg2": "llvm.log2.f64",
    "sin": "llvm.sin.f64",
    "cos": "llvm.cos.f64",
    "tanh": "llvm.tanh.f64",
}


def _sfu(name: str):
    def h(k: KernelLowering, types, mods, ops) -> None:
        t = k.one_type(types)
        k.only(mods, ("approx", "ftz"))
        if t.kind != "f" or t.bits != 32 or len(ops) != 2:
            raise k.refuse(f"{name} form")
        b = k.b
        if name == "ex2":

            def in_f64(a):  # the interpreter's polynomial, rounded once
                return b.fptrunc(exp2_f64(k, b.fpext(a, F64)), F32)

        else:
            f = k.intrinsic(_F64[name], F64, [F64])

            def in_f64(a):  # computed in float64, rounded once
                return b.fptrunc(b.call(f, [b.fpext(a, F64)]), F32)

        k.put(ops[0], t, flushed(k, t, mods, in_f64, k.get(ops[1], t)))

    return h


SFU_HANDLERS = {name: _sfu(name) for name in _F64}
