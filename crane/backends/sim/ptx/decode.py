"""Parsed module → decoded program: every instruction becomes an :class:`~.instr.Ins` once.

Layout decisions made here, once per module:

* all functions' instructions are concatenated into one code array; a PC is an index into it;
* each function gets its own register files (so a call needs no register saving, except to a
  function on a cycle of the call graph — see :func:`_check_recursion`) and its own parameter
  area (``.param`` parameters, return values and the ``.param`` variables of its call sites);
* variable addresses become *symbol slots*, valued per launch (module globals) or per kernel
  (shared and local layouts, see :mod:`.program`).

The opcode table (:mod:`.opcodes`) maps each mnemonic to a decoder from one of the ``ops_*``
modules; a decoder reads the modifiers and operands through :class:`Ctx` and fills the ``Ins``.
Anything a decoder does not understand raises :class:`~.errors.PtxUnsupported` naming the
instruction and its line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .calls import function_address
from .errors import PtxError, PtxUnsupported
from .instr import BRA, CALL, Ins
from .operands import CastReg, Dynamic, Imm, Reg, Sink, Special, Sym, Uniform
from .parser import Function, Instr, Label, Module, RegDecl, VarDecl
from .ptxtypes import TYPES, PtxType
from .state import storage_width, view_id

__all__ = ["SPECIAL_REGS", "Ctx", "Decoded", "FuncInfo", "decode_module"]

_PER_LANE = {
    "%tid.x",
    "%tid.y",
    "%tid.z",
    "%ctaid.x",
    "%ctaid.y",
    "%ctaid.z",
    "%laneid",
    "%warpid",
    "%smid",
    "%lanemask_eq",
    "%lanemask_lt",
    "%lanemask_le",
    "%lanemask_ge",
    "%lanemask_gt",
    # the CTA's cluster and its place in it (each CTA its own 1x1x1 cluster outside cluster
    # launches)
    "%clusterid.x",
    "%clusterid.y",
    "%clusterid.z",
    "%cluster_ctaid.x",
    "%cluster_ctaid.y",
    "%cluster_ctaid.z",
    "%cluster_ctarank",
}
_UNIFORM = {
    "%ntid.x",
    "%ntid.y",
    "%ntid.z",
    "%nctaid.x",
    "%nctaid.y",
    "%nctaid.z",
    "%nwarpid",
    "%nsmid",
    "%gridid",
    "%dynamic_smem_size",
    "%total_smem_size",
    "%aggr_smem_size",
    "%reserved_smem_offset_begin",
    "%reserved_smem_offset_end",
    "%reserved_smem_offset_cap",
    "%reserved_smem_offset_0",
    "%reserved_smem_offset_1",
    "%current_graph_exec",
    "%nclusterid.x",
    "%nclusterid.y",
    "%nclusterid.z",
    "%cluster_nctaid.x",
    "%cluster_nctaid.y",
    "%cluster_nctaid.z",
    "%cluster_nctarank",
    "%is_explicit_cluster",
    # performance-monitor counters: the simulator counts no events (pmevent is a no-op)
    *(f"%pm{i}" for i in range(8)),
    *(f"%pm{i}_64" for i in range(8)),
    # driver-supplied launch environment; %envreg1:%envreg2 is the grid-sync workspace
    *(f"%envreg{i}" for i in range(32)),
}
_DYNAMIC = {"%clock", "%clock_hi", "%clock64", "%globaltimer", "%globaltimer_lo", "%globaltimer_hi"}
SPECIAL_REGS = _PER_LANE | _UNIFORM | _DYNAMIC


@dataclass
class FuncInfo:
    fid: int
    fn: Function
    entry_pc: int = -1
    end_pc: int = -1
    rows: dict[int, tuple[int, int]] = field(default_factory=dict)  # reg uid -> (width, row)
    counts: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # 16, 32, 64, pred
    pm: dict[int, int] = field(default_factory=dict)  # id(VarDecl) -> offset in param area
    pm_size: int = 0
    callees: set[int] = field(default_factory=set)
    used_slots: set[int] = field(default_factory=set)
    labels: dict[str, int] = field(default_factory=dict)
    builtin: str | None = None
    #: On a cycle of the call graph: a call saves its frame (see frames.py).
    recursive: bool = False


@dataclass
class Decoded:
    code: list[Ins]
    funcs: dict[str, FuncInfo]
    by_fid: dict[int, FuncInfo]
    slots: list[tuple]  # symbol slot keys
    module: Module
    slot_index: dict[tuple, int]
    kparam_offsets: dict[int, int]


class Ctx:
    """What a decoder sees: the instruction being decoded and operand-resolution helpers."""

    def __init__(self, dec: _Decoder, fi: FuncInfo, pins: Instr, ins: Ins) -> None:
        self._dec = dec
        self.fi = fi
        self.pins = pins
        self.ins = ins
        self.ops = pins.operands
        self.line = pins.line

    # ---- errors --------------------------------------------------------------------------
    def unsupported(self, what: str) -> PtxUnsupported:
        return PtxUnsupported(f"{what} in `{self.pins.text}`", self.line)

    def error(self, what: str) -> PtxError:
        return PtxError(f"{what} in `{self.pins.text}`", self.line)

    def nops(self, *counts: int) -> None:
        if len(self.ops) not in counts:
            raise self.error(f"expected {' or '.join(map(str, counts))} operands")

    # ---- operands ------------------------------------------------------------------------
    def regdecl(self, name: str) -> RegDecl | None:
        return self.pins.scope.reg(name)

    def _reg(self, decl: RegDecl, ty: PtxType, name: str) -> Reg:
        _width, row = self.fi.rows[decl.uid]
        rb = decl.type.bits
        if ty.kind == "pred" or decl.type.kind == "pred":
            if ty.kind != decl.type.kind:
                raise self.error(f"{name} used as {ty.name}")
            return Reg(self.fi.fid, 8, row, name)
        if storage_width(rb) == storage_width(ty.bits) and ty.bits != 8:
            return Reg(self.fi.fid, view_id(rb, ty.kind), row, name)
        # width mismatch: read/write through the register's own integer view
        kind = "s" if ty.kind == "s" else "u"
        return CastReg(self.fi.fid, view_id(rb, kind), row, name, ty.dtype)

    def src(self, op, ty: PtxType):
        kind = op[0]
        if kind == "reg" or kind == "name":
            name = op[1]
            decl = self.regdecl(name)
            if decl is not None:
                return self._reg(decl, ty, name)
            if name in SPECIAL_REGS:
                return self.special(name, ty)
            if kind == "name" and name == "_":
                return Sink()
            var = self.pins.scope.var(name)
            if var is not None:
                return self.symbol(var, ty)
            if name in self._dec.funcs:  # a function's address (function pointers, vtables)
                return Imm(ty.dtype.type(function_address(self._dec.funcs[name].fid)))
            raise self.error(f"undeclared name {name!r}")
        if kind in ("int", "f32", "f64"):
            return Imm(imm_value(op, ty, self))
        if kind == "symoff":
            raise self.unsupported("symbol+offset operands outside an address")
        raise self.error(f"unexpected operand {op!r}")

    def dst(self, op, ty: PtxType):
        if op[0] == "name" and op[1] == "_":
            return Sink()
        if op[0] not in ("reg", "name"):
            raise self.error("destination must be a register")
        decl = self.regdecl(op[1])
        if decl is None:
            if op[1] in SPECIAL_REGS:
                raise self.error(f"cannot write {op[1]}")
            raise self.error(f"undeclared register {op[1]!r}")
        return self._reg(decl, ty, op[1])

    def pred(self, op) -> tuple[Reg, bool]:
        """A predicate source, possibly negated (``!%p``)."""
        neg = False
        if op[0] == "not":
            neg, op = True, op[1]
        if op[0] == "int":
            raise self.unsupported("immediate predicate operand")
        r = self.src(op, TYPES["pred"])
        return r, neg

    def special(self, name: str, ty: PtxType):
        if name in _PER_LANE:
            return Special(name, ty.dtype)
        if name in _UNIFORM:
            return Uniform(name, ty.dtype)
        return Dynamic(name, ty.dtype)

    def symbol(self, var: VarDecl, ty: PtxType) -> Sym | Imm:
        if var.space == "param":
            # a kernel parameter's address is its .param-space offset in the launch's buffer
            where, off = self.param_offset(var)
            if where != "kparam":
                raise self.unsupported(
                    f"the address of device-function parameter {var.name} (it would live in "
                    ".local memory)"
                )
            return Imm(ty.dtype.type(off))
        return Sym(self._dec.slot_for(var, self.fi), var.name, ty.dtype)

    def param_offset(self, var: VarDecl) -> tuple[str, int]:
        """Where a ``.param`` variable lives: ("kparam", offset) or ("pm", offset)."""
        return self._dec.param_location(var, self.fi)

    def address(self, op) -> tuple[str, object, int]:
        """A ``[base+off]`` operand → (kind, base, offset); kind "reg", "sym", "imm", "param"."""
        if op[0] != "mem":
            raise self.error("expected an address operand [..]")
        base, off = op[1], op[2]
        if base[0] == "int":
            return "imm", np.uint64(base[1] & (2**64 - 1)), off
        name = base[1]
        decl = self.regdecl(name)
        if decl is not None:
            if decl.type.bits not in (32, 64):
                raise self.error(f"address register {name} must be 32 or 64 bits")
            ty = TYPES["u64"] if decl.type.bits == 64 else TYPES["u32"]
            return "reg", self._reg(decl, ty, name), off
        var = self.pins.scope.var(name)
        if var is None:
            raise self.error(f"undeclared name {name!r}")
        if var.space == "param":
            return "param", self.param_offset(var), off
        return "sym", self.symbol(var, TYPES["u64"]), off

    def label(self, op) -> str:
        if op[0] != "name":
            raise self.error("expected a label")
        return op[1]

    def function(self, name: str) -> FuncInfo:
        fi = self._dec.funcs.get(name)
        if fi is None:
            raise self.error(f"call to undeclared function {name!r}")
        return fi

    def callsite_param(self, op) -> tuple[int, VarDecl]:
        """A call-site ``.param`` variable (``param0``): its offset in this function's area."""
        if op[0] != "name":
            raise self.error("call arguments must be .param variables")
        var = self.pins.scope.var(op[1])
        if var is None or var.space != "param":
            raise self.unsupported(f"call argument {op[1]!r} that is not a .param variable")
        kind, off = self.param_offset(var)
        if kind != "pm":
            raise self.unsupported("passing a kernel parameter directly to a call")
        return off, var


def imm_value(op, ty: PtxType, ctx: Ctx | None = None):
    """An immediate operand as a NumPy scalar of ``ty``."""
    kind, v = op[0], op[1]
    if ty.kind == "pred":
        return np.bool_(bool(v))
    if ty.kind == "f":
        if kind == "int":
            val = float(v)
        elif kind == "f32":
            val = float(np.uint32(v).view(np.float32))
        else:
            val = float(np.uint64(v).view(np.float64))
        if ty.bits == 32 and kind == "f32":
            return np.uint32(v).view(np.float32)
        if ty.bits == 64 and kind == "f64":
            return np.uint64(v).view(np.float64)
        with np.errstate(over="ignore"):
            return ty.dtype.type(val)
    # integer / bit types (f16 etc. are raw bits)
    if kind == "f32":
        if ty.bits == 32:
            return np.uint32(v).view(np.dtype(ty.dtype))
        if ty.bits == 16 and ty.kind in ("h", "bh"):
            f = np.uint32(v).view(np.float32)
            if ty.kind == "h":
                return np.float16(f).view(np.uint16)
        raise (ctx.error if ctx else PtxError)("float immediate for an integer type")
    if kind == "f64":
        if ty.bits == 64:
            return np.uint64(v).view(np.dtype(ty.dtype))
        raise (ctx.error if ctx else PtxError)("float immediate for an integer type")
    bits = 64 if ty.bits > 64 else ty.bits
    u = v & ((1 << bits) - 1)
    if ty.kind == "s" and u >= 1 << (bits - 1):
        u -= 1 << bits
    return ty.dtype.type(u)


class _Decoder:
    def __init__(self, mod: Module, info=None) -> None:
        self.mod = mod
        self.info = info
        self.funcs: dict[str, FuncInfo] = {}
        self.by_fid: dict[int, FuncInfo] = {}
        self.code: list[Ins] = []
        self.slots: list[tuple] = []
        self.slot_index: dict[tuple, int] = {}
        self.kparam_offsets: dict[int, int] = {}
        self.fixups: list[tuple[Ins, FuncInfo, str]] = []

    def slot_for(self, var: VarDecl, fi: FuncInfo) -> int:
        if var.space in ("global", "const"):
            key: tuple = ("global", var.name)
        elif var.space == "shared":
            if var.extern:
                key = ("dynshared",)
            elif var.name in self.mod.scope.vars and self.mod.scope.vars[var.name] is var:
                key = ("shared", var.name)
            else:
                key = ("fshared", fi.fid, var.name)
        elif var.space == "local":
            key = ("local", fi.fid, var.name)
        else:
            raise PtxUnsupported(f"the address of .{var.space} variable {var.name}", var.line)
        i = self.slot_index.get(key)
        if i is None:
            i = len(self.slots)
            self.slots.append(key)
            self.slot_index[key] = i
        fi.used_slots.add(i)
        return i

    def param_location(self, var: VarDecl, fi: FuncInfo) -> tuple[str, int]:
        if fi.fn.is_entry and any(p is var for p in fi.fn.params):
            return "kparam", self.kparam_offsets[id(var)]
        off = fi.pm.get(id(var))
        if off is None:
            a = max(var.align, 1)
            off = (fi.pm_size + a - 1) // a * a
            fi.pm[id(var)] = off
            fi.pm_size = off + max(var.size, 1)
        return "pm", off

    def run(self) -> Decoded:
        from .opcodes import OPCODES

        for fid, (name, fn) in enumerate(self.mod.functions.items()):
            fi = FuncInfo(fid, fn)
            if fn.body is None:
                fi.builtin = name
            self.funcs[name] = fi
            self.by_fid[fid] = fi
            if fn.is_entry:
                einfo = self.info.entries.get(name) if self.info is not None else None
                known = {q.name: q.offset for q in einfo.params} if einfo is not None else {}
                off = 0
                for p in fn.params:
                    a = max(p.align, 1)
                    off = (off + a - 1) // a * a
                    self.kparam_offsets[id(p)] = known.get(p.name, off)
                    off += p.size
            else:
                for p in fn.params + fn.rets:
                    self.param_location(p, fi)
        for fi in self.funcs.values():
            if fi.fn.body is None:
                continue
            self._alloc_regs(fi)
            fi.entry_pc = len(self.code)
            pending: list[Instr] = []
            for item in fi.fn.body:
                if isinstance(item, Label):
                    fi.labels[item.name] = len(self.code) + len(pending)
                else:
                    pending.append(item)
            for pins in pending:
                ins = Ins(len(self.code), pins.line, pins.text, pins.opcode, fi.fid)
                self._decode(fi, pins, ins, OPCODES)
                self.code.append(ins)
            # falling off the end of a function returns
            ret = Ins(len(self.code), fi.fn.line, "ret (implicit)", "ret", fi.fid)
            from .ops_control import make_ret

            make_ret(ret)
            self.code.append(ret)
            fi.end_pc = len(self.code)
        for ins, fi, label in self.fixups:
            pc = fi.labels.get(label)
            if pc is None:
                raise PtxError(f"undefined label {label!r} in `{ins.text}`", ins.line)
            ins.x = pc
        _check_recursion(self)
        return Decoded(
            self.code,
            self.funcs,
            self.by_fid,
            self.slots,
            self.mod,
            self.slot_index,
            self.kparam_offsets,
        )

    def _alloc_regs(self, fi: FuncInfo) -> None:
        for r in fi.fn.regs:
            if r.type.kind == "pred":
                k = 3
            else:
                k = {16: 0, 32: 1, 64: 2}.get(storage_width(r.type.bits))
                if k is None:
                    raise PtxUnsupported(f"{r.type.bits}-bit register {r.name}", fi.fn.line)
            fi.rows[r.uid] = ((16, 32, 64, 1)[k], fi.counts[k])
            fi.counts[k] += 1

    def _decode(self, fi: FuncInfo, pins: Instr, ins: Ins, table) -> None:
        base = pins.opcode.split(".", 1)[0]
        spec = table.get(base)
        if spec is None:
            raise PtxUnsupported(f"instruction `{pins.opcode}` is not supported", pins.line)
        ins.cls = spec.cls
        if isinstance(pins.operands, PtxError):
            raise pins.operands
        ctx = Ctx(self, fi, pins, ins)
        mods = pins.opcode.split(".")[1:]
        if pins.guard is not None:
            gname, neg = pins.guard
            decl = pins.scope.reg(gname)
            if decl is None or decl.type.kind != "pred":
                raise PtxError(f"guard {gname} is not a predicate register", pins.line)
            ins.guard = ctx._reg(decl, TYPES["pred"], gname)
            ins.gneg = neg
        spec.decode(ctx, mods)
        if ins.kind == CALL and isinstance(ins.x, tuple) and ins.x and ins.x[0] == "call":
            callee: FuncInfo = ins.x[1]
            fi.callees.add(callee.fid)
        elif ins.kind == CALL and isinstance(ins.x, tuple) and ins.x and ins.x[0] == "icall":
            # an indirect call may reach any device function with a body
            fi.callees |= {
                f.fid for f in self.funcs.values() if not f.fn.is_entry and f.fn.body is not None
            }
        if ins.kind == BRA:  # the target label, resolved to a PC after the function
            self.fixups.append((ins, fi, ins.x))


def _check_recursion(dec: _Decoder) -> None:
    """Mark the functions on a cycle of the call graph (recursion, direct or mutual): each has
    one register file per function, so a call to one saves the callee's frame and its return
    restores it (see :mod:`.frames`). A function is on a cycle when its strongly connected
    component has more than one function or it calls itself (iterative Tarjan, linear time)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    counter = 0
    for root in dec.by_fid:
        if root in index:
            continue
        work = [(root, iter(sorted(dec.by_fid[root].callees)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(dec.by_fid[w].callees))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                for f in comp:
                    fi = dec.by_fid[f]
                    fi.recursive = len(comp) > 1 or f in fi.callees


def decode_module(mod: Module, info=None) -> Decoded:
    """Decode every function of ``mod``; ``info`` is crane.modules.ptx_info's scan of it."""
    return _Decoder(mod, info).run()
