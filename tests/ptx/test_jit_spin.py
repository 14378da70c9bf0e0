"""A loop that waits on an atomic another lane of the block will change runs interpreted.

Compiled, a block's lanes run one after another between barriers, so lane 0 waiting for the
block's last lane would wait for ever (on a GPU and in the interpreter that lane runs beside
it). :mod:`crane.backends.sim.ptx.jit.spin` finds such loops; atomics whose results only feed
values and addresses stay compiled.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import jit, load_ptx

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: lane 0 waits until the last lane has set the flag, then writes 7: nvcc 13's PTX for
#: ``if (t == 0) { while (atomicAdd(flag, 0) == 0) {} out[0] = 7; } else if (t == n - 1)
#: atomicExch(flag, 1);`` (the interpreter, which runs the lowest program point first, lets
#: the setter run here because nvcc lays the wait out after it)
SPIN = (
    HEAD
    + """
.visible .entry t(.param .u64 flag, .param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd4, [flag];
    ld.param.u64 %rd3, [out];
    cvta.to.global.u64 %rd1, %rd4;
    mov.u32 %r1, %tid.x;
    setp.eq.s32 %p1, %r1, 0;
    @%p1 bra $L__BB0_3;
    mov.u32 %r2, %ntid.x;
    add.s32 %r3, %r2, -1;
    setp.ne.s32 %p2, %r1, %r3;
    @%p2 bra $L__BB0_6;
    atom.global.exch.b32 %r4, [%rd1], 1;
    bra.uni $L__BB0_6;
$L__BB0_3:
    cvta.to.global.u64 %rd2, %rd3;
$L__BB0_4:
    atom.global.add.u32 %r5, [%rd1], 0;
    setp.eq.s32 %p3, %r5, 0;
    @%p3 bra $L__BB0_4;
    mov.u32 %r6, 7;
    st.global.u32 [%rd2], %r6;
$L__BB0_6:
    ret;
}
"""
)

#: each lane takes a ticket in a loop and writes its id at the ticket's slot (stream
#: compaction's shape): the atomic's result is an address, never a branch's condition
TICKETS = (
    HEAD
    + """
.visible .entry t(.param .u64 count, .param .u64 out, .param .u32 rounds)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [count];
    ld.param.u64 %rd2, [out];
    ld.param.u32 %r1, [rounds];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, 0;
$L_loop:
    atom.global.add.u32 %r4, [%rd1], 1;
    mul.wide.u32 %rd3, %r4, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r2;
    add.s32 %r3, %r3, 1;
    setp.lt.u32 %p1, %r3, %r1;
    @%p1 bra $L_loop;
    ret;
}
"""
)


@pytest.fixture(autouse=True)
def _compile_every_launch(monkeypatch):
    monkeypatch.setattr(jit, "COMPILE_MIN_LANES", 1)
    monkeypatch.setenv("CRANE_PTX_JIT", "1")


def test_a_wait_on_a_later_lane_runs_interpreted_and_finishes(dev, caplog):
    prog = load_ptx(SPIN)
    with caplog.at_level(logging.INFO, logger="crane.sim.ptx.jit"):
        for _ in range(3):  # compiled, the first launch would never return
            flag, out = dev.zeros(1, np.uint32), dev.zeros(1, np.uint32)
            # compiled, it would spin until this deadline (CUDA_ERROR_LAUNCH_TIMEOUT)
            dev.launch(prog, "t", 1, 64, [Ptr(flag), Ptr(out)], deadline=time.monotonic() + 20)
            assert dev.download(out, 1, np.uint32).tolist() == [7]
    lines = [r.getMessage() for r in caplog.records if r.name == "crane.sim.ptx.jit"]
    assert len(lines) == 1 and "runs interpreted" in lines[0], lines
    assert "a spin-wait on `atom.global.add.u32" in lines[0], lines
    assert "PTX line 26" in lines[0], lines


def test_atomics_that_feed_addresses_stay_compiled(dev):
    prog = load_ptx(TICKETS)
    count, out = dev.zeros(1, np.uint32), dev.zeros(3 * 96, np.uint32)
    dev.launch(prog, "t", 1, 96, [Ptr(count), Ptr(out), np.uint32(3)])
    assert dev.download(count, 1, np.uint32).tolist() == [3 * 96]
    got = np.sort(dev.download(out, 3 * 96, np.uint32))
    assert np.array_equal(got, np.repeat(np.arange(96, dtype=np.uint32), 3))
    assert "t" in {name for name, _ in jit.stats()["compiled"]}


def test_compare_and_swap_retries_compile(dev, program, arch, monkeypatch):
    """A float max, a double multiply and a 16-bit add, each an atomicCAS retry loop (the
    loop waits on nobody: each attempt starts from what the last one saw), run compiled and
    bit for bit as interpreted (diff mode: the multiplications' order too)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = program("atomics", arch)
    n = 700
    vals = np.random.default_rng(8).uniform(-50, 50, n).astype(np.float32)
    fmax = dev.upload(np.array([-1e30], np.float32))
    prod, sums = dev.upload(np.ones(8, np.float64)), dev.zeros(4, np.uint16)
    dev.launch(
        prog,
        "cas_retries",
        3,
        256,
        [Ptr(dev.upload(vals)), Ptr(fmax), Ptr(prod), Ptr(sums), np.int32(n)],
    )
    assert dev.download(fmax, 1, np.float32)[0] == vals.max()
    want = [np.prod(1.0 + vals[j::8].astype(np.float64) * 1e-3) for j in range(8)]
    assert np.allclose(dev.download(prod, 8, np.float64), want, rtol=1e-12)
    # (unsigned)(float): cvt.rzi.u32.f32, which saturates (negatives to 0)
    adds = np.maximum(np.trunc(vals * np.float32(100.0)), 0).astype(np.int64)
    want16 = [int(adds[j::4].sum()) & 0xFFFF for j in range(4)]
    assert dev.download(sums, 4, np.uint16).tolist() == want16
    assert "cas_retries" in {name for name, _ in jit.stats()["compiled"]}


def test_a_spin_lock_runs_interpreted(dev, program, arch):
    prog = program("atomics", arch)
    lock, count = dev.zeros(1, np.int32), dev.zeros(1, np.int32)
    dev.launch(prog, "cas_lock", 5, 32, [Ptr(lock), Ptr(count)], deadline=time.monotonic() + 60)
    assert dev.download(count, 1, np.int32).tolist() == [5]
    refused = dict(jit.stats()["refused"])
    assert "a spin-wait on `atom.global.cas.b32" in refused["cas_lock"]
