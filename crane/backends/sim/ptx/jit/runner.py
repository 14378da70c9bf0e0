"""Running a compiled kernel over a launch: the context words, the block loop, faults.

The grid's blocks are handed, a chunk at a time and in block order (:mod:`.chunks`), to one
thread per core: the calling thread and a thread pool's (ctypes releases the GIL during the
native call), each with its own buffers; a launch with a deadline is also checked between
chunks, and inside a chunk the compiled code polls a stop flag at every backward branch,
which the watchdog thread (:mod:`.watchdog`) sets when the deadline passes. Within a chunk
the blocks run one after the other (a block's lanes, region by region, then the next block).
Blocks are independent in CUDA's model but for atomics and ordered accesses (compiled as real
atomic instructions, :mod:`.ops_atomic`, :mod:`.ops_order`), so running them at once is a legal
schedule. A block may wait on another through them (CUB's decoupled look-back spins on counts
that earlier blocks publish with ``st.volatile``): a block waits only on blocks that started
before it (chunks go out in block order: an earlier block has finished or runs on another
thread) in the kernels this is written for, and a loop waiting so yields to its block's other
lanes at every turn (:mod:`.spin`), so the wait ends when the producer runs. A kernel that
waits on a later block would wait for ever on a GPU too unless all blocks are resident; the
stop flag ends it at the launch's deadline.

A fault recorded by the compiled code becomes the interpreter's :class:`KernelFault`: the same
CUresult, the same address message (global addresses are re-checked through
``SimMemory.offsets``, which words it), and the instruction and PTX line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from crane.backends.sim.memory import MemoryFault

from ..errors import KernelFault, fault_code
from ..memspace import CLUSTER_RANK_SHIFT, LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW
from ..printf import assert_fault, assert_line, global_cstring
from . import buffers, printing, watchdog
from . import layout as L
from .chunks import Chunks, chunk_size
from .coop import run_cooperative

__all__ = ["LANES_PER_CALL", "run_compiled"]

#: lanes per native call: bounds how late a deadline between calls is noticed
LANES_PER_CALL = 1 << 20


def run_compiled(
    ck,
    *,
    geo,
    memory,
    kparams,
    symvals,
    shared_stride,
    deadline,
    local_stride: int = 16,
    serial: bool = False,
    printf=None,
    grid_workspace: int = 0,
) -> None:
    """Run compiled kernel ``ck`` (:class:`CompiledKernel`) over the whole grid: the blocks
    handed in chunks to one thread per core (each with its own shared memory, local memory,
    save area and caches), the fault of the lowest chunk that had one reported. ``printf``
    takes the line a failed ``assert`` prints (standard output without one).
    ``grid_workspace``: a cooperative launch's (nonzero), whose blocks are all resident at
    once (:mod:`.coop`)."""
    sink = printf if printf is not None else sys.stdout.write
    out = printing.Output(sink, memory, geo.grid, geo.block) if ck.prints else None
    starts, ends = memory.allocation_arrays()
    symvals = np.ascontiguousarray(symvals, np.uint64)
    grid, block = geo.grid, geo.block
    nblocks = grid[0] * grid[1] * grid[2]
    threads = block[0] * block[1] * block[2]
    workers = min(_cores(), max(1, nblocks * threads // MIN_LANES_PER_CORE), nblocks)
    if serial:
        workers = 1
    per_call = max(1, LANES_PER_CALL // max(threads, 1))
    # the context words every core's share has in common, filled once: a launch's shape
    # gives most of them (kept per shape), the rest are this launch's
    shape = (id(ck), grid, block, local_stride, len(kparams), shared_stride)
    got = _heads.get(shape)
    if got is not None and got[0] is ck:
        template = got[1]
    else:
        template = np.zeros(L.FIXED + 2 * max(ck.sites, 1), np.int64)
        template[L.LOCAL_SIZE] = local_stride
        template[L.KPARAM_SIZE] = len(kparams) - 8  # the launch appends 8 bytes of padding
        template[L.SHARED_SIZE] = shared_stride
        template[L.GRID : L.GRID + 3] = grid
        template[L.NTID : L.NTID + 3] = block
        template[L.PRINTF_FN] = printing.CALLBACK_ADDRESS
        if len(_heads) >= 256:
            _heads.clear()
        _heads[shape] = (ck, template)  # (ck kept: its id is the key's)
    if grid_workspace:
        cores = 1 if serial else min(_cores(), nblocks)
        run_cooperative(
            ck, template=template, geo=geo, memory=memory,
            memory_words=lambda w: _memory_words(w, memory, starts, ends, symvals),
            kparams=kparams, shared_stride=shared_stride, local_stride=local_stride,
            deadline=deadline, workers=cores, pool=_pool() if cores > 1 else None,
            grid_workspace=grid_workspace, fault=_fault, sink=sink, out=out,
        )  # fmt: skip
        return
    sizes = (
        max(shared_stride, 16),
        threads * max(ck.nregs, 1),  # as many words as the driver clears: one per lane
        max(threads, 1),  # at least, even with no register live
        max(threads * local_stride, 16),
        # the context words in the pooled set too, unless a watchdog may still write to them
        # (its stop flag) after the set went back to the pool
        len(template) if deadline is None else 0,
    )
    if workers == 1 and deadline is None:
        try:
            _run_alone(ck, template, sizes, memory, starts, ends, kparams, symvals, block,
                       nblocks, per_call, shared_stride, sink, out)  # fmt: skip
        finally:
            if out is not None:
                out.flush()
        return
    chunks = Chunks(nblocks, chunk_size(nblocks, workers, per_call))
    head = template.copy()
    _memory_words(head, memory, starts, ends, symvals)
    head[L.KPARAMS] = kparams.ctypes.data
    keep = (starts, ends, symvals, kparams)  # alive while the code runs
    parts = [
        _Part(ck, geo, memory, shared_stride, head, sizes, keep, sink, out) for _ in range(workers)
    ]
    timer = None
    if deadline is not None:  # one watchdog thread for all launches (a Timer costs ~40 µs)
        timer = watchdog.watch(deadline, lambda: _stop(parts))
    try:
        # the calling thread takes chunks itself (ctypes releases the GIL): one thread
        # hand-off fewer per launch, and the whole grid if the pool's threads start late
        pool = _pool() if workers > 1 else None
        futs = [pool.submit(p.run, chunks, deadline) for p in parts[1:]]
        faults = []
        try:
            faults.append(parts[0].run(chunks, deadline))
        finally:  # a task that never started is dropped; the others end before their
            # buffers go back to the pool
            faults += [f.result() for f in futs if not f.cancel()]
    finally:
        if timer is not None:
            watchdog.cancel(timer)
        for p in parts:
            if out is not None:
                printing.detach(p.ptr)
            buffers.give(p.bufs)
        if out is not None:
            out.flush()
    found = [f for f in faults if f is not None]
    if found:
        raise min(found, key=lambda f: f[0])[1]


def _run_alone(
    ck,
    template,
    sizes,
    memory,
    starts,
    ends,
    kparams,
    symvals,
    block,
    nblocks,
    per_call,
    stride,
    sink,
    out,
) -> None:
    """A launch on the calling thread alone, with no deadline (most small launches): what
    :func:`run_compiled` does with one :class:`_Part`, without the hand-out of chunks, the
    futures and the copies of the context words, which cost a small launch more than its
    run (about 10 of 30 µs). The kernel parameters go through the buffer set's own area when
    they fit (its address is known)."""
    bufs = buffers.take(*sizes)
    try:
        ctx = bufs.ctx
        ctx[:] = template
        words = bufs.ctx_words
        _memory_words(words, memory, starts, ends, symvals)
        n = len(kparams)
        if n <= len(bufs.kparams):
            bufs.kparams[:n] = kparams
            words[L.KPARAMS] = bufs.kparams_addr
        else:
            words[L.KPARAMS] = kparams.ctypes.data
        words[L.SHARED], words[L.SAVE], words[L.RESUME], words[L.LOCAL] = bufs.addrs
        fn = ck.entry_for(block)
        ptr = bufs.ctx_addr
        if out is not None:
            printing.attach(ptr, out)
        for first in range(0, nblocks, per_call):
            words[L.BLOCK_BEGIN] = first
            words[L.BLOCK_END] = min(first + per_call, nblocks)
            if fn(ptr):
                raise _fault(ck, ctx, memory, stride, sink, out)
    finally:
        if out is not None:
            printing.detach(bufs.ctx_addr)
        buffers.give(bufs)


def _memory_words(words, memory, starts, ends, symvals) -> None:
    """Set a launch's own context words on memory (the window, the allocation table, the
    symbol values) in ``words``: a numpy array or a memoryview of one."""
    words[L.MEM_BUF] = _addr(memory.buf)
    words[L.MEM_BASE] = memory.base
    words[L.ALLOC_STARTS] = _addr(starts)
    words[L.ALLOC_ENDS] = _addr(ends)
    words[L.NALLOC] = len(starts)
    words[L.SYMVALS] = _addr(symvals)


#: the launch-shape part of the context words (:func:`run_compiled`), by shape
_heads: dict[tuple, tuple[object, np.ndarray]] = {}
#: arrays whose address :func:`_addr` knows, by id (each kept alive, so its id stays its own)
_addrs: dict[int, tuple[np.ndarray, int]] = {}


def _addr(a: np.ndarray) -> int:
    """``a.ctypes.data``, remembered for arrays launches hand over again and again (device
    memory, the allocation table until it changes, a kernel's symbol values): asking numpy
    costs 1-2 µs each, a good part of a small launch."""
    got = _addrs.get(id(a))
    if got is not None and got[0] is a:
        return got[1]
    if len(_addrs) >= 64:
        _addrs.clear()
    addr = a.ctypes.data
    _addrs[id(a)] = (a, addr)
    return addr


#: grids smaller than this many lanes per core run on one core (a thread hand-off costs more)
MIN_LANES_PER_CORE = 1 << 15
_pool_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _cores() -> int:
    """The cores this process may run on (asked once: a system call per launch cost more
    than a small kernel's run)."""
    global _ncores
    if _ncores is None:
        try:
            _ncores = max(1, len(os.sched_getaffinity(0)))
        except AttributeError:
            _ncores = max(1, os.cpu_count() or 1)
    return _ncores


_ncores: int | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _pool_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(_cores(), thread_name_prefix="crane-ptx-jit")
        return _executor


class _Part:
    """One core's share of a launch: its context words and the buffers they point at."""

    def __init__(self, ck, geo, memory, shared_stride: int, head, sizes, keep, sink, out) -> None:
        self.ck, self.geo, self.memory, self.stride = ck, geo, memory, shared_stride
        self.sink, self.out = sink, out
        self._keep = keep
        # shared memory, save area, resume words and every lane's local area: the driver
        # clears each before a block uses it, so a pooled set serves (jit/buffers.py)
        bufs = self.bufs = buffers.take(*sizes)
        if sizes[4]:
            ctx = self.ctx = bufs.ctx
            ctx[:] = head
            self.ptr = bufs.ctx_addr
        else:
            ctx = self.ctx = head.copy()
            self.ptr = ctx.ctypes.data
        ctx[L.SHARED], ctx[L.SAVE], ctx[L.RESUME], ctx[L.LOCAL] = bufs.addrs
        if out is not None:
            printing.attach(self.ptr, out)

    def run(self, chunks: Chunks, deadline) -> tuple[int, KernelFault] | None:
        """Chunks of blocks, one native call each, until none is left; after a fault (or
        the deadline) no more for any thread, and ``(its chunk's first block, the fault)``."""
        ck, ctx, geo = self.ck, self.ctx, self.geo
        # the vectorizable form takes 1-D blocks (the lane index is %tid.x); the caller made
        # sure the general driver is compiled for any other (jit.compiled_kernel)
        fn = ck.entry_for(geo.block)
        ptr = self.ptr
        while (got := chunks.take()) is not None:
            first, end = got
            if deadline is not None and time.monotonic() > deadline:
                chunks.stop()
                return first, KernelFault(702, "the launch ran past its time limit")
            ctx[L.BLOCK_BEGIN] = first
            ctx[L.BLOCK_END] = end
            if fn(ptr):
                chunks.stop()
                return first, _fault(ck, ctx, self.memory, self.stride, self.sink, self.out)
        return None


def _stop(parts: list[_Part]) -> None:
    for p in parts:
        p.ctx[L.STOP] = 1


def _fault(ck, ctx: np.ndarray, memory, stride: int, sink, out) -> KernelFault:
    text, line = ck.texts[int(ctx[L.FAULT_PC])]
    kind = int(ctx[L.FAULT_KIND])
    if kind == L.KIND_ASSERT:  # (its line after the launch's printf lines)
        return _assert_fault(ctx, memory, sink if out is None else out.say)
    if kind == L.KIND_PRINTF:
        got = out.fault if out is not None else None
        return got or KernelFault(719, f"vprintf failed at `{text}` (PTX line {line})")
    where = f"`{text}` (PTX line {line})"
    if kind == L.KIND_TIMEOUT:
        return KernelFault(702, f"the launch ran past its time limit at {where}")
    if kind == L.KIND_TRAP:  # worded as the interpreter's (executor._trap)
        return KernelFault(719, f"trap executed at {where}")
    addr = int(ctx[L.FAULT_ADDR]) & (2**64 - 1)
    n = int(ctx[L.FAULT_BYTES])
    space = int(ctx[L.FAULT_SPACE])
    if space == L.SPACE_LOCAL:
        off = addr - LOCAL_WINDOW
        off = off - 2**64 if off >= 2**63 else off
        lstride = int(ctx[L.LOCAL_SIZE])
        if kind == L.KIND_ILLEGAL:  # worded as the interpreter's local window
            msg = (
                f"{n}-byte local access at local offset {off:#x} (generic {addr:#x}) is "
                f"outside the {lstride} bytes of local memory"
            )
            e = MemoryFault(msg, addr, "illegal")
        else:
            e = MemoryFault(f"misaligned {n}-byte local access at offset {off:#x}", addr)
            e.kind = "misaligned"
    elif space in (L.SPACE_PARAM, L.SPACE_PARAM_STORE):
        e = _param_fault(addr, n, kind, space == L.SPACE_PARAM_STORE, int(ctx[L.KPARAM_SIZE]))
    elif space == L.SPACE_GLOBAL:
        try:
            memory.offsets(np.array([addr], np.uint64), n)
            e = MemoryFault(f"{n}-byte access at {addr:#x} is outside every allocation", addr)
            e.kind = "illegal" if kind == L.KIND_ILLEGAL else "misaligned"
        except MemoryFault as err:
            e = err
    else:
        off = addr - SHARED_WINDOW
        off = off - 2**64 if off >= 2**63 else off
        if kind == L.KIND_ILLEGAL and off >> CLUSTER_RANK_SHIFT and off >= 0:
            # worded as the interpreter's .shared::cluster check (each CTA its own cluster)
            rank = (off >> CLUSTER_RANK_SHIFT) - 1
            msg = (
                f"{n}-byte shared::cluster access at {off:#x} (generic {addr:#x}): CTA rank "
                f"{rank} offset {off & ((1 << CLUSTER_RANK_SHIFT) - 1):#x} is outside the "
                f"cluster's 1 CTAs of {stride} bytes of shared memory"
            )
            e = MemoryFault(msg, addr, "illegal")
        elif kind == L.KIND_ILLEGAL:
            msg = (
                f"{n}-byte shared access at shared offset {off:#x} (generic {addr:#x}) is "
                f"outside the {stride} bytes of shared memory"
            )
            e = MemoryFault(msg, addr, "illegal")
        else:
            e = MemoryFault(f"misaligned {n}-byte shared access at offset {off:#x}", addr)
            e.kind = "misaligned"
    return KernelFault(fault_code(e.kind), f"{e} in {where}")


def _assert_fault(ctx: np.ndarray, memory, say) -> KernelFault:
    """A failed ``assert``: the failing thread's line printed, then the interpreter's
    CUDA_ERROR_ASSERT. The compiled kernel stops at the first thread to fail in its order
    (lanes one after another, region by region); the interpreter, whose lanes run in
    lockstep, prints every lane failing at that step, which may be other threads. The
    strings are module constants in global memory; one that is not readable there fails the
    launch as an illegal address."""
    words = [int(ctx[s]) & (2**64 - 1) for s in range(L.ASSERT_MSG, L.ASSERT_CTAID + 1)]
    msg, file, line, func, tid, cta = words
    try:
        text = assert_line(
            global_cstring(memory, file),
            line & 0xFFFF_FFFF,
            global_cstring(memory, func),
            L.unpack(cta, L.CTAID_SHIFTS),
            L.unpack(tid, L.TID_SHIFTS),
            global_cstring(memory, msg),
        )
    except MemoryFault as e:
        return KernelFault(fault_code(e.kind), f"{e} in __assertfail's strings")
    say(text)
    return assert_fault(text)


def _param_fault(addr: int, n: int, kind: int, store: bool, size: int) -> MemoryFault:
    """The interpreter's fault (memspace._param) for a kernel parameter access at generic
    address ``addr``: outside the parameters, a store (read-only), or misaligned."""
    off = addr - PARAM_WINDOW
    off = off - 2**64 if off >= 2**63 else off
    if kind == L.KIND_MISALIGNED:
        e = MemoryFault(f"misaligned {n}-byte .param access at offset {off:#x}", addr)
        e.kind = "misaligned"
        return e
    outside = off < 0 or off + n > size
    why = (
        f"outside the {size} bytes of kernel parameters"
        if outside
        else "kernel parameters are read-only"
    )
    msg = f"{n}-byte {'store' if store else 'load'} at .param offset {off:#x} (generic {addr:#x}): "
    return MemoryFault(msg + why, addr, "illegal")
