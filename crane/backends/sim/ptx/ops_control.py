"""Control-flow and synchronization instructions: bra, call, ret, exit, trap, bar/barrier,
membar/fence and friends (control class).

Branches, calls, returns, exits, traps and barriers only *decode* here; the executor
(:mod:`.executor`) moves lanes between groups. ``call`` to the CUDA runtime's device-side
externals is handled as a plain instruction: ``vprintf`` and ``__assertfail`` (see
:mod:`.printf`), ``malloc`` and ``free`` (see :mod:`.heap`). Calls through a register
(function pointers, virtual functions) pick their callee per lane when they run
(:mod:`.calls`). Barrier ids and thread counts are accepted but not distinguished: a barrier
completes when every live lane of the block has reached *a* barrier (exited lanes count as
arrived), which is what ``__syncthreads()`` needs.
"""

from __future__ import annotations

import numpy as np

from .device_launch import BUILTINS as DEVICE_RUNTIME
from .graph_conditional import BUILTINS as GRAPH_RUNTIME
from .heap import h_free, h_malloc
from .instr import BAR, BRA, CALL, EXIT, RET, TRAP, WBAR
from .ops_common import Mods, h_nop
from .printf import h_assertfail, h_vprintf
from .ptxtypes import TYPES

__all__ = [
    "dec_bar",
    "dec_bra",
    "dec_brx",
    "dec_call",
    "dec_exit",
    "dec_nop",
    "dec_ret",
    "dec_trap",
    "make_ret",
]


def dec_bra(ctx, mods) -> None:
    m = Mods(ctx, mods)
    m.done()
    ctx.nops(1)
    ctx.ins.kind = BRA
    ctx.ins.x = ctx.label(ctx.ops[0])  # a label name; the decoder resolves it to a PC


def dec_brx(ctx, mods) -> None:
    raise ctx.unsupported("brx.idx (indirect branch through a .branchtargets table)")


def make_ret(ins) -> None:
    ins.kind = RET


def dec_ret(ctx, mods) -> None:
    m = Mods(ctx, mods)
    m.done()
    ctx.nops(0)
    make_ret(ctx.ins)


def dec_exit(ctx, mods) -> None:
    m = Mods(ctx, mods)
    m.done()
    ctx.nops(0)
    ctx.ins.kind = EXIT


def dec_trap(ctx, mods) -> None:
    ctx.ins.kind = TRAP


def dec_nop(ctx, mods) -> None:
    """Instructions with no effect in a sequential simulation (fences, hints, sleeps)."""
    ctx.ins.fn = h_nop


def dec_call(ctx, mods) -> None:
    m = Mods(ctx, mods)
    m.done()
    ops = list(ctx.ops)
    rets: list = []
    args: list = []
    i = 0
    if ops and ops[0][0] == "list":
        rets = ops[0][1]
        i = 1
    if i >= len(ops):
        raise ctx.error("call without a target")
    target = ops[i]
    i += 1
    if i < len(ops) and ops[i][0] == "list":
        args = ops[i][1]
        i += 1
    ins = ctx.ins
    if target[0] in ("reg", "name") and ctx.regdecl(target[1]) is not None:
        # call through a register: a prototype (or a .calltargets list) names the signature;
        # the callee is looked up per lane when it runs (see .calls)
        if len(ops) - i > 1:
            raise ctx.error("indirect call with extra operands")
        arg_offs = [ctx.callsite_param(a) for a in args]
        ret_offs = [ctx.callsite_param(r) for r in rets]
        ins.kind = CALL
        ins.x = ("icall", ctx.src(target, TYPES["u64"]), arg_offs, ret_offs, {})
        return
    if i < len(ops) or target[0] != "name":
        raise ctx.error("a direct call takes no prototype operand")
    callee = ctx.function(target[1])
    arg_offs = [ctx.callsite_param(a) for a in args]
    ret_offs = [ctx.callsite_param(r) for r in rets]
    if callee.builtin is not None:
        if callee.builtin == "vprintf":
            if len(arg_offs) != 2:
                raise ctx.error("vprintf takes two arguments")
            ins.fn = h_vprintf
            ins.x = (arg_offs[0][0], arg_offs[1][0], ret_offs[0][0] if ret_offs else None)
            return
        if callee.builtin == "__assertfail":
            if len(arg_offs) != 5:
                raise ctx.error("__assertfail takes five arguments")
            ins.fn = h_assertfail
            ins.x = tuple(o for o, _ in arg_offs)
            return
        if callee.builtin == "malloc" and len(arg_offs) == 1:
            ins.fn = h_malloc
            ins.x = (arg_offs[0][0], ret_offs[0][0] if ret_offs else None)
            return
        if callee.builtin == "free" and len(arg_offs) == 1:
            ins.fn = h_free
            ins.x = (arg_offs[0][0],)
            return
        runtime = DEVICE_RUNTIME if callee.builtin in DEVICE_RUNTIME else GRAPH_RUNTIME
        if callee.builtin in runtime:  # dynamic parallelism, graph conditions
            handler, nargs = runtime[callee.builtin]
            if len(arg_offs) != nargs:
                raise ctx.error(f"{callee.builtin} takes {nargs} arguments")
            ins.fn = handler
            ins.x = (*(o for o, _ in arg_offs), ret_offs[0][0] if ret_offs else None)
            return
        raise ctx.unsupported(f"call to external function {callee.builtin}")
    params = callee.fn.params
    if len(params) != len(arg_offs) or len(callee.fn.rets) != len(ret_offs):
        raise ctx.error(f"call to {callee.fn.name} with the wrong number of arguments")
    arg_copies = []
    for (off, var), p in zip(arg_offs, params, strict=True):
        arg_copies.append((off, callee.pm[id(p)], min(var.size, p.size)))
    ret_copies = []
    for (off, var), r in zip(ret_offs, callee.fn.rets, strict=True):
        ret_copies.append((callee.pm[id(r)], off, min(var.size, r.size)))
    ins.kind = CALL
    ins.x = ("call", callee, arg_copies, ret_copies)


# ---- barriers -----------------------------------------------------------------------------


def _record_pred(st, ins, idx) -> None:
    p = ins.a.get(st, idx)
    if ins.e:
        p = ~p
    if idx is None:
        st.barpred[:] = p
    else:
        st.barpred[idx] = p


def _finish_red(op: str):
    def fin(st, ins, idx) -> None:
        lanes = np.arange(st.n) if idx is None else idx
        blk = st.block_of_lane[lanes]
        pred = st.barpred[lanes]
        cnt = np.bincount(blk, weights=pred.astype(np.float64), minlength=st.nblocks)
        tot = np.bincount(blk, minlength=st.nblocks)
        if op == "popc":
            ins.d.put(st, idx, cnt[blk].astype(np.uint32))
        elif op == "and":
            ins.d.put(st, idx, (cnt == tot)[blk])
        else:
            ins.d.put(st, idx, (cnt > 0)[blk])

    return fin


def dec_bar(ctx, mods) -> None:
    """bar / barrier in all their forms."""
    m = Mods(ctx, mods)
    m.take("cta")
    m.take("aligned")
    ins = ctx.ins
    if m.has("warp"):
        m.take("sync")
        m.done()
        # __syncwarp: the lanes of the mask wait for each other, wherever each calls it (two
        # divergent branches may each hold one); the executor parks them (see WBAR there)
        ins.kind = WBAR
        return
    if m.has("arrive"):
        m.done()
        ins.fn = h_nop  # arrive does not wait
        return
    if m.has("red"):
        op = m.take("popc", "and", "or")
        ty = m.one_type()
        m.done()
        if op is None:
            raise ctx.error("bar.red needs popc, and or or")
        ops = ctx.ops
        if len(ops) not in (3, 4):
            raise ctx.error("bar.red takes 3 or 4 operands")
        ins.d = ctx.dst(ops[0], TYPES["u32"] if op == "popc" else TYPES["pred"])
        r, neg = ctx.pred(ops[-1])
        ins.a = r
        ins.e = neg
        ins.kind = BAR
        ins.fn = _record_pred
        ins.x = _finish_red(op)
        _ = ty
        return
    m.take("sync")
    m.done()
    if len(ctx.ops) not in (0, 1, 2):
        raise ctx.error("bar.sync takes a barrier id and an optional thread count")
    ins.kind = BAR
    ins.fn = None
    ins.x = None
