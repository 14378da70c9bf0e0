"""PTX → LLVM IR for one kernel: each thread as scalar code, the block as a loop over its lanes.

Why this shape: a lane runs straight through the kernel's own control flow (PTX branches become
LLVM branches, registers become SSA values after ``mem2reg``), so loops and divergent ``if``s
cost what they cost on a CPU, not one NumPy call per instruction. Barriers split the kernel into
regions: ``bar.sync`` saves the lane's registers, returns the barrier's resume point, and the
block loop runs every lane up to its next barrier (or exit) before any lane goes on — the same
schedule the interpreter's release of parked lanes gives, so race-free programs get the same
results. A region that is loop-free and never loads what it stored (to the same memory) also
gets a vectorizable form, run when every lane of the block waits at its start: a loop over the
lanes (x innermost) in the checking/committing two-pass scheme of the barrier-free fast form
(one pass if the region stores nothing), the registers saved across barriers register-major so
the lanes' saves are contiguous; a lane that failed a check runs the region again, scalar.
Registers predicted affine in %tid.x (:mod:`.affine`) come back from the save area as
``base + stride * x`` in the vector form, so that loads through them are consecutive.
Lanes of a warp do *not* run in lockstep here: where a kernel relies on it (``.volatile``
shared-memory accesses, the warp-synchronous idiom) each such access gets a warp-level stop in
front of it (:mod:`.lockstep`). Everything outside the covered instruction set is refused: the
caller then runs the kernel interpreted (:class:`Refusal` names the instruction and PTX line).
Warp-level instructions (shuffle, vote, redux, match, activemask, ``bar.warp.sync``) end
regions too, as barriers scoped to the warp (:mod:`.warp`); a kernel with them runs its rounds
scalar. Loops that wait on an ordered load
get a yield point on their branch back (:mod:`.spin`), a stop after which the block loop's
rounds run only the yielded lanes; ``bar.red`` is a barrier that reduces (:mod:`.ops_barred`).

Every memory access is checked the interpreter's way in the generated code: global addresses
against the session's allocation table (a per-site cache of the last allocation hit, then a
binary search), shared addresses against the block's shared size, local and computed
kernel-parameter addresses against the lane's local stride and the parameter buffer
(:mod:`.local`, :mod:`.param`); a failed check stores the fault (instruction, address, kind) in
the launch context and ends the launch. Atomics are real atomic instructions
(:mod:`.ops_atomic`).

The lowering mirrors the interpreter's semantics where PTX leaves a choice: integer division by
zero gives all ones (remainder: the dividend), float ``min``/``max`` follow NumPy's
``fmin``/``fmax`` (the non-NaN operand; the second of two equal values), float→integer ``cvt``
saturates with NaN → 0, ``.approx`` division/reciprocal/square root are IEEE-rounded.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, field

from llvmlite import ir

from ..memspace import (
    CLUSTER_RANK_SHIFT,
    LOCAL_WINDOW,
    PARAM_WINDOW,
    SHARED_WINDOW,
    WINDOW_SIZE,
)
from ..parser import Function, Instr, Label
from ..ptxtypes import TYPES
from . import layout as L
from .affine import lane_strides
from .exits import with_exit_yields
from .inline import inline_calls
from .irtypes import (
    EXITED,
    FAULTED,
    I1,
    I8,
    I8P,
    I32,
    I64,
    I64P,
    SPECIAL_GEOM,
    Refusal,
    alloc_hit,
    c64,
    ity,
    sanitize,
    site_cache_locals,
    storage_bits,
)
from .liveness import dest_src, live_after
from .local import local_ptr, uses_local, zero_block_locals
from .lockstep import is_lockstep, with_lockstep
from .named_regs import resolve_named_regs
from .operands import LaneOperands, split_opcode
from .ops import HANDLERS
from .ops_atomic import is_atomic
from .ops_barred import NRED, is_bar_red
from .ops_cpasync import is_async_copy
from .ops_order import is_ordered
from .param import param_ptr, uses_param_window
from .proof import build_proof, emit_proof, static_accesses
from .regions import STOPS, carried, prints, region_loop_free, stop_indices
from .simd import SimdRegion, emit_groups, simd_lanes
from .spin import YIELD_OP, spin_wait, with_yields
from .warp import (
    NSCRATCH,
    YIELD,
    build_settle,
    call_settle,
    is_warp_stop,
    keep_live,
    lower_warp,
    shfl_sources,
)

__all__ = ["KernelLowering", "Lowered", "lower_kernel"]

log = logging.getLogger("crane.sim.ptx.jit")

#: instructions that end a lane's region: block barriers, yield points and warp-level ones
_STOPS = STOPS

#: context words the driver passes to the lane's code (:data:`.layout.INVARIANT`)
_INVARIANT = L.INVARIANT


@dataclass
class Lowered:
    """The IR module of one kernel and what the runner needs to drive and explain it."""

    module: ir.Module
    name: str  # the exported function: i32 name(i64* ctx)
    sites: int  # global access sites (cache slots after layout.FIXED)
    nregs: int  # words per lane in the barrier save area
    texts: list[tuple[str, int]] = field(default_factory=list)  # per fault pc: (text, line)
    fast: str | None = None  # the vectorizable driver (1-D blocks, few allocations), if any

    #: the lane loops declared parallel: (function, loop header block) of each
    par_loops: list[tuple[str, str]] = field(default_factory=list)
    #: functions that rarely run, compiled with a short pipeline (:mod:`.coldsplit`)
    cold: tuple[str, ...] = ()
    #: the kernel calls ``vprintf`` (:mod:`.printing`)
    prints: bool = False

    def ir_text(self) -> str:
        """The module's IR, with the fast forms' lane loops declared free of dependences
        between iterations (``llvm.loop.parallel_accesses`` over every access of
        ``step_fast``): lanes of a block between barriers share no data in a race-free CUDA
        program, which is what lets LLVM vectorize the loop without proving it."""
        text = str(self.module)
        if not self.par_loops:
            return text.replace("\n{\n", f"{_VECTOR_WIDTH}\n{{\n")
        group = "!90000"
        tags = {}
        for n, (fn_name, head) in enumerate(self.par_loops):
            tags[(f'@"{fn_name}"', f'br label %"{head}"')] = f"!{90001 + 2 * n}"
        out = []
        fn = None
        seen: set[tuple[str, str]] = set()
        for line in text.split("\n"):
            if line.startswith("define"):
                fn = line
                line += _VECTOR_WIDTH

            s = line.strip()
            in_step = fn is not None and '@"step_fast"' in fn
            if (in_step and (" = load " in s or s.startswith("store "))) or (
                (s.startswith("store ") or " = load " in s) and '%"vresume' in s
            ):  # the lane loops' resume words (vector rounds, the fast driver)
                line += f", !llvm.access.group {group}"
            elif fn is not None and s.startswith("br label"):
                for key, tag in tags.items():
                    if key[0] in fn and s == key[1]:
                        if key in seen:  # the second branch to the header is the back edge
                            line += f", !llvm.loop {tag}"
                        seen.add(key)
            out.append(line)
        out.append(f"{group} = distinct !{{}}")
        out.append('!89999 = !{!"llvm.loop.parallel_accesses", !90000}')
        for tag in tags.values():
            out.append(f"{tag} = distinct !{{{tag}, !89999}}")
        return "\n".join(out) + "\n"


#: the lane loops' vectors as wide as the CPU has (LLVM's x86 default stops at 256 bits where
#: AVX-512 is present): on the 2-core development machine (Emerald Rapids) the tiled matmul's
#: vectorized regions took about a fifth fewer cycles at 512 bits (VF 8 for the save area's
#: 64-bit words, 16 for 32-bit values); a CPU without AVX-512 is unaffected
_VECTOR_WIDTH = ' "prefer-vector-width"="512"'


class KernelLowering(LaneOperands):
    """Lowering state for one kernel (one ``step`` function and its driver)."""

    def __init__(
        self,
        fn: Function,
        kparam_offsets: dict,
        slot_of,
        param_bytes: int,
        externs: frozenset[str] = frozenset(),
    ) -> None:
        self.fn = fn
        #: the module's functions declared without a body (the CUDA runtime's: ``call``)
        self.externs = externs
        #: the per-lane cells of call-site ``.param`` variables, by (variable id, offset):
        #: (bits, alloca) (:func:`.ops._call_arg`)
        self.param_cells: dict[tuple[int, int], tuple[int, ir.AllocaInstr]] = {}
        #: the kernel calls ``vprintf`` (its launches collect output: :mod:`.printing`)
        self.prints = False
        self.kparam_offsets = kparam_offsets
        self.slot_of = slot_of  # VarDecl -> symbol slot (module variables, shared variables)
        self.param_bytes = param_bytes
        self.mod = ir.Module(name=fn.name)
        self.texts: list[tuple[str, int]] = []
        self.sites = 0
        self.site_of: dict[tuple, int] = {}  # a global address operand's site (site_for)
        self.ins: Instr | None = None
        body = fn.body or []
        self.has_bar = any(isinstance(s, Instr) and s.opcode.split(".")[0] in _STOPS for s in body)
        #: warp-level instructions stop lanes for their warp (:mod:`.warp`)
        self.has_warp = any(isinstance(s, Instr) and is_warp_stop(s) for s in body)
        self.has_red = any(is_bar_red(s) for s in body)
        #: the accesses :mod:`.lockstep` put a stop before (only those may be warp-synchronous)
        self.lockstepped = frozenset(id(b) for a, b in itertools.pairwise(body) if is_lockstep(a))
        #: yield points (:mod:`.spin`): the block loop's rounds after one run yielded lanes only
        self.has_yield = any(isinstance(s, Instr) and s.opcode == YIELD_OP for s in body)
        self.warp_sites: list = []
        self._intrinsics: dict[str, ir.Function] = {}
        self._pcs: dict[int, int] = {}
        #: whether a block's shared memory must be zeroed before it runs: the kernel names a
        #: shared variable or may reach shared memory through a generic address
        self.uses_shared = bool(fn.shared) or any(
            isinstance(s, Instr) and (".shared" in s.opcode or _is_generic_access(s.opcode))
            for s in body
        )
        self.uses_local = uses_local(fn)
        self.uses_param = uses_param_window(fn)
        self.simd = True  # regions may take the vector form (:mod:`.simd`)

    # ---- intrinsics -----------------------------------------------------------------------
    def intrinsic(self, name: str, ret, args) -> ir.Function:
        f = self._intrinsics.get(name)
        if f is None:
            f = ir.Function(self.mod, ir.FunctionType(ret, args), name)
            self._intrinsics[name] = f
        return f

    # ---- the step function ----------------------------------------------------------------
    def build(self) -> Lowered:
        fn = self.fn
        regs = list(fn.regs)
        # the save area holds only registers live across some barrier
        self.live = live_after(fn) if self.has_bar else {}
        self.remat, self.prefix = (
            rematerializable(fn.body or [], self.live) if self.has_bar else ({}, [])
        )
        self.x_uniform = x_uniform(fn.body or [], self.prefix)
        self.sym_shared = self.symbol_slots()
        self.sym_slots = sorted(self.sym_shared)
        self.safe_ptr = False  # the access being lowered has an always-valid pointer
        self.addr_uniform = False  # and its address is the same for every lane of a row
        self._dom: _Dominance | None = None
        # registers other lanes' shfl read: in the save area at every stop, never recomputed
        self.keep = frozenset(shfl_sources(fn))
        self.live = keep_live(fn, self.live, self.keep, lambda s: s.opcode.split(".")[0] in _STOPS)
        for uid in self.keep:
            self.remat.pop(uid, None)
        # what each stop saves and its resume point restores (:func:`.regions.carried`);
        # every live register where a warp's lanes or bar.red read other lanes' words
        if self.has_warp or self.has_red:
            stops = [fn.body[i] for i in stop_indices(fn.body or [])]
            self.save_at = self.restore_at = {id(s): self.live[id(s)] for s in stops}
        else:
            self.save_at, self.restore_at = carried(fn.body or [], self.live)
        saved = sorted(set().union(*self.live_at_barriers()))
        self.reg_index = {uid: i for i, uid in enumerate(saved)}
        self.nsave_regs = len(saved)
        #: bar.red's scratch words (:mod:`.ops_barred`) follow the warp-level ones
        self.red_base = len(saved) + (NSCRATCH if self.has_warp else 0)
        self.nsave = self.red_base + (NRED if self.has_red else 0)
        self.by_uid = {r.uid: r for r in regs}
        self.fast = False
        self.par_loops: list[tuple[str, str]] = []
        vec = self.has_bar and not self.has_warp  # a warp's lanes stop apart: scalar rounds
        self.vec_regions, self.store_regions = self.vector_regions() if vec else ([], [])
        # a warp's lanes stop apart: no vector form (kernels without barriers may have it)
        self.simd_lanes = simd_lanes() if self.simd and not self.has_warp else 0
        self.strides = lane_strides(fn) if self.vec_regions or self.simd_lanes else {}
        # shared accesses the vector regions take unchecked, proven per block (:mod:`.proof`)
        self.static_ids = static_accesses(self)
        self.proof = None
        self.build_step("step")
        scalar_step = self.step
        fast = None
        if self.fast_eligible():
            self.fast = True
            sites = self.nsites = self.sites
            self.sites, self.site_of = 0, {}  # the same sites, in the same order: shared caches
            self.build_step("step_fast")
            assert self.sites == sites
            fast = "kernfast_" + sanitize(fn.name)
            self.build_driver_fast(fast, scalar_step)
            self.par_loops.append((fast, "lanes"))
            self.fast = False
        # barrier kernels: regions (from the start or a barrier to the next) that are
        # loop-free and never load after storing get the same two-pass vectorizable form,
        # run when every lane of the block waits at that region's start
        self.fast_step = None
        if self.vec_regions:
            self.fast = True
            sites = self.nsites = self.sites
            self.sites, self.site_of = 0, {}
            self.build_step("step_fast")
            assert self.sites == sites
            self.fast_step = self.step
            self.fast = False
            fast = None
        self.step = scalar_step
        if self.static_ids:
            self.proof = build_proof(self)
        self.simd_fns = self.simd_regions()
        if self.has_warp:
            self.settle = build_settle(
                self, _INVARIANT + tuple(self.sym_slots), _INVARIANT.index(L.NTID)
            )
        self.build_lookup()
        self.build_driver()
        # every region has a vector form: the scalar one runs only for the lanes a vector
        # round could not finish and the rounds none takes (lanes at different barriers,
        # past the deadline)
        nregions = len(stop_indices(fn.body or [])) + 1
        covered = set(self.vec_regions) | set(self.simd_fns)
        rare = self.has_bar and not self.has_warp and len(covered) == nregions
        return Lowered(
            self.mod,
            "kern_" + sanitize(fn.name),
            self.sites,
            self.nsave,
            self.texts,
            fast,
            self.par_loops,
            ("step",) if rare else (),
            self.prints,
        )

    def fast_eligible(self) -> bool:
        """The fast form needs a loop-free lane (forward branches only, no barrier) that
        never loads after it stored: then deferring the lane's stores to its end changes
        nothing, and a lane that failed a check has had no effect and can simply run again."""
        seen: set[str] = set()
        stored = False
        for s in self.fn.body or []:
            if isinstance(s, Label):
                seen.add(s.name)
                continue
            op = s.opcode.split(".")[0]
            if op in _STOPS or is_atomic(s) or is_ordered(s) or prints(s) or is_async_copy(s):
                # loads what it stores; ordered accesses must not be deferred or predicated
                # (:mod:`.ops_order`); a printf must print once, in order
                return False
            ops = s.operands if isinstance(s.operands, list) else []
            if op == "bra" and any(o[0] == "name" and o[1] in seen for o in ops):
                return False
            if op == "st" and ".param" not in s.opcode:  # (st.param: a call's argument)
                stored = True
            elif op == "ld" and stored and ".param" not in s.opcode:
                return False
        return True

    def vector_regions(self) -> tuple[list[int], list[int]]:
        """The resume points (0: the kernel's start, k: after its k-th stop — a barrier or a
        yield point) whose region can run in the two-pass form
        (:func:`.regions.region_loop_free`: the conditions of :meth:`fast_eligible`, per
        region); and, of those, the regions that store at all (the others need no committing
        pass)."""
        body = self.fn.body or []
        labels = {s.name: i for i, s in enumerate(body) if isinstance(s, Label)}
        out: list[int] = []
        storing: list[int] = []
        for k, start in enumerate([0] + [i + 1 for i in stop_indices(body)]):
            ok, stores = region_loop_free(body, labels, start)
            if ok and k and is_bar_red(body[start - 1]):  # a reduction over the save area
                ok = False  # at the resume point: the scalar form
            if ok:
                out.append(k)
                if stores:
                    storing.append(k)
        return out, storing

    def simd_regions(self) -> dict[int, ir.Function]:
        """The vector form (:mod:`.simd`) of each region the two-pass form does not take (a
        loop inside, a load after a store) and it does: ``{region: its function}``. A region
        it refuses runs in scalar rounds as before; nothing is logged (the kernel compiles)."""
        out: dict[int, ir.Function] = {}
        if not self.simd_lanes:
            return out
        for k in range(len(stop_indices(self.fn.body or [])) + 1):
            if k in self.vec_regions or (
                k and is_bar_red(self.fn.body[stop_indices(self.fn.body)[k - 1]])
            ):
                continue
            here = self.ins
            try:
                out[k] = SimdRegion(self, k, self.simd_lanes).build()
            except Exception as e:  # a form it lacks (Refusal) or a lowering error: scalar
                log.debug("kernel %s region %d: no vector form (%s)", self.fn.name, k, e)
            self.ins = here
        return out

    def region_word(self, k: int) -> int:
        """The resume word of the lanes waiting to run region ``k``: ``k``, tagged YIELD
        after a yield point (:mod:`.spin`)."""
        body = self.fn.body or []
        if k and body[stop_indices(body)[k - 1]].opcode == YIELD_OP:
            return k | YIELD
        return k

    def build_step(self, name: str) -> None:
        """The lane's code as function ``name``. The fast form (``self.fast``, see
        :meth:`fast_eligible`) never leaves early and never looks an address up: an access
        outside its site's cached allocation (or any failed check) clears the lane's ``ok``
        flag, which predicates the lane's later loads, its stores wait until the lane's end
        and happen only if it is still ok, and it returns FAULTED then: the lane had no
        effect and the driver runs it again in the exact scalar form. No exit and no call
        keep the lane loop vectorizable."""
        fn = self.fn
        regs = list(fn.regs)
        fixed = [I64P, I32, I32, I32, I32, I32, I32, I32, I8P, I64P]
        # the fast form also takes the sites' cached bounds, whether the lane runs at all and
        # its row's bases of the registers restored affinely (restore_affine)
        extra = [I64] * (2 * self.nsites) + [I1, I64P] if self.fast else []
        nsym = len(self.sym_slots)
        sty = ir.FunctionType(I32, fixed + [I64] * (len(_INVARIANT) + nsym) + extra)
        step = ir.Function(self.mod, sty, name)
        step.linkage = "internal"
        # the scalar form of a kernel with vectorized regions is called from two places (the
        # scalar rounds and the lanes to run again): one copy, not two, to compile
        if self.fast or not (self.vec_regions or self.has_warp):
            step.attributes.add("alwaysinline")
        else:
            step.attributes.add("noinline")
        step.args[0].add_attribute("noalias")
        self.step = step
        ctx, resume, tx, ty_, tz, cx, cy, cz, shared, save = step.args[: len(fixed)]
        ninv = len(fixed) + len(_INVARIANT)
        self.inv = dict(zip(_INVARIANT, step.args[len(fixed) : ninv], strict=True))
        syms = step.args[ninv : ninv + nsym]
        self.sym_args = dict(zip(self.sym_slots, syms, strict=True))
        self.site_args = step.args[ninv + nsym : len(step.args) - 2] if self.fast else []
        self.row_bases = step.args[-1] if self.fast else None
        self.ctx, self.shared, self.save = ctx, shared, save
        self.resume_arg = resume
        self.tid = (tx, ty_, tz)
        self.ctaid = (cx, cy, cz)
        entry = self.entry = step.append_basic_block("entry")
        self._params: dict[tuple[int, int], ir.Instruction] = {}
        self.param_cells = {}  # (per step function: its cells are its allocas)
        self.carry = None  # the lane's carry flag cell (:mod:`.ops_carry`), once used
        self._syms: dict[int, ir.Instruction] = {}
        b = self.b = ir.IRBuilder(entry)
        self.regs: dict[int, ir.AllocaInstr] = {}
        for r in regs:
            self.regs[r.uid] = b.alloca(ity(storage_bits(r.type)), name=r.name.lstrip("%"))
        self.ntid = tuple(self.ctx_word(L.NTID + i, I32) for i in range(3))
        self.nctaid = tuple(self.ctx_word(L.GRID + i, I32) for i in range(3))
        if self.fast:
            # a lane the round does not run (``active`` false: masked off, it waits elsewhere)
            # runs as one that failed a check, with no effect: no store, no save
            self.lane_ok = b.alloca(I1, name="lane_ok")
            b.store(step.args[-2], self.lane_ok)
            # whether the access being lowered passed its own checks: what its load is
            # predicated on in the checking pass (not the lane's running ``ok``, whose chain
            # of conditions would make the lane's code a maze of early exits)
            self.access_ok = b.alloca(I1, name="access_ok")
        for r in regs:  # registers start at zero, as in the interpreter
            st = ity(storage_bits(r.type))
            b.store(ir.Constant(st, 0), self.regs[r.uid])
        body = fn.body or []
        self.resumes: list[ir.Block] = []
        start = step.append_basic_block("start")
        dispatch = b.switch(resume, start)
        b.position_at_end(start)
        # the fast form runs the lane's code twice: checking (no store), then committing
        # (the stores, only if every check passed); no load follows a store (fast_eligible),
        # so both passes compute the same values
        self.commit = False
        self.commit_start = step.append_basic_block("commit") if self.fast else None
        for commit in (False, True) if self.fast else (False,):
            self.commit = commit
            if commit:
                b.position_at_end(self.commit_start)
                for r in regs:
                    b.store(ir.Constant(ity(storage_bits(r.type)), 0), self.regs[r.uid])
                if self.has_bar:  # the committing pass restarts where the checking one did
                    checked, self.resumes = self.resumes, []
                    cstart = step.append_basic_block("commit_start")
                    cdispatch = b.switch(resume, cstart)
                    b.position_at_end(cstart)
            self.labels = {
                s.name: step.append_basic_block(f"L_{s.name}") for s in body if isinstance(s, Label)
            }
            for s in body:
                if isinstance(s, Label):
                    blk = self.labels[s.name]
                    if not b.block.is_terminated:
                        b.branch(blk)
                    b.position_at_end(blk)
                    continue
                if b.block.is_terminated:  # code after a jump with no label: unreachable
                    b.position_at_end(step.append_basic_block("dead"))
                self.ins = s
                self.lower(s)
            self.ins = None
            if not b.block.is_terminated:
                self.ret_exited()
        if self.fast and self.has_bar:
            for k, blk in enumerate(self.resumes, start=1):
                cdispatch.add_case(ir.Constant(I32, k), blk)
            self.resumes = checked
        for k, blk in enumerate(self.resumes, start=1):
            dispatch.add_case(ir.Constant(I32, k), blk)

    def param_load(self, off: int, it: ir.IntType):
        """A kernel parameter word, loaded once in the lane's entry block (in bounds, checked
        when lowering; read-only for the launch), so it is loop-invariant for the lane loop
        even where the kernel reads it under a condition."""
        key = (off, it.width)
        v = self._params.get(key)
        if v is None:
            eb = ir.IRBuilder(self.entry)
            eb.position_before(self.entry.terminator)
            kp = eb.inttoptr(self.inv[L.KPARAMS], I8P)
            p = eb.bitcast(eb.gep(kp, [c64(off)]), it.as_pointer())
            # align 1: the buffer's alignment is not promised, so that its known size alone
            # lets LLVM read the word ahead of the branch that uses it (kparams_word)
            v = self._params[key] = eb.load(p, align=1)
            v.set_metadata("invariant.load", self.mod.add_metadata([]))
        return v

    def to_commit(self) -> None:
        """The end of the fast form's checking pass: on to the committing pass if the region
        the lane runs stores anything, else the builder is left where the lane finishes (its
        values are final: nothing it loaded can have changed). The region is the ``resume``
        argument, a constant where the driver inlines this code, so the test folds away."""
        b = self.b
        if not self.has_bar:
            b.branch(self.commit_start)
            return
        need = ir.Constant(I1, 0)
        for k in self.store_regions:
            need = b.or_(need, b.icmp_signed("==", self.resume_arg, ir.Constant(I32, k)))
        finish = self.step.append_basic_block("finish")
        b.cbranch(need, self.commit_start, finish)
        b.position_at_end(finish)

    def ret_exited(self) -> None:
        """The lane is done: EXITED, or FAULTED in the fast form when a check failed."""
        b = self.b
        if self.fast and not self.commit:  # checked: now the committing pass
            self.to_commit()
            if not b.block.is_terminated:
                ok = b.load(self.lane_ok)
                b.ret(b.select(ok, ir.Constant(I32, EXITED), ir.Constant(I32, FAULTED)))
        elif self.fast:
            ok = b.load(self.lane_ok)
            b.ret(b.select(ok, ir.Constant(I32, EXITED), ir.Constant(I32, FAULTED)))
        else:
            if self.keep:  # other lanes' shfl may still read them
                self.save_regs(self.keep)
            b.ret(ir.Constant(I32, EXITED))

    def ctx_word(self, slot: int, ty=I64):
        b = self.b
        v = self.inv.get(slot)
        if v is None:
            v = b.load(b.gep(self.ctx, [ir.Constant(I64, slot)]))
        return v if ty == I64 else b.trunc(v, ty)

    def ctx_ptr(self, slot: int, ty=I8P):
        return self.b.inttoptr(self.ctx_word(slot), ty)

    def live_at_barriers(self) -> list[frozenset[int]]:
        body = self.fn.body or []
        return [
            self.live[id(s)]
            for s in body
            if isinstance(s, Instr) and s.opcode.split(".")[0] in _STOPS
        ]

    def uniform_here(self, uid: int) -> bool:
        """Whether register ``uid`` holds its x-uniform value (:func:`x_uniform`) at the
        instruction being lowered: its one definition dominates it."""
        at = self.x_uniform.get(uid)
        if at is None or self.ins is None:
            return False
        if self._dom is None:
            self._dom = _Dominance(self.fn.body or [])
            self._index = {id(s): i for i, s in enumerate(self.fn.body or [])}
        here = self._index.get(id(self.ins))
        return here is not None and at != here and self._dom.dominates(at, here)

    def save_offset(self, uid: int):
        """Where register ``uid`` of this lane lies from the lane's save pointer (the area's
        base plus the lane's linear index): register-major, so the lanes of a vectorized
        region save and restore a register with one contiguous vector access."""
        b = self.b
        nthreads = b.mul(b.mul(self.ntid[0], self.ntid[1]), self.ntid[2])
        return b.mul(b.zext(nthreads, I64), c64(self.reg_index[uid]))

    def save_regs(self, live: frozenset[int], ok=None) -> None:
        """At a barrier: the registers live after it, to the lane's save area (but those
        computed again at the resume point, :func:`rematerializable`); where ``ok`` (an
        ``i1``) is false, each word is written back unchanged instead."""
        b = self.b
        for uid in sorted(live - self.remat.keys()):
            v = b.load(self.regs[uid])
            v = b.zext(v, I64) if v.type != I64 else v
            p = b.gep(self.save, [self.save_offset(uid)])
            b.store(v if ok is None else b.select(ok, v, b.load(p)), p)

    def restore_regs(self, live: frozenset[int]) -> None:
        """After a barrier: the live registers from the save area, except the ones the
        kernel's entry computed from the lane's geometry, parameters and constants — those
        are computed again (their defining instructions, in order), so in a vectorized
        region an address such as ``shared + 4 * tid.x`` is an affine function of the lane
        again and its accesses contiguous, not a gather through values loaded back."""
        b = self.b
        need = {uid for uid in live if uid in self.remat}
        for uid in sorted(need):
            need |= self.remat[uid]
        if need:
            here = self.ins
            for ins, uid in self.prefix:
                if uid in need:
                    self.ins = ins
                    self.lower(ins)
            self.ins = here
        affine = self.affine_regs(live) if self.fast else {}
        for uid in sorted(live - self.remat.keys()):
            st = ity(storage_bits(self.by_uid[uid].type))
            v = b.load(b.gep(self.save, [self.save_offset(uid)]))
            v = v if st == I64 else b.trunc(v, st)
            if uid in affine:
                v = self.restore_affine(uid, affine[uid], v, st)
            b.store(v, self.regs[uid])

    def affine_regs(self, live: frozenset[int]) -> dict[int, int]:
        """Of the registers restored from the save area at a stop after which ``live`` are
        live, those the vector form restores as ``base + stride * x`` (:mod:`.affine`), with
        their strides: any stride for 32- and 64-bit integers (small enough that a row's
        values cannot wrap), stride 0 (the row's first lane's value) for the others."""
        out = {}
        for uid in sorted(live - self.remat.keys()):
            c = self.strides.get(uid)
            if c is None:
                continue
            t = self.by_uid[uid].type
            if c == 0 or (
                t.kind in ("u", "s", "b")
                and storage_bits(t) in (32, 64)
                and abs(c) * L.MAX_BLOCK_DIM < 1 << 30
            ):
                out[uid] = c
        return out

    def restore_affine(self, uid: int, c: int, saved, st: ir.IntType):
        """Register ``uid``'s value in the vector form as its row's base (the driver's copy
        of the row's first lane's word) plus ``c`` times the lane's x; in the checking pass
        the lane's own word must equal it, else the lane fails (runs again, scalar)."""
        b = self.b
        base = b.load(b.gep(self.row_bases, [c64(self.reg_index[uid])]))
        if c == 0:
            v = base if st == I64 else b.trunc(base, st)
        elif st == I64:
            v = b.add(base, b.mul(b.zext(self.tid[0], I64), c64(c)))
        else:
            # in 32 bits: the base clamped so that no lane's value wraps (a lane whose value
            # would fails the comparison instead), which lets LLVM prove ``base + c * x``
            # does not wrap and so sign-extends to consecutive 64-bit addresses
            lim = ir.Constant(
                I32, (2**31 - 1) - c * L.MAX_BLOCK_DIM if c > 0 else -(2**31) - c * L.MAX_BLOCK_DIM
            )
            clamp = self.intrinsic("llvm.smin.i32" if c > 0 else "llvm.smax.i32", I32, [I32, I32])
            b0 = b.call(clamp, [b.trunc(base, I32), lim])
            step = b.mul(self.tid[0], ir.Constant(I32, c), flags=["nsw"])
            v = b.add(b0, step, flags=["nsw"])
        if not self.commit:
            ok = b.and_(b.load(self.lane_ok), b.icmp_unsigned("==", saved, v))
            b.store(ok, self.lane_ok)
        return v

    # ---- faults ---------------------------------------------------------------------------
    def pc(self) -> int:
        """This instruction's index in the fault table (added once per instruction)."""
        ins = self.ins
        assert ins is not None
        i = self._pcs.get(id(ins))
        if i is None:
            i = self._pcs[id(ins)] = len(self.texts)
            self.texts.append((ins.text, ins.line))
        return i

    def fault_if(self, cond, addr, kind: int, nbytes: int, space: int, more: tuple = ()) -> None:
        """Branch to a fault exit when ``cond`` holds; continue in a fresh block otherwise.
        ``more``: (context word, i64 value) pairs the exit also stores (what the runner
        needs to word the fault)."""
        b = self.b
        if self.fast and self.commit:  # checked in the first pass
            return
        if self.fast:  # no exit: the lane runs on, its result discarded
            ok = b.and_(b.load(self.lane_ok), b.not_(cond))
            b.store(ok, self.lane_ok)
            b.store(b.and_(b.load(self.access_ok), b.not_(cond)), self.access_ok)
            return
        bad = self.step.append_basic_block("fault")
        ok = self.step.append_basic_block("ok")
        b.cbranch(cond, bad, ok)
        b.position_at_end(bad)
        pc = self.pc()
        for slot, v in (
            (L.FAULT_PC, ir.Constant(I64, pc)),
            (L.FAULT_ADDR, addr),
            (L.FAULT_KIND, ir.Constant(I64, kind)),
            (L.FAULT_BYTES, ir.Constant(I64, nbytes)),
            (L.FAULT_SPACE, ir.Constant(I64, space)),
            *more,
        ):
            b.store(v, b.gep(self.ctx, [ir.Constant(I64, slot)]))
        b.ret(ir.Constant(I32, FAULTED))
        b.position_at_end(ok)

    # ---- operands -------------------------------------------------------------------------
    def symbol_value(self, slot: int, var):
        """Module or shared variable ``var``'s value (symbol ``slot``): the driver's argument,
        else loaded once in the lane's entry block (the slot is in the array)."""
        got = self.sym_args.get(slot)  # loaded by the driver (symbol_slots)
        if got is not None:
            return got
        v = self._syms.get(slot)
        if v is not None:
            return v
        eb = ir.IRBuilder(self.entry)
        eb.position_before(self.entry.terminator)
        sv = eb.inttoptr(self.inv[L.SYMVALS], I64P)
        v = self._syms[slot] = self.symbol_load(eb, sv, slot, var.space == "shared")
        return v

    def symbol_slots(self) -> dict[int, bool]:
        """The symbol slots the kernel's instructions name (module and shared variables),
        each with whether it is a shared variable's offset."""
        out: dict[int, bool] = {}

        def names(op):
            if (
                isinstance(op, tuple)
                and len(op) == 2
                and op[0] == "name"
                and isinstance(op[1], str)
            ):
                yield op[1]
            elif isinstance(op, (tuple, list)):
                for o in op:
                    yield from names(o)

        for s in self.fn.body or []:
            if not isinstance(s, Instr) or not isinstance(s.operands, list) or s.scope is None:
                continue
            for name in names(s.operands):
                var = s.scope.var(name)
                if var is None or var.space == "param":
                    continue
                slot = self.slot_of(var)
                if slot is not None:
                    out[slot] = var.space == "shared"
        return out

    def symbol_load(self, b: ir.IRBuilder, sv, slot: int, shared: bool):
        """Symbol value ``slot`` from the launch's array ``sv``: invariant while the launch
        runs; a shared variable's offset bounded (``!range``)."""
        v = b.load(b.gep(sv, [ir.Constant(I64, slot)]))
        v.set_metadata("invariant.load", self.mod.add_metadata([]))
        if shared:
            # an offset in the block's shared memory, which the runner keeps below
            # MAX_SHARED: with the lane's bounded %tid, LLVM proves 32-bit shared addresses
            # (sh + 4 * tid.x) do not wrap, so the vector forms access them contiguously
            # instead of gathering
            v.set_metadata("range", self.range_md(0, L.MAX_SHARED))
        return v

    def param_cell(self, key: tuple[int, int], bits: int) -> ir.AllocaInstr:
        """The cell of call-site ``.param`` bytes ``key`` (variable id, offset) as ``bits``
        wide (made, zeroed, in the lane's entry block the first time); a cell reused at
        another width is refused."""
        got = self.param_cells.get(key)
        if got is not None:
            if got[0] != bits:
                raise self.refuse("a call's parameter written at two widths")
            return got[1]
        cell = self._zeroed_cell(ir.IntType(bits), "param")
        self.param_cells[key] = (bits, cell)
        return cell

    def carry_flag(self) -> ir.AllocaInstr:
        """The lane's carry flag (CC.CF) cell, made and cleared in the entry block once."""
        if self.carry is None:
            self.carry = self._zeroed_cell(I1, "cc")
        return self.carry

    def _zeroed_cell(self, ty: ir.IntType, name: str) -> ir.AllocaInstr:
        """A per-lane cell of ``ty`` made and zeroed in the step's entry block (as the
        interpreter's state starts at zero when a lane starts)."""
        eb = ir.IRBuilder(self.entry)
        eb.position_before(self.entry.terminator)
        cell = eb.alloca(ty, name=name)
        eb.store(ir.Constant(ty, 0), cell)
        return cell

    def range_md(self, lo: int, hi: int):
        """``!range`` metadata [lo, hi) for an i64 load."""
        return self.mod.add_metadata([ir.Constant(I64, lo), ir.Constant(I64, hi)])

    # ---- dispatch -------------------------------------------------------------------------
    def lower(self, ins: Instr) -> None:
        self.safe_ptr = self.addr_uniform = False
        if isinstance(ins.operands, Exception):
            raise self.refuse("unparsable operands")
        op, types, mods = split_opcode(ins.opcode)
        if ins.guard is not None and op not in ("bra",):
            if op in ("bar", "barrier") and not is_warp_stop(ins):
                raise self.refuse("a guarded barrier")
            b = self.b
            g = self.guard(ins)
            run = self.step.append_basic_block("guarded")
            after = self.step.append_basic_block("after")
            b.cbranch(g, run, after)
            b.position_at_end(run)
            self.lower_op(op, types, mods, ins)
            if not b.block.is_terminated:
                b.branch(after)
            b.position_at_end(after)
            return
        self.lower_op(op, types, mods, ins)

    def guard(self, ins: Instr):
        name, neg = ins.guard
        v = self.get(("reg", name), TYPES["pred"])
        return self.b.not_(v) if neg else v

    def lower_op(self, op: str, types, mods, ins: Instr) -> None:
        if is_warp_stop(ins):
            lower_warp(self, op, types, mods, ins.operands)
            return
        h = HANDLERS.get(op)
        if h is None:
            raise self.refuse(f"instruction {op}")
        h(self, types, mods, ins.operands)

    # ---- memory ---------------------------------------------------------------------------
    def global_ptr(self, addr, nbytes: int):
        """Check a global access of ``nbytes`` at device address ``addr`` (i64) the way
        SimMemory.offsets does (alignment first, then the allocation table)."""
        b = self.b
        if nbytes > 1:
            mis = b.icmp_unsigned("!=", b.and_(addr, ir.Constant(I64, nbytes - 1)), c64(0))
            self.fault_if(mis, addr, L.KIND_MISALIGNED, nbytes, L.SPACE_GLOBAL)
        if self.fast and self.commit:  # checked in the first pass
            return b.gep(self.ctx_ptr(L.MEM_BUF), [b.sub(addr, self.ctx_word(L.MEM_BASE))])
        site = self.site_for()
        if self.fast:  # the driver read the caches before the lane loop
            lo, hi = self.site_args[2 * site], self.site_args[2 * site + 1]
        else:  # the site's cache as local values (registers in loops), refreshed on a miss
            lo_v, hi_v = self.site_cache(site)
            lo, hi = b.load(lo_v), b.load(hi_v)
        hit = alloc_hit(b, addr, lo, hi, c64(nbytes))
        if self.fast:  # outside the cached allocation: the lane runs again, scalar
            self.fault_if(b.not_(hit), addr, L.KIND_ILLEGAL, nbytes, L.SPACE_GLOBAL)
            base = self.ctx_word(L.MEM_BASE)
            return b.gep(self.ctx_ptr(L.MEM_BUF), [b.sub(addr, base)])
        fast = b.block
        slow = self.step.append_basic_block("lookup")
        done = self.step.append_basic_block("checked")
        b.cbranch(hit, done, slow)
        b.position_at_end(slow)
        found = b.call(self.lookup, [self.ctx, addr, c64(nbytes), c64(site)])
        for v, slot in ((lo_v, L.FIXED + 2 * site), (hi_v, L.FIXED + 2 * site + 1)):
            b.store(b.load(b.gep(self.ctx, [c64(slot)])), v)
        slow_end = b.block
        b.branch(done)
        b.position_at_end(done)
        ok = b.phi(I1)
        ok.add_incoming(ir.Constant(I1, 1), fast)
        ok.add_incoming(found, slow_end)
        self.fault_if(b.not_(ok), addr, L.KIND_ILLEGAL, nbytes, L.SPACE_GLOBAL)
        base = self.ctx_word(L.MEM_BASE)
        buf = self.ctx_ptr(L.MEM_BUF)
        return b.gep(buf, [b.sub(addr, base)])

    def site_for(self) -> int:
        """The allocation cache (site) of the global access being lowered: one per address
        operand (base register or symbol, offset) of the kernel, else one per access. Why
        shared: ``y[i] = a * x[i] + y[i]`` loads and stores through the same register, and
        with one cache the two checks are the same IR (the same address against the same
        bounds), which LLVM computes once; any cache is correct for any access (a miss looks
        the address up, or runs the lane again in the scalar form)."""
        key = _address_key(self.ins)
        site = self.site_of.get(key) if key is not None else None
        if site is None:
            site = self.sites
            self.sites += 1
            if key is not None:
                self.site_of[key] = site
        return site

    def site_cache(self, site: int):
        """Local copies of access site ``site``'s cached allocation bounds, read from the
        context once in the lane's entry block (:func:`.irtypes.site_cache_locals`)."""
        eb = ir.IRBuilder(self.entry)
        eb.position_before(self.entry.terminator)
        return site_cache_locals(eb, self.ctx, site)

    def shared_ptr(self, off, nbytes: int, gen_base: int, direct: bool = False):
        """Check a shared access at window offset ``off`` (i64) like the interpreter's shared
        window: inside the block's shared size, then aligned. ``direct``: the pointer is
        the access's own (a ``.shared`` access, not one route of a generic address)."""
        b = self.b
        size = self.ctx_word(L.SHARED_SIZE)
        if self.fast and direct and id(self.ins) in self.static_ids:
            # in bounds and aligned for every lane of the block (:mod:`.proof`): no check, no
            # condition, so LLVM loads it as a vector (or once, where it is the row's)
            self.safe_ptr = True
            return b.gep(self.shared, [off])
        if self.fast:
            # the vectorized form takes plain offsets only (an address that is an affine
            # function of the lane stays one, so LLVM makes contiguous accesses of it): any
            # other, a rank-tagged one included, fails the check and the lane runs scalar
            uniform = self.addr_uniform and direct
            if not self.commit or uniform:
                bad = b.or_(
                    b.icmp_signed("<", off, c64(0)),
                    b.icmp_signed(">", b.add(off, c64(nbytes)), size),
                )
                if nbytes > 1:
                    bad = b.or_(bad, b.icmp_unsigned("!=", b.and_(off, c64(nbytes - 1)), c64(0)))
                self.fault_if(bad, off, L.KIND_ILLEGAL, nbytes, L.SPACE_SHARED)
            if uniform:
                # the same address for every lane of the vector loop (As[ty][k] in a tiled
                # matmul): a failed check reads offset 0 instead (the buffer has at least 16
                # bytes; the lane's result is discarded anyway), so the load needs no
                # condition and LLVM loads it once per vector instead of gathering it
                self.safe_ptr = True
                off = b.select(bad, c64(0), off)
            return b.gep(self.shared, [off])
        # a .shared::cluster address tagged with rank 0 (bit 24: rank + 1) is the CTA's own
        # shared memory: outside cluster launches every CTA is rank 0 of its own cluster
        orig = off
        tag = ir.Constant(I64, 1 << CLUSTER_RANK_SHIFT)
        own = b.icmp_unsigned("<", b.sub(off, tag), tag)
        off = b.select(own, b.sub(off, tag), off)
        out = b.or_(
            b.icmp_signed("<", off, c64(0)),
            b.icmp_signed(">", b.add(off, c64(nbytes)), size),
        )
        gen = b.add(orig, c64(gen_base))
        self.fault_if(out, gen, L.KIND_ILLEGAL, nbytes, L.SPACE_SHARED)
        if nbytes > 1:
            mis = b.icmp_unsigned("!=", b.and_(off, c64(nbytes - 1)), c64(0))
            self.fault_if(mis, gen, L.KIND_MISALIGNED, nbytes, L.SPACE_SHARED)
        return b.gep(self.shared, [off])

    def address(self, op, space: str):
        """An address operand ``[base+off]`` → (kind, i64 value or constant offset)."""
        if op[0] != "mem":
            raise self.refuse("expected an address")
        base, off = op[1], op[2]
        b = self.b
        self.addr_uniform = base[0] in ("int", "name")
        if base[0] == "int":
            return "value", c64((base[1] + off) & (2**64 - 1))
        if base[0] == "name":
            var = self.ins.scope.var(base[1])
            if var is not None and var.space == "param":
                if space != "param":
                    raise self.refuse("a kernel parameter through a non-.param address")
                o = self.kparam_offsets.get(id(var))
                if o is None:  # declared in the body: a call's argument (``call``)
                    return "call", (id(var), off)
                return "param", o + off
            return "value", b.add(self.symbol(base[1]), c64(off))
        r = self.regdecl(base[1])
        self.addr_uniform = self.uniform_here(r.uid)
        v = b.load(self.regs[r.uid])
        if r.type.kind == "pred":
            raise self.refuse("predicate as an address")
        v = b.zext(v, I64) if v.type.width < 64 else v
        return "value", b.add(v, c64(off & (2**64 - 1)))

    def mem_ptr(self, space: str, addr, nbytes: int, write: bool):
        """A checked pointer for an access in ``space`` (global/const/shared/generic)."""
        if space in ("global", "const"):
            if write and space == "const":
                raise self.refuse("st.const")
            return self.global_ptr(addr, nbytes)
        if space == "shared":
            return self.shared_ptr(addr, nbytes, SHARED_WINDOW, direct=True)
        if space == "local":
            return local_ptr(self, addr, nbytes)
        # generic: the shared window is routed to shared memory, the local and param windows
        # (in kernels that can point there) to the lane's local area and the parameters,
        # everything else to global
        windows = []
        if self.uses_local:
            windows.append((LOCAL_WINDOW, lambda rel: local_ptr(self, rel, nbytes)))
        if self.uses_param:
            windows.append((PARAM_WINDOW, lambda rel: param_ptr(self, rel, nbytes, write)))
        return self._generic_windows(addr, nbytes, windows)

    def _generic_windows(self, addr, nbytes: int, windows: list):
        """Route a generic address: into the first of ``windows`` (base, pointer of the
        offset) it falls in, else shared or global memory."""
        if not windows:
            return self._generic_not_local(addr, nbytes)
        b = self.b
        (base, ptr), rest = windows[0], windows[1:]
        rel = b.sub(addr, c64(base))
        inside = b.icmp_unsigned("<", rel, c64(WINDOW_SIZE))
        win = self.step.append_basic_block("generic_window")
        other = self.step.append_basic_block("generic_other")
        join = self.step.append_basic_block("generic_window_join")
        b.cbranch(inside, win, other)
        b.position_at_end(win)
        p0 = ptr(rel)
        e0 = b.block
        b.branch(join)
        b.position_at_end(other)
        p1 = self._generic_windows(addr, nbytes, rest)
        e1 = b.block
        b.branch(join)
        b.position_at_end(join)
        p = b.phi(I8P)
        p.add_incoming(p0, e0)
        p.add_incoming(p1, e1)
        return p

    def _generic_not_local(self, addr, nbytes: int):
        """A generic access outside the local window: shared window or global memory."""
        b = self.b
        rel = b.sub(addr, c64(SHARED_WINDOW))
        in_sh = b.icmp_unsigned("<", rel, c64(WINDOW_SIZE))
        sh_blk = self.step.append_basic_block("generic_shared")
        gl_blk = self.step.append_basic_block("generic_global")
        join = self.step.append_basic_block("generic_join")
        b.cbranch(in_sh, sh_blk, gl_blk)
        b.position_at_end(sh_blk)
        p1 = self.shared_ptr(rel, nbytes, SHARED_WINDOW)
        e1 = b.block
        b.branch(join)
        b.position_at_end(gl_blk)
        p2 = self.global_ptr(addr, nbytes)
        e2 = b.block
        b.branch(join)
        b.position_at_end(join)
        p = b.phi(I8P)
        p.add_incoming(p1, e1)
        p.add_incoming(p2, e2)
        return p

    # ---- lookup and driver ----------------------------------------------------------------
    def declare_lookup(self) -> None:
        fty = ir.FunctionType(I1, [I64P, I64, I64, I64])
        self.lookup = ir.Function(self.mod, fty, "lookup")
        self.lookup.linkage = "internal"
        self.lookup.attributes.add("noinline")

    def build_lookup(self) -> None:
        """Binary search of the allocation table; on a hit, the site's cache is updated."""
        f = self.lookup
        ctx, addr, n, site = f.args
        b = ir.IRBuilder(f.append_basic_block("entry"))
        starts = b.inttoptr(b.load(b.gep(ctx, [c64(L.ALLOC_STARTS)])), I64P)
        ends = b.inttoptr(b.load(b.gep(ctx, [c64(L.ALLOC_ENDS)])), I64P)
        cnt = b.load(b.gep(ctx, [c64(L.NALLOC)]))
        head = f.append_basic_block("head")
        body = f.append_basic_block("body")
        fin = f.append_basic_block("fin")
        entry = b.block
        b.branch(head)
        b.position_at_end(head)
        lo = b.phi(I64)
        hi = b.phi(I64)
        lo.add_incoming(c64(0), entry)
        hi.add_incoming(cnt, entry)
        b.cbranch(b.icmp_unsigned("<", lo, hi), body, fin)
        b.position_at_end(body)
        mid = b.lshr(b.add(lo, hi), c64(1))
        le = b.icmp_unsigned("<=", b.load(b.gep(starts, [mid])), addr)
        lo.add_incoming(b.select(le, b.add(mid, c64(1)), lo), body)
        hi.add_incoming(b.select(le, hi, mid), body)
        b.branch(head)
        b.position_at_end(fin)
        none = f.append_basic_block("none")
        have = f.append_basic_block("have")
        b.cbranch(b.icmp_unsigned("==", lo, c64(0)), none, have)
        b.position_at_end(none)
        b.ret(ir.Constant(I1, 0))
        b.position_at_end(have)
        i = b.sub(lo, c64(1))
        s = b.load(b.gep(starts, [i]))
        e = b.load(b.gep(ends, [i]))
        ok = alloc_hit(b, addr, s, e, n)  # s <= addr: the search's answer
        yes = f.append_basic_block("yes")
        b.cbranch(ok, yes, none)
        b.position_at_end(yes)
        slot = b.add(c64(L.FIXED), b.mul(site, c64(2)))
        b.store(s, b.gep(ctx, [slot]))
        b.store(e, b.gep(ctx, [b.add(slot, c64(1))]))
        b.ret(ir.Constant(I1, 1))

    def open_driver(self, name: str) -> _Driver:
        """The start both drivers share: ``i32 name(i64* ctx)`` with the context's words
        loaded, a loop over blocks [BLOCK_BEGIN, BLOCK_END) whose body computes %ctaid and
        zeroes the block's shared memory; the builder is left in that body."""
        f = ir.Function(self.mod, ir.FunctionType(I32, [I64P]), name)
        (ctx,) = f.args
        ctx.add_attribute("noalias")
        b = ir.IRBuilder(f.append_basic_block("entry"))

        def word(slot):
            v = b.load(b.gep(ctx, [c64(slot)]))
            if L.NTID <= slot < L.NTID + 3:  # the runner never runs larger blocks compiled
                v.set_metadata("range", self.range_md(1, L.MAX_BLOCK_DIM + 1))
            return v

        d = _Driver(f, b, ctx, word)
        d.inv = [
            word(slot) if slot != L.KPARAMS else self.kparams_word(b, ctx) for slot in _INVARIANT
        ]
        # the symbol values the kernel reads, loaded once per call and passed like the
        # invariant words: loaded in the lane's code, LLVM sinks them into the branches that
        # use them, where the lane loops cannot hoist them (addresses computed from them
        # then vary per lane: gathers and scatters)
        sv = b.inttoptr(word(L.SYMVALS), I64P)
        for slot in self.sym_slots:
            d.inv.append(self.symbol_load(b, sv, slot, self.sym_shared[slot]))
        gx, gy = word(L.GRID), word(L.GRID + 1)
        d.ntid = (word(L.NTID), word(L.NTID + 1), word(L.NTID + 2))
        d.shared = b.inttoptr(word(L.SHARED), I8P)
        shsize = word(L.SHARED_SIZE)
        d.save = b.inttoptr(word(L.SAVE), I64P)
        d.resume = b.inttoptr(word(L.RESUME), I32.as_pointer())
        d.memset = self.intrinsic("llvm.memset.p0.i64", ir.VoidType(), [I8P, I8, I64, I1])
        b0, b1 = word(L.BLOCK_BEGIN), word(L.BLOCK_END)
        d.grid = (gx, gy)
        # %ctaid of the first block by division, then counted up block by block
        first = (b.urem(b0, gx), b.urem(b.udiv(b0, gx), gy), b.udiv(b0, b.mul(gx, gy)))
        entry = b.block
        d.head, body, d.done = (f.append_basic_block(x) for x in ("blocks", "block", "done"))
        b.branch(d.head)
        b.position_at_end(d.head)
        d.blk = b.phi(I64)
        d.blk.add_incoming(b0, entry)
        d.cta = [b.phi(I64) for _ in range(3)]
        for phi, v in zip(d.cta, first, strict=True):
            phi.add_incoming(v, entry)
        b.cbranch(b.icmp_unsigned("<", d.blk, b1), body, d.done)
        b.position_at_end(body)
        d.ctaid = tuple(b.trunc(v, I32) for v in d.cta)
        d.fresh = ir.Constant(I1, 1)
        if self.has_yield:  # a cooperative block resumed keeps its state (:mod:`.coop`)
            d.fresh = b.icmp_unsigned("!=", word(L.COOP), c64(L.COOP_RESUME))
        if self.uses_shared or self.uses_local:
            init, after = f.append_basic_block("block_init"), f.append_basic_block("block_run")
            b.cbranch(d.fresh, init, after)
            b.position_at_end(init)
            if self.uses_shared:
                b.call(d.memset, [d.shared, ir.Constant(I8, 0), shsize, ir.Constant(I1, 0)])
            if self.uses_local:
                nthreads = b.mul(b.mul(d.ntid[0], d.ntid[1]), d.ntid[2])
                zero_block_locals(b, d.memset, word, nthreads)
            b.branch(after)
            b.position_at_end(after)
        return d

    def kparams_word(self, b: ir.IRBuilder, ctx):
        """The kernel parameters' address (an i64 word, as the lane's code takes it), loaded
        as a pointer LLVM knows it may read ``param_bytes`` from: the launch refuses fewer
        (``PtxProgram.launch``) and pads 8 more. Why: a parameter the lane loads (once, in its
        entry block) and uses only under a branch (``if (i < n) c[i] = a[i] + b[i]``) is sunk
        into that branch, and a conditional load the lane loop cannot hoist unless it may read
        the address anyway: it was a gather from one address per vector of lanes."""
        p = b.load(b.bitcast(b.gep(ctx, [c64(L.KPARAMS)]), I8P.as_pointer()))
        n = ir.Constant(I64, max(self.param_bytes, 8))
        p.set_metadata("dereferenceable", self.mod.add_metadata([n]))
        return b.ptrtoint(p, I64)

    def close_driver(self, d: _Driver) -> None:
        """From the current block: on to the next block; after the last, return 0."""
        b = d.b
        d.blk.add_incoming(b.add(d.blk, c64(1)), b.block)
        x, y, z = d.cta
        gx, gy = d.grid
        x1 = b.add(x, c64(1))
        wrap_x = b.icmp_unsigned("==", x1, gx)
        y1 = b.select(wrap_x, b.add(y, c64(1)), y)
        wrap_y = b.icmp_unsigned("==", y1, gy)
        d.cta[0].add_incoming(b.select(wrap_x, c64(0), x1), b.block)
        d.cta[1].add_incoming(b.select(wrap_y, c64(0), y1), b.block)
        d.cta[2].add_incoming(b.select(wrap_y, b.add(z, c64(1)), z), b.block)
        b.branch(d.head)
        b.position_at_end(d.done)
        b.ret(ir.Constant(I32, 0))

    def build_driver_fast(self, name: str, scalar) -> None:
        """``i32 name(i64* ctx)``: 1-D blocks [BLOCK_BEGIN, BLOCK_END), each one countable
        loop over its lanes with no exit (vectorizable), then the lanes it could not finish
        (RESUME[t] == FAULTED) again through the exact scalar form. Returns 0, or 1 after a
        fault (recorded by the scalar form)."""
        d = self.open_driver(name)
        b, f, ctx = d.b, d.f, d.ctx
        inv, shared, save, resume = d.inv, d.shared, d.save, d.resume
        bx = d.ntid[0]
        cx, cy, cz = d.ctaid
        bbody = b.block
        lhead, lbody = f.append_basic_block("lanes"), f.append_basic_block("lane")
        lend = f.append_basic_block("lanes_end")
        rhead, rbody = f.append_basic_block("redo"), f.append_basic_block("redo_lane")
        rrun, rnext = f.append_basic_block("redo_run"), f.append_basic_block("redo_next")
        nextblk, fault = f.append_basic_block("next"), f.append_basic_block("fault")
        caches = [d.word(L.FIXED + i) for i in range(2 * self.nsites)]
        b.branch(lhead)
        b.position_at_end(lhead)
        t, missed = b.phi(I64), b.phi(I1)
        t.add_incoming(c64(0), bbody)
        missed.add_incoming(ir.Constant(I1, 0), bbody)
        b.cbranch(b.icmp_unsigned("<", t, bx), lbody, lend)
        b.position_at_end(lbody)
        zero = ir.Constant(I32, 0)
        lane = [ctx, zero, b.trunc(t, I32), zero, zero, cx, cy, cz, shared, save, *inv]
        r = b.call(self.step, [*lane, *caches, ir.Constant(I1, 1), ir.Constant(I64P, None)])
        # in the lanes' access group (Lowered.ir_text: each lane its own word): with every
        # access of the loop in it, LLVM vectorizes without proving the lane's accesses apart,
        # which it could not for nvcc's vadd_f32 (a gather-free loop it left scalar)
        b.store(r, b.gep(resume, [t], name="vresume_fast"))
        missed.add_incoming(b.or_(missed, b.icmp_signed("==", r, ir.Constant(I32, FAULTED))), lbody)
        t.add_incoming(b.add(t, c64(1)), lbody)
        b.branch(lhead)
        b.position_at_end(lend)
        b.cbranch(missed, rhead, nextblk)
        b.position_at_end(rhead)
        u = b.phi(I64)
        u.add_incoming(c64(0), lend)
        b.cbranch(b.icmp_unsigned("<", u, bx), rbody, nextblk)
        b.position_at_end(rbody)
        again = b.icmp_signed("==", b.load(b.gep(resume, [u])), ir.Constant(I32, FAULTED))
        b.cbranch(again, rrun, rnext)
        b.position_at_end(rrun)
        r2 = b.call(
            scalar, [ctx, zero, b.trunc(u, I32), zero, zero, cx, cy, cz, shared, save, *inv]
        )
        b.cbranch(b.icmp_signed("==", r2, ir.Constant(I32, FAULTED)), fault, rnext)
        b.position_at_end(rnext)
        u.add_incoming(b.add(u, c64(1)), rnext)
        b.branch(rhead)
        b.position_at_end(fault)
        b.ret(ir.Constant(I32, 1))
        b.position_at_end(nextblk)
        self.close_driver(d)

    def build_driver(self) -> None:
        """``i32 kern(i64* ctx)``: blocks [BLOCK_BEGIN, BLOCK_END) one after the other, each
        as rounds of a loop over its lanes (one round per barrier phase). Returns 0, or 1
        after a fault (recorded in the context)."""
        d = self.open_driver("kern_" + sanitize(self.fn.name))
        b, f, ctx = d.b, d.f, d.ctx
        inv, shared, save, resume = d.inv, d.shared, d.save, d.resume
        bx, by, bz = d.ntid
        nthreads = b.mul(b.mul(bx, by), bz)
        cx, cy, cz = d.ctaid
        nregs = self.nsave
        bar = self.has_bar
        yields = None
        if bar:
            zero, kept = f.append_basic_block("block_zero"), f.append_basic_block("block_kept")
            b.cbranch(d.fresh, zero, kept)
            b.position_at_end(zero)
            _zero(d, save, b.mul(nthreads, c64(8 * max(nregs, 1))))
            _zero(d, resume, b.mul(nthreads, c64(4)))
            b.branch(kept)
            b.position_at_end(kept)
        if self.has_yield:  # yield rounds this call ran (a cooperative block suspends at 2)
            at_entry = ir.IRBuilder()
            at_entry.position_at_start(f.entry_basic_block)
            yields = at_entry.alloca(I32, name="yield_rounds")
            b.store(ir.Constant(I32, 0), yields)
        # the block's unchecked shared accesses in bounds for all its lanes (:mod:`.proof`)
        proven = emit_proof(self, d, nthreads) if self.proof is not None else None
        rhead = round_head = f.append_basic_block("round")
        b.branch(rhead)
        b.position_at_end(rhead)
        if yields is not None:
            self.suspend_if_waiting(d, nthreads, yields)
            rhead = b.block
        nextblk = f.append_basic_block("next_block")
        fault = f.append_basic_block("fault")
        if not bar and 0 in self.simd_fns:  # no barrier, a loop: W lanes at a time
            _zero(d, resume, b.mul(nthreads, c64(4)))
            emit_groups(self, d, self.simd_fns[0], nthreads, fault, nextblk)
            b.position_at_end(fault)
            b.ret(ir.Constant(I32, 1))
            b.position_at_end(nextblk)
            self.close_driver(d)
            return
        if self.vec_regions or self.simd_fns:
            scalar_round = f.append_basic_block("scalar_round")
            self.build_vector_rounds(d, nthreads, rhead, scalar_round, nextblk, fault, proven)
            b.position_at_end(scalar_round)
            rhead = scalar_round
        yround = self.yield_round(d, nthreads) if self.has_yield else None
        rhead = b.block
        # lanes x fastest, then y, then z (the linear thread id order of the interpreter)
        zhead, zbody = f.append_basic_block("z"), f.append_basic_block("zb")
        yhead, ybody = f.append_basic_block("y"), f.append_basic_block("yb")
        xhead, xbody = f.append_basic_block("x"), f.append_basic_block("xb")
        lrun, lnext = f.append_basic_block("run"), f.append_basic_block("next")
        ynext, znext = f.append_basic_block("ynext"), f.append_basic_block("znext")
        rend = f.append_basic_block("round_end")
        b.branch(zhead)
        b.position_at_end(zhead)
        z, t_z, live_z = b.phi(I64), b.phi(I64), b.phi(I1)
        z.add_incoming(c64(0), rhead)
        t_z.add_incoming(c64(0), rhead)
        live_z.add_incoming(ir.Constant(I1, 0), rhead)
        b.cbranch(b.icmp_unsigned("<", z, bz), zbody, rend)
        b.position_at_end(zbody)
        b.branch(yhead)
        b.position_at_end(yhead)
        y, t_y, live_y = b.phi(I64), b.phi(I64), b.phi(I1)
        y.add_incoming(c64(0), zbody)
        t_y.add_incoming(t_z, zbody)
        live_y.add_incoming(live_z, zbody)
        b.cbranch(b.icmp_unsigned("<", y, by), ybody, znext)
        b.position_at_end(ybody)
        b.branch(xhead)
        b.position_at_end(xhead)
        x, t, live = b.phi(I64), b.phi(I64), b.phi(I1)
        x.add_incoming(c64(0), ybody)
        t.add_incoming(t_y, ybody)
        live.add_incoming(live_y, ybody)
        b.cbranch(b.icmp_unsigned("<", x, bx), xbody, ynext)
        b.position_at_end(xbody)
        if bar:
            rp = b.gep(resume, [t])
            r = b.load(rp)
            go = b.icmp_signed(">=", r, ir.Constant(I32, 0))
            skip_live = live
            if yround is not None:  # after a yield, only the yielded lanes run
                go = b.and_(go, b.or_(b.not_(yround), _tagged(b, r, YIELD)))
                skip_live = b.or_(live, b.icmp_signed(">=", r, ir.Constant(I32, 0)))
                r = b.and_(r, ir.Constant(I32, ~YIELD))
            b.cbranch(go, lrun, lnext)
        else:
            r = ir.Constant(I32, 0)
            b.branch(lrun)
        b.position_at_end(lrun)
        lane_save = b.gep(save, [t])
        tid = [b.trunc(v, I32) for v in (x, y, z)]
        nr = b.call(self.step, [ctx, r, *tid, cx, cy, cz, shared, lane_save, *inv])
        if bar:
            b.store(nr, rp)
        cont = f.append_basic_block("cont")
        b.cbranch(b.icmp_signed("==", nr, ir.Constant(I32, FAULTED)), fault, cont)
        b.position_at_end(cont)
        now_live = b.or_(live, b.icmp_signed(">=", nr, ir.Constant(I32, 0)))
        b.branch(lnext)
        b.position_at_end(lnext)
        live2 = b.phi(I1)
        live2.add_incoming(now_live, cont)
        if bar:
            live2.add_incoming(skip_live, xbody)
        if self.has_warp:  # the warp's last lane ran: its warp-level instructions now
            call_settle(self, d, t, nthreads, fault)
        x.add_incoming(b.add(x, c64(1)), b.block)
        t.add_incoming(b.add(t, c64(1)), b.block)
        live.add_incoming(live2, b.block)
        b.branch(xhead)
        b.position_at_end(ynext)
        y.add_incoming(b.add(y, c64(1)), ynext)
        t_y.add_incoming(t, ynext)
        live_y.add_incoming(live, ynext)
        b.branch(yhead)
        b.position_at_end(znext)
        z.add_incoming(b.add(z, c64(1)), znext)
        t_z.add_incoming(t_y, znext)
        live_z.add_incoming(live_y, znext)
        b.branch(zhead)
        live = live_z
        b.position_at_end(rend)
        b.cbranch(live, round_head, nextblk)
        b.position_at_end(fault)
        b.ret(ir.Constant(I32, 1))
        b.position_at_end(nextblk)
        self.close_driver(d)

    def suspend_if_waiting(self, d: _Driver, nthreads, yields) -> None:
        """At a round's start, in a cooperative launch (:mod:`.coop`): if some lane is
        stopped at a yield point and this call already ran a round of yielded lanes, return
        SUSPENDED, the block's state left in its buffers: its lanes wait on other blocks
        (grid.sync()'s arrival count), which the runner now runs. The first yield round of
        each call runs, so a resumed block looks at what it waits on once per call."""
        b, f = d.b, d.f
        scan, run = f.append_basic_block("coop_scan"), f.append_basic_block("coop_run")
        coop = b.icmp_unsigned("!=", d.word(L.COOP), c64(0))
        b.cbranch(coop, scan, run)
        b.position_at_end(scan)
        waiting = self.yield_round(d, nthreads)
        n = b.load(yields)
        leave, count = f.append_basic_block("coop_suspend"), f.append_basic_block("coop_count")
        b.cbranch(b.and_(waiting, b.icmp_unsigned(">=", n, ir.Constant(I32, 1))), leave, count)
        b.position_at_end(leave)
        b.ret(ir.Constant(I32, L.SUSPENDED))
        b.position_at_end(count)
        b.store(b.add(n, b.zext(waiting, I32)), yields)
        b.branch(run)
        b.position_at_end(run)

    def yield_round(self, d: _Driver, nthreads):
        """At a scalar round's start: whether some lane of the block is stopped at a yield
        point (:mod:`.spin`). Such a round runs only those lanes: the others wait at a
        barrier or a warp collective the yielded ones have not reached yet."""
        b, f = d.b, d.f
        start = b.block
        head, body, done = (f.append_basic_block(x) for x in ("yscan", "yscan_lane", "yscanned"))
        b.branch(head)
        b.position_at_end(head)
        i, anyy = b.phi(I64), b.phi(I1)
        i.add_incoming(c64(0), start)
        anyy.add_incoming(ir.Constant(I1, 0), start)
        b.cbranch(b.icmp_unsigned("<", i, nthreads), body, done)
        b.position_at_end(body)
        r = b.load(b.gep(d.resume, [i]))
        y = b.and_(b.icmp_signed(">=", r, ir.Constant(I32, 0)), _tagged(b, r, YIELD))
        anyy.add_incoming(b.or_(anyy, y), body)
        i.add_incoming(b.add(i, c64(1)), body)
        b.branch(head)
        b.position_at_end(done)
        return anyy

    def build_vector_rounds(
        self, d: _Driver, nthreads, rhead, scalar_round, nextblk, fault, proven=None
    ):
        """At the start of a round (``rhead``): pick the lanes to run and, when their region
        has the two-pass form, run it as vectorizable loops over the lanes (x innermost, the
        other lanes masked off), then the lanes it could not finish (a failed check) through
        the exact scalar form, in lane order; otherwise the scalar round. The lanes picked:
        if some lane is stopped at a yield point, those at the lowest yield (the others wait;
        lanes at barriers wait for all yields to be done), else every live lane, when all wait
        at the same barrier."""
        b, f, ctx = d.b, d.f, d.ctx
        inv, shared, save, resume = d.inv, d.shared, d.save, d.resume
        bx, by, bz = d.ntid
        cx, cy, cz = d.ctaid
        redo_tag = ir.Constant(I32, _REDO)
        big, none = ir.Constant(I32, 0x7FFFFFFF), ir.Constant(I32, -1)
        smin = self.intrinsic("llvm.smin.i32", I32, [I32, I32])
        smax = self.intrinsic("llvm.smax.i32", I32, [I32, I32])
        # the scan: the lowest and highest resume word of the live lanes, the lowest yield's
        shead, sbody, send = (f.append_basic_block(x) for x in ("scan", "scan_lane", "scanned"))
        b.branch(shead)
        b.position_at_end(shead)
        i, lmin, lmax, ymin = b.phi(I64), b.phi(I32), b.phi(I32), b.phi(I32)
        for phi, v in ((i, c64(0)), (lmin, big), (lmax, none), (ymin, big)):
            phi.add_incoming(v, rhead)
        b.cbranch(b.icmp_unsigned("<", i, nthreads), sbody, send)
        b.position_at_end(sbody)
        r = b.load(b.gep(resume, [i]))
        live = b.icmp_signed(">=", r, ir.Constant(I32, 0))
        lmin.add_incoming(b.call(smin, [lmin, b.select(live, r, big)]), sbody)
        lmax.add_incoming(b.call(smax, [lmax, r]), sbody)
        yielded = b.and_(live, _tagged(b, r, YIELD)) if self.has_yield else ir.Constant(I1, 0)
        ymin.add_incoming(b.call(smin, [ymin, b.select(yielded, r, big)]), sbody)
        i.add_incoming(b.add(i, c64(1)), sbody)
        b.branch(shead)
        b.position_at_end(send)
        alldone = f.append_basic_block("all_exited")
        pick = f.append_basic_block("pick_region")
        b.cbranch(b.icmp_signed("<", lmax, ir.Constant(I32, 0)), alldone, pick)
        b.position_at_end(alldone)
        b.branch(nextblk)
        b.position_at_end(pick)
        anyy = b.icmp_signed("!=", ymin, big)
        target = b.select(anyy, ymin, lmin)
        uni = f.append_basic_block("uniform")
        vec = b.or_(anyy, b.icmp_signed("==", lmin, lmax))
        if proven is not None:  # else its vector regions' unchecked accesses may fault
            vec = b.and_(vec, proven)
        b.cbranch(vec, uni, scalar_round)
        b.position_at_end(uni)
        # past the deadline: the scalar round, whose branches back check the stop flag (a
        # loop around barriers whose regions are all vectorized would otherwise never see it)
        stop = b.load_atomic(b.gep(ctx, [c64(L.STOP)]), "monotonic", 8)
        go = f.append_basic_block("vector_round")
        b.cbranch(b.icmp_unsigned("!=", stop, c64(0)), scalar_round, go)
        b.position_at_end(go)
        sw = b.switch(target, scalar_round)
        redo = f.append_basic_block("redo")
        failed_any: list = []
        body = self.fn.body or []
        stops = stop_indices(body)
        affine = {
            k: self.affine_regs(self.restore_at[id(body[stops[k - 1]])]) if k else {}
            for k in self.vec_regions
        }
        with b.goto_entry_block():
            bases = b.alloca(I64, max(self.nsave_regs, 1), name="row_bases")
        for k in self.vec_regions:
            word = ir.Constant(I32, self.region_word(k))
            ent = f.append_basic_block(f"vec{k}")
            sw.add_case(word, ent)
            b.position_at_end(ent)
            caches = [d.word(L.FIXED + j) for j in range(2 * self.nsites)]
            zh, zb, yh, yb = (f.append_basic_block(f"v{k}{x}") for x in ("z", "zb", "y", "yb"))
            xh, xb = f.append_basic_block(f"vlanes{k}"), f.append_basic_block(f"vlane{k}")
            yn, zn = f.append_basic_block(f"v{k}yn"), f.append_basic_block(f"v{k}zn")
            b.branch(zh)
            b.position_at_end(zh)
            # whether some lane failed a check (an or-reduction through the loops): the
            # lanes to redo are looked for only then
            z, fz = b.phi(I64), b.phi(I8)
            z.add_incoming(c64(0), ent)
            fz.add_incoming(ir.Constant(I8, 0), ent)
            failed_any.append((fz, zh))
            b.cbranch(b.icmp_unsigned("<", z, bz), zb, redo)
            b.position_at_end(zb)
            b.branch(yh)
            b.position_at_end(yh)
            y, fy = b.phi(I64), b.phi(I8)
            y.add_incoming(c64(0), zb)
            fy.add_incoming(fz, zb)
            b.cbranch(b.icmp_unsigned("<", y, by), yb, zn)
            b.position_at_end(yb)
            row = b.mul(b.add(b.mul(z, by), y), bx)
            for uid in affine[k]:  # the row's first lane's words (restore_affine)
                j = c64(self.reg_index[uid])
                word0 = b.load(b.gep(save, [b.add(b.mul(nthreads, j), row)]))
                b.store(word0, b.gep(bases, [j]))
            b.branch(xh)
            b.position_at_end(xh)
            x, fx = b.phi(I64), b.phi(I8)
            x.add_incoming(c64(0), yb)
            fx.add_incoming(fy, yb)
            b.cbranch(b.icmp_unsigned("<", x, bx), xb, yn)
            b.position_at_end(xb)
            t = b.add(row, x)
            slot = b.gep(resume, [t], name="vresume")  # in the loops' access group
            old = b.load(slot)
            active = b.icmp_signed("==", old, word)
            tid = [b.trunc(v, I32) for v in (x, y, z)]
            lane_save = b.gep(save, [t])
            lane = [ctx, ir.Constant(I32, k), *tid, cx, cy, cz, shared, lane_save, *inv]
            # every lane runs the region's code, the masked-off ones without effect: a
            # branch around it would make every access of the loop a masked one, which the
            # vectorizer's cost model finds not worth vectorizing
            nr = b.call(self.fast_step, [*lane, *caches, active, bases])
            failed = b.icmp_signed("==", nr, ir.Constant(I32, FAULTED))
            nr = b.select(failed, b.add(redo_tag, ir.Constant(I32, k)), nr)
            b.store(b.select(active, nr, old), slot)
            fx.add_incoming(b.or_(fx, b.zext(b.and_(active, failed), I8)), xb)
            x.add_incoming(b.add(x, c64(1)), xb)
            b.branch(xh)
            self.par_loops.append((d.f.name, f"vlanes{k}"))
            b.position_at_end(yn)
            fy.add_incoming(fx, yn)
            y.add_incoming(b.add(y, c64(1)), yn)
            b.branch(yh)
            b.position_at_end(zn)
            fz.add_incoming(fy, zn)
            z.add_incoming(b.add(z, c64(1)), zn)
            b.branch(zh)
        # regions with loops (or loads after stores): W lanes at a time, explicit vectors
        for k, fn in self.simd_fns.items():
            ent = f.append_basic_block(f"simd{k}")
            sw.add_case(ir.Constant(I32, self.region_word(k)), ent)
            b.position_at_end(ent)
            done = f.append_basic_block(f"simd{k}_done")
            emit_groups(self, d, fn, nthreads, fault, done)
            b.position_at_end(done)
            b.branch(rhead)
        # the lanes left to redo, in lane order, through the scalar form
        b.position_at_end(redo)
        failed = b.phi(I8)
        for v, blk in failed_any:
            failed.add_incoming(v, blk)
        rh, rb, rr = (f.append_basic_block(x) for x in ("redo_head", "redo_lane", "redo_run"))
        rn = f.append_basic_block("redo_next")
        b.cbranch(b.icmp_unsigned("!=", failed, ir.Constant(I8, 0)), rh, rhead)
        b.position_at_end(rh)
        u = b.phi(I64)
        u.add_incoming(c64(0), redo)
        b.cbranch(b.icmp_unsigned("<", u, nthreads), rb, rhead)
        b.position_at_end(rb)
        rp = b.gep(resume, [u])
        rv = b.load(rp)
        b.cbranch(b.icmp_signed(">=", rv, redo_tag), rr, rn)
        b.position_at_end(rr)
        ux = b.urem(u, bx)
        uy = b.urem(b.udiv(u, bx), by)
        uz = b.udiv(u, b.mul(bx, by))
        tid = [b.trunc(v, I32) for v in (ux, uy, uz)]
        lane_save = b.gep(save, [u])
        r2 = b.call(
            self.step, [ctx, b.sub(rv, redo_tag), *tid, cx, cy, cz, shared, lane_save, *inv]
        )
        b.store(r2, rp)
        b.cbranch(b.icmp_signed("==", r2, ir.Constant(I32, FAULTED)), fault, rn)
        b.position_at_end(rn)
        u.add_incoming(b.add(u, c64(1)), rn)
        b.branch(rh)


#: kernels with more warp-level instructions than this run interpreted. Each one stops every
#: lane (:mod:`.warp`: its live registers saved, the warp settled, the registers restored), and
#: the interpreter runs a collective for all lanes at once: CUB's onesweep radix sort kernel
#: (239 of them, unrolled block-wide ranking with ``vote.ballot``/``match``) ran 2.5-3x slower
#: compiled (0.30 s against 0.11 s for 16 tiles of 8064 keys) and took ~18 s to compile.
#: ``CRANE_PTX_JIT_MAX_WARP_SITES`` overrides it (to measure such kernels compiled)
MAX_WARP_SITES = 64

#: a lane's resume word after the vectorized form could not finish it: this plus its region
_REDO = 1 << 24


def _tagged(b: ir.IRBuilder, r, tag: int):
    return b.icmp_unsigned("!=", b.and_(r, ir.Constant(I32, tag)), ir.Constant(I32, 0))


def _zero(d: _Driver, ptr, nbytes) -> None:
    """Clear ``nbytes`` at ``ptr`` (the driver's buffers before a block runs)."""
    b = d.b
    b.call(d.memset, [b.bitcast(ptr, I8P), ir.Constant(I8, 0), nbytes, ir.Constant(I1, 0)])


class _Driver:
    """What :meth:`KernelLowering.open_driver` built: the function, its builder and context, the
    loaded context words and the block loop's pieces."""

    def __init__(self, f: ir.Function, b: ir.IRBuilder, ctx, word) -> None:
        self.f, self.b, self.ctx, self.word = f, b, ctx, word


#: instructions whose result is a function of their operands only (no memory but kernel
#: parameters, no fault): a register such an instruction defines can be computed again
_PURE = {
    "mov", "add", "sub", "mul", "mad", "shl", "shr", "and", "or", "xor", "not", "neg",
    "min", "max", "cvt", "cvta", "setp", "selp", "ld",
}  # fmt: skip


def rematerializable(body, live=None) -> tuple[dict[int, frozenset[int]], list]:
    """Registers that can be computed again after a stop instead of saved: defined once in
    the whole kernel, by an unguarded pure instruction that dominates every stop the register
    is live after (``live``: :func:`.liveness.live_after`; None: every stop) — every lane
    that reaches one ran it — from immediates, symbols, kernel parameters, the geometry
    special registers and other such registers whose definitions dominate it. Returns
    ``{uid: the uids it depends on, transitively}`` and the defining instructions in order
    as ``[(instr, uid)]``."""
    defs: dict[int, int] = {}
    for s in body:
        if isinstance(s, Instr):
            for uid in dest_src(s)[0]:
                defs[uid] = defs.get(uid, 0) + 1
    dom = _Dominance(body)
    stops = stop_indices(body)
    remat: dict[int, frozenset[int]] = {}
    prefix: list = []
    by_name: dict[str, tuple[int, int]] = {}  # register -> (uid, index of its definition)
    for i, s in enumerate(body):
        if isinstance(s, Label):
            continue
        op = s.opcode.split(".")[0]
        ops = s.operands if isinstance(s.operands, list) else None
        if s.guard is not None or op not in _PURE or not ops or ops[0][0] != "reg":
            continue
        if op == "ld" and "param" not in s.opcode.split("."):
            continue
        dest = ops[0][1]
        r = s.scope.reg(dest) if s.scope is not None else None
        if r is None or defs.get(r.uid) != 1:
            continue
        at = [j for j in stops if live is None or r.uid in live[id(body[j])]]
        if not all(dom.dominates(i, j) for j in at):
            continue
        deps: set[int] = set()
        ok = True
        for o in ops[1:]:
            for name in _reg_names(o):
                if name in SPECIAL_GEOM:
                    continue
                got = by_name.get(name)
                if got is None or not dom.dominates(got[1], i):
                    ok = False
                    break
                deps |= {got[0]} | remat[got[0]]
            ok = ok and _pure_operand(o, op)
        if ok:
            by_name[dest] = (r.uid, i)
            remat[r.uid] = frozenset(deps)
            prefix.append((s, r.uid))
    return remat, prefix


#: special registers with the same value for every lane of a vector loop over %tid.x
_X_INVARIANT_SPECIALS = frozenset(
    {"%tid.y", "%tid.z", "%ntid.x", "%ntid.y", "%ntid.z"}
    | {"%ctaid.x", "%ctaid.y", "%ctaid.z", "%nctaid.x", "%nctaid.y", "%nctaid.z"}
)


def x_uniform(body, prefix) -> dict[int, int]:
    """Of the rematerializable registers (``prefix``, :func:`rematerializable`), those whose
    value does not depend on %tid.x (nor on %laneid or the like): the same for every lane of
    a row of the block, so for every lane of a vector loop over x. Returns ``{uid: index
    of its one definition}`` (a use is uniform only where that definition dominates it)."""
    index = {id(s): i for i, s in enumerate(body)}
    out: dict[int, int] = {}
    by_name: dict[str, int] = {}
    for ins, uid in prefix:
        ops = ins.operands
        ok = True
        for o in ops[1:]:
            for name in _reg_names(o):
                if name in SPECIAL_GEOM:
                    ok = ok and name in _X_INVARIANT_SPECIALS
                else:
                    ok = ok and by_name.get(name) in out
        dest = ops[0][1]
        if ok:
            by_name[dest] = uid
            out[uid] = index[id(ins)]
    return out


class _Dominance:
    """Dominance between the kernel's instructions (by index), from its basic blocks."""

    def __init__(self, body) -> None:
        n = len(body)
        labels = {s.name: i for i, s in enumerate(body) if isinstance(s, Label)}
        succ: dict[int, list[int]] = {}
        for i, s in enumerate(body):
            nxt = [i + 1]
            if isinstance(s, Instr):
                op = s.opcode.split(".")[0]
                if op in ("exit", "ret", "trap") and s.guard is None:
                    nxt = []
                elif op in ("bra", "brx"):
                    ops = s.operands if isinstance(s.operands, list) else []
                    t = labels.get(ops[0][1]) if ops and ops[0][0] == "name" else None
                    # an unknown target: every instruction may follow (dominates nothing)
                    targets = [t] if t is not None else list(range(n))
                    nxt = targets if s.guard is None else [*targets, i + 1]
            succ[i] = [x for x in nxt if x < n]
        leaders = {0} | {x for i in succ for x in succ[i] if x != i + 1}
        leaders |= {i + 1 for i in succ if succ[i] != [i + 1] and i + 1 < n}
        order = sorted(leaders)
        self.block = [0] * n
        for k, start in enumerate(order):
            end = order[k + 1] if k + 1 < len(order) else n
            for i in range(start, end):
                self.block[i] = k
        nb = len(order)
        preds: list[set[int]] = [set() for _ in range(nb)]
        for i, outs in succ.items():
            for x in outs:
                if self.block[x] != self.block[i] or x <= i:
                    preds[self.block[x]].add(self.block[i])
        full = (1 << nb) - 1
        doms = [full] * nb
        if nb:
            doms[0] = 1
        changed = True
        while changed:
            changed = False
            for b in range(1, nb):
                d = full
                for p in preds[b]:
                    d &= doms[p]
                d = (d if preds[b] else 0) | (1 << b)
                if d != doms[b]:
                    doms[b], changed = d, True
        self.doms = doms

    def dominates(self, a: int, b: int) -> bool:
        """Whether instruction ``a`` runs before ``b`` on every path from the entry."""
        ba, bb = self.block[a], self.block[b]
        if ba == bb:
            return a < b
        return bool(self.doms[bb] >> ba & 1)


def _reg_names(op) -> list[str]:
    if not isinstance(op, tuple) or not op:
        return []
    if op[0] == "reg":
        return [op[1]]
    if op[0] == "not":
        return _reg_names(op[1])
    if op[0] == "vec":
        return [n for o in op[1] for n in _reg_names(o)]
    if op[0] == "mem" and isinstance(op[1], tuple):
        return _reg_names(op[1])
    return [n for o in op[1:] if isinstance(o, tuple) for n in _reg_names(o)]


def _pure_operand(op, opcode: str) -> bool:
    """An operand a rematerialized instruction may read: registers (checked by the caller),
    immediates, symbol addresses, or a kernel parameter's memory (``ld.param``)."""
    kind = op[0] if isinstance(op, tuple) and op else None
    if kind in ("reg", "int", "f32", "f64", "name", "not"):
        return True
    return kind == "mem" and opcode == "ld"


def _address_key(ins: Instr | None) -> tuple | None:
    """``ins``'s memory operand as ``(base, offset)``, its base a register's uid, a symbol's
    name or an immediate; None without one (or a register the scope does not know)."""
    ops = ins.operands if ins is not None and isinstance(ins.operands, list) else []
    mem = next((o for o in ops if isinstance(o, tuple) and o and o[0] == "mem"), None)
    if mem is None or len(mem) < 3 or not isinstance(mem[1], tuple):
        return None
    base, off = mem[1], mem[2]
    if base[0] == "reg":
        r = ins.scope.reg(base[1]) if ins.scope is not None else None
        return None if r is None else ("reg", r.uid, off)
    if base[0] in ("name", "int"):
        return (base[0], base[1], off)
    return None


def _is_generic_access(opcode: str) -> bool:
    """An ld/st without a state space: its address may fall in the shared window."""
    parts = opcode.split(".")
    return parts[0] in ("ld", "st", "atom", "red") and not any(
        p in ("global", "shared", "param", "const", "local") for p in parts[1:]
    )


def lower_kernel(
    fn: Function,
    kparam_offsets: dict,
    slot_of,
    param_bytes: int,
    simd: bool = True,
    externs: frozenset[str] = frozenset(),
    funcs: dict[str, Function] | None = None,
) -> Lowered:
    """Lower entry function ``fn`` or raise :class:`Refusal`. ``slot_of(var)`` gives the
    symbol slot of a module or shared variable (None if it has none); ``simd``: whether
    regions may take the vector form (:mod:`.simd`); ``externs``: the module's functions
    declared without a body (a call to ``__assertfail`` is lowered only if it is one);
    ``funcs``: its device functions with a body, by name (calls to them are inlined)."""
    if fn.body is None:
        raise Refusal(f"{fn.name} has no body", fn.line)
    fn = inline_calls(fn, funcs or {})  # device functions' bodies at their call sites
    fn = resolve_named_regs(fn)
    waited = spin_wait(fn)
    if waited is not None:  # lanes run one after another here: a wait on a later lane hangs
        raise Refusal(f"a spin-wait on `{waited.text}`", waited.line)
    fn = with_lockstep(fn)  # warp-synchronous .volatile accesses: a warp stop before each
    sites = sum(1 for s in fn.body if isinstance(s, Instr) and is_warp_stop(s))
    most = int(os.environ.get("CRANE_PTX_JIT_MAX_WARP_SITES", MAX_WARP_SITES))
    if sites > most:
        raise Refusal(
            f"{sites} warp-level instructions (more than {most}: each stops every "
            "lane, and so many make the kernel slower compiled than interpreted)",
            fn.line,
        )
    fn = with_yields(fn)  # loops waiting on ordered loads let the block's other lanes run
    fn = with_exit_yields(fn)  # a loop around barriers leaves its exit path to a region
    k = KernelLowering(fn, kparam_offsets, slot_of, param_bytes, externs)
    k.simd = simd
    k.declare_lookup()
    return k.build()
