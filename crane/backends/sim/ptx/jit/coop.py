"""A cooperative launch compiled: every block resident, run in turns until all have ended.

Why: ``cooperative_groups::this_grid().sync()`` as nvcc emits it is a block barrier, one
thread's ``atom.add.release`` on the grid-sync workspace's arrival count (``%envreg1:%envreg2``)
and an ``ld.acquire`` loop until the count's phase flips, which only the *last* block to
arrive makes happen. The ordinary runner (:mod:`.runner`) runs a block to its end before the
next one starts, so the first block would wait for ever. Here each block has buffers of its
own for the whole launch (shared memory, register save area, resume words, local memory,
context words), and a block whose lanes only wait at a yield point (:mod:`.spin`: the loop's
branch back) *suspends*: the driver returns :data:`.layout.SUSPENDED` with the block's state
in those buffers, the runner goes on with other blocks and calls it again later with
:data:`.layout.COOP_RESUME` (the driver then skips the block's initialization). One call runs
one block; the blocks wait in a queue and one thread per core takes them from it, so a grid
barrier costs each block a call per turn until the last block arrives. What a GPU guarantees a
cooperative launch (all blocks co-resident, so any block may wait on any other) therefore
holds; a block that waits on something no block ever does waits until the launch's deadline,
as on a GPU. A launch's grid is bounded by the device's co-residency limit (checked before
it gets here), so the buffers for all its blocks at once are bounded too.
"""

from __future__ import annotations

import collections
import threading
import time

import numpy as np

from ..errors import KernelFault
from . import layout as L
from . import printing, watchdog

__all__ = ["run_cooperative"]


def run_cooperative(
    ck, *, template, geo, memory, memory_words, kparams, shared_stride, local_stride, deadline,
    workers: int, pool, grid_workspace: int, fault, sink, out,
) -> None:  # fmt: skip
    """Run compiled kernel ``ck``'s grid with every block resident (see the module).
    ``template``: the launch's context words (shape part); ``memory_words`` fills a row's
    memory words; ``fault`` turns a failed call's context into its :class:`KernelFault`;
    ``pool``: the runner's thread pool for ``workers`` > 1."""
    grid, block = geo.grid, geo.block
    nblocks = grid[0] * grid[1] * grid[2]
    threads = block[0] * block[1] * block[2]
    nregs = max(ck.nregs, 1)
    # every block's buffers at once, a row each
    ctxs = np.zeros((nblocks, len(template)), np.int64)
    shared = np.zeros((nblocks, max(shared_stride, 16)), np.uint8)
    save = np.zeros((nblocks, threads * nregs), np.int64)
    resume = np.zeros((nblocks, max(threads, 1)), np.int32)
    local = np.zeros((nblocks, max(threads * local_stride, 16)), np.uint8)
    head = template.copy()
    memory_words(head)
    head[L.KPARAMS] = kparams.ctypes.data
    head[L.GRID_WS] = grid_workspace
    head[L.COOP] = L.COOP_START
    ctxs[:] = head
    ctxs[:, L.BLOCK_BEGIN] = np.arange(nblocks)
    ctxs[:, L.BLOCK_END] = np.arange(1, nblocks + 1)
    ctxs[:, L.SHARED] = shared.ctypes.data + np.arange(nblocks) * shared.shape[1]
    ctxs[:, L.SAVE] = save.ctypes.data + np.arange(nblocks) * save.shape[1] * 8
    ctxs[:, L.RESUME] = resume.ctypes.data + np.arange(nblocks) * resume.shape[1] * 4
    ctxs[:, L.LOCAL] = local.ctypes.data + np.arange(nblocks) * local.shape[1]
    base = ctxs.ctypes.data
    row = ctxs.shape[1] * 8
    ptrs = [base + i * row for i in range(nblocks)]
    fn = ck.entry_for(block)
    if out is not None:
        for p in ptrs:
            printing.attach(p, out)
    queue = collections.deque(range(nblocks))
    lock = threading.Lock()
    state = {"left": nblocks, "faults": []}

    def turns() -> None:
        """Take blocks from the queue until every block has ended or one faulted."""
        while state["left"] and not state["faults"]:
            try:
                i = queue.popleft()
            except IndexError:  # the others' blocks are running: let their thread go on
                time.sleep(0)
                continue
            if deadline is not None and time.monotonic() > deadline:
                with lock:
                    state["faults"].append(
                        (i, KernelFault(702, "the launch ran past its time limit"))
                    )
                return
            rc = fn(ptrs[i])
            if rc == L.SUSPENDED:
                ctxs[i, L.COOP] = L.COOP_RESUME
                queue.append(i)
            elif rc == 0:
                with lock:
                    state["left"] -= 1
            else:
                got = fault(ck, ctxs[i], memory, shared_stride, sink, out)
                with lock:
                    state["faults"].append((i, got))
                return

    timer = None
    if deadline is not None:
        timer = watchdog.watch(deadline, lambda: ctxs[:, L.STOP].fill(1))
    try:
        helpers = [pool.submit(turns) for _ in range(workers - 1)] if workers > 1 else []
        try:
            turns()
        finally:
            for h in helpers:
                if not h.cancel():
                    h.result()
    finally:
        if timer is not None:
            watchdog.cancel(timer)
        if out is not None:
            for p in ptrs:
                printing.detach(p)
            out.flush()
    if state["faults"]:
        raise min(state["faults"], key=lambda f: f[0])[1]
