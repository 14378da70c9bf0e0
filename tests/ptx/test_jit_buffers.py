"""Compiled launches reuse their per-core buffers (shared memory, local memory, barrier save
area, resume words: ``jit/buffers.py``). What must hold: a launch never sees what an earlier
launch left in them — each block starts with zeroed shared and local memory, as the
interpreter gives it — and two launches at once never share a set."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import jit, load_ptx
from crane.backends.sim.ptx.jit import buffers

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: each thread reads its shared word (zero at the block's start), then writes tid + 1 there,
#: and stores what it read: all zeros unless shared memory came in dirty
SHARED_DIRTY = (
    HEAD
    + """
.visible .entry t(.param .u64 out)
{
    .reg .b32 %r<10>;
    .reg .b64 %rd<8>;
    .shared .align 4 .b8 sh[1024];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r7, %ctaid.x;
    mov.u32 %r8, %ntid.x;
    mad.lo.s32 %r9, %r7, %r8, %r1;
    mov.u32 %r2, sh;
    shl.b32 %r3, %r1, 2;
    add.s32 %r4, %r2, %r3;
    ld.shared.u32 %r5, [%r4];
    add.s32 %r6, %r1, 1;
    st.shared.u32 [%r4], %r6;
    mul.wide.u32 %rd2, %r9, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r5;
    ret;
}
"""
)

#: the same with the lane's local frame (and a barrier, so the save area is used too)
LOCAL_DIRTY = (
    HEAD
    + """
.visible .entry t(.param .u64 out)
{
    .local .align 4 .b8 __local_depot0[16];
    .reg .b64 %SPL;
    .reg .b32 %r<10>;
    .reg .b64 %rd<8>;
    mov.u64 %SPL, __local_depot0;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r7, %ctaid.x;
    mov.u32 %r8, %ntid.x;
    mad.lo.s32 %r9, %r7, %r8, %r1;
    ld.local.u32 %r5, [%SPL+4];
    add.s32 %r6, %r1, 7;
    st.local.u32 [%SPL+4], %r6;
    bar.sync 0;
    ld.local.u32 %r2, [%SPL+8];
    add.s32 %r3, %r5, %r2;
    st.local.u32 [%SPL+8], %r6;
    mul.wide.u32 %rd2, %r9, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r3;
    ret;
}
"""
)


@pytest.fixture(autouse=True)
def _compiled(monkeypatch):
    monkeypatch.setattr(jit, "COMPILE_MIN_LANES", 1)
    monkeypatch.setenv("CRANE_PTX_JIT", "1")


def _dirty_sets() -> int:
    """Pooled buffer sets holding anything but zeros (what a launch left there)."""
    with buffers._lock:
        sets = [s for v in buffers._free.values() for s in v]
    return sum(bool(s.shared.any() or s.local.any()) for s in sets)


@pytest.mark.parametrize("source", [SHARED_DIRTY, LOCAL_DIRTY], ids=["shared", "local"])
def test_reused_buffers_are_cleared_for_every_block(dev, source):
    """Two launches of the same shape: the second runs on the sets the first left dirty in the
    pool, and still every lane reads zeros, as the interpreter gives."""
    prog = load_ptx(source)
    blocks, threads = 3, 256
    out = dev.zeros(blocks * threads, np.uint32)
    dev.launch(prog, "t", blocks, threads, [Ptr(out)])
    assert "t" in {n for n, _ in jit.stats()["compiled"]}
    assert not dev.download(out, blocks * threads, np.uint32).any()
    assert _dirty_sets() > 0  # the pool holds what the first launch wrote
    out2 = dev.upload(np.full(blocks * threads, 99, np.uint32))
    dev.launch(prog, "t", blocks, threads, [Ptr(out2)])
    assert not dev.download(out2, blocks * threads, np.uint32).any()


def test_concurrent_launches_do_not_share_buffers(dev):
    """Launches from several threads at once each take their own sets (each lane's result
    would show another launch's shared writes)."""
    prog = load_ptx(SHARED_DIRTY)
    blocks, threads = 4, 256
    outs = [dev.zeros(blocks * threads, np.uint32) for _ in range(4)]
    dev.launch(prog, "t", blocks, threads, [Ptr(outs[0])])  # compiled before the race
    errors: list[BaseException] = []

    def go(o) -> None:
        try:
            for _ in range(20):
                dev.launch(prog, "t", blocks, threads, [Ptr(o)])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=go, args=(o,)) for o in outs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for o in outs:
        assert not dev.download(o, blocks * threads, np.uint32).any()


def test_pool_is_bounded():
    """The pool gives back memory beyond its bound (least recently used sizes first) and
    keeps a few sets per size."""
    for n in range(1, 12):
        buffers.give(buffers.take(16, n, 1, 16))
    assert buffers.pooled_bytes() <= buffers.MAX_POOLED_BYTES
    big = buffers.take(16, 1, 1, buffers.MAX_POOLED_BYTES + 1)
    buffers.give(big)  # larger than the whole pool: dropped
    assert buffers.pooled_bytes() <= buffers.MAX_POOLED_BYTES
    sets = [buffers.take(64, 3, 1, 16) for _ in range(10)]
    for s in sets:
        buffers.give(s)
    with buffers._lock:
        assert len(buffers._free[(64, 3, 1, 16, 0)]) <= buffers._PER_KEY
    again = buffers.take(64, 3, 1, 16)
    assert again in sets  # a pooled set, not a new one


#: each thread stores the last 8 bytes of a by-value struct parameter of ``N`` bytes plus its
#: thread index: kernel parameters that fit the pooled set's area go through it, larger ones
#: from the launch's own array (jit/runner.py ``_run_alone``)
PARAM_TAIL = (
    HEAD
    + """
.visible .entry t(.param .u64 out, .param .align 8 .b8 blob[N])
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [blob+M];
    mov.u32 %r1, %tid.x;
    cvt.u64.u32 %rd3, %r1;
    add.s64 %rd4, %rd2, %rd3;
    mul.wide.u32 %rd5, %r1, 8;
    add.s64 %rd6, %rd1, %rd5;
    st.global.u64 [%rd6], %rd4;
    ret;
}
"""
)


@pytest.mark.parametrize("size", [8, buffers.KPARAM_AREA - 16, buffers.KPARAM_AREA + 64])
def test_each_launch_sees_its_own_parameters(dev, size):
    """Launches one after another with different parameter values, through the pooled area
    (which keeps what the last launch copied there) and past its end: each lane reads this
    launch's values."""
    prog = load_ptx(PARAM_TAIL.replace("[N]", f"[{size}]").replace("+M]", f"+{size - 8}]"))
    threads = 64
    outs = [dev.zeros(threads, np.uint64) for _ in range(2)]
    for i in range(6):
        blob = bytes(size - 8) + (1000 * (i + 1)).to_bytes(8, "little")
        dev.launch(prog, "t", 1, threads, [Ptr(outs[i % 2]), blob])
        assert "t" in {n for n, _ in jit.stats()["compiled"]}
        got = dev.download(outs[i % 2], threads, np.uint64)
        assert (got == 1000 * (i + 1) + np.arange(threads)).all(), (i, got[:4])
