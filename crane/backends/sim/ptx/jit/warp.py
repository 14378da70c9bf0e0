"""Warp-level instructions in compiled kernels: each one a barrier scoped to the warp.

Why this shape: the compiled code runs a block's lanes one after the other, not in lockstep,
so a lane cannot compute a collective alone. A warp-level instruction (``shfl``, ``vote``,
``redux``, ``match``, ``activemask``, ``bar.warp.sync``) therefore *stops* the lane the way
``bar.sync`` does (:mod:`.lower`'s regions): the lane writes its operands to scratch words of
its save area, saves its live registers and returns the instruction's resume point tagged
:data:`WARP_STOP` (``bar.warp.sync``: :data:`WARP_BAR`). When the block loop has run the last
lane of a warp, :func:`build_settle`'s function *settles* the warp the interpreter's way:

* its scheduler runs the group at the lowest program point first and lanes at one point run
  together, so of the warp's lanes stopped at collectives, those at the lowest one are the
  group: their results are computed from the group's scratch words (all of them before any
  lane goes on), then they run on, in lane order, to their next stop;
* lanes at ``bar.warp.sync`` are released only when no lane of the warp is at a collective
  (the interpreter releases warp-parked lanes when nothing else can run);
* lanes at ``bar.sync`` or exited stay so: the block loop's next round takes them.

The collectives follow ops_warp.py exactly: ``vote``/``redux`` over the lanes here with the
same member mask (each counting only if its own bit is in the mask), ``match`` over the lanes
here named in the lane's mask, ``activemask`` the lanes here. ``shfl`` reads its source lane's
register wherever that lane is (the interpreter does too): the registers read by a ``shfl``
are kept in the save area at every stop and at exit (never recomputed), so the word there is
the lane's current value. What is left different: a source lane that is neither here nor
stopped nor exited cannot exist (the warp is settled when all its lanes stopped), but a lane
that ran ahead to a later stop than the interpreter's schedule would have let it reach shows
its later value — only in programs that read lanes outside the shuffle's group, which CUDA
leaves undefined.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..ptxtypes import TYPES
from .irtypes import FAULTED, I1, I8P, I32, I64, I64P, Refusal, c64, counted_loop, resize
from .lockstep import LOCKSTEP_OP

__all__ = [
    "NSCRATCH",
    "WARP_BAR",
    "WARP_OPS",
    "WARP_STOP",
    "YIELD",
    "WarpSite",
    "build_settle",
    "call_settle",
    "is_warp_stop",
    "keep_live",
    "lower_warp",
    "shfl_sources",
]

#: opcodes (first part) of the collectives handled here (``lockstep``: the stop :mod:`.lockstep`
#: puts before a warp-synchronous ``.volatile`` access, a collective that computes nothing)
WARP_OPS = frozenset({"shfl", "vote", "redux", "match", "activemask", LOCKSTEP_OP})
#: resume tags: a lane stopped at a collective / at ``bar.warp.sync`` (below the lowering's
#: redo tag, above every resume point)
WARP_STOP = 1 << 20
WARP_BAR = 1 << 21
#: resume tag of a lane stopped at a yield point (:mod:`.spin`): a warp with such a lane is
#: not settled until it has run on (it may be on its way to the warp's collective)
YIELD = 1 << 22
#: scratch words per lane after its saved registers: the operand, shfl's b and c, the member
#: mask, the result and the result predicate
A, B, C, M, RES, RES2 = range(6)
NSCRATCH = 6
FULL = 0xFFFFFFFF


@dataclass
class WarpSite:
    """One collective: its resume point and what the settle code needs to compute it."""

    resume: int
    op: str  # shfl / vote / redux / match / activemask / lockstep
    mode: str  # shfl: up/down/bfly/idx; vote: all/any/uni/ballot; redux: add/...; match
    signed: bool = False  # redux min/max
    bits: int = 32  # redux / match operand width
    src_slot: int | None = None  # shfl: the save-area index of register a (None: immediate)


def is_warp_stop(s) -> bool:
    """Whether instruction ``s`` stops a lane for its warp (a collective or bar.warp.sync)."""
    parts = s.opcode.split(".")
    return parts[0] in WARP_OPS or (parts[0] in ("bar", "barrier") and "warp" in parts)


def shfl_sources(fn) -> set[int]:
    """Register uids a ``shfl`` reads as its value: other lanes read them wherever the lane
    is, so they are kept in the save area at every stop and at exit."""
    out: set[int] = set()
    for s in fn.body or []:
        if getattr(s, "opcode", "").split(".")[0] != "shfl":
            continue
        ops = s.operands if isinstance(s.operands, list) else []
        if len(ops) > 1 and ops[1][0] == "reg" and s.scope is not None:
            r = s.scope.reg(ops[1][1])
            if r is not None:
                out.add(r.uid)
    return out


def keep_live(fn, live: dict, keep: set[int], is_stop) -> dict:
    """``live`` with the ``keep`` registers live after every stop."""
    if not keep:
        return live
    out = dict(live)
    for s in fn.body or []:
        if hasattr(s, "opcode") and is_stop(s) and id(s) in out:
            out[id(s)] = out[id(s)] | frozenset(keep)
    return out


# ---- the lane's side: operands out, stop, results in ---------------------------------------


def _scratch(k, j: int):
    """A pointer to this lane's scratch word ``j``."""
    b = k.b
    nthreads = b.mul(b.mul(k.ntid[0], k.ntid[1]), k.ntid[2])
    off = b.mul(b.zext(nthreads, I64), c64(k.nsave_regs + j))
    return b.gep(k.save, [off])


def _put_scratch(k, j: int, v) -> None:
    b = k.b
    v = b.zext(v, I64) if v.type.width < 64 else v
    b.store(v, _scratch(k, j))


def _mask(k, ops, idx: int):
    """Member mask operand ``idx`` (absent: the full warp)."""
    if len(ops) <= idx:
        return ir.Constant(I32, FULL)
    return k.get(ops[idx], TYPES["u32"])


def lower_warp(k, op: str, types, mods, ops) -> None:
    """The lane's code for a warp-level instruction (``k``: the :class:`KernelLowering`)."""
    if k.fast:
        raise k.refuse("warp-level instruction in the vectorized form")
    if isinstance(ops, Exception):
        raise k.refuse("unparsable operands")
    rk = len(k.resumes) + 1
    dests: list[tuple] = []
    if op in ("bar", "barrier"):
        k.only(mods, ("warp", "sync"))
        tag = WARP_BAR
        site = None
    else:
        tag = WARP_STOP
        site = _operands(k, op, types, mods, ops, rk, dests)
        k.warp_sites.append(site)
    b = k.b
    live = k.live[id(k.ins)]
    k.save_regs(live)
    b.ret(ir.Constant(I32, rk | tag))
    blk = k.step.append_basic_block(f"resume{rk}")
    k.resumes.append(blk)
    b.position_at_end(blk)
    k.restore_regs(live)
    for slot, dest, t in dests:
        v = b.load(_scratch(k, slot))
        k.put(dest, t, b.trunc(v, I1) if t.kind == "pred" else resize(b, v, t.bits, False))


def _operands(k, op, types, mods, ops, rk: int, dests: list) -> WarpSite:
    """Check the form, write the lane's operands to scratch, note the destinations."""
    b32, pred, u32 = TYPES["b32"], TYPES["pred"], TYPES["u32"]

    def dest_pair(d) -> None:
        if d[0] == "pair":
            dests.extend([(RES, d[1], b32), (RES2, d[2], pred)])
        else:
            dests.append((RES, d, b32))

    if op == "shfl":
        mode = next((m for m in mods if m in ("up", "down", "bfly", "idx")), None)
        k.only(mods, ("sync", "up", "down", "bfly", "idx"))
        sync = "sync" in mods
        if mode is None or len(types) != 1 or types[0].bits != 32 or types[0].kind == "pred":
            raise k.refuse("shfl form")
        if len(ops) != (5 if sync else 4):
            raise k.refuse("shfl operands")
        a = ops[1]
        src_slot = None
        if a[0] == "reg":
            r = k.regdecl(a[1])
            if r.uid not in k.reg_index or r.type.bits != 32 or r.type.kind == "pred":
                raise k.refuse("shfl source register")
            src_slot = k.reg_index[r.uid]
        else:
            _put_scratch(k, A, k.get(a, b32))
        _put_scratch(k, B, k.get(ops[2], u32))
        _put_scratch(k, C, k.get(ops[3], u32))
        dest_pair(ops[0])
        return WarpSite(rk, "shfl", mode, src_slot=src_slot)
    if op == "vote":
        mode = next((m for m in mods if m in ("all", "any", "uni", "ballot")), None)
        k.only(mods, ("sync", "all", "any", "uni", "ballot"))
        sync = "sync" in mods
        if mode is None or len(ops) != (3 if sync else 2):
            raise k.refuse("vote form")
        _put_scratch(k, A, k.get(ops[1], pred))
        _put_scratch(k, M, _mask(k, ops, 2))
        dests.append((RES, ops[0], b32 if mode == "ballot" else pred))
        return WarpSite(rk, "vote", mode)
    if op == "redux":
        mode = next((m for m in mods if m in ("add", "min", "max", "and", "or", "xor")), None)
        k.only(mods, ("sync", "add", "min", "max", "and", "or", "xor"))
        if mode is None or len(types) != 1 or len(ops) != 3:
            raise k.refuse("redux form")
        t = types[0]
        if t.kind not in ("u", "s", "b") or t.bits != 32:
            raise k.refuse(f"redux type .{t.name}")
        _put_scratch(k, A, k.get(ops[1], t))
        _put_scratch(k, M, k.get(ops[2], u32))
        dests.append((RES, ops[0], t))
        return WarpSite(rk, "redux", mode, signed=t.kind == "s")
    if op == "match":
        mode = next((m for m in mods if m in ("any", "all")), None)
        k.only(mods, ("sync", "any", "all"))
        if mode is None or len(types) != 1 or len(ops) != 3:
            raise k.refuse("match form")
        t = types[0]
        if t.kind not in ("u", "s", "b") or t.bits not in (32, 64):
            raise k.refuse(f"match type .{t.name}")
        _put_scratch(k, A, k.get(ops[1], t))
        _put_scratch(k, M, k.get(ops[2], u32))
        dest_pair(ops[0])
        if mode == "any" and ops[0][0] == "pair":
            raise k.refuse("match.any with a predicate")
        return WarpSite(rk, "match", mode, bits=t.bits)
    if op == LOCKSTEP_OP:  # nothing to hand over: the access follows the resume point
        return WarpSite(rk, op, "")
    # activemask
    k.only(mods)
    if len(ops) != 1:
        raise k.refuse("activemask form")
    dests.append((RES, ops[0], b32))
    return WarpSite(rk, "activemask", "")


# ---- the driver's side: settling a warp --------------------------------------------------


class _Fn:
    """Builder state of the settle function."""

    def __init__(self, f: ir.Function, b: ir.IRBuilder) -> None:
        self.f, self.b = f, b

    def loop(self, n, body) -> None:
        """``for j in range(n): body(j)`` (j: i64); body may add blocks."""
        counted_loop(self.b, self.f, n, body)

    def when(self, cond, body) -> None:
        b, f = self.b, self.f
        yes, after = f.append_basic_block("w"), f.append_basic_block("wa")
        b.cbranch(cond, yes, after)
        b.position_at_end(yes)
        body()
        if not b.block.is_terminated:
            b.branch(after)
        b.position_at_end(after)


def build_settle(k, invariant: tuple, ntid_at: int) -> ir.Function:
    """``i32 warp_settle(ctx, w0, wn, cx, cy, cz, shared, save, resume, *inv)``: settle the
    warp of lanes [w0, w0 + wn) of the block (see the module docstring); 1 after a fault."""
    args = [I64P, I64, I64, I32, I32, I32, I8P, I64P, I32.as_pointer()] + [I64] * len(invariant)
    f = ir.Function(k.mod, ir.FunctionType(I32, args), "warp_settle")
    f.linkage = "internal"
    f.attributes.add("noinline")
    ctx, w0, wn, cx, cy, cz, shared, save, resume = f.args[:9]
    inv = list(f.args[9:])
    b = ir.IRBuilder(f.append_basic_block("entry"))
    s = _Fn(f, b)
    bx, by, bz = inv[ntid_at : ntid_at + 3]
    nthreads = b.mul(b.mul(bx, by), bz)
    kmin = b.alloca(I32, name="kmin")
    anybar = b.alloca(I1, name="anybar")
    anyyield = b.alloca(I1, name="anyyield")
    acc = [b.alloca(I64, name=f"acc{i}") for i in range(3)]
    top = f.append_basic_block("settle")
    b.branch(top)
    b.position_at_end(top)
    b.store(ir.Constant(I32, WARP_STOP), kmin)
    b.store(ir.Constant(I1, 0), anybar)
    b.store(ir.Constant(I1, 0), anyyield)

    def res_of(j):
        return b.gep(resume, [b.add(w0, j)])

    def scan(j):
        r = b.load(res_of(j))
        at = b.and_(b.icmp_signed(">=", r, ir.Constant(I32, 0)), _has(b, r, WARP_STOP))
        pt = b.and_(r, ir.Constant(I32, WARP_STOP - 1))
        cur = b.load(kmin)
        b.store(b.select(b.and_(at, b.icmp_unsigned("<", pt, cur)), pt, cur), kmin)
        wb = b.and_(b.icmp_signed(">=", r, ir.Constant(I32, 0)), _has(b, r, WARP_BAR))
        b.store(b.or_(b.load(anybar), wb), anybar)
        wy = b.and_(b.icmp_signed(">=", r, ir.Constant(I32, 0)), _has(b, r, YIELD))
        b.store(b.or_(b.load(anyyield), wy), anyyield)

    s.loop(wn, scan)
    km = b.load(kmin)
    coll, nocoll = f.append_basic_block("collective"), f.append_basic_block("no_collective")
    fin = f.append_basic_block("settled")
    decide = f.append_basic_block("decide")
    b.cbranch(b.load(anyyield), fin, decide)  # a lane yielded: the warp waits for it
    b.position_at_end(decide)
    b.cbranch(b.icmp_unsigned("<", km, ir.Constant(I32, WARP_STOP)), coll, nocoll)

    def word(slot: int, lane):
        """Scratch word ``slot`` of block lane ``lane`` (i64)."""
        off = b.add(b.mul(nthreads, c64(k.nsave_regs + slot)), lane)
        return b.gep(save, [off])

    def run_lanes(pick, start_of) -> None:
        """Run the lanes ``pick(r)`` selects from resume point ``start_of(r)``, in order."""

        def one(j):
            rp = res_of(j)
            r = b.load(rp)

            def go():
                t = b.add(w0, j)
                tx = b.trunc(b.urem(t, bx), I32)
                ty = b.trunc(b.urem(b.udiv(t, bx), by), I32)
                tz = b.trunc(b.udiv(t, b.mul(bx, by)), I32)
                lane_save = b.gep(save, [t])
                nr = b.call(
                    k.step, [ctx, start_of(r), tx, ty, tz, cx, cy, cz, shared, lane_save, *inv]
                )
                b.store(nr, rp)
                bad = f.append_basic_block("faulted")
                ok = f.append_basic_block("ran")
                b.cbranch(b.icmp_signed("==", nr, ir.Constant(I32, FAULTED)), bad, ok)
                b.position_at_end(bad)
                b.ret(ir.Constant(I32, 1))
                b.position_at_end(ok)

            s.when(pick(r), go)

        s.loop(wn, one)

    # the group at the lowest collective: results for all of them, then they run on
    b.position_at_end(coll)
    tagged = b.or_(km, ir.Constant(I32, WARP_STOP))

    def here(j):
        return b.icmp_unsigned("==", b.load(res_of(j)), tagged)

    sw_end = f.append_basic_block("computed")
    b.position_at_end(coll)

    def compute(i):
        def for_lane():
            after = f.append_basic_block("lane_done")
            sw = b.switch(km, after)
            for site in k.warp_sites:
                blk = f.append_basic_block(f"site{site.resume}")
                sw.add_case(ir.Constant(I32, site.resume), blk)
                b.position_at_end(blk)
                _compute_site(s, site, i, w0, wn, here, word, save, nthreads, acc)
                b.branch(after)
            b.position_at_end(after)

        s.when(here(i), for_lane)

    s.loop(wn, compute)
    b.branch(sw_end)
    b.position_at_end(sw_end)
    run_lanes(lambda r: b.icmp_unsigned("==", r, tagged), lambda r: km)
    b.branch(top)
    # no collective: release the lanes at bar.warp.sync, or the warp is settled
    b.position_at_end(nocoll)
    rel = f.append_basic_block("release")
    b.cbranch(b.load(anybar), rel, fin)
    b.position_at_end(rel)
    run_lanes(
        lambda r: b.and_(b.icmp_signed(">=", r, ir.Constant(I32, 0)), _has(b, r, WARP_BAR)),
        lambda r: b.and_(r, ir.Constant(I32, WARP_BAR - 1)),
    )
    b.branch(top)
    b.position_at_end(fin)
    b.ret(ir.Constant(I32, 0))
    return f


def _has(b: ir.IRBuilder, r, tag: int):
    """Whether resume word ``r`` (not negative) carries ``tag``."""
    return b.icmp_unsigned("!=", b.and_(r, ir.Constant(I32, tag)), ir.Constant(I32, 0))


def _compute_site(s: _Fn, site: WarpSite, i, w0, wn, here, word, save, nthreads, acc) -> None:
    """The results (scratch RES, RES2) of warp lane ``i`` at collective ``site``."""
    if site.op == LOCKSTEP_OP:
        return
    b = s.b
    li = b.add(w0, i)
    one = c64(1)

    def ld(slot, j):
        return b.load(word(slot, b.add(w0, j)))

    def st(slot, v):
        b.store(b.zext(v, I64) if v.type.width < 64 else v, word(slot, li))

    if site.op == "shfl":
        lane = i
        bb = b.and_(ld(B, i), c64(31))
        cc = b.and_(ld(C, i), c64(FULL))
        cval = b.and_(cc, c64(31))
        seg = b.and_(b.lshr(cc, c64(8)), c64(31))
        nseg = b.xor(seg, c64(-1))
        maxl = b.or_(b.and_(lane, seg), b.and_(cval, nseg))
        minl = b.and_(lane, seg)
        if site.mode == "up":
            j = b.sub(lane, bb)
            p = b.icmp_signed(">=", j, maxl)
        elif site.mode == "down":
            j = b.add(lane, bb)
            p = b.icmp_signed("<=", j, maxl)
        elif site.mode == "bfly":
            j = b.xor(lane, bb)
            p = b.icmp_signed("<=", j, maxl)
        else:
            j = b.or_(minl, b.and_(bb, nseg))
            p = b.icmp_signed("<=", j, maxl)
        src = b.select(p, j, lane)
        exists = b.icmp_signed("<", src, wn)
        p = b.and_(p, exists)
        src = b.select(exists, src, lane)
        if site.src_slot is None:
            val = ld(A, i)
        else:
            off = b.add(b.mul(nthreads, c64(site.src_slot)), b.add(w0, src))
            val = b.load(b.gep(save, [off]))
        st(RES, b.and_(val, c64(FULL)))
        st(RES2, p)
        return
    if site.op == "match":
        mi = ld(M, i)
        vi = ld(A, i)
        members, out = acc[0], acc[1]
        b.store(c64(0), members)
        b.store(c64(0), out)

        def each(j):
            bit = b.shl(one, j)
            ok = b.and_(b.icmp_unsigned("!=", b.and_(mi, bit), c64(0)), here(j))
            z = c64(0)
            b.store(b.or_(b.load(members), b.select(ok, bit, z)), members)
            same = b.and_(ok, b.icmp_unsigned("==", ld(A, j), vi))
            b.store(b.or_(b.load(out), b.select(same, bit, z)), out)

        s.loop(wn, each)
        o, m = b.load(out), b.load(members)
        if site.mode == "any":
            st(RES, o)
        else:
            eq = b.icmp_unsigned("==", o, m)
            st(RES, b.select(eq, o, c64(0)))
            st(RES2, eq)
        return
    # vote / redux / activemask: the lanes here with this lane's member mask
    mi = ld(M, i) if site.op != "activemask" else c64(FULL)
    a0, a1, a2 = acc
    op, mode = site.op, site.mode
    if op == "redux":
        ident = {
            "add": 0,
            "or": 0,
            "xor": 0,
            "and": FULL,
            "min": 0x7FFFFFFF if site.signed else FULL,
            "max": 0x80000000 if site.signed else 0,
        }[mode]
        b.store(c64(ident), a0)
    else:
        for a in acc:
            b.store(c64(0), a)

    def each(j):
        member = here(j)
        if op != "activemask":
            member = b.and_(member, b.icmp_unsigned("==", ld(M, j), mi))
        inm = b.icmp_unsigned("!=", b.and_(b.lshr(mi, j), one), c64(0))
        take = b.and_(member, inm)
        bit = b.shl(one, j)
        z = c64(0)
        if op == "activemask":
            b.store(b.or_(b.load(a0), b.select(member, bit, z)), a0)
            return
        v = ld(A, j)
        if op == "vote":
            pj = b.icmp_unsigned("!=", v, z)
            # a0: ballot bits / lanes with the predicate; a1: lanes without; a2: lanes in mask
            b.store(b.or_(b.load(a0), b.select(b.and_(take, pj), bit, z)), a0)
            b.store(b.add(b.load(a1), b.zext(b.and_(take, b.not_(pj)), I64)), a1)
            b.store(b.add(b.load(a2), b.zext(take, I64)), a2)
            return
        cur = b.load(a0)
        v32, c32 = b.trunc(v, I32), b.trunc(cur, I32)
        if mode == "add":
            r = b.add(c32, v32)
        elif mode == "and":
            r = b.and_(c32, v32)
        elif mode == "or":
            r = b.or_(c32, v32)
        elif mode == "xor":
            r = b.xor(c32, v32)
        else:
            less = b.icmp_signed("<", v32, c32) if site.signed else b.icmp_unsigned("<", v32, c32)
            r = b.select(less, v32, c32) if mode == "min" else b.select(less, c32, v32)
        b.store(b.select(take, b.zext(r, I64), cur), a0)

    s.loop(wn, each)
    if op in ("activemask", "redux") or mode == "ballot":
        st(RES, b.load(a0))
        return
    with_p, without, total = b.load(a0), b.load(a1), b.load(a2)
    if mode == "all":
        r = b.icmp_unsigned("==", without, c64(0))
    elif mode == "any":
        r = b.icmp_unsigned("!=", with_p, c64(0))
    else:  # uni: none or all of the mask's lanes here have it
        r = b.or_(b.icmp_unsigned("==", without, c64(0)), b.icmp_unsigned("==", without, total))
    st(RES, r)


def call_settle(k, d, t, nthreads, fault) -> None:
    """In the block loop, after lane ``t`` (i64) ran: if it is its warp's last lane, settle
    the warp; a fault there goes to ``fault``. Leaves the builder where the loop goes on."""
    b, f = d.b, d.f
    t1 = b.add(t, c64(1))
    last = b.or_(
        b.icmp_unsigned("==", b.and_(t1, c64(31)), c64(0)), b.icmp_unsigned("==", t1, nthreads)
    )
    go, cont = f.append_basic_block("settle_warp"), f.append_basic_block("settled")
    b.cbranch(last, go, cont)
    b.position_at_end(go)
    w0 = b.and_(t, c64(~31))
    wn = b.sub(t1, w0)
    cx, cy, cz = d.ctaid
    r = b.call(k.settle, [d.ctx, w0, wn, cx, cy, cz, d.shared, d.save, d.resume, *d.inv])
    b.cbranch(b.icmp_signed("!=", r, ir.Constant(I32, 0)), fault, cont)
    b.position_at_end(cont)


_ = Refusal  # the handlers raise it through k.refuse
