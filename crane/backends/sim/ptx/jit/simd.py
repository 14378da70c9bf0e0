"""A region run W lanes at a time with explicit vectors: SIMT on SIMD, for regions with loops.

Why: a region (the code between stops, :mod:`.regions`) whose lane code has a loop cannot take
the two-pass vectorizable form (:mod:`.lower`), and LLVM will not vectorize a loop over lanes
around an inner loop; such regions ran lane after lane, a grid-stride reduction bound by one
float add chain per lane. Here a group of W consecutive lanes of a row (W: the CPU's vector
width for 32-bit values, 16 with AVX-512) runs the region's code once for the group: each
register is a ``<W x T>`` vector (:mod:`.vecbuild` makes the instruction handlers of
:mod:`.ops` emit it), each lane has a program counter (the leader of the basic block it runs
next), and the group runs the lowest one for the lanes at it (the mask), as ISPC, COX or a
GPU's reconvergence would: a uniform branch branches, a divergent one runs both sides under
masks one after the other, a loop iterates while some lane of the group is in it. A register
write changes only the masked lanes; loads and stores are masked vector accesses where the
lanes' addresses are consecutive (or the same), else masked gathers and scatters
(:mod:`.simd_mem`), with the interpreter's checks and faults per lane.

Why that schedule gives the scalar form's results: lanes of a block share no data between
barriers in a race-free program, so each lane computes what it computes alone, whatever order
its blocks run in; a lane's first failed check is its fault, and the group reports the lowest
faulting lane's, the one the scalar form (lanes in order) would have reported. Lanes leave the
region at a stop (their live registers saved, their resume word set) or at an exit.

A region is taken only if every instruction it may run is one this form has: the arithmetic
handlers of :data:`REUSED`, ``ld``/``st`` on global, const, shared and kernel-parameter memory,
``bra``, ``exit``/``ret`` and ``bar.sync 0``; any other (or a lowering that fails) leaves the
region to the scalar rounds, as before (no log line: the kernel still compiles).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from llvmlite import ir

from ..parser import Instr, Label
from ..ptxtypes import TYPES
from . import layout as L
from .irtypes import EXITED, I1, I8P, I32, I64, I64P, Refusal, c64, counted_loop, ity, storage_bits
from .operands import LaneOperands, split_opcode
from .ops import HANDLERS
from .ops_cvt import DIRECTED
from .regions import Block, region_blocks, stop_indices
from .simd_mem import lower_ldst, masked_load, masked_store
from .vecbuild import VecBuilder, any_lane, iota, splat, vector_intrinsic

if TYPE_CHECKING:
    from .lower import KernelLowering, _Driver

__all__ = ["REUSED", "SimdRegion", "emit_groups", "simd_lanes"]

#: the instruction handlers (:mod:`.ops`) the vector form runs as they are, on vectors
REUSED = frozenset(
    {"mov", "add", "sub", "mul", "mad", "fma", "min", "max", "neg", "abs", "and", "or", "xor"}
    | {"not", "shl", "shr", "setp", "selp", "cvt", "cvta", "div", "rem", "rcp", "sqrt", "rsqrt"}
    # bit instructions (a bit-field insert also joins cooperative groups' grid-sync workspace
    # address from %envreg1:%envreg2 before a grid-stride loop; hashes, radix digits)
    | {"bfi", "bfe", "popc", "clz", "brev", "bfind", "prmt", "lop3", "shf"}
    # ex2, a polynomial (ops_sfu.exp2_f64); not the other special functions: float64 C library
    # calls, made for every lane of a group, masked ones too, made a loop with uneven trip
    # counts 1.6x slower than the scalar rounds
    | {"ex2"}
)

#: every instruction the vector form has: the reused handlers and its own
_TAKEN = REUSED | {"ld", "st", "bra", "ret", "exit", "bar", "barrier"}

#: a lane's program counter once it left the region (above every leader)
DONE = 0x7FFFFFFF


def simd_lanes() -> int:
    """Lanes per group: 16 where the CPU has AVX-512 (16 x 32 bits a register), else 8;
    ``CRANE_PTX_JIT_SIMD``: 0 turns the vector form off (to measure without it), a power of
    two from 4 to 64 sets the lanes (LLVM splits wider vectors into the CPU's)."""
    v = os.environ.get("CRANE_PTX_JIT_SIMD", "1").strip().lower()
    if v in ("0", "off", "no"):
        return 0
    if v in ("4", "8", "16", "32", "64"):
        return int(v)
    import llvmlite.binding as llvm

    from .engine import _target_machine

    _target_machine()  # initializes the native target
    return 16 if llvm.get_host_cpu_features().get("avx512f") else 8


class SimdRegion(LaneOperands):
    """The vector form of region ``region`` of kernel ``k`` (:class:`.lower.KernelLowering`):
    ``i32 simd_<region>(ctx, x0, y, z, ctaid.x/y/z, shared, save + t0, resume + t0,
    nthreads, invariant words..., symbol values...)`` runs the lanes t0..t0+W-1 of a row
    (x0..x0+W-1, those inside the block) whose resume word is the region's; it returns 1
    after a fault (recorded in the context), else 0."""

    fast = False  # the handlers' two-pass form flag: this form is exact

    def __init__(self, k: KernelLowering, region: int, lanes: int) -> None:
        self.k = k
        self.region = region
        self.lanes = lanes
        self.body = k.fn.body or []
        self.ins: Instr | None = None
        self.kparam_offsets = k.kparam_offsets
        self.slot_of = k.slot_of
        self.param_bytes = k.param_bytes

    # ---- what the handlers ask of a lowering ------------------------------------------------
    def intrinsic(self, name: str, ret, args) -> ir.Function:
        """The vector form of intrinsic ``name``: its operands and result vectors, but for an
        ``i1`` flag that must be an immediate (``ctlz``/``cttz``'s zero-is-poison)."""
        v = self.b.vtype
        immediate = name.startswith(("llvm.ctlz.", "llvm.cttz."))
        vargs = [a if immediate and a == I1 else v(a) for a in args]
        return self.k.intrinsic(vector_intrinsic(name, self.lanes), v(ret), vargs)

    def symbol_value(self, slot: int, var):
        """Every symbol the kernel names is an argument (the driver loads them)."""
        got = self.sym_args.get(slot)
        if got is None:
            raise self.refuse(f"the address of .{var.space} variable {var.name}")
        return got

    def envreg(self, n: int):
        """The scalar form's value (:meth:`LaneOperands.envreg`) in every lane."""
        rb = self.rb
        v = ir.Constant(I32, 0)
        if n in (1, 2):
            w = rb.load(rb.gep(self.ctx, [c64(L.GRID_WS)]))
            v = rb.trunc(rb.lshr(w, c64(32)) if n == 1 else w, I32)
        return splat(rb, v, self.lanes)

    def write_reg(self, uid: int, v) -> None:
        """Only the lanes that run the instruction (``imask``) take the new value."""
        rb, p = self.rb, self.regs[uid]
        rb.store(rb.select(self.imask, self.b.vec(v), rb.load(p)), p)

    def pc(self) -> int:
        """The instruction's index in the kernel's fault table (shared with its scalar form)."""
        here, self.k.ins = self.k.ins, self.ins
        try:
            return self.k.pc()
        finally:
            self.k.ins = here

    # ---- the function -----------------------------------------------------------------------
    def build(self) -> ir.Function:
        """Lower the region, or raise :class:`Refusal` (the function is then left empty: a
        declaration nothing calls)."""
        k = self.k
        name = f"simd_{self.region}"
        nsym = len(k.sym_slots)
        args = [I64P, I32, I32, I32, I32, I32, I32, I8P, I64P, I32.as_pointer(), I64]
        fty = ir.FunctionType(I32, args + [I64] * (len(L.INVARIANT) + nsym))
        self.f = f = ir.Function(k.mod, fty, name)
        f.linkage = "internal"
        try:
            self._build(f, len(args), L.INVARIANT)
        except Exception:
            f.blocks.clear()
            f.linkage = ""
            raise
        return f

    def _build(self, f: ir.Function, nfixed: int, invariant) -> None:
        k, W = self.k, self.lanes
        body = self.body
        labels = {s.name: i for i, s in enumerate(body) if isinstance(s, Label)}
        stops = stop_indices(body)
        start = 0 if self.region == 0 else stops[self.region - 1] + 1
        blocks = region_blocks(body, labels, start)
        self.labels = labels
        if blocks is None:
            raise Refusal("a branch to an unknown label", None)
        if not any(self._back_edges(lead, blk) for lead, blk in blocks.items()):
            raise Refusal("no loop (the two-pass or the scalar form serves it)", None)
        self._check(blocks)
        self.blocks, self.stops = blocks, stops
        ctx, x0, y, z, cx, cy, cz, shared, save, resume, nthreads = f.args[:nfixed]
        self.ctx, self.shared, self.save, self.nthreads = ctx, shared, save, nthreads
        self.inv = dict(zip(invariant, f.args[nfixed : nfixed + len(invariant)], strict=True))
        self.sym_args = dict(zip(k.sym_slots, f.args[nfixed + len(invariant) :], strict=True))
        self.entry = f.append_basic_block("entry")
        init = f.append_basic_block("init")
        self.rb = rb = ir.IRBuilder(init)
        self.b = VecBuilder(rb, W)
        self.regs = _VecRegs(self)
        vi32 = ir.VectorType(I32, W)
        ntid = [rb.trunc(self.inv[L.NTID + i], I32) for i in range(3)]
        self.ntid = tuple(splat(rb, v, W) for v in ntid)
        self.nctaid = tuple(splat(rb, rb.trunc(self.inv[L.GRID + i], I32), W) for i in range(3))
        self.ctaid = tuple(splat(rb, v, W) for v in (cx, cy, cz))
        xs = rb.add(splat(rb, x0, W), iota(I32, W))
        self.tid = (xs, splat(rb, y, W), splat(rb, z, W))
        # the group: lanes inside the row whose resume word is the region's
        inrow = rb.icmp_unsigned("<", xs, self.ntid[0])
        self.resume_p = rb.bitcast(resume, vi32.as_pointer())
        words = masked_load(self, self.resume_p, inrow, ir.Constant(vi32, -1))
        word = k.region_word(self.region)
        self.group = rb.and_(inrow, rb.icmp_signed("==", words, ir.Constant(vi32, word)))
        self.rvec = self.alloca(vi32, words)
        self.pcs = self.alloca(vi32, rb.select(self.group, _c(vi32, start), _c(vi32, DONE)))
        self.flane = self.alloca(I32, ir.Constant(I32, W))
        self.site_caches: dict[int, tuple] = {}
        self.mask = self.imask = self.group
        self.gone = ir.Constant(ir.VectorType(I1, W), 0)
        if self.region:
            self.restore(k.restore_at[id(body[start - 1])])
        self.bbs = {lead: f.append_basic_block(f"b{lead}") for lead in blocks}
        self.sched = f.append_basic_block("sched")
        self.finish = f.append_basic_block("finish")
        rb.cbranch(any_lane(rb, self.group), self.bbs[start], self.finish)
        for lead, blk in blocks.items():
            self.lower_block(lead, blk)
        rb.position_at_end(self.sched)
        pcs = rb.load(self.pcs)
        umin = k.intrinsic(f"llvm.vector.reduce.umin.v{W}i32", I32, [vi32])
        sw = rb.switch(rb.call(umin, [pcs]), self.finish)
        for lead, bb in self.bbs.items():
            sw.add_case(ir.Constant(I32, lead), bb)
        rb.position_at_end(self.finish)
        masked_store(self, rb.load(self.rvec), self.resume_p, self.group)
        failed = rb.icmp_unsigned("!=", rb.load(self.flane), ir.Constant(I32, W))
        rb.ret(rb.zext(failed, I32))
        ir.IRBuilder(self.entry).branch(init)

    def _back_edges(self, lead: int, blk: Block) -> bool:
        """Whether block ``lead`` ends in a branch to itself or an earlier leader. Regions
        without one keep their form: on a large loop-free region (the tiled matmul's) the
        vector form's masked writes and per-access checks made slower code (register spills)
        than the two-pass loops LLVM vectorizes, and even than scalar lanes."""
        s = self.body[blk.instrs[-1]] if blk.instrs else None
        if not isinstance(s, Instr) or s.opcode.split(".")[0] != "bra":
            return False
        ops = s.operands if isinstance(s.operands, list) else []
        return bool(ops) and ops[0][0] == "name" and self.labels[ops[0][1]] <= lead

    def _check(self, blocks: dict[int, Block]) -> None:
        """Refuse a region with an instruction this form does not have (before emitting)."""
        for blk in blocks.values():
            for i in blk.instrs:
                s = self.body[i]
                self.ins = s
                op, _, mods = split_opcode(s.opcode)
                ops = s.operands if isinstance(s.operands, list) else None
                if ops is None or op not in _TAKEN:
                    raise self.refuse(f"instruction {op} (vector form)")
                if any(o[0] == "vec" for o in ops) or (op == "cvt" and set(mods) & set(DIRECTED)):
                    raise self.refuse("a vector operand or directed rounding (vector form)")
                if op in ("bar", "barrier") and (
                    s.guard is not None or "red" in mods or ops != [("int", 0)]
                ):
                    raise self.refuse("barrier form (vector form)")
        self.ins = None

    def alloca(self, ty, init):
        """A local of type ``ty`` in the entry block, set to ``init`` where the builder is."""
        p = ir.IRBuilder(self.entry).alloca(ty)
        self.rb.store(init, p)
        return p

    # ---- blocks and control -----------------------------------------------------------------
    def lower_block(self, lead: int, blk: Block) -> None:
        rb = self.rb
        rb.position_at_end(self.bbs[lead])
        self.lead = lead
        self.mask = rb.icmp_unsigned("==", rb.load(self.pcs), _c(self.pcs_type, lead))
        self.imask = self.mask
        self.gone = ir.Constant(self.mask.type, 0)
        for i in blk.instrs:
            self.ins = self.body[i]
            self.lower(self.ins)
            if rb.block.is_terminated:
                return
        self.ins = None
        if blk.fall >= len(self.body):  # off the kernel's end: an exit
            self.leave(EXITED)
            return
        self.go([(self.mask, blk.fall)], [(self.mask, blk.fall)])

    @property
    def pcs_type(self):
        return ir.VectorType(I32, self.lanes)

    def lower(self, ins: Instr) -> None:
        op, types, mods = split_opcode(ins.opcode)
        self.imask = self.mask
        if ins.guard is not None and op != "bra":
            self.imask = self.rb.and_(self.mask, self.guard_mask(ins))
        if op == "bra":
            self.branch(ins)
        elif op in ("exit", "ret"):
            self.exit(ins)
        elif op == "trap":  # (rare, and a fault: the region's scalar rounds take it)
            raise self.refuse("trap (vector form)")
        elif op in ("bar", "barrier"):
            self.stop(ins)
        elif op in ("ld", "st"):
            lower_ldst(self, op == "st", types, mods, ins.operands)
        else:
            HANDLERS[op](self, types, mods, ins.operands)

    def guard_mask(self, ins: Instr):
        name, neg = ins.guard
        v = self.get(("reg", name), TYPES["pred"])
        return self.rb.not_(v) if neg else v

    def drop(self, lanes) -> None:
        """Lanes that left mid-block (a guarded exit, a fault): out of the block's mask."""
        rb = self.rb
        self.mask = rb.and_(self.mask, rb.not_(lanes))
        self.imask = rb.and_(self.imask, rb.not_(lanes))
        self.gone = rb.or_(self.gone, lanes)

    def go(self, moves, direct=()) -> None:
        """End the block: lanes of each ``(mask, leader)`` in ``moves`` go there (later
        entries win) and those that left go nowhere; then on to the first ``(mask, leader)``
        of ``direct`` with a lane in its mask (a leader no waiting lane can be below), else
        to the schedule."""
        rb = self.rb
        pcs = rb.load(self.pcs)
        for m, lead in moves:
            pcs = rb.select(m, _c(self.pcs_type, lead), pcs)
        pcs = rb.select(self.gone, _c(self.pcs_type, DONE), pcs)
        rb.store(pcs, self.pcs)
        for m, lead in direct:
            other = self.f.append_basic_block(f"b{self.lead}_not{lead}")
            rb.cbranch(any_lane(rb, m), self.bbs[lead], other)
            rb.position_at_end(other)
        rb.branch(self.sched)

    def branch(self, ins: Instr) -> None:
        """``[@p] bra T``. Every waiting lane is at a leader above this block's (the schedule
        runs the lowest), so the group goes straight on to a target at or before this block,
        or to the next leader, when some lane went there; after a branch back, to the
        fall-through block when no lane took it."""
        rb = self.rb
        target = self.labels[ins.operands[0][1]]
        fall = self.blocks[self.lead].fall
        nxt_leader = min((x for x in self.blocks if x > self.lead), default=None)
        near = target <= self.lead or target == nxt_leader
        if target <= self.lead:  # a loop's branch back checks the launch's deadline
            self.deadline_check()
        if ins.guard is None:
            self.go([(self.mask, target)], [(self.mask, target)] if near else [])
            return
        p = self.guard_mask(ins)
        taken = rb.and_(self.mask, p)
        fell = rb.and_(self.mask, rb.not_(p))
        if fall >= len(self.body):  # falling off the kernel's end: those lanes exit
            self.set_resume(fell, EXITED)
            self.gone = rb.or_(self.gone, fell)
            self.go([(taken, target)], [(taken, target)] if near else [])
        elif target > self.lead:
            self.go([(taken, target), (fell, fall)], [(fell, fall)])
        else:
            self.go([(fell, fall), (taken, target)], [(taken, target), (fell, fall)])

    def deadline_check(self) -> None:
        """Past the launch's deadline (the watchdog's stop flag): a timeout fault."""
        rb = self.rb
        stop = rb.load_atomic(rb.gep(self.ctx, [c64(L.STOP)]), "monotonic", 8)
        late = self.f.append_basic_block("late")
        cont = self.f.append_basic_block("on_time")
        rb.cbranch(rb.icmp_unsigned("!=", stop, c64(0)), late, cont)
        rb.position_at_end(late)
        for slot, v in (
            (L.FAULT_PC, c64(self.pc())),
            (L.FAULT_ADDR, c64(0)),
            (L.FAULT_KIND, c64(L.KIND_TIMEOUT)),
            (L.FAULT_BYTES, c64(0)),
            (L.FAULT_SPACE, c64(0)),
        ):
            rb.store(v, rb.gep(self.ctx, [c64(slot)]))
        rb.ret(ir.Constant(I32, 1))
        rb.position_at_end(cont)

    def set_resume(self, lanes, word: int) -> None:
        rb = self.rb
        rb.store(rb.select(lanes, _c(self.pcs_type, word), rb.load(self.rvec)), self.rvec)

    def leave(self, word: int) -> None:
        """The block's lanes leave the region with resume word ``word``."""
        self.set_resume(self.mask, word)
        self.gone = self.rb.or_(self.gone, self.mask)
        self.go([])

    def exit(self, ins: Instr) -> None:
        if ins.guard is None:
            self.leave(EXITED)
            return
        self.set_resume(self.imask, EXITED)
        self.drop(self.imask)

    def stop(self, ins: Instr) -> None:
        """``bar.sync 0``: the lanes save their live registers and wait at stop n."""
        n = self.stops.index(self.body.index(ins)) + 1
        saved = self.k.save_at[id(ins)]  # :func:`.regions.carried`
        for uid in sorted(saved - self.k.remat.keys()):
            v = self.rb.load(self.regs[uid])
            v = self.b.zext(v, I64) if v.type.element != I64 else v
            masked_store(self, v, self.save_ptr(uid), self.mask)
        self.leave(n)

    # ---- the save area ----------------------------------------------------------------------
    def save_ptr(self, uid: int):
        """Register ``uid``'s words of the group's lanes (register-major: consecutive)."""
        rb = self.rb
        off = rb.mul(self.nthreads, c64(self.k.reg_index[uid]))
        vt = ir.VectorType(I64, self.lanes)
        return rb.bitcast(rb.gep(self.save, [off]), vt.as_pointer())

    def restore(self, live: frozenset[int]) -> None:
        """At the region's start: the registers live after its stop, computed again (those
        :func:`.lower.rematerializable`) or loaded from the save area."""
        k = self.k
        need = {uid for uid in live if uid in k.remat}
        for uid in sorted(need):
            need |= k.remat[uid]
        for ins, uid in k.prefix:
            if uid in need:
                self.ins = ins
                self.lower(ins)
        self.ins = None
        vt = ir.VectorType(I64, self.lanes)
        for uid in sorted(live - k.remat.keys()):
            v = masked_load(self, self.save_ptr(uid), self.group, ir.Constant(vt, 0))
            st = ity(storage_bits(k.by_uid[uid].type))
            self.rb.store(v if st == I64 else self.b.trunc(v, st), self.regs[uid])


class _VecRegs(dict):
    """Register uid -> its ``<W x T>`` local, made (zeroed, as registers start) on first use."""

    def __init__(self, s: SimdRegion) -> None:
        super().__init__()
        self.s = s

    def __missing__(self, uid: int):
        s = self.s
        st = ity(storage_bits(s.k.by_uid[uid].type))
        vt = ir.VectorType(st, s.lanes)
        eb = ir.IRBuilder(s.entry)
        p = self[uid] = eb.alloca(vt)
        eb.store(ir.Constant(vt, 0), p)
        return p


def _c(vt: ir.VectorType, v: int) -> ir.Constant:
    return ir.Constant(vt, v)


def emit_groups(k: KernelLowering, d: _Driver, fn: ir.Function, nthreads, fault, after) -> None:
    """In the driver, from its builder's block: every row of the block, W lanes at a time,
    through region function ``fn``; on to ``fault`` when one returns 1, else to ``after``."""
    b, f = d.b, d.f
    bx, by, bz = d.ntid
    cx, cy, cz = d.ctaid

    def group(row, x, y, z) -> None:
        t0 = b.add(row, x)
        tid = [b.trunc(v, I32) for v in (x, y, z)]
        args = [d.ctx, *tid, cx, cy, cz, d.shared, b.gep(d.save, [t0]), b.gep(d.resume, [t0])]
        r = b.call(fn, [*args, nthreads, *d.inv])
        on = f.append_basic_block(f"{fn.name}_on")
        b.cbranch(b.icmp_unsigned("!=", r, ir.Constant(I32, 0)), fault, on)
        b.position_at_end(on)

    def rows(z) -> None:
        def row(y) -> None:
            first = b.mul(b.add(b.mul(z, by), y), bx)
            counted_loop(b, f, bx, lambda x: group(first, x, y, z), k.simd_lanes)

        counted_loop(b, f, by, row)

    counted_loop(b, f, bz, rows)
    b.branch(after)
