"""Loads and stores of the vector form (:mod:`.simd`): a group's lanes access memory at once,
checked per lane as the scalar form checks one lane (:meth:`.lower.KernelLowering.global_ptr`,
``shared_ptr``), faulting with the same instruction, address and kind.

Why two paths: the common access of a group is consecutive (``in[i]`` with ``i`` affine in the
lane) or the same for every lane (a tile row's element); :mod:`.affine` predicts which for the
address register, and the prediction is checked at run time against lane 0's address. When it
holds and the whole span lies in the site's cached allocation (or the block's shared memory),
aligned, one check covers the group and the access is one masked vector load or store (or a
scalar load broadcast). Otherwise every lane is checked: alignment, then the cached allocation,
then the allocation table for the lanes outside it (a helper that runs the scalar form's
lookup per lane); lanes that fail are faults (the lowest lane's recorded, :func:`_fault_fn`)
and leave the group; the others access memory by masked gather or scatter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..memspace import CLUSTER_RANK_SHIFT, SHARED_WINDOW
from . import layout as L
from .irtypes import I1, I8P, I32, I64, I64P, alloc_hit, c64, ity, site_cache_locals
from .ops import ld_put, space_of, st_value
from .ops_order import is_ordered
from .vecbuild import any_lane, iota, lanes_of, splat

if TYPE_CHECKING:
    from .simd import SimdRegion

__all__ = ["lower_ldst", "masked_load", "masked_store"]


def masked_load(s: SimdRegion, ptr, mask, passthru):
    """``llvm.masked.load`` of ``passthru``'s vector type from ``ptr`` (a pointer to it)."""
    vt = passthru.type
    name = f"llvm.masked.load.{_vname(vt)}.p0"
    f = s.k.intrinsic(name, vt, [vt.as_pointer(), mask.type, vt])
    return s.rb.call(f, [ptr, mask, passthru])


def masked_store(s: SimdRegion, val, ptr, mask) -> None:
    vt = val.type
    f = s.k.intrinsic(
        f"llvm.masked.store.{_vname(vt)}.p0", ir.VoidType(), [vt, vt.as_pointer(), mask.type]
    )
    s.rb.call(f, [val, ptr, mask])


def _vname(vt: ir.VectorType) -> str:
    return f"v{vt.count}i{vt.element.width}"


def lower_ldst(s: SimdRegion, store: bool, types, mods, ops) -> None:
    """``ld``/``st`` of one value on global, const, shared or kernel-parameter memory."""
    t = s.one_type(types, bytes_ok=True)
    if t.kind == "pred" or is_ordered(s.ins):
        raise s.refuse("ld/st form (vector form)")
    space = space_of(s, mods)
    s.only(mods, ("global", "shared", "param", "const"))
    if len(ops) != 2 or (ops[0] if store else ops[1])[0] != "mem":
        raise s.refuse("operand count")
    mem_op, val_op = (ops[0], ops[1]) if store else (ops[1], ops[0])
    size = t.bits // 8
    base, off = mem_op[1], mem_op[2]
    var = s.ins.scope.var(base[1]) if base[0] == "name" else None
    if var is not None and var.space == "param":
        o = s.kparam_offsets.get(id(var))
        if store or space != "param" or o is None:
            raise s.refuse("a kernel parameter access (vector form)")
        o += off
        if o < 0 or o + size > s.param_bytes or o % size:
            raise s.refuse("a kernel parameter access outside the parameters")
        ld_put(s, val_op, t, splat(s.rb, _param_word(s, o, ity(t.bits)), s.lanes))
        return
    if space not in ("global", "const", "shared") or (store and space == "const"):
        raise s.refuse(f"ld/st on .{space} (vector form)")
    addr, stride = _address(s, base, off)
    val = s.b.vec(st_value(s, val_op, t)) if store else None
    if space == "shared":
        x = _shared(s, addr, size, stride, val)
    else:
        x = _global(s, addr, size, stride, val)
    if not store:
        ld_put(s, val_op, t, x)


def _param_word(s: SimdRegion, off: int, it: ir.IntType):
    """A kernel parameter, loaded once in the function's entry block."""
    eb = ir.IRBuilder(s.entry)
    kp = eb.inttoptr(s.inv[L.KPARAMS], I8P)
    return eb.load(eb.bitcast(eb.gep(kp, [c64(off)]), it.as_pointer()))


def _address(s: SimdRegion, base, off: int):
    """The lanes' addresses (``<W x i64>``) and their predicted stride in bytes per lane
    (None: no prediction)."""
    rb = s.rb
    if base[0] == "int":
        return splat(rb, c64((base[1] + off) & (2**64 - 1)), s.lanes), 0
    if base[0] == "name":
        return splat(rb, rb.add(s.symbol(base[1]), c64(off)), s.lanes), 0
    if base[0] != "reg":
        raise s.refuse("an address (vector form)")
    r = s.regdecl(base[1])
    if r.type.kind == "pred":
        raise s.refuse("predicate as an address")
    v = rb.load(s.regs[r.uid])
    if v.type.element != I64:
        v = s.b.zext(v, I64)
    return rb.add(v, splat(rb, c64(off & (2**64 - 1)), s.lanes)), s.k.strides.get(r.uid)


def _whole_group(s: SimdRegion, addr, size: int, stride, store: bool, in_bounds):
    """The fast path's test: the lanes' addresses are lane 0's plus ``stride`` per lane
    (consecutive, or the same) and ``in_bounds(a0, span)`` holds. Returns (a0, taken) or
    None when the path does not apply (no prediction, another stride, a uniform store)."""
    if stride is None or not (stride == size or (stride == 0 and not store)):
        return None
    rb, W = s.rb, s.lanes
    a0 = rb.extract_element(addr, ir.Constant(I32, 0))
    want = rb.add(splat(rb, a0, W), iota(I64, W, stride))
    fits = rb.or_(rb.not_(s.imask), rb.icmp_unsigned("==", addr, want))
    bits = lanes_of(rb, fits)
    same = rb.icmp_unsigned("==", bits, ir.Constant(bits.type, (1 << W) - 1))
    ok = rb.and_(same, in_bounds(a0, stride * (W - 1) + size))
    if size > 1:
        ok = rb.and_(ok, rb.icmp_unsigned("==", rb.and_(a0, c64(size - 1)), c64(0)))
    return a0, ok


def _access(s: SimdRegion, fast, slow, size: int, stride, val):
    """Emit the fast path (``fast()``: a pointer to lane 0's element) if it applies and the
    checked path (``slow()``: the lanes' pointers and the mask of those that passed), and
    join them; the lanes that failed leave the group. Returns the loaded vector."""
    rb, f, W = s.rb, s.f, s.lanes
    it = ity(8 * size)
    vt = ir.VectorType(it, W)
    mask = s.imask
    got = fast()
    results = []
    join = f.append_basic_block("accessed")
    if got is not None:
        a0_ptr, taken = got
        yes, no = f.append_basic_block("group_access"), f.append_basic_block("lane_access")
        rb.cbranch(taken, yes, no)
        rb.position_at_end(yes)
        if val is not None:
            masked_store(s, val, rb.bitcast(a0_ptr, vt.as_pointer()), mask)
            x = None
        elif stride == 0:
            x = splat(rb, rb.load(rb.bitcast(a0_ptr, it.as_pointer())), W)
        else:
            _prefetch_ahead(s, a0_ptr)
            x = masked_load(s, rb.bitcast(a0_ptr, vt.as_pointer()), mask, ir.Constant(vt, 0))
        results.append((x, mask, rb.block))
        rb.branch(join)
        rb.position_at_end(no)
    ptrs, ok = slow()
    ptrs = rb.inttoptr(ptrs, ir.VectorType(it.as_pointer(), W))
    if val is not None:
        f_sc = s.k.intrinsic(
            f"llvm.masked.scatter.{_vname(vt)}.v{W}p0", ir.VoidType(), [vt, ptrs.type, ok.type]
        )
        rb.call(f_sc, [val, ptrs, ok])
        x = None
    else:
        f_g = s.k.intrinsic(f"llvm.masked.gather.{_vname(vt)}.v{W}p0", vt, [ptrs.type, ok.type, vt])
        x = rb.call(f_g, [ptrs, ok, ir.Constant(vt, 0)])
    results.append((x, ok, rb.block))
    rb.branch(join)
    rb.position_at_end(join)
    m = rb.phi(ok.type)
    for _, mk, blk in results:
        m.add_incoming(mk, blk)
    out = None
    if val is None:
        out = rb.phi(vt)
        for xv, _, blk in results:
            out.add_incoming(xv, blk)
    s.drop(rb.and_(mask, rb.not_(m)))
    return out


#: how many of a load site's steps ahead its group prefetches (:func:`_prefetch_ahead`)
PREFETCH_AHEAD = 8


def _prefetch_ahead(s: SimdRegion, ptr) -> None:
    """Prefetch where this consecutive load will read ``PREFETCH_AHEAD`` executions later, if
    its address keeps moving by what it moved since the last one (learned per group). Why: a
    grid-stride loop run group after group reads one 64-byte line per iteration at the
    grid's stride (1 MB in the benchmark's reduction), a pattern the CPU's prefetchers do not
    follow, so the loop waited on memory with few misses in flight; prefetching 8 steps
    ahead took the 16M-float reduction from 17.7-18.7 to 16.7-17.1 ms CPU (five runs each,
    interleaved; 16 steps the same, 32 slower). A prefetch never faults, wherever it points."""
    rb = s.rb
    eb = ir.IRBuilder(s.entry)
    last_p = eb.alloca(I64)
    eb.store(c64(0), last_p)
    p = rb.ptrtoint(ptr, I64)
    last = rb.load(last_p)
    rb.store(p, last_p)
    ahead = rb.add(p, rb.mul(rb.sub(p, last), c64(PREFETCH_AHEAD)))
    ahead = rb.select(rb.icmp_unsigned("==", last, c64(0)), p, ahead)
    pf = s.k.intrinsic("llvm.prefetch.p0", ir.VoidType(), [I8P, I32, I32, I32])
    rw, locality, data = (ir.Constant(I32, v) for v in (0, 3, 1))
    rb.call(pf, [rb.inttoptr(ahead, I8P), rw, locality, data])


def _global(s: SimdRegion, addr, size: int, stride, val):
    k, rb, W = s.k, s.rb, s.lanes
    site = k.sites
    k.sites += 1
    lo_p, hi_p = site_cache_locals(ir.IRBuilder(s.entry), s.ctx, site)
    membuf = rb.inttoptr(s.inv[L.MEM_BUF], I8P)

    def in_cache(a0, span):
        return alloc_hit(rb, a0, rb.load(lo_p), rb.load(hi_p), c64(span))

    def fast():
        got = _whole_group(s, addr, size, stride, val is not None, in_cache)
        if got is None:
            return None
        a0, ok = got
        return rb.gep(membuf, [rb.sub(a0, s.inv[L.MEM_BASE])]), ok

    def slow():
        mask = s.imask
        lo, hi = (splat(rb, rb.load(p), W) for p in (lo_p, hi_p))
        mis = _misaligned(s, addr, size, mask)
        hit = alloc_hit(rb, addr, lo, hi, splat(rb, c64(size), W))
        need = rb.and_(rb.and_(mask, rb.not_(mis)), rb.not_(hit))
        # lanes outside the cached allocation: the allocation table, lane by lane
        came = rb.block
        look, looked = s.f.append_basic_block("lookup_lanes"), s.f.append_basic_block("looked")
        rb.cbranch(any_lane(rb, need), look, looked)
        rb.position_at_end(look)
        found = rb.call(_lookup_fn(s), [s.ctx, addr, lanes_of(rb, need), c64(size), c64(site)])
        for p, slot in ((lo_p, L.FIXED + 2 * site), (hi_p, L.FIXED + 2 * site + 1)):
            rb.store(rb.load(rb.gep(s.ctx, [c64(slot)])), p)
        rb.branch(looked)
        rb.position_at_end(looked)
        fbits = rb.phi(found.type)
        fbits.add_incoming(found, look)
        fbits.add_incoming(ir.Constant(found.type, 0), came)
        lost = rb.and_(lanes_of(rb, need), rb.not_(fbits))
        bad = rb.or_(lanes_of(rb, mis), lost)
        _fault(s, bad, addr, lanes_of(rb, mis), size, L.SPACE_GLOBAL)
        ok = rb.and_(mask, rb.not_(rb.bitcast(bad, mask.type)))
        base = rb.sub(rb.ptrtoint(membuf, I64), s.inv[L.MEM_BASE])
        return rb.add(splat(rb, base, W), addr), ok

    return _access(s, fast, slow, size, stride, val)


def _shared(s: SimdRegion, off, size: int, stride, val):
    rb, W = s.rb, s.lanes
    ssize = s.inv[L.SHARED_SIZE]

    def in_shared(a0, span):
        return rb.and_(
            rb.icmp_signed(">=", a0, c64(0)), rb.icmp_signed("<=", rb.add(a0, c64(span)), ssize)
        )

    def fast():
        got = _whole_group(s, off, size, stride, val is not None, in_shared)
        if got is None:
            return None
        a0, ok = got
        return rb.gep(s.shared, [a0]), ok

    def slow():
        # a .shared::cluster address tagged with rank 0 is the CTA's own (as the scalar form)
        mask = s.imask
        tag = splat(rb, c64(1 << CLUSTER_RANK_SHIFT), W)
        own = rb.icmp_unsigned("<", rb.sub(off, tag), tag)
        o2 = rb.select(own, rb.sub(off, tag), off)
        out = rb.or_(
            rb.icmp_signed("<", o2, splat(rb, c64(0), W)),
            rb.icmp_signed(">", rb.add(o2, splat(rb, c64(size), W)), splat(rb, ssize, W)),
        )
        mis = rb.and_(_misaligned(s, o2, size, mask), rb.not_(out))
        bad = rb.or_(lanes_of(rb, rb.and_(mask, out)), lanes_of(rb, mis))
        gen = rb.add(off, splat(rb, c64(SHARED_WINDOW), W))
        _fault(s, bad, gen, lanes_of(rb, mis), size, L.SPACE_SHARED)
        ok = rb.and_(mask, rb.not_(rb.bitcast(bad, mask.type)))
        return rb.add(splat(rb, rb.ptrtoint(s.shared, I64), W), o2), ok

    return _access(s, fast, slow, size, stride, val)


def _misaligned(s: SimdRegion, addr, size: int, mask):
    rb = s.rb
    if size == 1:
        return ir.Constant(mask.type, 0)
    low = rb.and_(addr, splat(rb, c64(size - 1), s.lanes))
    return rb.and_(mask, rb.icmp_unsigned("!=", low, splat(rb, c64(0), s.lanes)))


def _fault(s: SimdRegion, bad, addr, mis, size: int, space: int) -> None:
    """Lanes ``bad`` (bits) failed a check: the lowest one's fault recorded, unless a lower
    lane of the group has one already."""
    rb = s.rb
    rec, on = s.f.append_basic_block("fault_lanes"), s.f.append_basic_block("checked")
    rb.cbranch(rb.icmp_unsigned("!=", bad, ir.Constant(bad.type, 0)), rec, on)
    rb.position_at_end(rec)
    rb.call(_fault_fn(s), [s.ctx, s.flane, bad, addr, mis, c64(size), c64(space), c64(s.pc())])
    rb.branch(on)
    rb.position_at_end(on)


def _helpers(s: SimdRegion) -> dict:
    h = getattr(s.k, "_simd_helpers", None)
    if h is None:
        h = s.k._simd_helpers = {}
    return h


def _fault_fn(s: SimdRegion) -> ir.Function:
    """``void simd_fault(ctx, flane*, bad, addr, misaligned, bytes, space, pc)``: lane j, the
    lowest of ``bad``, faulted (misaligned, or an illegal address) at ``addr[j]``; recorded
    in the context if no lower lane of the group has a fault (``*flane``)."""
    h = _helpers(s)
    if "fault" in h:
        return h["fault"]
    W = s.lanes
    iw, av = ir.IntType(W), ir.VectorType(I64, W)
    fty = ir.FunctionType(ir.VoidType(), [I64P, I32.as_pointer(), iw, av, iw, I64, I64, I64])
    f = h["fault"] = ir.Function(s.k.mod, fty, "simd_fault")
    f.linkage = "internal"
    f.attributes.add("noinline")
    f.attributes.add("cold")
    ctx, flane, bad, addr, mis, nbytes, space, pc = f.args
    b = ir.IRBuilder(f.append_basic_block("entry"))
    cttz = s.k.intrinsic(f"llvm.cttz.i{W}", iw, [iw, I1])
    j = b.call(cttz, [bad, ir.Constant(I1, 1)])
    j32 = b.zext(j, I32) if W < 32 else b.trunc(j, I32) if W > 32 else j
    rec, done = f.append_basic_block("record"), f.append_basic_block("done")
    b.cbranch(b.icmp_unsigned("<", j32, b.load(flane)), rec, done)
    b.position_at_end(rec)
    m = b.trunc(b.lshr(mis, j), I1)
    kind = b.select(m, c64(L.KIND_MISALIGNED), c64(L.KIND_ILLEGAL))
    for slot, v in (
        (L.FAULT_PC, pc),
        (L.FAULT_ADDR, b.extract_element(addr, j32)),
        (L.FAULT_KIND, kind),
        (L.FAULT_BYTES, nbytes),
        (L.FAULT_SPACE, space),
    ):
        b.store(v, b.gep(ctx, [c64(slot)]))
    b.store(j32, flane)
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return f


def _lookup_fn(s: SimdRegion) -> ir.Function:
    """``iW simd_lookup(ctx, addr, need, bytes, site)``: for each lane in ``need``, whether
    its address lies in an allocation (the site's cache, refreshed by the scalar form's
    ``lookup``, which it calls for a lane outside it); the found lanes as bits."""
    h = _helpers(s)
    if "lookup" in h:
        return h["lookup"]
    W = s.lanes
    iw, av = ir.IntType(W), ir.VectorType(I64, W)
    f = h["lookup"] = ir.Function(
        s.k.mod, ir.FunctionType(iw, [I64P, av, iw, I64, I64]), "simd_lookup"
    )
    f.linkage = "internal"
    f.attributes.add("noinline")
    ctx, addr, need, n, site = f.args
    entry = f.append_basic_block("entry")
    head, body, test, call, yes, nxt, out = (
        f.append_basic_block(x) for x in ("head", "body", "test", "call", "yes", "next", "out")
    )
    b = ir.IRBuilder(entry)
    b.branch(head)
    b.position_at_end(head)
    i, found = b.phi(I32), b.phi(iw)
    i.add_incoming(ir.Constant(I32, 0), entry)
    found.add_incoming(ir.Constant(iw, 0), entry)
    b.cbranch(b.icmp_unsigned("<", i, ir.Constant(I32, W)), body, out)
    b.position_at_end(body)
    iw_i = b.zext(i, iw) if W > 32 else b.trunc(i, iw) if W < 32 else i
    bit = b.trunc(b.lshr(need, iw_i), I1)
    b.cbranch(bit, test, nxt)
    b.position_at_end(test)
    a = b.extract_element(addr, i)
    slot = b.add(c64(L.FIXED), b.mul(site, c64(2)))
    lo = b.load(b.gep(ctx, [slot]))
    hi = b.load(b.gep(ctx, [b.add(slot, c64(1))]))
    b.cbranch(alloc_hit(b, a, lo, hi, n), yes, call)
    b.position_at_end(call)
    b.cbranch(b.call(s.k.lookup, [ctx, a, n, site]), yes, nxt)
    b.position_at_end(yes)
    with_i = b.or_(found, b.shl(ir.Constant(iw, 1), iw_i))
    b.branch(nxt)
    b.position_at_end(nxt)
    f2 = b.phi(iw)
    f2.add_incoming(found, body)
    f2.add_incoming(found, call)
    f2.add_incoming(with_i, yes)
    found.add_incoming(f2, nxt)
    i.add_incoming(b.add(i, ir.Constant(I32, 1)), nxt)
    b.branch(head)
    b.position_at_end(out)
    b.ret(found)
    return f
