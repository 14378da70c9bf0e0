"""Warp-level instructions in compiled kernels (crane/backends/sim/ptx/jit/warp.py): each
kernel here must be compiled, give the interpreter's bytes (``diff`` mode runs both) and the
values CUDA defines, with partial member masks, masks that differ within a warp, lanes that
exited before the instruction, blocks that end inside a warp and divergent shuffles.
(A separate file from test_jit.py so that parallel work on the compiler merges cleanly.)"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import jit, load_ptx

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: out[gid] = the shfl.down reduction's value at each lane, the count of valid shuffles in
#: the top byte (a loop: the offset halves from 16 to 1)
WARPSUM = (
    HEAD
    + """
.visible .entry warpsum(.param .u64 out, .param .u64 inp)
{
    .reg .b32 %r<12>;
    .reg .b64 %rd<8>;
    .reg .pred %p<4>;
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [inp];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.s32 %r4, %r2, %r3, %r1;
    mul.wide.u32 %rd3, %r4, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r5, [%rd4];
    mov.u32 %r6, 16;
    mov.u32 %r9, 0;
$L_loop:
    shfl.sync.down.b32 %r7|%p1, %r5, %r6, 31, 0xffffffff;
    add.s32 %r5, %r5, %r7;
    selp.u32 %r8, 1, 0, %p1;
    add.s32 %r9, %r9, %r8;
    shr.u32 %r6, %r6, 1;
    setp.ne.u32 %p2, %r6, 0;
    @%p2 bra $L_loop;
    add.s64 %rd5, %rd1, %rd3;
    shl.b32 %r10, %r9, 24;
    xor.b32 %r11, %r5, %r10;
    st.global.u32 [%rd5], %r11;
    ret;
}
"""
)

#: lanes 70.. exit first; lanes 0-15 of a warp vote over mask 0xff, the others over
#: 0xffff0000 (masks differ within the warp): out[4 tid ..] = ballot, any, all(!p), uni
VOTES = (
    HEAD
    + """
.visible .entry votes(.param .u64 out)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    .reg .pred %p<8>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    setp.ge.u32 %p1, %r1, 70;
    @%p1 bra $L_end;
    mov.u32 %r2, %laneid;
    setp.lt.u32 %p2, %r2, 16;
    selp.b32 %r3, 255, -65536, %p2;
    rem.u32 %r4, %r1, 3;
    setp.eq.u32 %p3, %r4, 0;
    vote.sync.ballot.b32 %r5, %p3, %r3;
    vote.sync.any.pred %p4, %p3, %r3;
    vote.sync.all.pred %p5, !%p3, %r3;
    vote.sync.uni.pred %p6, %p3, %r3;
    selp.u32 %r6, 1, 0, %p4;
    selp.u32 %r7, 1, 0, %p5;
    selp.u32 %r8, 1, 0, %p6;
    mul.wide.u32 %rd2, %r1, 16;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r5;
    st.global.u32 [%rd3+4], %r6;
    st.global.u32 [%rd3+8], %r7;
    st.global.u32 [%rd3+12], %r8;
$L_end:
    ret;
}
"""
)

#: out[6 tid ..] = match.any(tid / 5), match.all(tid / 48) and its predicate, redux add of
#: tid and redux min of -tid over mask (lane < 20 ? 0xfffff : 0xfff00000), %lanemask_lt
MATCH_REDUX = (
    HEAD
    + """
.visible .entry matchredux(.param .u64 out)
{
    .reg .b32 %r<20>;
    .reg .b64 %rd<8>;
    .reg .pred %p<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %laneid;
    div.u32 %r3, %r1, 5;
    match.any.sync.b32 %r4, %r3, 0xffffffff;
    div.u32 %r5, %r1, 48;
    match.all.sync.b32 %r6|%p1, %r5, 0xffffffff;
    selp.u32 %r7, 1, 0, %p1;
    setp.lt.u32 %p2, %r2, 20;
    selp.b32 %r8, 1048575, -1048576, %p2;
    redux.sync.add.s32 %r9, %r1, %r8;
    neg.s32 %r10, %r1;
    redux.sync.min.s32 %r11, %r10, %r8;
    mov.u32 %r12, %lanemask_lt;
    mul.wide.u32 %rd2, %r1, 24;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r4;
    st.global.u32 [%rd3+4], %r6;
    st.global.u32 [%rd3+8], %r7;
    st.global.u32 [%rd3+12], %r9;
    st.global.u32 [%rd3+16], %r11;
    st.global.u32 [%rd3+20], %r12;
    ret;
}
"""
)

#: lanes 0-15 shuffle among themselves (idx, mask 0xffff) inside a branch the others skip;
#: then every lane stores to shared memory, __syncwarp (guarded, always true), and reads its
#: neighbour's word
DIVERGE = (
    HEAD
    + """
.visible .entry diverge(.param .u64 out)
{
    .reg .b32 %r<20>;
    .reg .b64 %rd<8>;
    .reg .pred %p<4>;
    .shared .align 4 .b8 sh[1024];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %laneid;
    mul.lo.s32 %r3, %r1, 7;
    mov.u32 %r4, 0;
    setp.ge.u32 %p1, %r2, 16;
    @%p1 bra $L_join;
    add.s32 %r5, %r2, 1;
    and.b32 %r6, %r5, 15;
    shfl.sync.idx.b32 %r4, %r3, %r6, 31, 0xffff;
$L_join:
    mov.u32 %r7, sh;
    shl.b32 %r8, %r1, 2;
    add.s32 %r9, %r7, %r8;
    st.shared.u32 [%r9], %r3;
    setp.lt.u32 %p2, %r1, 1000;
    @%p2 bar.warp.sync 0xffffffff;
    xor.b32 %r10, %r1, 1;
    shl.b32 %r11, %r10, 2;
    add.s32 %r12, %r7, %r11;
    ld.shared.u32 %r13, [%r12];
    mul.wide.u32 %rd2, %r1, 8;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r4;
    st.global.u32 [%rd3+4], %r13;
    ret;
}
"""
)

#: lanes loop laneid % 5 times, shuffling (bfly 1) over the lanes still in the loop
#: (activemask): the group at each iteration is the lanes that have not left yet, and a lane
#: that left is read where it stopped (its register no longer changes after the loop)
LOOPY = (
    HEAD
    + """
.visible .entry loopy(.param .u64 out)
{
    .reg .b32 %r<20>;
    .reg .b64 %rd<8>;
    .reg .pred %p<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %laneid;
    rem.u32 %r3, %r2, 5;
    mov.u32 %r4, %r1;
    mov.u32 %r5, 0;
    mov.u32 %r9, 0;
$L_top:
    setp.ge.u32 %p1, %r5, %r3;
    @%p1 bra $L_done;
    activemask.b32 %r6;
    shfl.sync.bfly.b32 %r7, %r4, 1, 31, %r6;
    add.s32 %r4, %r4, %r7;
    xor.b32 %r9, %r9, %r6;
    add.s32 %r5, %r5, 1;
    bra.uni $L_top;
$L_done:
    mul.wide.u32 %rd2, %r1, 8;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r4;
    st.global.u32 [%rd3+4], %r9;
    ret;
}
"""
)

#: a 2-D block (6 x 11: warps across rows, the last one of 2 lanes): shfl.bfly and ballot
TWOD = (
    HEAD
    + """
.visible .entry twod(.param .u64 out)
{
    .reg .b32 %r<20>;
    .reg .b64 %rd<8>;
    .reg .pred %p<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %tid.y;
    mov.u32 %r3, %ntid.x;
    mad.lo.s32 %r4, %r2, %r3, %r1;
    mul.lo.s32 %r5, %r4, 3;
    shfl.sync.bfly.b32 %r6|%p1, %r5, 1, 31, 0xffffffff;
    selp.u32 %r7, 1000000, 0, %p1;
    add.s32 %r8, %r6, %r7;
    mov.u32 %r9, %laneid;
    setp.lt.u32 %p2, %r9, 7;
    vote.sync.ballot.b32 %r10, %p2, 0xffffffff;
    add.s32 %r8, %r8, %r10;
    mul.wide.u32 %rd2, %r4, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r8;
    ret;
}
"""
)

#: elect.sync is not compiled: the kernel runs interpreted and the log says why
ELECT = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry elect1(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .reg .pred %p<2>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    elect.sync %r2|%p1, 0xffffffff;
    selp.u32 %r3, 1, 0, %p1;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r3;
    ret;
}
"""


@pytest.fixture(autouse=True)
def _diff_every_launch(monkeypatch):
    """Compile however small the launch, and run it both ways (compiled and interpreted)."""
    monkeypatch.setattr(jit, "COMPILE_MIN_LANES", 1)
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")


def _compiled(name: str) -> bool:
    return name in {n for n, _ in jit.stats()["compiled"]}


@pytest.mark.parametrize("block", [32, 80, 256])
def test_shfl_down_reduction(dev, block):
    """The warp sum by shfl.down in a loop; a block that ends inside a warp shuffles from
    lanes that do not exist (predicate false, own value)."""
    grid = 3
    n = grid * block
    vals = (np.arange(n, dtype=np.uint32) * 2654435761 % 1000).astype(np.uint32)
    inp = dev.upload(vals)
    out = dev.zeros(n, np.uint32)
    dev.launch(load_ptx(WARPSUM), "warpsum", grid, block, [Ptr(out), Ptr(inp)])
    assert _compiled("warpsum")
    got = dev.download(out, n, np.uint32)
    for g in range(grid):
        for w0 in range(0, block, 32):
            first = g * block + w0
            width = min(32, block - w0)
            if width == 32:  # lane 0 holds the whole warp's sum; all 5 shuffles valid
                assert got[first] & 0xFFFFFF == int(vals[first : first + 32].sum())
                assert got[first] >> 24 == 5
            else:  # the last lane of a partial warp had no valid source at all
                assert got[first + width - 1] >> 24 == 0


def test_vote_with_partial_and_differing_masks(dev):
    out = dev.zeros(4 * 80, np.uint32)
    dev.launch(load_ptx(VOTES), "votes", 1, 80, [Ptr(out)])
    assert _compiled("votes")
    got = dev.download(out, 4 * 80, np.uint32).reshape(80, 4)
    tid = np.arange(80)
    pred = tid % 3 == 0
    for t in range(70):
        lane = t % 32
        mask = 0xFF if lane < 16 else 0xFFFF0000
        group = [u for u in range(t - lane, min(t - lane + 32, 70)) if (u % 32 < 16) == (lane < 16)]
        contrib = [u for u in group if mask >> (u % 32) & 1]
        ballot = sum(1 << (u % 32) for u in contrib if pred[u])
        n_p = sum(bool(pred[u]) for u in contrib)
        want = [ballot, int(ballot != 0), int(n_p == 0), int(n_p in (0, len(contrib)))]
        assert got[t].tolist() == want, t
    assert not got[70:].any()  # the exited lanes stored nothing


def test_match_and_redux(dev):
    out = dev.zeros(6 * 80, np.uint32)
    dev.launch(load_ptx(MATCH_REDUX), "matchredux", 1, 80, [Ptr(out)])
    assert _compiled("matchredux")
    got = dev.download(out, 6 * 80, np.uint32).reshape(80, 6)
    for t in range(80):
        lane, w0 = t % 32, t - t % 32
        warp = range(w0, min(w0 + 32, 80))
        same5 = sum(1 << (u - w0) for u in warp if u // 5 == t // 5)
        members = sum(1 << (u - w0) for u in warp)
        alleq = all(u // 48 == t // 48 for u in warp)
        low = lane < 20
        mask = 0xFFFFF if low else 0xFFF00000
        red = [u for u in warp if ((u - w0) < 20) == low and mask >> (u - w0) & 1]
        want = [
            same5,
            members if alleq else 0,
            int(alleq),
            sum(red) & 0xFFFFFFFF,
            (-max(red)) & 0xFFFFFFFF,
            (1 << lane) - 1,
        ]
        assert got[t].tolist() == want, t


def test_divergent_shuffle_and_syncwarp(dev):
    out = dev.zeros(2 * 64, np.uint32)
    dev.launch(load_ptx(DIVERGE), "diverge", 1, 64, [Ptr(out)])
    assert _compiled("diverge")
    got = dev.download(out, 2 * 64, np.uint32).reshape(64, 2)
    tid = np.arange(64)
    lane = tid % 32
    shuffled = np.where(lane < 16, (tid - lane + (lane + 1) % 16) * 7, 0)
    assert got[:, 0].tolist() == shuffled.tolist()
    assert got[:, 1].tolist() == ((tid ^ 1) * 7).tolist()


def test_shuffle_in_a_loop_lanes_leave(dev):
    """Each iteration's group is the lanes still looping (the interpreter's schedule): the
    compiled kernel must match it (``diff``) and activemask must name exactly those lanes."""
    out = dev.zeros(2 * 64, np.uint32)
    dev.launch(load_ptx(LOOPY), "loopy", 1, 64, [Ptr(out)])
    assert _compiled("loopy")
    got = dev.download(out, 2 * 64, np.uint32).reshape(64, 2)
    active = [sum(1 << m for m in range(32) if m % 5 > it) for it in range(5)]
    for t in range(64):
        want = 0
        for it in range(t % 32 % 5):  # xor of the active masks of the iterations it ran
            want ^= active[it]
        assert got[t, 1] == want, t


def test_two_dimensional_block(dev):
    out = dev.zeros(66, np.uint32)
    dev.launch(load_ptx(TWOD), "twod", 2, (6, 11, 1), [Ptr(out)])
    assert _compiled("twod")
    got = dev.download(out, 66, np.uint32)
    for t in range(66):
        w0, width = t - t % 32, min(32, 66 - (t - t % 32))
        ballot = (1 << min(7, width)) - 1
        src = t ^ 1
        want = (src * 3 + 1000000 if src < w0 + width else t * 3) + ballot
        assert got[t] == want, t


def test_elect_is_refused_and_says_why(dev, caplog):
    out = dev.zeros(64, np.uint32)
    with caplog.at_level(logging.INFO, logger="crane.sim.ptx.jit"):
        dev.launch(load_ptx(ELECT), "elect1", 1, 64, [Ptr(out)])
    assert not _compiled("elect1")
    lines = [r.getMessage() for r in caplog.records if r.name == "crane.sim.ptx.jit"]
    assert any("elect1 runs interpreted" in m and "instruction elect" in m for m in lines), lines
    got = dev.download(out, 64, np.uint32)
    assert got.tolist() == [1 if t % 32 == 0 else 0 for t in range(64)]
