"""mbarrier, cp.async.mbarrier.arrive, cp.async.bulk and cp.reduce.async.bulk (hand-written
PTX for the corners; CUDA's cuda::barrier / memcpy_async / pipeline in test_mbarrier_cuda)."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import KernelFault, PtxError, PtxUnsupported, load_ptx

HEAD = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 pin, .param .u64 pout)
{{
    .reg .pred %p<8>;
    .reg .b32 %r<40>;
    .reg .b64 %rd<40>;
    .shared .align 8 .b64 bar[4];
    .shared .align 16 .b8 buf[4096];
    ld.param.u64 %rd1, [pin];
    ld.param.u64 %rd2, [pout];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, bar;
    mov.u32 %r4, buf;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
{body}
    ret;
}}
"""


def run(dev, body, threads, nin=1024, nout=None, inputs=None, grid=1):
    prog = load_ptx(HEAD.format(body=body))
    x = inputs if inputs is not None else np.arange(nin, dtype=np.uint32)
    pin = dev.upload(x)
    nout = nout or threads * grid * 4
    pout = dev.zeros(nout, np.uint32)
    dev.launch(prog, "k", grid, threads, [Ptr(pin), Ptr(pout)])
    return dev.download(pout, nout, np.uint32)


def test_phases_arrive_and_parity_waits(dev):
    """Thread 0 inits for 64 arrivals; every thread arrives, waits on its state and on the
    parity, and reads the pending count of its state; a second phase follows."""
    body = """
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared::cta.b64 [bar], 64;
    bar.sync 0;
    mbarrier.arrive.shared::cta.b64 %rd10, [bar];
    mbarrier.pending_count.b64 %r10, %rd10;
$Lw1:
    mbarrier.try_wait.shared::cta.b64 %p2, [bar], %rd10;
    @!%p2 bra $Lw1;
    mbarrier.test_wait.parity.shared::cta.b64 %p3, [bar], 0;
    selp.u32 %r11, 1, 0, %p3;
    mbarrier.test_wait.parity.shared::cta.b64 %p4, [bar], 1;
    selp.u32 %r12, 1, 0, %p4;
    mbarrier.arrive.release.cta.shared::cta.b64 %rd11, [bar];
$Lw2:
    mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 %p5, [bar], 1;
    @!%p5 bra $Lw2;
    mbarrier.test_wait.shared::cta.b64 %p6, [bar], %rd10;
    selp.u32 %r13, 1, 0, %p6;
    st.global.u32 [%rd4], %r10;
    st.global.u32 [%rd4+256], %r11;
    st.global.u32 [%rd4+512], %r12;
    st.global.u32 [%rd4+768], %r13;
    """
    out = run(dev, body, 64)
    assert sorted(out[:64].tolist()) == list(range(64))  # pending after each arrival: 63..0
    assert out[:64].tolist() == list(range(63, -1, -1))  # in lane order
    assert (out[64:128] == 1).all()  # phase 0 (parity 0) completed
    assert (out[128:192] == 0).all()  # phase 1 not completed yet when tested
    assert (out[192:256] == 1).all()


def test_consumer_waits_for_producer_at_a_higher_pc(dev):
    """Warp 0 waits (try_wait) before the code warp 1 runs to fill the buffer and arrive:
    without parking, lowest-PC-first scheduling would spin warp 0 forever."""
    body = """
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared.b64 [bar], 32;
    bar.sync 0;
    setp.ge.u32 %p2, %r1, 32;
    @%p2 bra $Lproducer;
$Lwait:
    mbarrier.try_wait.parity.shared.b64 %p3, [bar], 0;
    @!%p3 bra $Lwait;
    shl.b32 %r10, %r1, 2;
    add.u32 %r11, %r4, %r10;
    ld.shared.u32 %r12, [%r11];
    st.global.u32 [%rd4], %r12;
    bra $Ldone;
$Lproducer:
    sub.u32 %r20, %r1, 32;
    shl.b32 %r21, %r20, 2;
    add.u32 %r22, %r4, %r21;
    mul.lo.u32 %r23, %r20, 7;
    st.shared.u32 [%r22], %r23;
    mbarrier.arrive.shared.b64 _, [bar];
$Ldone:
    """
    out = run(dev, body, 64)
    assert out[:32].tolist() == [7 * i for i in range(32)]


def test_expect_tx_complete_tx_drop_and_counts(dev):
    """arrive.expect_tx holds the phase until complete_tx brings the count back to zero;
    arrive_drop lowers the expected count of later phases; arrive with a count."""
    body = """
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared.b64 [bar], 4;
    bar.sync 0;
    @%p1 mbarrier.arrive.expect_tx.shared.b64 %rd10, [bar], 64;
    setp.eq.u32 %p2, %r1, 1;
    @%p2 mbarrier.arrive.shared.b64 %rd10, [bar], 3;
    bar.sync 0;
    mbarrier.test_wait.parity.shared.b64 %p3, [bar], 0;
    selp.u32 %r10, 1, 0, %p3;
    bar.sync 0;
    @%p1 mbarrier.complete_tx.shared.b64 [bar], 32;
    bar.sync 0;
    mbarrier.test_wait.parity.shared.b64 %p3, [bar], 0;
    selp.u32 %r11, 1, 0, %p3;
    bar.sync 0;
    @%p1 mbarrier.complete_tx.shared.b64 [bar], 32;
    bar.sync 0;
    mbarrier.test_wait.parity.shared.b64 %p3, [bar], 0;
    selp.u32 %r12, 1, 0, %p3;
    bar.sync 0;
    // phase 1: expected 4; two threads drop (expected 2 afterwards), two arrive
    setp.lt.u32 %p4, %r1, 2;
    @%p4 mbarrier.arrive_drop.shared.b64 %rd11, [bar];
    setp.eq.u32 %p5, %r1, 2;
    @%p5 mbarrier.arrive.shared.b64 %rd11, [bar], 2;
    bar.sync 0;
    mbarrier.test_wait.parity.shared.b64 %p3, [bar], 1;
    selp.u32 %r13, 1, 0, %p3;
    // phase 2 needs only 2 arrivals now
    @%p4 mbarrier.arrive.shared.b64 %rd12, [bar];
    bar.sync 0;
    mbarrier.test_wait.parity.shared.b64 %p3, [bar], 0;
    selp.u32 %r14, 1, 0, %p3;
    @%p1 mbarrier.inval.shared.b64 [bar];
    st.global.u32 [%rd4], %r10;
    st.global.u32 [%rd4+32], %r11;
    st.global.u32 [%rd4+64], %r12;
    st.global.u32 [%rd4+96], %r13;
    st.global.u32 [%rd4+128], %r14;
    """
    out = run(dev, body, 8, nout=40).reshape(5, 8)
    assert (out[0] == 0).all(), "tx pending: phase 0 not complete"
    assert (out[1] == 0).all(), "half the bytes: still pending"
    assert (out[2] == 1).all(), "all bytes: phase 0 complete"
    assert (out[3] == 1).all(), "phase 1 complete"
    assert (out[4] == 1).all(), "phase 2 complete with the dropped expected count"


def test_cp_async_mbarrier_arrive_noinc(dev):
    body = """
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared.b64 [bar], 32;
    bar.sync 0;
    shl.b32 %r10, %r1, 4;
    add.u32 %r11, %r4, %r10;
    mul.wide.u32 %rd10, %r1, 16;
    add.s64 %rd11, %rd1, %rd10;
    cp.async.ca.shared.global [%r11], [%rd11], 16;
    cp.async.mbarrier.arrive.shared.b64 [bar];
    cp.async.mbarrier.arrive.noinc.shared.b64 [bar];
$Lw:
    mbarrier.try_wait.parity.shared.b64 %p2, [bar], 0;
    @!%p2 bra $Lw;
    xor.b32 %r12, %r1, 1;
    shl.b32 %r13, %r12, 4;
    add.u32 %r14, %r4, %r13;
    ld.shared.u32 %r15, [%r14+4];
    st.global.u32 [%rd4], %r15;
    """
    out = run(dev, body, 32)
    assert out[:32].tolist() == [4 * (t ^ 1) + 1 for t in range(32)]


def test_bulk_copies_and_reduce(dev):
    """cp.async.bulk global→shared completing an mbarrier's transactions, shared→shared,
    shared→global in a bulk group, and cp.reduce.async.bulk add into global."""
    body = """
    setp.eq.u32 %p1, %r1, 0;
    @!%p1 bra $Lwait;
    mbarrier.init.shared::cta.b64 [bar], 1;
    fence.mbarrier_init.release.cluster;
    fence.proxy.async.shared::cta;
    mbarrier.arrive.expect_tx.shared::cta.b64 %rd10, [bar], 512;
    cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [buf], [%rd1], 256, [bar];
    add.u32 %r10, %r4, 256;
    cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes
        [%r10], [buf], 256, [bar];
$Lwait:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [bar], 0;
    @!%p2 bra $Lwait;
    @!%p1 bra $Ldone;
    cp.async.bulk.global.shared::cta.bulk_group [%rd2], [buf], 512;
    cp.async.bulk.commit_group;
    cp.async.bulk.wait_group.read 0;
    add.s64 %rd11, %rd2, 1024;
    cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32 [%rd11], [buf], 512;
    cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32 [%rd11], [buf], 512;
    cp.reduce.async.bulk.global.shared::cta.bulk_group.max.u32 [%rd11+512], [buf], 16;
    add.s64 %rd12, %rd2, 1600;
    cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.f16 [%rd12], [buf], 32;
    cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.f16 [%rd12], [buf], 32;
    cp.async.bulk.commit_group;
    cp.async.bulk.wait_group 0;
$Ldone:
    """
    x = np.arange(1000, 1064, dtype=np.uint32)
    out = run(dev, body, 64, inputs=x, nout=512)
    assert out[:64].tolist() == x.tolist()
    assert out[64:128].tolist() == x.tolist()
    assert out[256:384].tolist() == (2 * np.concatenate([x, x])).tolist()[:128]
    assert out[384:388].tolist() == x[:4].tolist()
    # f16 adds, twice, of the buffer's first 16 halves (the u32 values' halves) into zeros
    h = np.concatenate([x, x])[:8].view(np.float16)
    want = (h + h).view(np.uint16)
    assert (out[400:408].view(np.uint16) == want).all()


def test_bulk_reduce_into_shared_completes_the_barrier(dev):
    body = """
    setp.eq.u32 %p1, %r1, 0;
    shl.b32 %r10, %r1, 2;
    add.u32 %r11, %r4, %r10;
    st.shared.u32 [%r11], %r1;
    st.shared.u32 [%r11+1024], 100;
    @%p1 mbarrier.init.shared::cta.b64 [bar], 1;
    bar.sync 0;
    @!%p1 bra $Lw;
    mbarrier.arrive.expect_tx.shared::cta.b64 %rd10, [bar], 256;
    add.u32 %r12, %r4, 1024;
    cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes.add.u32
        [%r12], [buf], 256, [bar];
$Lw:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [bar], 0;
    @!%p2 bra $Lw;
    ld.shared.u32 %r13, [%r11+1024];
    st.global.u32 [%rd4], %r13;
    """
    out = run(dev, body, 64)
    assert out[:64].tolist() == [100 + t for t in range(64)]


def test_deadlocked_wait_faults_instead_of_hanging(dev):
    body = """
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared.b64 [bar], 100;
    bar.sync 0;
$Lw:
    mbarrier.try_wait.parity.shared.b64 %p2, [bar], 0;
    @!%p2 bra $Lw;
    """
    with pytest.raises(KernelFault) as e:
        run(dev, body, 32)
    assert "deadlock" in str(e.value) and "mbarrier" in str(e.value)


def test_test_wait_poll_gives_up(dev):
    """A wait that can never complete answers false when nothing else can run."""
    body = """
    setp.eq.u32 %p1, %r1, 0;
    @%p1 mbarrier.init.shared.b64 [bar], 100;
    bar.sync 0;
    mbarrier.test_wait.parity.shared.b64 %p2, [bar], 0;
    selp.u32 %r10, 5, 9, %p2;
    st.global.u32 [%rd4], %r10;
    """
    out = run(dev, body, 32)
    assert (out[:32] == 9).all()


def test_mbarrier_outside_shared_memory_faults(dev):
    body = """
    mbarrier.arrive.b64 %rd10, [%rd1];
    """
    with pytest.raises(KernelFault) as e:
        run(dev, body, 4)
    assert "not in shared memory" in str(e.value)


@pytest.mark.parametrize(
    "line",
    [
        "cp.async.bulk.global.shared::cta.bulk_group.cp_mask [%rd1], [buf], 16, %rs1;",
        "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [buf], [%rd1, {%r1}], [bar];",
    ],
)
def test_unsupported_bulk_forms_are_refused(line):
    with pytest.raises((PtxUnsupported, PtxError)) as e:
        load_ptx(HEAD.format(body=line))
    assert "cp.async.bulk" in str(e.value)
