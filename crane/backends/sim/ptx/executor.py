"""The SIMT scheduler: runs decoded code over a batch of lanes.

Lanes that are at the same place run together as a *group*: ``key -> idx`` where ``key`` is
``(call-site PCs..., pc)`` and ``idx`` the sorted lane indices (``None`` = every lane of the
batch, the fast path with no gathers). Each step runs the group with the smallest key — the
lowest PC, call frames compared from the outermost — for exactly its lanes. Min-PC scheduling
reconverges structured control flow by itself: the lanes that skip an ``if`` body wait at the
join point (a higher PC) until the body's lanes reach it, and the two groups merge. Comparing
call-site PCs first keeps the lanes inside a call ahead of lanes waiting after the call site,
so warp-level operations after a divergent call see the whole warp again.

``bar.sync`` parks its lanes; parked lanes are released when nothing else can run (every live
lane of the batch is then at a barrier or has exited — exited lanes count as arrived, as on
hardware). Blocks are independent, so releasing them together is a legal schedule.
``bar.warp.sync`` (``__syncwarp``) parks its lanes the same way, apart, unless every lane of
the batch is there at once: lanes of one warp may call it at different places (two divergent
branches each holding one), and each must wait until the others of its mask arrived at theirs.
Warp-parked lanes are released first, when nothing else can run (in a correct program the
other lanes of their masks are then warp-parked too, or exited), so a CTA barrier is never
completed while some lane still has a warp barrier to pass on the way to it.

``mbarrier.test_wait``/``try_wait`` (kind ``MWAIT``) park the lanes whose phase has not completed
at the wait. When nothing else can run, parked waits whose phase has completed since go back to
their wait (which passes now); they are tried before a ``bar.sync`` is released. If only waits
that cannot complete are left, each answers false and moves on (a ``try_wait`` time limit), and
a launch that keeps coming back to that state with no mbarrier changing is failed as a deadlock.

Cooperative launches (grid-wide sync) break that independence: a block spins in a loop
(``ld.acquire`` until every block has arrived) and blocks that have not arrived must still run.
Min-PC alone does not guarantee it: the spinning group can be the lowest key forever while a
lagging block sits at a ``bar.sync`` (released only when nothing else runs) or at a higher PC.
An ordinary launch promises nothing about blocks waiting on each other, but libraries do it
(cuBLAS's triangular solve: a block spins until the block before it published its rows). So a
batch of several blocks whose groups keep looping back (:data:`SPIN_BRANCHES` backward branches)
is run as a cooperative one from then on: that only changes the order between blocks.

So in a cooperative batch (``st.cooperative``) a group that takes a backward branch *yields to
other blocks*: it is set aside with every lane of its blocks (the *held* lanes, so lanes of one
block still reconverge by min-PC), the other blocks run until they exit, park or yield in turn,
and barriers complete per block (a block whose live lanes are all parked is released even while
other blocks run). When nothing else can run the held lanes come back. Every block therefore
reaches the grid barrier, and the spinning lanes see it on their next load.
"""

from __future__ import annotations

from time import monotonic

import numpy as np

from crane.backends.sim.memory import MemoryFault

from .calls import indirect_copies, resolve_indirect
from .errors import KernelFault, fault_code
from .frames import Frames
from .instr import BAR, BRA, CALL, CLUSTER_WAIT, EXIT, MWAIT, PLAIN, RET, TRAP, WBAR

__all__ = ["MAX_STALLS", "SPIN_BRANCHES", "check_deadline", "merge", "run_batch"]

_NONE = object()
#: rounds in a row in which only mbarrier waits were left, none could complete and no mbarrier
#: changed, before the launch is failed as a deadlock (each round answers every wait false,
#: so a program that polls and gives up still ends)
MAX_STALLS = 20000
#: backward branches taken in a batch of several blocks before its blocks take turns at
#: backward branches as in a cooperative launch (a block may be spinning on another's store);
#: far more than the loops of ordinary kernels take in one batch
SPIN_BRANCHES = 1 << 14


def merge(a, b, n: int):
    """Union of two disjoint lane sets (``None`` = all lanes)."""
    if a is None or b is None:
        return None
    m = np.concatenate((a, b))
    if m.size == n:
        return None
    m.sort(kind="stable")
    return m


def _rejoin(groups: dict, key: tuple, idx, n: int, wait_for_lower: bool) -> bool:
    """The running group reached ``key``: True when it must stop running, because it merged
    into a group already waiting there or, with ``wait_for_lower`` (after a jump or a return,
    where a group at a lower program point may still arrive), because it now waits there."""
    other = groups.pop(key, _NONE)
    if other is not _NONE:
        groups[key] = merge(other, idx, n)
        return True
    if wait_for_lower and any(k < key for k in groups):
        groups[key] = idx
        return True
    return False


def _split(mask: np.ndarray, idx):
    """Lanes of ``idx`` where ``mask`` (aligned with idx) is true / false; None if empty."""
    if idx is None:
        t = np.flatnonzero(mask)
        f = np.flatnonzero(~mask)
    else:
        t = idx[mask]
        f = idx[~mask]
    return (t if t.size else None), (f if f.size else None)


def run_batch(code: list, entry_pc: int, st, funcs_by_fid: dict) -> None:
    """Run one batch from ``entry_pc`` until every lane has exited."""
    n = st.n
    groups: dict[tuple, object] = {(entry_pc,): None}
    parked: dict[tuple, object] = {}
    wparked: dict[tuple, object] = {}  # lanes at a bar.warp.sync
    coop = st.cooperative
    held: dict[tuple, object] = {}  # cooperative only: lanes of blocks that yielded
    held_blk = np.zeros(st.nblocks, np.bool_)
    spin_left = SPIN_BRANCHES if st.nblocks > 1 and not coop else -1
    mparked: dict[tuple, object] = {}  # lanes at an mbarrier wait whose phase is not complete
    stalls, stall_epoch = 0, -1
    frames = Frames()  # saved activations of recursive functions
    deadline = st.deadline  # a kernel time limit: checked on backward branches (every loop)
    ins = None
    try:
        while True:
            if not groups:
                if wparked:  # every warp barrier's lanes have all arrived: move them past it
                    _release(code, st, wparked, groups, n)
                    wparked = {}
                    continue
                if mparked and _wake(code, st, mparked, groups, n):
                    continue
                if coop and held:
                    if parked and _release_blocks(code, st, parked, groups, held_blk, n):
                        continue
                    _merge_into(groups, held, n)
                    held = {}
                    held_blk[:] = False
                    continue
                if parked:
                    _release(code, st, parked, groups, n)
                    parked = {}
                    continue
                if not mparked:
                    return
                # only mbarrier waits are left and none can complete: they answer false
                stalls = stalls + 1 if st.mbar_epoch == stall_epoch else 0
                stall_epoch = st.mbar_epoch
                if stalls > MAX_STALLS:
                    _deadlock(code, mparked)
                mparked = _give_up(code, st, mparked, groups, n)
                if not groups:  # only cluster barriers wait, for threads that never arrive
                    _deadlock(code, mparked)
                continue
            key = min(groups)
            idx = groups.pop(key)
            stack = key[:-1]
            pc = key[-1]
            while True:
                ins = code[pc]
                kind = ins.kind
                if ins.guard is not None:
                    g = ins.guard.row(st)
                    m = g if idx is None else g[idx]
                    if ins.gneg:
                        m = ~m
                    if kind in (PLAIN, TRAP):
                        if m.all():
                            sub = idx
                        elif not m.any():
                            sub = False
                        else:
                            sub = np.flatnonzero(m) if idx is None else idx[m]
                        if sub is not False:
                            if kind == PLAIN:
                                ins.fn(st, ins, sub)
                            else:
                                _trap(ins)
                        pc += 1
                        if groups and _rejoin(groups, (*stack, pc), idx, n, False):
                            break
                        continue
                    if not m.all():
                        if not m.any():
                            # nobody takes it: fall through like a plain instruction
                            pc += 1
                            if groups and _rejoin(groups, (*stack, pc), idx, n, False):
                                break
                            continue
                        run_idx, skip_idx = _split(m, idx)
                        nk = (*stack, pc + 1)
                        groups[nk] = merge(groups[nk], skip_idx, n) if nk in groups else skip_idx
                        idx = run_idx
                if kind == PLAIN:
                    ins.fn(st, ins, idx)
                    pc += 1
                    if groups and _rejoin(groups, (*stack, pc), idx, n, False):
                        break
                    continue
                if kind == BRA:
                    back = ins.x <= pc
                    pc = ins.x
                    if back:
                        if spin_left > 0:
                            spin_left -= 1
                            coop = spin_left == 0  # blocks may be waiting on each other
                        if deadline is not None and monotonic() > deadline:
                            check_deadline(deadline, ins)
                    if groups and _rejoin(groups, (*stack, pc), idx, n, True):
                        break
                    if (
                        coop
                        and back
                        and (groups or parked or wparked or mparked)
                        and _yield_blocks(
                            st, (*stack, pc), idx, groups, parked, wparked, held, held_blk, mparked
                        )
                    ):
                        break
                    continue
                if kind == CALL:
                    # ins.x = ("call", callee FuncInfo, arg copies, ret copies)
                    if ins.x[0] == "icall":  # through a register: the callee per lane
                        callee, idx, rest = resolve_indirect(st, ins, idx, funcs_by_fid)
                        if rest is not None:  # other targets call after these lanes
                            k = (*stack, pc)
                            groups[k] = merge(groups[k], rest, n) if k in groups else rest
                        args = indirect_copies(ins, callee)[0]
                    else:
                        _, callee, args, _rets = ins.x
                    if callee.recursive:
                        frames.push(st, callee.fid, (*stack, pc), idx, ins)
                    _copy_params(st.pm[callee.fid], st.pm[ins.fid], args, idx)
                    stack = (*stack, pc)
                    pc = callee.entry_pc
                    continue
                if kind == RET:
                    if not stack:  # the kernel returns: these lanes are done
                        if st.exited is not None:
                            _exit(st, idx)
                        break
                    site = code[stack[-1]]
                    if site.x[0] == "icall":
                        callee = funcs_by_fid[ins.fid]
                        rets = indirect_copies(site, callee)[1]
                    else:
                        _, callee, _args, rets = site.x
                    if callee.recursive:  # the return values, then the outer activation back
                        vals = _take_params(st.pm[callee.fid], rets, idx)
                        frames.pop(st, callee.fid, stack, idx)
                        _put_params(st.pm[site.fid], vals, idx)
                    else:
                        _copy_params(st.pm[site.fid], st.pm[callee.fid], rets, idx)
                    pc = stack[-1] + 1
                    stack = stack[:-1]
                    if groups and _rejoin(groups, (*stack, pc), idx, n, True):
                        break
                    continue
                if kind == EXIT:
                    if st.exited is not None:
                        _exit(st, idx)
                    break
                if kind == WBAR:
                    if idx is None:  # every lane of the batch is here: nobody to wait for
                        pc += 1
                        if groups and _rejoin(groups, (*stack, pc), idx, n, False):
                            break
                        continue
                    k = (*stack, pc)
                    wparked[k] = merge(wparked[k], idx, n) if k in wparked else idx
                    break
                if kind == BAR:
                    if ins.fn is not None:
                        ins.fn(st, ins, idx)  # bar.red: record this lane's predicate
                    k = (*stack, pc)
                    parked[k] = merge(parked[k], idx, n) if k in parked else idx
                    break
                if kind == MWAIT:
                    done = ins.fn(st, ins, idx)
                    if not done.all():
                        run_idx, wait_idx = _split(done, idx)
                        k = (*stack, pc)
                        mparked[k] = merge(mparked[k], wait_idx, n) if k in mparked else wait_idx
                        if run_idx is None:
                            break
                        idx = run_idx
                    pc += 1
                    if groups and _rejoin(groups, (*stack, pc), idx, n, False):
                        break
                    continue
                if kind == TRAP:
                    _trap(ins)
                raise AssertionError(f"unknown instruction kind {kind}")
    except MemoryFault as e:
        where = f"`{ins.text}` (PTX line {ins.line})" if ins is not None else "a kernel"
        raise KernelFault(fault_code(e.kind), f"{e} in {where}") from None
    except KernelFault:
        raise


def check_deadline(deadline: float | None, ins=None) -> None:
    """Fail the launch with CUDA_ERROR_LAUNCH_TIMEOUT (702) once ``deadline`` (monotonic
    time) has passed, as a display watchdog ends a kernel that runs too long."""
    if deadline is None or monotonic() <= deadline:
        return
    where = f" at `{ins.text}` (PTX line {ins.line})" if ins is not None else ""
    raise KernelFault(702, f"the launch ran past its time limit{where}")


def _trap(ins) -> None:
    raise KernelFault(719, f"trap executed at `{ins.text}` (PTX line {ins.line})")


def _release(code: list, st, parked: dict, groups: dict, n: int) -> None:
    """Every live lane waits at a barrier: complete the barriers and move the lanes past them."""
    for key, idx in parked.items():
        ins = code[key[-1]]
        if ins.x is not None and callable(ins.x):
            ins.x(st, ins, idx)  # bar.red: write the block-wide reduction
        nk = (*key[:-1], key[-1] + 1)
        groups[nk] = merge(groups[nk], idx, n) if nk in groups else idx


# ---- mbarrier waits ---------------------------------------------------------------------------


def _wake(code: list, st, mparked: dict, groups: dict, n: int) -> bool:
    """Move the lanes whose awaited phase completed back to their wait (which then passes).
    Returns True if any moved."""
    woke = False
    for key in list(mparked):
        idx = mparked[key]
        ins = code[key[-1]]
        done = ins.e(st, ins, idx)
        if not done.any():
            continue
        go, stay = _split(done, idx)
        if stay is None:
            del mparked[key]
        else:
            mparked[key] = stay
        groups[key] = merge(groups[key], go, n) if key in groups else go
        woke = True
    return woke


def _give_up(code: list, st, mparked: dict, groups: dict, n: int) -> dict:
    """Nothing else can run: every parked mbarrier wait returns its (false) answer and moves
    on. Cluster barrier waits have no such answer: they stay parked (returned)."""
    keep = {}
    for key, idx in mparked.items():
        ins = code[key[-1]]
        if ins.x is CLUSTER_WAIT:
            keep[key] = idx
            continue
        ins.fn(st, ins, idx)
        nk = (*key[:-1], key[-1] + 1)
        groups[nk] = merge(groups[nk], idx, n) if nk in groups else idx
    return keep


def _exit(st, idx) -> None:
    """Lanes exit: a cluster barrier no longer waits for them."""
    if idx is None:
        st.exited[:] = True
    else:
        st.exited[idx] = True
    st.mbar_epoch += 1


def _deadlock(code: list, mparked: dict) -> None:
    ins = code[next(iter(mparked))[-1]]
    what = "a cluster barrier" if ins.x is CLUSTER_WAIT else "an mbarrier phase"
    raise KernelFault(
        702,
        f"deadlock: threads wait at `{ins.text}` (PTX line {ins.line}) for {what} that no "
        "thread can complete",
    )


# ---- cooperative launches: blocks that wait on each other ------------------------------------


def _blocks_of(st, idx) -> np.ndarray:
    """Block-in-batch mask of the lanes ``idx`` (None = every lane)."""
    m = np.zeros(st.nblocks, np.bool_)
    if idx is None:
        m[:] = True
    else:
        m[st.block_of_lane[idx]] = True
    return m


def _merge_into(dst: dict, src: dict, n: int) -> None:
    for k, idx in src.items():
        dst[k] = merge(dst[k], idx, n) if k in dst else idx


def _yield_blocks(
    st, key: tuple, idx, groups: dict, parked: dict, wparked: dict, held: dict, held_blk, mparked
) -> bool:
    """A group loops back in a cooperative batch: if lanes of *other* blocks wait (to run, at a
    barrier they can leave, or set aside earlier), set this group and every lane of its blocks
    aside and make the other blocks' set-aside lanes runnable again, so they go first. Returns
    True when the group was set aside. Lanes of one block stay together, so min-PC
    reconvergence inside a block is unchanged; only the order between blocks differs."""
    mine = _blocks_of(st, idx)
    blk = st.block_of_lane
    if not (
        _any_outside(blk, groups.values(), mine)
        or _any_outside(blk, wparked.values(), mine)
        or _any_outside(blk, mparked.values(), mine)
        or _any_outside(blk, parked.values(), mine | held_blk)
        or _any_outside(blk, held.values(), mine)
    ):
        return False
    n = st.n
    # blocks set aside earlier get their turn only when no block outside them and this one can
    # run: released at once, two blocks spinning at the same low PC took turns for ever while
    # the block they waited on sat at a higher PC (a look-back scan's tile 0)
    # Only in a launch that became cooperative by spinning (st.cooperative is the caller's
    # request): a launch made cooperative, whose blocks also loop through block barriers
    # (test_cooperative's staggered rounds), no longer finished with this rule, and keeps
    # the turn-taking it was written with.
    fresh = not st.cooperative and _any_outside(blk, groups.values(), mine | held_blk)
    for k in [] if fresh else list(held):  # other blocks set aside earlier: their turn
        g = held[k]
        lanes = np.arange(n) if g is None else g
        sel = ~mine[blk[lanes]]
        if not sel.any():
            continue
        back = g if sel.all() else lanes[sel]
        groups[k] = merge(groups[k], back, n) if k in groups else back
        rest = lanes[~sel]
        if rest.size:
            held[k] = rest
        else:
            del held[k]
    if not fresh:
        held_blk &= mine
    held[key] = merge(held[key], idx, n) if key in held else idx
    held_blk |= mine
    for k in list(groups):
        g = groups[k]
        lanes = np.arange(n) if g is None else g
        sel = mine[blk[lanes]]
        if not sel.any():
            continue
        moved = g if sel.all() else lanes[sel]
        held[k] = merge(held[k], moved, n) if k in held else moved
        rest = lanes[~sel]
        if rest.size:
            groups[k] = rest
        else:
            del groups[k]
    return True


def _any_outside(block_of_lane: np.ndarray, sets, blocks) -> bool:
    """Whether any lane of the lane sets belongs to a block outside the mask ``blocks``."""
    for g in sets:
        if g is None:
            if not blocks.all():
                return True
        elif not blocks[block_of_lane[g]].all():
            return True
    return False


def _release_blocks(code: list, st, parked: dict, groups: dict, held_blk, n: int) -> bool:
    """Nothing runs but held lanes: complete the barriers of the blocks none of whose lanes are
    held (all their live lanes are parked). Returns True if any lanes were released."""
    released = False
    for key in list(parked):
        idx = parked[key]
        lanes = np.arange(n) if idx is None else idx
        free = ~held_blk[st.block_of_lane[lanes]]
        if not free.any():
            continue
        go = idx if free.all() else lanes[free]
        stay = lanes[~free]
        if stay.size:
            parked[key] = stay
        else:
            del parked[key]
        ins = code[key[-1]]
        if ins.x is not None and callable(ins.x):
            ins.x(st, ins, go)  # bar.red: the reduction over the released blocks
        nk = (*key[:-1], key[-1] + 1)
        groups[nk] = merge(groups[nk], go, n) if nk in groups else go
        released = True
    return released


def _copy_params(dst, src, copies, idx) -> None:  # type: ignore[no-untyped-def]
    """Copy a call's argument (or return) bytes between the caller's and the callee's param
    space, for every lane (``idx is None``) or for the lanes in ``idx``."""
    rows = slice(None) if idx is None else idx
    for src_off, dst_off, size in copies:
        dst[rows, dst_off : dst_off + size] = src[rows, src_off : src_off + size]


def _take_params(src, copies, idx) -> list:  # type: ignore[no-untyped-def]
    """The bytes a return copies out of the callee's param space (before its frame is restored)."""
    rows = slice(None) if idx is None else idx
    return [
        (dst_off, src[rows, src_off : src_off + size].copy()) for src_off, dst_off, size in copies
    ]


def _put_params(dst, vals, idx) -> None:  # type: ignore[no-untyped-def]
    rows = slice(None) if idx is None else idx
    for dst_off, data in vals:
        dst[rows, dst_off : dst_off + data.shape[1]] = data
