"""A compiled launch's blocks handed to its threads in chunks (``jit/chunks.py``): every block
exactly once and in order; a pool thread that never gets to run costs the launch nothing (the
calling thread takes every chunk, the late task is cancelled); the fault reported is the
first faulting block's, whichever thread ran it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from ptxdev import Ptr
from test_jit_affine import HEAD

from crane.backends.sim.ptx import KernelFault, jit, load_ptx
from crane.backends.sim.ptx.jit import runner
from crane.backends.sim.ptx.jit.chunks import Chunks, chunk_size

#: ``out[i] = i``; with ``bad`` = block b, that block stores ``b << 32`` bytes on instead
#: (outside every allocation)
FILL = (
    HEAD
    + """
.visible .entry fill(.param .u64 out, .param .u32 bad1, .param .u32 bad2)
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [bad1];
    ld.param.u32 %r2, [bad2];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r6, %r3, %r4, %r5;
    mul.wide.u32 %rd2, %r6, 4;
    setp.eq.u32 %p1, %r3, %r1;
    setp.eq.u32 %p2, %r3, %r2;
    or.pred %p3, %p1, %p2;
    @!%p3 bra STORE;
    cvt.u64.u32 %rd3, %r3;
    shl.b64 %rd2, %rd3, 32;
STORE:
    add.s64 %rd4, %rd1, %rd2;
    st.global.u32 [%rd4], %r6;
    ret;
}
"""
)

BLOCKS, THREADS = 2048, 64  # 128K lanes: two threads (runner.MIN_LANES_PER_CORE)
NONE = 0xFFFFFFFF


@pytest.fixture(autouse=True)
def _two_threads(monkeypatch):
    monkeypatch.setattr(jit, "COMPILE_MIN_LANES", 1)
    monkeypatch.setattr(runner, "_cores", lambda: 2)


def test_chunks_cover_the_blocks_once_in_order():
    chunks = Chunks(1000, chunk_size(1000, 2, 1 << 20))
    got: list[tuple[int, int]] = []
    lock = threading.Lock()

    def take() -> None:
        while (c := chunks.take()) is not None:
            with lock:
                got.append(c)

    threads = [threading.Thread(target=take) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [b for first, end in sorted(got) for b in range(first, end)]
    assert flat == list(range(1000))
    assert len(got) == 8  # four chunks per thread of an even split over two


def test_chunk_size_bounds():
    assert chunk_size(4096, 2, 1 << 20) == 512
    assert chunk_size(4096, 2, 100) == 100  # one native call's worth at most
    assert chunk_size(3, 2, 100) == 1
    stopped = Chunks(10, 2)
    assert stopped.take() == (0, 2)
    stopped.stop()
    assert stopped.take() is None


def test_a_pool_thread_that_never_runs_costs_the_launch_nothing(dev, monkeypatch):
    """The pool's only thread is held busy until the launch is over (or 5 s pass): the
    calling thread runs every block, the pool's task is dropped, not waited for."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    prog = load_ptx(FILL)
    out = dev.zeros(BLOCKS * THREADS, np.uint32)
    args = [Ptr(out), np.uint32(NONE), np.uint32(NONE)]
    dev.launch(prog, "fill", BLOCKS, THREADS, args)  # compiled here, outside the timing
    busy = ThreadPoolExecutor(1)
    release = threading.Event()
    busy.submit(release.wait, 5.0)
    monkeypatch.setattr(runner, "_pool", lambda: busy)
    try:
        out2 = dev.zeros(BLOCKS * THREADS, np.uint32)
        t = time.monotonic()
        dev.launch(prog, "fill", BLOCKS, THREADS, [Ptr(out2), np.uint32(NONE), np.uint32(NONE)])
        took = time.monotonic() - t
    finally:
        release.set()
        busy.shutdown(wait=True)
    assert took < 4.0  # the busy thread's half would have waited for the release
    assert (dev.download(out2, BLOCKS * THREADS, np.uint32) == np.arange(BLOCKS * THREADS)).all()


@pytest.mark.parametrize("bad", [(1900, 1500), (40, 1800), (700, 699)])
def test_the_first_faulting_block_is_reported(dev, monkeypatch, bad):
    """Two blocks fault, whichever threads run them: the lower one's address is named, and
    the code is the interpreter's (diff mode)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(FILL + f"\n// {bad}\n")
    out = dev.zeros(BLOCKS * THREADS, np.uint32)
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "fill", BLOCKS, THREADS, [Ptr(out), *map(np.uint32, bad)])
    assert e.value.code == 700
    first = min(bad)
    assert f"{int(out) + (first << 32):#x}" in str(e.value)  # the block's lane 0
