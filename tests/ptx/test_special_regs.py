"""Predefined identifiers and special registers, clocks that follow wall time, and the legacy
``.target`` options (hand-written PTX)."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import PtxUnsupported, load_ptx

HEAD = """
.version 8.0
.target sm_80{opts}
.address_size 64
"""

SREGS = """
.visible .entry t(.param .u64 pout)
{
    .reg .b32 %r<40>;
    .reg .b64 %rd<20>;
    ld.param.u64 %rd1, [pout];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 128;
    add.s64 %rd3, %rd1, %rd2;
    mov.u32 %r2, WARP_SZ;
    add.u32 %r3, %r1, WARP_SZ;
    mov.u32 %r4, %laneid;
    mov.u32 %r5, %warpid;
    mov.u32 %r6, %nwarpid;
    mov.u32 %r7, %smid;
    mov.u32 %r8, %nsmid;
    mov.u32 %r9, %lanemask_eq;
    mov.u32 %r10, %lanemask_le;
    mov.u32 %r11, %lanemask_lt;
    mov.u32 %r12, %lanemask_ge;
    mov.u32 %r13, %lanemask_gt;
    mov.u32 %r14, %total_smem_size;
    mov.u32 %r15, %dynamic_smem_size;
    mov.u32 %r16, %aggr_smem_size;
    mov.u32 %r17, %reserved_smem_offset_begin;
    mov.u32 %r18, %reserved_smem_offset_end;
    mov.u32 %r19, %reserved_smem_offset_cap;
    mov.u32 %r20, %reserved_smem_offset_0;
    mov.u32 %r21, %envreg0;
    mov.u32 %r22, %pm0;
    mov.u32 %r23, %pm7;
    st.global.v4.u32 [%rd3], {%r2, %r3, %r4, %r5};
    st.global.v4.u32 [%rd3+16], {%r6, %r7, %r8, %r9};
    st.global.v4.u32 [%rd3+32], {%r10, %r11, %r12, %r13};
    st.global.v4.u32 [%rd3+48], {%r14, %r15, %r16, %r17};
    st.global.v4.u32 [%rd3+64], {%r18, %r19, %r20, %r21};
    st.global.v2.u32 [%rd3+80], {%r22, %r23};
    mov.u64 %rd4, %gridid;
    mov.u64 %rd5, %pm3_64;
    mov.u64 %rd6, %current_graph_exec;
    st.global.v2.u64 [%rd3+96], {%rd4, %rd5};
    st.global.u64 [%rd3+112], %rd6;
    ld.global.u32 %r24, [%rd3+WARP_SZ];
    st.global.u32 [%rd3+120], %r24;
    ret;
}
"""


def test_special_registers(dev):
    prog = load_ptx(HEAD.format(opts="") + SREGS)
    n = 80
    out_p = dev.zeros(32 * n, np.uint32)
    dev.launch(prog, "t", 2, n, [Ptr(out_p)], shared=48)
    raw = dev.download(out_p, 32 * n, np.uint32).reshape(n, 32)
    # grid of 2: the second block wrote the same rows over the first's, with its own values
    prof = dev.profile
    for t in range(n):
        r = [int(v) for v in raw[t]]
        lane = t % 32
        assert r[0:4] == [32, t + 32, lane, t // 32]
        assert r[4] == prof.max_threads_per_sm // 32
        assert r[5] < prof.sm_count and r[6] == prof.sm_count
        eq = 1 << lane
        assert r[7:12] == [
            eq,
            (eq << 1) - 1,
            eq - 1,
            (~(eq - 1)) & 0xFFFFFFFF,
            (~((eq << 1) - 1)) & 0xFFFFFFFF,
        ]
        assert r[12:14] == [48, 48]  # no static shared memory: all of it is dynamic
        assert r[14] == 48 and r[15:19] == [0, 0, 0, 0]
        assert r[19] == 0 and r[20:22] == [0, 0]  # %envreg0, performance counters
        gridid = r[24] | r[25] << 32
        assert gridid >= 1 and r[26:28] == [0, 0] and r[28:30] == [0, 0]
        assert r[30] == r[8]  # ld [addr+WARP_SZ] read word 8 (%lanemask_eq)


def test_gridid_differs_between_launches(dev):
    prog = load_ptx(HEAD.format(opts="") + SREGS)
    ids = []
    for _ in range(2):
        out_p = dev.zeros(32, np.uint32)
        dev.launch(prog, "t", 1, 1, [Ptr(out_p)])
        ids.append(int(dev.download(out_p, 16, np.uint64)[12]))
    assert ids[0] != ids[1]


SPIN = """
.visible .entry spin(.param .u64 pout, .param .u64 cycles)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<20>;
    ld.param.u64 %rd1, [pout];
    ld.param.u64 %rd2, [cycles];
    mov.u64 %rd10, %globaltimer;
    mov.u64 %rd3, %clock64;
    mov.u32 %r1, %clock;
    mov.u64 %rd8, 0;
$Lspin:
    add.u64 %rd8, %rd8, 1;
    mov.u64 %rd4, %clock64;
    sub.u64 %rd5, %rd4, %rd3;
    setp.lt.u64 %p1, %rd5, %rd2;
    @%p1 bra $Lspin;
    mov.u32 %r2, %clock;
    mov.u32 %r3, %clock_hi;
    mov.u64 %rd11, %globaltimer;
    mov.u32 %r4, %globaltimer_lo;
    mov.u32 %r5, %globaltimer_hi;
    st.global.v2.u64 [%rd1], {%rd3, %rd4};
    st.global.v2.u64 [%rd1+16], {%rd10, %rd11};
    st.global.v4.u32 [%rd1+32], {%r1, %r2, %r3, %r4};
    st.global.u32 [%rd1+48], %r5;
    st.global.u64 [%rd1+56], %rd8;
    ret;
}
"""


def test_clock_follows_wall_time(dev):
    """A kernel spinning 0.2 s worth of cycles at the profile's clock rate takes about 0.2 s."""
    prog = load_ptx(HEAD.format(opts="") + SPIN)
    hz = dev.profile.clock_khz * 1000
    cycles = int(0.2 * hz)
    out_p = dev.zeros(16, np.uint64)
    t0 = time.perf_counter()
    dev.launch(prog, "spin", 1, 1, [Ptr(out_p), np.uint64(cycles)])
    wall = time.perf_counter() - t0
    o = [int(v) for v in dev.download(out_p, 8, np.uint64)]
    assert 0.19 <= wall < 2.0, wall
    assert o[1] - o[0] >= cycles
    assert o[7] > 10  # the loop really spun, more than a few instructions
    # %globaltimer is in nanoseconds and monotone: the spin lasted ~0.2 s of it
    assert 0.19e9 <= o[3] - o[2] < 2.0e9
    assert abs(o[2] / 1e9 - time.time()) < 60  # Unix-epoch based, like the driver's
    words = dev.download(out_p, 14, np.uint32)
    clk0, clk1, clk_hi, gt_lo, gt_hi = (int(w) for w in words[8:13])
    # %clock is the low word of the same counter, read just after %clock64 each time
    assert 0 < (clk0 - o[0]) & 0xFFFFFFFF < hz // 10
    assert 0 < (clk1 - o[1]) & 0xFFFFFFFF < hz // 10
    assert clk_hi == (o[1] >> 32) or clk_hi == (o[1] >> 32) + 1
    assert gt_hi == o[3] >> 32 or gt_hi == (o[3] >> 32) + 1
    assert gt_lo != 0 or gt_hi != 0


def test_target_options_accepted(dev):
    body = """
.visible .entry k(.param .u64 p)
{
    .reg .b64 %rd<4>;
    .reg .b32 %r<4>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, 7;
    st.global.u32 [%rd1], %r1;
    ret;
}
"""
    for opts in (", texmode_unified", ", texmode_independent", ", debug"):
        prog = load_ptx(HEAD.format(opts=opts) + body)
        out_p = dev.zeros(1, np.uint32)
        dev.launch(prog, "k", 1, 1, [Ptr(out_p)])
        assert int(dev.download(out_p, 1, np.uint32)[0]) == 7
    with pytest.raises(PtxUnsupported, match="bogus_option"):
        load_ptx(HEAD.format(opts=", bogus_option") + body)


def test_map_f64_to_f32(dev):
    """f64 arithmetic runs in single precision; 64-bit locations hold the f32 in their low half."""
    body = """
.visible .entry k(.param .u64 p, .param .f64 x)
{
    .reg .b64 %rd<4>;
    .reg .f64 %fd<6>;
    ld.param.u64 %rd1, [p];
    ld.param.f64 %fd1, [x];
    ld.global.f64 %fd2, [%rd1];
    add.f64 %fd3, %fd1, %fd2;
    div.rn.f64 %fd4, %fd3, 0d4008000000000000;
    st.global.f64 [%rd1+8], %fd4;
    ret;
}
"""
    prog = load_ptx(HEAD.format(opts=", map_f64_to_f32") + body)
    x = struct.unpack("<Q", struct.pack("<f", 1.0) + b"\0" * 4)[0]
    mem = np.zeros(2, np.uint64)
    mem[0] = struct.unpack("<Q", struct.pack("<f", 0.1) + b"\xaa" * 4)[0]
    mem[1] = 0xDEADBEEF_00000000
    p = dev.upload(mem)
    dev.launch(prog, "k", 1, 1, [Ptr(p), np.uint64(x)])
    got = dev.download(p, 4, np.uint32)
    want = np.float32(np.float32(np.float32(1.0) + np.float32(0.1)) / np.float32(3.0))
    assert got[2] == want.view(np.uint32)  # computed in f32, not f64
    assert got[3] == 0xDEADBEEF  # the high half of the 64-bit location is untouched


CLUSTER = """
.visible .entry c(.param .u64 pout){dirs}
{{
    .reg .pred %p<2>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pout];
    mov.u32 %r1, %ctaid.x;
    mad.wide.u32 %rd3, %r1, 48, %rd1;
    mov.u32 %r2, %clusterid.x;
    mov.u32 %r3, %nclusterid.x;
    mov.u32 %r4, %cluster_ctaid.x;
    mov.u32 %r5, %cluster_nctaid.y;
    mov.u32 %r6, %cluster_ctarank;
    mov.u32 %r7, %cluster_nctarank;
    mov.pred %p1, %is_explicit_cluster;
    selp.u32 %r8, 1, 0, %p1;
    mov.u32 %r9, %nclusterid.z;
    st.global.v4.u32 [%rd3], {{%r2, %r3, %r4, %r5}};
    st.global.v4.u32 [%rd3+16], {{%r6, %r7, %r8, %r9}};
    ret;
}}
"""


def test_cluster_registers_describe_one_cta_clusters(dev):
    prog = load_ptx(HEAD.format(opts="").replace("sm_80", "sm_90") + CLUSTER.format(dirs=""))
    out_p = dev.zeros(3 * 12, np.uint32)
    dev.launch(prog, "c", 3, 1, [Ptr(out_p)])
    rows = dev.download(out_p, 36, np.uint32).reshape(3, 12)
    for b in range(3):
        assert rows[b, :8].tolist() == [b, 3, 0, 1, 0, 1, 0, 1]


def test_required_cluster_dims_run_as_clusters(dev):
    """.reqnctapercluster (nvcc's __cluster_dims__) launches clusters of that shape."""
    text = HEAD.format(opts="").replace("sm_80", "sm_90") + CLUSTER.format(
        dirs="\n.reqnctapercluster 2, 1, 1"
    )
    out_p = dev.zeros(4 * 12, np.uint32)
    dev.launch(load_ptx(text), "c", 4, 1, [Ptr(out_p)])
    rows = dev.download(out_p, 48, np.uint32).reshape(4, 12)
    for b in range(4):
        assert rows[b, :8].tolist() == [b // 2, 2, b % 2, 1, b % 2, 2, 1, 1]
