"""Operands of a lane's code: registers, immediates, symbols and special registers read and
written by the instruction handlers (:mod:`.ops`), shared by the two forms that lower a PTX
thread: one lane as scalar code (:class:`.lower.KernelLowering`) and a group of lanes as
vectors (:class:`.simd.SimdRegion`).

Why one class for both: an operand's meaning (widths, immediates' encodings, which special
registers exist, what is refused) must be the same in both forms, or a kernel would compute
differently depending on which form runs a region. The forms differ in what a value is (a
scalar, or one vector with a lane per thread; the builder makes scalars vectors there) and in
how a register is written (:meth:`LaneOperands.write_reg`: the vector form writes only the
lanes that run the instruction).
"""

from __future__ import annotations

from llvmlite import ir

from ..ops_common import IGNORED_MODS
from ..ptxtypes import TYPES, PtxType
from . import layout as L
from .irtypes import (
    F32,
    I1,
    I32,
    I64,
    SPECIAL_GEOM,
    Refusal,
    float_of,
    ity,
    lane_type,
    resize,
    storage_bits,
    vty,
)

__all__ = ["IGNORED", "LaneOperands", "split_opcode"]

#: qualifiers that change nothing when one thread runs at a time (caching, hints, scopes of
#: relaxed accesses): the interpreter's list without the ones through which threads or blocks
#: wait on each other (``.volatile``, acquire/release ordering), which only ld/st take
#: (:mod:`.ops_order`); ``.relaxed`` stays here for atomics (ld/st make it an atomic access)
IGNORED = IGNORED_MODS - {"volatile", "acquire", "release", "acq_rel", "sc", "mmio", "unified"}


def split_opcode(opcode: str) -> tuple[str, list[PtxType], list[str]]:
    """An opcode's name, its types and its other modifiers."""
    parts = opcode.split(".")
    types, mods = [], []
    for p in parts[1:]:
        if p in TYPES:
            types.append(TYPES[p])
        else:
            mods.append(p)
    return parts[0], types, mods


class LaneOperands:
    """Reading and writing a lane's operands. Users provide ``b`` (the builder), ``ins`` (the
    instruction being lowered), ``regs`` (register uid -> its storage), ``tid``/``ntid``/
    ``ctaid``/``nctaid`` (the geometry values), ``kparam_offsets``, ``slot_of`` (a variable's
    symbol slot), :meth:`symbol_value` and :meth:`write_reg`."""

    ins: object
    b: ir.IRBuilder
    regs: dict

    def symbol(self, name: str):
        """The address of variable ``name`` (i64): a kernel parameter's .param offset, a
        module variable's device address or a shared variable's offset (per launch)."""
        assert self.ins is not None
        var = self.ins.scope.var(name)
        if var is None:
            raise self.refuse(f"unknown symbol {name}")
        if var.space == "param":
            off = self.kparam_offsets.get(id(var))
            if off is None:
                raise self.refuse(f"parameter {name}")
            return ir.Constant(I64, off)
        slot = self.slot_of(var)
        if slot is None:
            raise self.refuse(f"the address of .{var.space} variable {name}")
        return self.symbol_value(slot, var)

    def symbol_value(self, slot: int, var):  # pragma: no cover - provided by the lowering
        raise NotImplementedError

    def write_reg(self, uid: int, v) -> None:
        """Store ``v`` (already of the register's storage type) to register ``uid``."""
        self.b.store(v, self.regs[uid])

    def refuse(self, what: str) -> Refusal:
        ins = self.ins
        if ins is None:
            return Refusal(what, None)
        return Refusal(f"{what} in `{ins.text}`", ins.line)

    def fname(self, ty) -> str:
        """An intrinsic's name suffix for float type ``ty`` (the lane type of a vector)."""
        return "f32" if lane_type(ty) == F32 else "f64"

    def regdecl(self, name: str):
        assert self.ins is not None
        r = self.ins.scope.reg(name)
        if r is None:
            raise self.refuse(f"unknown register {name}")
        return r

    def special(self, name: str):
        b = self.b
        axis = "xyz".index(name[-1]) if name[-2] == "." else 0
        if name.startswith("%tid."):
            return self.tid[axis]
        if name.startswith("%ntid."):
            return self.ntid[axis]
        if name.startswith("%ctaid."):
            return self.ctaid[axis]
        if name.startswith("%nctaid."):
            return self.nctaid[axis]
        lin = b.add(
            self.tid[0],
            b.mul(self.ntid[0], b.add(self.tid[1], b.mul(self.ntid[1], self.tid[2]))),
        )
        if name == "%laneid":
            return b.and_(lin, ir.Constant(I32, 31))
        if name.startswith("%lanemask_"):
            eq = b.shl(ir.Constant(I32, 1), b.and_(lin, ir.Constant(I32, 31)))
            lt = b.sub(eq, ir.Constant(I32, 1))
            le = b.or_(lt, eq)
            return {"eq": eq, "lt": lt, "le": le, "ge": b.not_(lt), "gt": b.not_(le)}[name[10:]]
        return b.lshr(lin, ir.Constant(I32, 5))  # %warpid

    def envreg(self, n: int):
        """``%envreg<n>`` (i32): what the driver hands a kernel in its launch environment. Only
        a cooperative launch's grid-sync workspace is ever set, its address split as
        ``%envreg1`` (high) : ``%envreg2`` (low), as the interpreter has it (state.py); every
        other one, and both outside a cooperative launch, 0 (nvcc's grid.sync() then traps)."""
        if n not in (1, 2):
            return ir.Constant(I32, 0)
        b = self.b
        w = self.ctx_word(L.GRID_WS)
        return b.trunc(b.lshr(w, ir.Constant(I64, 32)) if n == 1 else w, I32)

    def get(self, op, t: PtxType):
        """Operand ``op`` as a value of PTX type ``t`` (registers must have its width)."""
        b = self.b
        vt = vty(t)
        kind = op[0]
        if kind == "reg":
            name = op[1]
            if name in SPECIAL_GEOM:
                v = self.special(name)
                if t.kind in ("f", "pred"):
                    raise self.refuse(f"{name} read as .{t.name}")
                return resize(b, v, t.bits, signed=False)
            if name.startswith("%envreg") and name[7:].isdigit() and int(name[7:]) < 32:
                if t.kind in ("f", "pred"):
                    raise self.refuse(f"{name} read as .{t.name}")
                return resize(b, self.envreg(int(name[7:])), t.bits, signed=False)
            if name.startswith("%") and self.ins.scope.reg(name) is None:
                raise self.refuse(f"special register {name}")
            r = self.regdecl(name)
            if storage_bits(r.type) != storage_bits(t):
                raise self.refuse(f"register {name} of .{r.type.name} used as .{t.name}")
            v = b.load(self.regs[r.uid])
            if t.kind == "pred":
                return v
            if t.bits < lane_type(v.type).width:  # an 8-bit type in 16-bit storage
                v = b.trunc(v, ity(t.bits))
            return b.bitcast(v, vt) if t.kind == "f" else v
        if kind == "not":
            if t.kind != "pred":
                raise self.refuse("negated non-predicate operand")
            return b.not_(self.get(op[1], t))
        if kind == "int":
            if t.kind == "f":
                raise self.refuse("integer immediate for a float operand")
            if t.kind == "pred":
                return ir.Constant(I1, 1 if op[1] else 0)
            return ir.Constant(vt, op[1] & ((1 << t.bits) - 1))
        if kind in ("f32", "f64"):
            val = float_of(op)
            if t.kind == "f":
                return ir.Constant(vt, val)
            if t.kind == "pred":
                raise self.refuse("float immediate for a predicate")
            bits = op[1] if (kind == "f32") == (t.bits == 32) else None
            if bits is None:
                raise self.refuse("float immediate of another width")
            return ir.Constant(vt, bits)
        if kind == "name":
            return resize(b, self.symbol(op[1]), t.bits, signed=False)
        raise self.refuse(f"operand {op!r}")

    def put(self, op, t: PtxType, v) -> None:
        """Write value ``v`` (of PTX type ``t``) to destination register ``op``."""
        b = self.b
        if op[0] == "reg" and op[1] == "_":
            return
        if op[0] != "reg":
            raise self.refuse(f"destination {op!r}")
        r = self.regdecl(op[1])
        if storage_bits(r.type) != storage_bits(t):
            raise self.refuse(f"register {op[1]} of .{r.type.name} written as .{t.name}")
        if t.kind == "f":
            v = b.bitcast(v, ity(t.bits))
        st = ity(storage_bits(t))
        if t.kind != "pred" and lane_type(v.type).width < st.width:
            v = b.sext(v, st) if t.kind == "s" else b.zext(v, st)
        self.write_reg(r.uid, v)

    def only(self, mods, allowed=()) -> None:
        left = [m for m in mods if m not in allowed and m not in IGNORED]
        if left:
            raise self.refuse(f"modifier .{'.'.join(left)}")

    def one_type(self, types, bytes_ok: bool = False) -> PtxType:
        """The instruction's one type; 8-bit types only where ``bytes_ok`` (ld/st)."""
        if len(types) != 1:
            raise self.refuse("expected one type")
        t = types[0]
        sizes = (1, 8, 16, 32, 64) if bytes_ok else (1, 16, 32, 64)
        if t.kind not in ("u", "s", "b", "f", "pred") or t.bits not in sizes:
            raise self.refuse(f"type .{t.name}")
        return t
