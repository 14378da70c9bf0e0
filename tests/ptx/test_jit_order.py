"""Ordered accesses in compiled kernels: ``.volatile``/``.relaxed``/``.acquire``/``.release``
loads and stores, fences, waits on them, and ``bar.red``.

The module runs in ``diff`` mode (conftest): every compiled launch also runs interpreted and the
bytes must agree. What is checked beyond that: legacy warp-synchronous code on a ``volatile``
shared array (or a generic pointer) runs compiled in the warp's lockstep order
(:mod:`crane.backends.sim.ptx.jit.lockstep`; lane by lane its sum would be wrong); a lane
spinning on a flag a later lane of its own block sets neither hangs nor releases the block's
barrier early (:mod:`crane.backends.sim.ptx.jit.spin`'s yield points); a chain of blocks, each
waiting on the one before it (dynamic block ids taken with an atomic, as CUB's look-back does),
runs compiled, also split over several cores.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import jit, load_ptx
from crane.backends.sim.ptx.jit import lower

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: the classic tail of a shared-memory sum without __syncwarp: 32 lanes add halves of a
#: ``volatile`` array in lockstep
WARPSYNC = (
    HEAD
    + """
.visible .entry vol_warpsync(.param .u64 in, .param .u64 out)
{
    .reg .pred %p<3>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<6>;
    .shared .align 4 .b32 sdata[64];
    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.u32 %r2, [%rd4];
    mov.u32 %r3, sdata;
    shl.b32 %r4, %r1, 2;
    add.s32 %r5, %r3, %r4;
    st.shared.u32 [%r5], %r2;
    bar.sync 0;
    setp.ge.u32 %p1, %r1, 32;
    @%p1 bra $DONE;
    ld.volatile.shared.u32 %r6, [%r5];
    ld.volatile.shared.u32 %r7, [%r5+128];
    add.s32 %r6, %r6, %r7;
    st.volatile.shared.u32 [%r5], %r6;
    ld.volatile.shared.u32 %r7, [%r5+64];
    add.s32 %r6, %r6, %r7;
    st.volatile.shared.u32 [%r5], %r6;
    ld.volatile.shared.u32 %r7, [%r5+32];
    add.s32 %r6, %r6, %r7;
    st.volatile.shared.u32 [%r5], %r6;
    ld.volatile.shared.u32 %r7, [%r5+16];
    add.s32 %r6, %r6, %r7;
    st.volatile.shared.u32 [%r5], %r6;
    ld.volatile.shared.u32 %r7, [%r5+8];
    add.s32 %r6, %r6, %r7;
    st.volatile.shared.u32 [%r5], %r6;
    ld.volatile.shared.u32 %r7, [%r5+4];
    add.s32 %r6, %r6, %r7;
    st.volatile.shared.u32 [%r5], %r6;
    setp.ne.u32 %p2, %r1, 0;
    @%p2 bra $DONE;
    ld.volatile.shared.u32 %r8, [%r5];
    st.global.u32 [%rd2], %r8;
$DONE:
    ret;
}
"""
)


def _same_block(load: str, store: str, name: str) -> str:
    """Lane 0 waits (``load``) for the flag lane 40 sets (``store``) after writing 42 to data;
    then it writes data to out[0]; every lane meets at a barrier and copies out[0] to
    res[tid]. The setter comes first in the code, as nvcc lays such branches out (the
    interpreter runs the lowest program point first)."""
    return (
        HEAD
        + f"""
.visible .entry {name}(.param .u64 flag, .param .u64 data, .param .u64 out, .param .u64 res)
{{
    .reg .pred %p<5>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [data];
    ld.param.u64 %rd3, [out];
    ld.param.u64 %rd4, [res];
    mov.u32 %r1, %tid.x;
    setp.eq.s32 %p1, %r1, 0;
    @%p1 bra $WAIT;
    setp.ne.s32 %p2, %r1, 40;
    @%p2 bra $MEET;
    mov.u32 %r2, 42;
    st.global.u32 [%rd2], %r2;
    mov.u32 %r3, 1;
    {store} [%rd1], %r3;
    bra.uni $MEET;
$WAIT:
    {load} %r4, [%rd1];
    setp.eq.s32 %p3, %r4, 0;
    @%p3 bra $WAIT;
    ld.global.u32 %r5, [%rd2];
    st.global.u32 [%rd3], %r5;
$MEET:
    bar.sync 0;
    ld.global.u32 %r6, [%rd3];
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd6, %rd4, %rd5;
    st.global.u32 [%rd6], %r6;
    ret;
}}
"""
    )


#: lane 0 waits for lane 40's flag while the rest of its warp waits at a ballot (the warp may
#: not be settled without lane 0: the ballot would miss its bit); every lane stores the ballot
WAIT_AT_BALLOT = (
    HEAD
    + """
.visible .entry wait_ballot(.param .u64 flag, .param .u64 res)
{
    .reg .pred %p<5>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd4, [res];
    mov.u32 %r1, %tid.x;
    setp.eq.s32 %p1, %r1, 0;
    @%p1 bra $WAIT;
    setp.ne.s32 %p2, %r1, 40;
    @%p2 bra $MEET;
    mov.u32 %r3, 1;
    st.volatile.global.u32 [%rd1], %r3;
    bra.uni $MEET;
$WAIT:
    ld.volatile.global.u32 %r4, [%rd1];
    setp.eq.s32 %p3, %r4, 0;
    @%p3 bra $WAIT;
$MEET:
    and.b32 %r5, %r1, 5;
    setp.ne.s32 %p4, %r5, 0;
    vote.sync.ballot.b32 %r6, %p4, -1;
    @%p1 or.b32 %r6, %r6, %r4;
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd6, %rd4, %rd5;
    st.global.u32 [%rd6], %r6;
    ret;
}
"""
)

#: each block takes a ticket (its place in the chain) with an atomic, waits until the block
#: before it in the chain published, and publishes its own total: flags[i] = 1 + ... + (i+1),
#: with bit 31 set as "published" (CUB's look-back marks its partials so)
CHAIN = (
    HEAD
    + """
.visible .entry vol_chain(.param .u64 counter, .param .u64 flags)
{
    .reg .pred %p<4>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<10>;
    .shared .align 4 .b32 ticket;
    ld.param.u64 %rd1, [counter];
    ld.param.u64 %rd2, [flags];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %tid.x;
    setp.ne.s32 %p1, %r1, 0;
    @%p1 bra $SYNC;
    atom.global.add.u32 %r2, [%rd1], 1;
    st.shared.u32 [ticket], %r2;
$SYNC:
    bar.sync 0;
    @%p1 bra $END;
    ld.shared.u32 %r3, [ticket];
    mov.u32 %r4, 0;
    setp.eq.s32 %p2, %r3, 0;
    @%p2 bra $PUBLISH;
    add.s32 %r5, %r3, -1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
$SPIN:
    membar.gl;
    ld.volatile.global.u32 %r6, [%rd4];
    setp.eq.s32 %p3, %r6, 0;
    @%p3 bra $SPIN;
    fence.acq_rel.gpu;
    and.b32 %r4, %r6, 2147483647;
$PUBLISH:
    add.s32 %r7, %r4, %r3;
    add.s32 %r7, %r7, 1;
    or.b32 %r8, %r7, -2147483648;
    mul.wide.u32 %rd5, %r3, 4;
    add.s64 %rd6, %rd2, %rd5;
    fence.sc.gpu;
    st.volatile.global.u32 [%rd6], %r8;
$END:
    ret;
}
"""
)

#: the same chain by %ctaid, acquire/release: block b waits on block b - 1
CHAIN_CTAID = (
    HEAD
    + """
.visible .entry acq_chain(.param .u64 flags)
{
    .reg .pred %p<4>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd2, [flags];
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %tid.x;
    setp.ne.s32 %p1, %r1, 0;
    @%p1 bra $END;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, 0;
    setp.eq.s32 %p2, %r3, 0;
    @%p2 bra $PUBLISH;
    add.s32 %r5, %r3, -1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
$SPIN:
    ld.acquire.gpu.global.u32 %r6, [%rd4];
    setp.eq.s32 %p3, %r6, 0;
    @%p3 bra $SPIN;
    and.b32 %r4, %r6, 2147483647;
$PUBLISH:
    add.s32 %r7, %r4, %r3;
    add.s32 %r7, %r7, 1;
    or.b32 %r8, %r7, -2147483648;
    mul.wide.u32 %rd5, %r3, 4;
    add.s64 %rd6, %rd2, %rd5;
    st.release.gpu.global.u32 [%rd6], %r8;
$END:
    ret;
}
"""
)

#: lanes 90.. exit first; the others reduce predicates twice (both epoch parities): popc of
#: bit 0, and of bit 1, or of !bit 2; then popc of bit 3
BARRED = (
    HEAD
    + """
.visible .entry bar_red(.param .u64 in, .param .u64 out)
{
    .reg .pred %p<8>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %tid.x;
    setp.ge.u32 %p7, %r1, 90;
    @%p7 bra $END;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.u32 %r2, [%rd4];
    and.b32 %r3, %r2, 1;
    setp.ne.s32 %p1, %r3, 0;
    and.b32 %r4, %r2, 2;
    setp.ne.s32 %p2, %r4, 0;
    and.b32 %r5, %r2, 4;
    setp.ne.s32 %p3, %r5, 0;
    and.b32 %r6, %r2, 8;
    setp.ne.s32 %p4, %r6, 0;
    bar.red.popc.u32 %r7, 0, %p1;
    bar.red.and.pred %p5, 0, %p2;
    bar.red.or.pred %p6, 0, !%p3;
    barrier.red.popc.u32 %r8, 0, %p4;
    selp.u32 %r9, 1, 0, %p5;
    selp.u32 %r10, 1, 0, %p6;
    mul.wide.u32 %rd5, %r1, 16;
    add.s64 %rd6, %rd2, %rd5;
    st.global.v4.u32 [%rd6], {%r7, %r9, %r10, %r8};
$END:
    ret;
}
"""
)


pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _compiled() -> set[str]:
    return {name for name, _ in jit.stats()["compiled"]}


def test_warp_synchronous_volatile_shared_code_runs_compiled_in_lockstep(dev):
    """Lane by lane (no stop before each access) lane 0 would add lanes 16, 8, ... before
    they added theirs, and the sum would be wrong (diff mode compares the bytes too)."""
    prog = load_ptx(WARPSYNC)
    vals = (np.arange(64, dtype=np.uint32) * 7 + 3) % 101
    src, out = dev.upload(vals), dev.zeros(1, np.uint32)
    dev.launch(prog, "vol_warpsync", 1, 64, [Ptr(src), Ptr(out)])
    assert dev.download(out, 1, np.uint32).tolist() == [int(vals.sum())]
    assert "vol_warpsync" in _compiled()


@pytest.mark.parametrize(
    ("load", "store"),
    [
        ("ld.volatile.global.u32", "st.volatile.global.u32"),
        ("ld.acquire.gpu.global.u32", "st.release.gpu.global.u32"),
        ("ld.relaxed.sys.global.u32", "st.relaxed.sys.global.u32"),
    ],
)
def test_a_wait_on_a_later_lane_of_the_block_compiles_and_finishes(dev, load, store):
    name = "wait_" + load.split(".")[1]
    prog = load_ptx(_same_block(load, store, name))
    for blocks in (1, 3):
        flag, data = dev.zeros(1, np.uint32), dev.zeros(1, np.uint32)
        out, res = dev.zeros(1, np.uint32), dev.zeros(64, np.uint32)
        # only one block's flag: blocks after the first find it set
        args = [Ptr(flag), Ptr(data), Ptr(out), Ptr(res)]
        dev.launch(prog, name, blocks, 64, args, deadline=time.monotonic() + 60)
        assert dev.download(out, 1, np.uint32).tolist() == [42]
        # no lane passed the barrier before lane 0 had written out[0]
        assert dev.download(res, 64, np.uint32).tolist() == [42] * 64
    assert name in _compiled()


def test_a_waiting_lane_holds_its_warps_collective(dev):
    prog = load_ptx(WAIT_AT_BALLOT)
    flag, res = dev.zeros(1, np.uint32), dev.zeros(64, np.uint32)
    dev.launch(prog, "wait_ballot", 1, 64, [Ptr(flag), Ptr(res)], deadline=time.monotonic() + 60)
    ballot = sum(1 << i for i in range(32) if i & 5)
    want = [ballot | 1] + [ballot] * 63  # lane 0 ors in the flag it saw
    assert dev.download(res, 64, np.uint32).tolist() == want
    assert "wait_ballot" in _compiled()


def _chain_expected(n: int) -> list[int]:
    return [(((i + 1) * (i + 2)) // 2) | 1 << 31 for i in range(n)]


def test_blocks_waiting_on_earlier_blocks_run_compiled(dev):
    prog = load_ptx(CHAIN)
    n = 48
    counter, flags = dev.zeros(1, np.uint32), dev.zeros(n, np.uint32)
    dev.launch(prog, "vol_chain", n, 32, [Ptr(counter), Ptr(flags)])
    assert dev.download(flags, n, np.uint32).tolist() == _chain_expected(n)
    assert "vol_chain" in _compiled()
    prog = load_ptx(CHAIN_CTAID)
    flags = dev.zeros(n, np.uint32)
    dev.launch(prog, "acq_chain", n, 32, [Ptr(flags)])
    assert dev.download(flags, n, np.uint32).tolist() == _chain_expected(n)
    assert "acq_chain" in _compiled()


def test_a_chain_of_blocks_split_over_cores(dev, monkeypatch):
    """Compiled only (the interpreter would take long over this many blocks): the ranges of
    blocks run on several cores at once, each block waiting on one that another core runs."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    monkeypatch.setattr("crane.backends.sim.ptx.jit.runner._cores", lambda: 4)
    n = 4096  # 4 x 32768 lanes: four ranges
    for text, name in ((CHAIN, "vol_chain"), (CHAIN_CTAID, "acq_chain")):
        prog = load_ptx(text)
        flags = dev.zeros(n, np.uint32)
        args = [Ptr(dev.zeros(1, np.uint32)), Ptr(flags)] if name == "vol_chain" else [Ptr(flags)]
        dev.launch(prog, name, n, 32, args, deadline=time.monotonic() + 120)
        want = [((((i + 1) * (i + 2)) // 2) & 0x7FFFFFFF) | 1 << 31 for i in range(n)]
        assert dev.download(flags, n, np.uint32).tolist() == want


def test_bar_red_reduces_over_the_lanes_that_arrive(dev):
    prog = load_ptx(BARRED)
    vals = np.random.default_rng(5).integers(0, 16, 128, dtype=np.uint32)
    vals[:90] |= 2  # `and` true ...
    src, out = dev.upload(vals), dev.zeros(4 * 128, np.uint32)
    dev.launch(prog, "bar_red", 1, 128, [Ptr(src), Ptr(out)])
    got = dev.download(out, 4 * 128, np.uint32).reshape(128, 4)
    v = vals[:90]
    want = [int((v & 1).astype(bool).sum()), 1, int((v & 4 == 0).any()), int((v & 8 > 0).sum())]
    assert (got[:90] == np.array(want, np.uint32)).all()
    assert (got[90:] == 0).all()
    src2 = dev.upload(vals & ~np.uint32(2) | np.uint32(4))  # ... and false; or of !bit2 false
    dev.launch(prog, "bar_red", 1, 128, [Ptr(src2), Ptr(out)])
    got = dev.download(out, 4 * 128, np.uint32).reshape(128, 4)
    assert (got[:90, 1] == 0).all() and (got[:90, 2] == 0).all()
    assert "bar_red" in _compiled()


def _many_collectives(n: int, name: str) -> str:
    body = "\n".join(f"    activemask.b32 %r{2 + i % 2};" for i in range(n))
    return (
        HEAD
        + f"""
.visible .entry {name}(.param .u64 out)
{{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
{body}
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r2;
    ret;
}}
"""
    )


def test_kernels_with_very_many_warp_collectives_run_interpreted(dev, caplog):
    """Each collective stops every lane compiled; CUB's onesweep (239 of them) ran slower
    compiled than interpreted, so past MAX_WARP_SITES the kernel stays interpreted."""
    n = lower.MAX_WARP_SITES
    with caplog.at_level(logging.INFO, logger="crane.sim.ptx.jit"):
        for count, name in ((n, "few_collectives"), (n + 1, "many_collectives")):
            out = dev.zeros(64, np.uint32)
            prog = load_ptx(_many_collectives(count, name))
            dev.launch(prog, name, 1, 64, [Ptr(out)])
            assert dev.download(out, 64, np.uint32).tolist() == [0xFFFFFFFF] * 64
    assert "few_collectives" in _compiled()
    lines = [r.getMessage() for r in caplog.records if "many_collectives" in r.getMessage()]
    assert any(f"{n + 1} warp-level instructions" in x for x in lines), lines


@pytest.mark.parametrize("tiles", [1, 3, 37])
def test_nvcc_decoupled_lookback_scan_runs_compiled(dev, program, arch, tiles):
    """kernels/lookback.cu: nvcc's own volatile look-back (ld/st.volatile.global.u64,
    membar.gl), blocks ordered by an atomic ticket; checked against NumPy and in diff mode
    byte for byte against the interpreter. The interpreter once did not finish more than two
    tiles: the blocks spinning at the loop's low program point took turns yielding to each
    other for ever while tile 0's block, at a higher one, never ran its store
    (CUDA_ERROR_LAUNCH_TIMEOUT; executor._yield_blocks)."""
    prog = program("lookback", arch)
    n = 512 * tiles - (100 if tiles > 1 else 0)
    vals = np.random.default_rng(tiles).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    src, out = dev.upload(vals), dev.zeros(n, np.uint32)
    ticket, status = dev.zeros(1, np.uint32), dev.zeros(tiles, np.uint64)
    args = [Ptr(src), Ptr(out), np.int32(n), Ptr(ticket), Ptr(status)]
    dev.launch(prog, "lookback_scan", tiles, 128, args, deadline=time.monotonic() + 120)
    want = np.cumsum(vals.astype(np.uint64)).astype(np.uint32)
    assert np.array_equal(dev.download(out, n, np.uint32), want)
    assert "lookback_scan" in _compiled()


def test_nvcc_warp_synchronous_sum_runs_compiled(dev, program, arch):
    prog = program("lookback", arch)
    vals = np.random.default_rng(3).integers(0, 1000, 64 * 5, dtype=np.uint32)
    src, out = dev.upload(vals), dev.zeros(5, np.uint32)
    dev.launch(prog, "warp_sync_sum", 5, 64, [Ptr(src), Ptr(out)])
    assert dev.download(out, 5, np.uint32).tolist() == vals.reshape(5, 64).sum(1).tolist()
    assert "warp_sync_sum" in _compiled()


def test_nvcc_classic_reduction_runs_compiled(dev, program, arch):
    """A grid-stride sum, a __syncthreads tree and the volatile warp tail (the published
    reduction samples' shape): per-block sums equal NumPy's, compiled."""
    prog = program("lookback", arch)
    n, blocks = 100_003, 24
    vals = np.random.default_rng(4).integers(0, 1 << 20, n, dtype=np.uint32)
    src, out = dev.upload(vals), dev.zeros(blocks, np.uint32)
    dev.launch(prog, "warp_sync_reduce", blocks, 256, [Ptr(src), Ptr(out), np.uint32(n)])
    got = dev.download(out, blocks, np.uint32)
    want = [
        int(vals[np.arange(n) % (512 * blocks) // 512 == b].sum()) & 0xFFFFFFFF
        for b in range(blocks)
    ]
    assert got.tolist() == want
    assert "warp_sync_reduce" in _compiled()


@pytest.mark.parametrize("use_shared", [1, 0], ids=["shared", "global"])
def test_volatile_generic_accesses_keep_the_warps_lockstep(dev, program, arch, use_shared):
    """Each lane reads its neighbour and itself, then writes, three times: the result is the
    lockstep one (every read of a step before any write) whether the generic pointer holds
    shared or global memory."""
    prog = program("lookback", arch)
    vals = np.random.default_rng(5).integers(0, 1 << 30, 32, dtype=np.uint32)
    src, out, g = dev.upload(vals), dev.zeros(32, np.uint32), dev.zeros(32, np.uint32)
    dev.launch(prog, "warp_sync_steps", 1, 32, [Ptr(src), Ptr(out), Ptr(g), np.int32(use_shared)])
    want = vals.copy()
    for _ in range(3):
        want = np.roll(want, -1) + want * np.uint32(3)
    assert np.array_equal(dev.download(out, 32, np.uint32), want)
    assert "warp_sync_steps" in _compiled()
