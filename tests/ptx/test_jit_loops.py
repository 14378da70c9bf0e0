"""Loops inside a region (no barrier in the loop): an iteration stop on the branch back makes
each iteration a vectorized round over the lanes (``jit/loops.py``), and registers predicted
affine in %tid.x come back from the save area as ``base + stride * x`` so that loads through
them are consecutive (``jit/affine.py``). What must hold: the interpreter's bytes on every
launch (diff mode), also where lanes leave the loop at different iterations, where only one
lane loops, and where the affine prediction is wrong for some lanes (they run again scalar);
loops the vector form cannot take keep running inside their lane."""

from __future__ import annotations

import re

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import jit, load_ptx
from crane.backends.sim.ptx.jit import engine
from crane.backends.sim.ptx.jit.affine import lane_strides
from crane.backends.sim.ptx.jit.loops import ITERATION_LABEL, with_iteration_stops
from crane.backends.sim.ptx.jit.lower import KernelLowering, lower_kernel
from crane.backends.sim.ptx.jit.spin import YIELD_OP
from crane.backends.sim.ptx.parser import Label, parse_module

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: a grid-stride sum into shared memory (its loop: the iteration stop), then lane 0 adds the
#: block's partials in a loop of its own (one lane loops, the others have exited) and stores
#: the block's sum; ``skew`` (0 or 1) starts the odd lanes 64 elements later (the same stride
#: in %tid.x for the analysis, not at run time: those lanes fail the affine check)
GSUM = (
    HEAD
    + """
.visible .entry gsum(.param .u64 in, .param .u64 out, .param .u32 n, .param .u32 skew)
{
    .reg .pred %p<6>;
    .reg .f32 %f<8>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<10>;
    .shared .align 4 .b8 sh[1024];
    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [out];
    ld.param.u32 %r1, [n];
    ld.param.u32 %r15, [skew];
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r3, %r2, %r4;
    and.b32 %r16, %r4, %r15;
    setp.eq.s32 %p5, %r16, 0;
    @%p5 bra START;
    add.s32 %r5, %r5, 64;
START:
    mov.u32 %r6, %nctaid.x;
    mul.lo.s32 %r7, %r2, %r6;
    mov.f32 %f1, 0f00000000;
    setp.ge.s32 %p1, %r5, %r1;
    @%p1 bra DONE;
LOOP:
    mul.wide.s32 %rd3, %r5, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.f32 %f2, [%rd4];
    add.f32 %f1, %f1, %f2;
    add.s32 %r5, %r5, %r7;
    setp.lt.s32 %p2, %r5, %r1;
    @%p2 bra LOOP;
DONE:
    mov.u32 %r8, sh;
    shl.b32 %r9, %r4, 2;
    add.s32 %r10, %r8, %r9;
    st.shared.f32 [%r10], %f1;
    bar.sync 0;
    setp.ne.s32 %p3, %r4, 0;
    @%p3 bra END;
    mov.f32 %f3, 0f00000000;
    mov.u32 %r11, 0;
SUM:
    shl.b32 %r12, %r11, 2;
    add.s32 %r13, %r8, %r12;
    ld.shared.f32 %f4, [%r13];
    add.f32 %f3, %f3, %f4;
    add.s32 %r11, %r11, 1;
    setp.lt.u32 %p4, %r11, %r2;
    @%p4 bra SUM;
    mul.wide.u32 %rd5, %r3, 4;
    add.s64 %rd6, %rd2, %rd5;
    st.global.f32 [%rd6], %f3;
END:
    ret;
}
"""
)

#: a loop whose iteration loads what it stored (a running prefix over global memory, each
#: new value read back and added up): the vector form cannot take the iteration (its stores
#: wait for the committing pass), so the loop keeps running inside the lane. (Loading in one
#: iteration what the previous one stored is fine: each iteration is a round of its own.)
PREFIX = (
    HEAD
    + """
.visible .entry prefix(.param .u64 buf, .param .u32 m)
{
    .reg .pred %p<2>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [buf];
    ld.param.u32 %r1, [m];
    mov.u32 %r2, %tid.x;
    mul.lo.s32 %r3, %r2, %r1;
    mul.wide.s32 %rd2, %r3, 4;
    add.s64 %rd3, %rd1, %rd2;
    mov.u32 %r4, 1;
LOOP:
    ld.global.u32 %r5, [%rd3];
    ld.global.u32 %r6, [%rd3+4];
    add.s32 %r7, %r5, %r6;
    st.global.u32 [%rd3+4], %r7;
    ld.global.u32 %r8, [%rd3+4];
    add.s32 %r9, %r9, %r8;
    add.s64 %rd3, %rd3, 4;
    add.s32 %r4, %r4, 1;
    setp.lt.s32 %p1, %r4, %r1;
    @%p1 bra LOOP;
    add.s64 %rd4, %rd1, %rd2;
    st.global.u32 [%rd4], %r9;
    ret;
}
"""
)


@pytest.fixture(autouse=True)
def _compile_every_launch(monkeypatch):
    monkeypatch.setattr(jit, "COMPILE_MIN_LANES", 1)


def test_loop_gets_an_iteration_stop_whose_region_is_vectorized():
    """Both loops of GSUM branch back through an added yield, and the regions after those
    yields (resume points 2 and 3: after the barrier, then the two yields) take the vector
    form; without the stops the first region held a cycle and no region after a yield
    existed."""
    fn = with_iteration_stops(parse_module(GSUM).functions["gsum"])
    added = [s.name for s in fn.body if isinstance(s, Label) and s.name.startswith(ITERATION_LABEL)]
    assert len(added) == 2
    assert sum(1 for s in fn.body if getattr(s, "opcode", "") == YIELD_OP) == 2
    k = KernelLowering(fn, {}, lambda v: None, 32)
    vec, _ = k.vector_regions()
    assert vec == [0, 1, 2, 3]
    assert k.region_word(2) != 2 and k.region_word(1) == 1  # yields are tagged


def test_loop_that_loads_what_it_stored_keeps_its_lane_loop():
    fn = parse_module(PREFIX).functions["prefix"]
    assert with_iteration_stops(fn) is fn


def test_lane_strides_of_the_grid_stride_loop():
    fn = parse_module(GSUM).functions["gsum"]
    names = {r.uid: r.name for r in fn.regs}
    got = {names[u]: c for u, c in lane_strides(fn).items()}
    assert got["%r5"] == 1 and got["%rd3"] == 4 and got["%rd4"] == 4 and got["%r10"] == 4
    assert got["%r7"] == 0 and got["%r11"] == 0 and got["%r2"] == 0
    assert "%f1" not in got and "%f2" not in got  # loaded: varying


def test_grid_stride_load_is_consecutive_not_gathered():
    """The affine restore's point: in the round of the loop's next iteration, ``in[i]``
    through %r5 (restored as ``base + x``) is a consecutive masked vector load of floats in
    the optimized driver; restored word by word it was a gather (as it still is in the first
    iteration, whose %r5 the skew's branch leaves a choice of two values). The kernel has no
    other float load that could be consecutive."""
    fn = parse_module(GSUM).functions["gsum"]
    offsets = {id(p): off for p, off in zip(fn.params, (0, 8, 16, 20), strict=True)}
    low = lower_kernel(fn, offsets, lambda v: 0 if v.space == "shared" else None, 24)
    driver = str(engine.optimize(low.ir_text()).get_function(low.name))
    assert re.search(r"@llvm\.masked\.load\.v\d+f32", driver)


@pytest.mark.parametrize(
    "n,blocks,threads,skew",
    [(4096, 4, 128, 0), (1000, 3, 64, 0), (777, 2, 96, 1), (100, 4, 32, 0), (5000, 2, 40, 1)],
)
def test_grid_stride_sum_same_as_interpreter(dev, monkeypatch, n, blocks, threads, skew):
    """Diff mode (every byte against the interpreter): lanes leaving the loop at different
    iterations (``n`` not a multiple of the grid), a block size that is no multiple of the
    vector width, and (``skew``) odd lanes whose index the affine restore mispredicts."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(GSUM + f"\n// {n} {blocks} {threads} {skew}\n")
    data = (np.arange(n, dtype=np.float32) % 7) + 0.5
    pin, out = dev.upload(data), dev.zeros(blocks, np.float32)
    dev.launch(prog, "gsum", blocks, threads, [Ptr(pin), Ptr(out), np.uint32(n), np.uint32(skew)])
    got = dev.download(out, blocks, np.float32)
    want = np.zeros(blocks)
    for lane in range(blocks * threads):
        i = lane + (64 if skew and lane % threads % 2 else 0)
        want[lane // threads] += data[i : n : blocks * threads].sum()
    assert np.allclose(got, want, rtol=1e-5)
    assert "gsum" in {name for name, _ in jit.stats()["compiled"]}


def test_loop_that_loads_what_it_stored_same_as_interpreter(dev, monkeypatch):
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(PREFIX)
    m, lanes = 9, 48
    buf = dev.upload(np.arange(m * lanes, dtype=np.uint32) % 5)
    dev.launch(prog, "prefix", 1, lanes, [Ptr(buf), np.uint32(m)])
    got = dev.download(buf, m * lanes, np.uint32).reshape(lanes, m)
    want = np.cumsum(np.arange(m * lanes, dtype=np.uint32).reshape(lanes, m) % 5, axis=1)
    want[:, 0] = want[:, 1:].sum(axis=1)
    assert np.array_equal(got, want)


#: %r5 (a shared address that is also a store's address) and %r6 (defined after a branch, so
#: not before the first barrier, but before the only barrier after which it is live)
REMAT = (
    HEAD
    + """
.visible .entry rm(.param .u64 out, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<10>;
    .reg .b64 %rd<4>;
    .shared .align 4 .b8 sh[256];
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, sh;
    shl.b32 %r4, %r2, 2;
    add.s32 %r5, %r3, %r4;
    st.shared.u32 [%r5], %r2;
    bar.sync 0;
    setp.eq.s32 %p1, %r1, 0;
    @%p1 bra END;
    mul.lo.s32 %r6, %r1, 3;
    ld.shared.u32 %r7, [%r5];
    add.s32 %r7, %r7, %r6;
    st.shared.u32 [%r5], %r7;
    bar.sync 0;
    ld.shared.u32 %r8, [%r5+4];
    add.s32 %r9, %r8, %r6;
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r9;
END:
    ret;
}
"""
)


def test_rematerialized_across_the_stops_where_live():
    """A register a store uses as its address is still defined once (the store's address
    was counted as a definition: %r5 was saved and restored, its stores scattered), and a
    register needs to dominate only the stops after which it is live (%r6 does not dominate
    the first barrier)."""
    from crane.backends.sim.ptx.jit.liveness import live_after
    from crane.backends.sim.ptx.jit.lower import rematerializable

    fn = parse_module(REMAT).functions["rm"]
    names = {r.uid: r.name for r in fn.regs}
    remat, _ = rematerializable(fn.body, live_after(fn))
    assert {"%r5", "%r6"} <= {names[u] for u in remat}
    assert "%r7" not in {names[u] for u in remat}  # defined twice


@pytest.mark.parametrize("n", [0, 5])
def test_rematerialized_same_as_interpreter(dev, monkeypatch, n):
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(REMAT + f"\n// {n}\n")
    out = dev.zeros(64, np.uint32)
    dev.launch(prog, "rm", 1, 63, [Ptr(out), np.uint32(n)])
    if n:
        lanes = np.arange(64)
        want = np.where(lanes + 1 < 63, lanes + 1 + 3 * n, 0) + 3 * n
        want[63] = 0
        assert np.array_equal(dev.download(out, 64, np.uint32), want.astype(np.uint32))
