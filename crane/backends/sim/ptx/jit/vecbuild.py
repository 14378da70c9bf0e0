"""An IR builder for the vector form of a region (:mod:`.simd`): values are vectors with one
lane per thread of a group, and scalars an instruction handler makes are made vectors.

Why: the instruction handlers (:mod:`.ops`) emit one lane's arithmetic with scalar constants
and scalar target types (``ir.Constant(I32, 31)``, ``b.zext(v, I64)``, ``llvm.fma.f32``).
Given this builder and vector operands they emit the same arithmetic for a group of lanes, so
the vector form computes exactly what the scalar form computes, instruction by instruction,
with no second copy of the handlers. A scalar operand (a constant, a kernel parameter, a
symbol) is splatted; a cast's scalar target type becomes the vector of it; an intrinsic's
overloaded types are vectorized by :func:`vector_intrinsic`. Everything else (loads, stores,
branches, blocks) passes through to the wrapped builder.
"""

from __future__ import annotations

import re

from llvmlite import ir

__all__ = ["VecBuilder", "any_lane", "iota", "lanes_of", "splat", "vector_intrinsic"]

_BINARY = (
    "add", "sub", "mul", "udiv", "sdiv", "urem", "srem", "and_", "or_", "xor", "shl", "lshr",
    "ashr", "fadd", "fsub", "fmul", "fdiv", "frem",
)  # fmt: skip
_CASTS = (
    "trunc", "zext", "sext", "fptrunc", "fpext", "fptosi", "fptoui", "sitofp", "uitofp",
    "bitcast",
)  # fmt: skip


def splat(b: ir.IRBuilder, v, lanes: int):
    """``v`` in every lane of a ``lanes``-wide vector (``v`` itself if it is one)."""
    if isinstance(v.type, ir.VectorType):
        return v
    vt = ir.VectorType(v.type, lanes)
    if isinstance(v, ir.Constant) and not isinstance(v.constant, (list, tuple)):
        return ir.Constant(vt, v.constant)
    one = b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(ir.IntType(32), 0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), lanes), None)
    return b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), zeros)


def iota(ty: ir.IntType, lanes: int, scale: int = 1) -> ir.Constant:
    """The constant vector ``<0, scale, 2 * scale, ...>``."""
    return ir.Constant(ir.VectorType(ty, lanes), [ir.Constant(ty, i * scale) for i in range(lanes)])


def lanes_of(b: ir.IRBuilder, mask):
    """A ``<W x i1>`` mask as a W-bit integer (bit i: lane i)."""
    return b.bitcast(mask, ir.IntType(mask.type.count))


def any_lane(b: ir.IRBuilder, mask):
    """Whether some lane of ``mask`` is set (i1)."""
    bits = lanes_of(b, mask)
    return b.icmp_unsigned("!=", bits, ir.Constant(bits.type, 0))


_SUFFIX = re.compile(r"^(i\d+|f16|f32|f64)$")


def vector_intrinsic(name: str, lanes: int) -> str:
    """An overloaded intrinsic's name for ``lanes``-wide vectors of its types:
    ``llvm.fma.f32`` -> ``llvm.fma.v16f32``, ``llvm.fptosi.sat.i32.f64`` ->
    ``llvm.fptosi.sat.v16i32.v16f64``."""
    return ".".join(f"v{lanes}{p}" if _SUFFIX.match(p) else p for p in name.split("."))


class VecBuilder:
    """Wraps an :class:`ir.IRBuilder` (``raw``): arithmetic, comparisons, selects and casts
    take scalar operands as splats and scalar target types as vectors of ``lanes``; calls
    splat the arguments the callee takes as vectors. Other methods are the raw builder's."""

    def __init__(self, raw: ir.IRBuilder, lanes: int) -> None:
        self.raw = raw
        self.lanes = lanes
        for name in _BINARY:
            setattr(self, name, self._binary(name))
        for name in _CASTS:
            setattr(self, name, self._cast(name))

    def __getattr__(self, name: str):
        return getattr(self.raw, name)

    def vec(self, v):
        return splat(self.raw, v, self.lanes)

    def vtype(self, ty):
        return ty if isinstance(ty, ir.VectorType) else ir.VectorType(ty, self.lanes)

    def _binary(self, name: str):
        op = getattr(self.raw, name)

        def emit(a, c, name: str = "", flags=()):
            return op(self.vec(a), self.vec(c), name=name, flags=flags)

        return emit

    def _cast(self, name: str):
        op = getattr(self.raw, name)

        def emit(v, ty, name: str = ""):
            return op(self.vec(v), self.vtype(ty), name=name)

        return emit

    def icmp_signed(self, cmpop, a, c, name: str = ""):
        return self.raw.icmp_signed(cmpop, self.vec(a), self.vec(c), name=name)

    def icmp_unsigned(self, cmpop, a, c, name: str = ""):
        return self.raw.icmp_unsigned(cmpop, self.vec(a), self.vec(c), name=name)

    def fcmp_ordered(self, cmpop, a, c, name: str = "", flags=()):
        return self.raw.fcmp_ordered(cmpop, self.vec(a), self.vec(c), name=name, flags=flags)

    def fcmp_unordered(self, cmpop, a, c, name: str = "", flags=()):
        return self.raw.fcmp_unordered(cmpop, self.vec(a), self.vec(c), name=name, flags=flags)

    def select(self, cond, a, c, name: str = "", flags=()):
        return self.raw.select(self.vec(cond), self.vec(a), self.vec(c), name=name, flags=flags)

    def not_(self, v, name: str = ""):
        return self.raw.not_(self.vec(v), name=name)

    def neg(self, v, name: str = ""):
        return self.raw.neg(self.vec(v), name=name)

    def fneg(self, v, name: str = "", flags=()):
        return self.raw.fneg(self.vec(v), name=name, flags=flags)

    def call(self, fn, args, name: str = "", **kw):
        params = fn.function_type.args
        args = [
            self.vec(a) if isinstance(p, ir.VectorType) else a
            for a, p in zip(args, params, strict=True)
        ]
        return self.raw.call(fn, args, name=name, **kw)
