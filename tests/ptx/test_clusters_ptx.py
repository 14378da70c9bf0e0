"""Thread-block clusters in hand-written PTX: the %cluster* registers of a cluster launch,
barrier.cluster ordering, distributed shared memory (mapa, getctarank, ld/st/atom
.shared::cluster, generic addresses of another CTA's shared memory) and its bounds faults,
and the driver's cluster checks on the simulated GPU."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr, u32

from crane.api.generated.cuda_enums import CUresult
from crane.backends.sim.ptx import KernelFault, load_ptx

HEAD = """
.version 8.0
.target sm_90
.address_size 64
"""

REGS = (
    HEAD
    + """
.visible .entry regs(.param .u64 out)
{
    .reg .b32 %r<24>;
    .reg .b64 %rd<8>;
    .reg .pred %p1;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %ctaid.x; mov.u32 %r2, %ctaid.y; mov.u32 %r3, %nctaid.x;
    mad.lo.u32 %r4, %r2, %r3, %r1;
    mov.u32 %r5, %tid.x;
    mad.lo.u32 %r4, %r4, %ntid.x, %r5;
    mul.wide.u32 %rd2, %r4, 48;
    add.s64 %rd3, %rd1, %rd2;
    mov.u32 %r6, %clusterid.x; mov.u32 %r7, %clusterid.y;
    mov.u32 %r8, %cluster_ctaid.x; mov.u32 %r9, %cluster_ctaid.y;
    mov.u32 %r10, %cluster_ctarank; mov.u32 %r11, %cluster_nctarank;
    mov.u32 %r12, %nclusterid.x; mov.u32 %r13, %nclusterid.y;
    mov.u32 %r14, %cluster_nctaid.x; mov.u32 %r15, %cluster_nctaid.y;
    mov.pred %p1, %is_explicit_cluster;
    selp.u32 %r16, 1, 0, %p1;
    st.global.v4.u32 [%rd3], {%r1, %r2, %r6, %r7};
    st.global.v4.u32 [%rd3+16], {%r8, %r9, %r10, %r11};
    st.global.v4.u32 [%rd3+32], {%r12, %r13, %r14, %r16};
    ret;
}
"""
)


def _regs(dev, grid, block, cluster):
    prog = load_ptx(REGS)
    n = grid[0] * grid[1] * block
    out = dev.zeros(n * 12, np.uint32)
    dev.launch(prog, "regs", grid, block, [Ptr(out)], cluster=cluster)
    return dev.download(out, n * 12, np.uint32).reshape(grid[1], grid[0], block, 12)


@pytest.mark.parametrize(("grid", "cluster"), [((8, 6, 1), (2, 3, 1)), ((12, 2, 1), (4, 1, 1))])
def test_cluster_registers(dev, grid, cluster):
    got = _regs(dev, grid, 40, cluster)
    cx, cy, _ = cluster
    for y in range(grid[1]):
        for x in range(grid[0]):
            rx, ry = x % cx, y % cy
            want = [x, y, x // cx, y // cy, rx, ry, rx + ry * cx, cx * cy]
            want += [grid[0] // cx, grid[1] // cy, cx, 1]
            assert got[y, x, :, :12].tolist() == [want] * 40, (x, y)


def test_no_cluster_launch_is_one_cta_per_cluster(dev):
    got = _regs(dev, (3, 2, 1), 8, None)
    assert got[1, 2, 0].tolist() == [2, 1, 2, 1, 0, 0, 0, 1, 3, 2, 1, 0]


def test_reqnctapercluster_gives_the_cluster_without_launch_dims(dev):
    prog = load_ptx(
        REGS.replace("(.param .u64 out)", "(.param .u64 out) .reqnctapercluster 2, 1, 1")
    )
    out = dev.zeros(4 * 12, np.uint32)
    dev.launch(prog, "regs", (4, 1, 1), 1, [Ptr(out)])
    got = dev.download(out, 4 * 12, np.uint32).reshape(4, 12)
    assert got[:, 2].tolist() == [0, 0, 1, 1]  # %clusterid.x
    assert got[:, 6].tolist() == [0, 1, 0, 1]  # %cluster_ctarank
    assert got[:, 11].tolist() == [1] * 4  # %is_explicit_cluster
    with pytest.raises(KernelFault) as e:  # launch dims differing from the compiled ones
        dev.launch(prog, "regs", (4, 1, 1), 1, [Ptr(out)], cluster=(4, 1, 1))
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE


@pytest.mark.parametrize(
    ("dirs", "cluster", "ok"),
    [
        (".explicitcluster", None, False),  # compiled for clusters, launched without
        (".explicitcluster", (2, 1, 1), True),
        (".maxclusterrank 2", (4, 1, 1), False),
        (".maxclusterrank 2", (2, 1, 1), True),
        (".maxclusterrank 2", None, True),
    ],
)
def test_explicitcluster_and_maxclusterrank(dev, dirs, cluster, ok):
    prog = load_ptx(REGS.replace("(.param .u64 out)", f"(.param .u64 out) {dirs}"))
    out = dev.zeros(4 * 12, np.uint32)
    if ok:
        dev.launch(prog, "regs", (4, 1, 1), 1, [Ptr(out)], cluster=cluster)
        got = dev.download(out, 4 * 12, np.uint32).reshape(4, 12)
        assert got[:, 11].tolist() == [int(cluster is not None)] * 4  # %is_explicit_cluster
        return
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "regs", (4, 1, 1), 1, [Ptr(out)], cluster=cluster)
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE


@pytest.mark.parametrize(
    ("grid", "cluster", "kw", "code"),
    [
        ((6, 1, 1), (4, 1, 1), {}, CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE),  # not divisible
        ((16, 1, 1), (16, 1, 1), {}, CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE),  # not portable
        ((32, 1, 1), (32, 1, 1), {"non_portable_cluster": True},
         CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE),
    ],
)  # fmt: skip
def test_cluster_launch_checks(dev, grid, cluster, kw, code):
    prog = load_ptx(REGS)
    out = dev.zeros(32 * 12, np.uint32)
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "regs", grid, 1, [Ptr(out)], cluster=cluster, **kw)
    assert e.value.code == code


def test_sixteen_ctas_with_non_portable_size(dev):
    prog = load_ptx(REGS)
    out = dev.zeros(16 * 12, np.uint32)
    dev.launch(prog, "regs", (16, 1, 1), 1, [Ptr(out)], cluster=(16, 1, 1),
               non_portable_cluster=True)  # fmt: skip
    got = dev.download(out, 16 * 12, np.uint32).reshape(16, 12)
    assert got[:, 6].tolist() == list(range(16))


def test_device_without_clusters_refuses(dev):
    from ptxdev import Device

    a100 = Device("a100-80gb")
    try:
        prog = load_ptx(REGS)
        out = a100.zeros(4 * 12, np.uint32)
        with pytest.raises(KernelFault) as e:
            a100.launch(prog, "regs", (4, 1, 1), 1, [Ptr(out)], cluster=(2, 1, 1))
        assert e.value.code == CUresult.CUDA_ERROR_NOT_SUPPORTED
    finally:
        a100.close()


# Each thread stores rank*1000+tid in its CTA's sh[tid]; after a cluster barrier it reads
# sh[tid] of CTA (rank+1) % n through mapa + ld.shared::cluster, and through a generic
# address (cvta + mapa generic), adds 1 to a counter in CTA 0 (atom.shared::cluster), and
# records getctarank of the mapped address; a second barrier keeps every CTA's shared memory
# alive until all reads are done. Rank 0 first spins `delay` rounds, so its stores come last.
RING = (
    HEAD
    + """
.visible .entry ring(.param .u64 out, .param .u32 delay)
{
    .reg .b32 %r<32>;
    .reg .b64 %rd<16>;
    .reg .pred %p<4>;
    .shared .align 4 .b32 sh[128];
    .shared .align 4 .b32 counter;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r20, [delay];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %cluster_ctarank;
    mov.u32 %r3, %cluster_nctarank;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra SKIPINIT;
    st.shared.u32 [counter], 0;
SKIPINIT:
    setp.ne.u32 %p2, %r2, 0;
    @%p2 bra STORE;
    mov.u32 %r21, 0;
SPIN:
    add.u32 %r21, %r21, 1;
    setp.lt.u32 %p3, %r21, %r20;
    @%p3 bra SPIN;
STORE:
    mad.lo.u32 %r4, %r2, 1000, %r1;
    mov.u32 %r5, sh;
    shl.b32 %r6, %r1, 2;
    add.u32 %r7, %r5, %r6;
    st.shared.u32 [%r7], %r4;
    barrier.cluster.arrive.release;
    barrier.cluster.wait.acquire;
    add.u32 %r8, %r2, 1;
    rem.u32 %r8, %r8, %r3;
    mapa.shared::cluster.u32 %r9, %r7, %r8;
    ld.shared::cluster.u32 %r10, [%r9];
    getctarank.shared::cluster.u32 %r11, %r9;
    mov.u64 %rd2, sh;
    cvta.shared.u64 %rd3, %rd2;
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd5, %rd3, %rd4;
    mapa.u64 %rd6, %rd5, %r8;
    ld.u32 %r12, [%rd6];
    isspacep.shared::cluster %p1, %rd6;
    selp.u32 %r13, 1, 0, %p1;
    isspacep.shared::cta %p2, %rd6;
    selp.u32 %r24, 1, 0, %p2;
    isspacep.shared::cta %p2, %rd5;
    selp.u32 %r25, 2, 0, %p2;
    add.u32 %r24, %r24, %r25;
    mov.u32 %r14, counter;
    mapa.shared::cluster.u32 %r15, %r14, 0;
    atom.shared::cluster.add.u32 %r16, [%r15], 1;
    barrier.cluster.arrive;
    barrier.cluster.wait;
    ld.shared.u32 %r17, [counter];
    mov.u32 %r22, %ctaid.x;
    mad.lo.u32 %r23, %r22, %ntid.x, %r1;
    mul.wide.u32 %rd7, %r23, 32;
    add.s64 %rd8, %rd1, %rd7;
    st.global.v4.u32 [%rd8], {%r10, %r11, %r12, %r13};
    st.global.v4.u32 [%rd8+16], {%r17, %r2, %r3, %r24};
    ret;
}
"""
)


@pytest.mark.parametrize(("blocks", "csize", "threads"), [(8, 4, 64), (6, 2, 128), (16, 8, 33)])
def test_distributed_shared_memory_ring(dev, blocks, csize, threads):
    prog = load_ptx(RING)
    out = dev.zeros(blocks * threads * 8, np.uint32)
    dev.launch(prog, "ring", blocks, threads, [Ptr(out), u32(300)], cluster=(csize, 1, 1))
    got = dev.download(out, blocks * threads * 8, np.uint32).reshape(blocks, threads, 8)
    for b in range(blocks):
        rank = b % csize
        nxt = (rank + 1) % csize
        t = np.arange(threads)
        np.testing.assert_array_equal(got[b, :, 0], nxt * 1000 + t)  # ld.shared::cluster
        np.testing.assert_array_equal(got[b, :, 1], nxt)  # getctarank
        np.testing.assert_array_equal(got[b, :, 2], nxt * 1000 + t)  # generic
        np.testing.assert_array_equal(got[b, :, 3], 1)  # isspacep.shared::cluster
        want = csize * threads if rank == 0 else 0  # every thread's atom went to CTA 0
        np.testing.assert_array_equal(got[b, :, 4], want)
        # isspacep.shared::cta: the neighbour's shared memory is not this CTA's; its own is
        np.testing.assert_array_equal(got[b, :, 7], 2)


MAPA_FAULT = (
    HEAD
    + """
.visible .entry bad(.param .u32 rank, .param .u32 off)
{
    .reg .b32 %r<8>;
    .shared .align 4 .b32 sh[16];
    ld.param.u32 %r1, [rank];
    ld.param.u32 %r2, [off];
    mov.u32 %r3, sh;
    add.u32 %r3, %r3, %r2;
    mapa.shared::cluster.u32 %r4, %r3, %r1;
    ld.shared::cluster.u32 %r5, [%r4];
    barrier.cluster.arrive;
    barrier.cluster.wait;
    ret;
}
"""
)


@pytest.mark.parametrize(("rank", "off", "ok"), [(1, 60, True), (2, 0, False), (1, 64, False)])
def test_mapa_bounds_fault_as_illegal_addresses(dev, rank, off, ok):
    prog = load_ptx(MAPA_FAULT)
    args = [u32(rank), u32(off)]
    if ok:
        dev.launch(prog, "bad", 4, 32, args, cluster=(2, 1, 1))
        return
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "bad", 4, 32, args, cluster=(2, 1, 1))
    assert e.value.code == CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    assert "shared::cluster" in e.value.message


@pytest.mark.parametrize(("rank", "ok"), [(0, True), (1, False)])
def test_outside_cluster_launches_rank_0_is_the_cta_itself(dev, rank, ok):
    prog = load_ptx(MAPA_FAULT)
    args = [u32(rank), u32(8)]
    if ok:
        dev.launch(prog, "bad", 3, 32, args)
        return
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "bad", 3, 32, args)
    assert e.value.code == CUresult.CUDA_ERROR_ILLEGAL_ADDRESS


def test_cluster_wait_completes_the_phase_of_the_threads_own_arrivals(dev):
    """Rank 0 arrives twice before it waits: its wait completes only when rank 1 has arrived
    twice too, i.e. after rank 1 (which passes its first wait at once, then spins) stored the
    flag that rank 0 then reads from rank 1's shared memory."""
    text = (
        HEAD
        + """
.visible .entry phases(.param .u64 out)
{
    .reg .b32 %r<12>;
    .reg .b64 %rd<4>;
    .reg .pred %p<3>;
    .shared .align 4 .b32 flag;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %cluster_ctarank;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra RANK0;
    st.shared.u32 [flag], 0;
    barrier.cluster.arrive;
    barrier.cluster.wait;
    mov.u32 %r2, 0;
SPIN:
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p2, %r2, 500;
    @%p2 bra SPIN;
    st.shared.u32 [flag], 7;
    barrier.cluster.arrive;
    barrier.cluster.wait;
    ret;
RANK0:
    barrier.cluster.arrive;
    barrier.cluster.arrive;
    barrier.cluster.wait;
    mov.u32 %r3, flag;
    mapa.shared::cluster.u32 %r4, %r3, 1;
    ld.shared::cluster.u32 %r5, [%r4];
    mov.u32 %r6, %tid.x;
    mul.wide.u32 %rd2, %r6, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r5;
    ret;
}
"""
    )
    prog = load_ptx(text)
    out = dev.zeros(32, np.uint32)
    dev.launch(prog, "phases", 2, 32, [Ptr(out)], cluster=(2, 1, 1))
    np.testing.assert_array_equal(dev.download(out, 32, np.uint32), 7)


# CTA 1 of each pair copies 64 bytes of global memory into CTA 0's shared buffer with a bulk
# copy completing on CTA 0's mbarrier (both named by mapa), and also arrives remotely on it;
# CTA 0 waits on its own mbarrier, then stores what landed.
REMOTE_BULK = (
    HEAD
    + """
.visible .entry remote(.param .u64 src, .param .u64 out)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<16>;
    .reg .pred %p<4>;
    .shared .align 16 .b8 buf[64];
    .shared .align 8 .b64 bar;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %cluster_ctarank;
    mov.u32 %r2, %tid.x;
    setp.eq.u32 %p1, %r2, 0;
    setp.eq.u32 %p2, %r1, 0;
    @!%p1 bra SYNC;
    @!%p2 bra SYNC;
    mbarrier.init.shared::cta.b64 [bar], 2;
    mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], 64;
SYNC:
    barrier.cluster.arrive.release;
    barrier.cluster.wait.acquire;
    @!%p1 bra WAIT;
    @%p2 bra ARRIVED;
    mov.u32 %r3, buf;
    mapa.shared::cluster.u32 %r4, %r3, 0;
    mov.u32 %r5, bar;
    mapa.shared::cluster.u32 %r6, %r5, 0;
    cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r4], [%rd1], 64, [%r6];
    mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r6];
    bra.uni WAIT;
ARRIVED:
    mbarrier.arrive.shared::cta.b64 %rd3, [bar];
WAIT:
    @!%p2 bra DONE;
LOOP:
    mbarrier.try_wait.parity.shared::cta.b64 %p3, [bar], 0;
    @!%p3 bra LOOP;
    setp.ge.u32 %p1, %r2, 16;
    @%p1 bra DONE;
    mov.u32 %r7, buf;
    shl.b32 %r8, %r2, 2;
    add.u32 %r9, %r7, %r8;
    ld.shared.u32 %r10, [%r9];
    mov.u32 %r11, %clusterid.x;
    mad.lo.u32 %r12, %r11, 16, %r2;
    mul.wide.u32 %rd4, %r12, 4;
    add.s64 %rd5, %rd2, %rd4;
    st.global.u32 [%rd5], %r10;
DONE:
    barrier.cluster.arrive;
    barrier.cluster.wait;
    ret;
}
"""
)


def test_bulk_copy_and_mbarrier_arrive_into_another_cta(dev):
    prog = load_ptx(REMOTE_BULK)
    src = np.arange(16, dtype=np.uint32) * 3 + 5
    psrc, out = dev.upload(src), dev.zeros(3 * 16, np.uint32)
    dev.launch(prog, "remote", 6, 32, [Ptr(psrc), Ptr(out)], cluster=(2, 1, 1))
    got = dev.download(out, 3 * 16, np.uint32).reshape(3, 16)
    for c in range(3):
        np.testing.assert_array_equal(got[c], src)


ST_ASYNC = (
    HEAD
    + """
.visible .entry sta(.param .u64 out)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<16>;
    .reg .pred %p<4>;
    .shared .align 16 .b32 buf[16];
    .shared .align 8 .b64 bar;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %cluster_ctarank;
    mov.u32 %r2, %tid.x;
    setp.eq.u32 %p1, %r2, 0;
    setp.eq.u32 %p2, %r1, 0;
    @!%p1 bra SYNC;
    @!%p2 bra SYNC;
    mbarrier.init.shared::cta.b64 [bar], 1;
    mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], 64;
SYNC:
    barrier.cluster.arrive;
    barrier.cluster.wait;
    @%p2 bra WAIT;
    setp.ge.u32 %p3, %r2, 8;
    @%p3 bra DONE;
    mov.u32 %r3, buf;
    shl.b32 %r4, %r2, 3;
    add.u32 %r5, %r3, %r4;
    mapa.shared::cluster.u32 %r6, %r5, 0;
    mov.u32 %r7, bar;
    mapa.shared::cluster.u32 %r8, %r7, 0;
    mad.lo.u32 %r9, %r2, 2, 100;
    add.u32 %r10, %r9, 1;
    st.async.weak.shared::cluster.mbarrier::complete_tx::bytes.v2.u32 [%r6], {%r9, %r10}, [%r8];
    bra.uni DONE;
WAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p3, [bar], 0;
    @!%p3 bra WAIT;
    setp.ge.u32 %p3, %r2, 16;
    @%p3 bra DONE;
    mov.u32 %r3, buf;
    shl.b32 %r4, %r2, 2;
    add.u32 %r5, %r3, %r4;
    ld.shared.u32 %r11, [%r5];
    mov.u32 %r12, %clusterid.x;
    mad.lo.u32 %r13, %r12, 16, %r2;
    mul.wide.u32 %rd2, %r13, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r11;
DONE:
    barrier.cluster.arrive;
    barrier.cluster.wait;
    ret;
}
"""
)


def test_st_async_into_another_cta_completes_its_mbarrier(dev):
    prog = load_ptx(ST_ASYNC)
    out = dev.zeros(2 * 16, np.uint32)
    dev.launch(prog, "sta", 4, 32, [Ptr(out)], cluster=(2, 1, 1))
    got = dev.download(out, 2 * 16, np.uint32).reshape(2, 16)
    np.testing.assert_array_equal(got, np.tile(np.arange(16) + 100, (2, 1)))


def test_red_async_into_another_cta_completes_its_mbarrier(dev):
    """As st.async, with 16 u32 additions (64 bytes) onto values CTA 0 stored first."""
    body = ST_ASYNC.replace(
        "mbarrier.init.shared::cta.b64 [bar], 1;",
        "mbarrier.init.shared::cta.b64 [bar], 1;\n"
        "    mov.u32 %r14, buf;\n"
        "    mov.u32 %r15, 0;\n"
        "INIT:\n"
        "    mul.lo.u32 %r13, %r15, 10;\n"
        "    st.shared.u32 [%r14], %r13;\n"
        "    add.u32 %r14, %r14, 4;\n"
        "    add.u32 %r15, %r15, 1;\n"
        "    setp.lt.u32 %p3, %r15, 16;\n"
        "    @%p3 bra INIT;",
    )
    body = body.replace("setp.ge.u32 %p3, %r2, 8;", "setp.ge.u32 %p3, %r2, 16;")
    body = body.replace("shl.b32 %r4, %r2, 3;", "shl.b32 %r4, %r2, 2;")
    body = body.replace(
        "st.async.weak.shared::cluster.mbarrier::complete_tx::bytes.v2.u32 "
        "[%r6], {%r9, %r10}, [%r8];",
        "add.u32 %r9, %r2, 1;\n"
        "    red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.add.u32"
        " [%r6], %r9, [%r8];",
    )
    prog = load_ptx(body)
    out = dev.zeros(2 * 16, np.uint32)
    dev.launch(prog, "sta", 4, 32, [Ptr(out)], cluster=(2, 1, 1))
    got = dev.download(out, 2 * 16, np.uint32).reshape(2, 16)
    t = np.arange(16)
    np.testing.assert_array_equal(got, np.tile(t * 10 + t + 1, (2, 1)))


# Rank 0 multicasts 64 bytes of global memory to the CTAs of the mask (same offset in each),
# completing on each one's own mbarrier; every CTA in the mask waits on its mbarrier and
# stores what landed, the others store their untouched buffer.
MULTICAST = (
    HEAD
    + """
.visible .entry mc(.param .u64 src, .param .u64 out, .param .u16 mask)
{
    .reg .b16 %rs<4>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<16>;
    .reg .pred %p<4>;
    .shared .align 16 .b32 buf[16];
    .shared .align 8 .b64 bar;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [out];
    ld.param.u16 %rs1, [mask];
    mov.u32 %r1, %cluster_ctarank;
    mov.u32 %r2, %tid.x;
    cvt.u32.u16 %r3, %rs1;
    shr.u32 %r4, %r3, %r1;
    and.b32 %r4, %r4, 1;
    setp.eq.u32 %p2, %r4, 1;
    setp.eq.u32 %p1, %r2, 0;
    @!%p1 bra SYNC;
    mbarrier.init.shared::cta.b64 [bar], 1;
    @!%p2 bra SYNC;
    mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], 64;
SYNC:
    barrier.cluster.arrive;
    barrier.cluster.wait;
    setp.eq.u32 %p3, %r1, 0;
    and.pred %p3, %p3, %p1;
    @!%p3 bra WAIT;
    cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster
        [buf], [%rd1], 64, [bar], %rs1;
WAIT:
    @!%p2 bra STORE;
LOOP:
    mbarrier.try_wait.parity.shared::cta.b64 %p3, [bar], 0;
    @!%p3 bra LOOP;
STORE:
    setp.ge.u32 %p3, %r2, 16;
    @%p3 bra DONE;
    mov.u32 %r5, buf;
    shl.b32 %r6, %r2, 2;
    add.u32 %r7, %r5, %r6;
    ld.shared.u32 %r8, [%r7];
    mov.u32 %r9, %ctaid.x;
    mad.lo.u32 %r10, %r9, 16, %r2;
    mul.wide.u32 %rd3, %r10, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r8;
DONE:
    barrier.cluster.arrive;
    barrier.cluster.wait;
    ret;
}
"""
)


@pytest.mark.parametrize("mask", [0b1111, 0b0101, 0b1000])
def test_multicast_bulk_copy_to_the_masked_ctas(dev, mask):
    prog = load_ptx(MULTICAST)
    src = np.arange(16, dtype=np.uint32) * 7 + 3
    psrc, out = dev.upload(src), dev.zeros(8 * 16, np.uint32)
    dev.launch(prog, "mc", 8, 32, [Ptr(psrc), Ptr(out), np.uint16(mask)], cluster=(4, 1, 1))
    got = dev.download(out, 8 * 16, np.uint32).reshape(8, 16)
    for b in range(8):
        want = src if mask >> (b % 4) & 1 else np.zeros(16, np.uint32)
        np.testing.assert_array_equal(got[b], want, err_msg=f"block {b}")
