"""Registers carried across barriers in the vector form (``jit/affine.py``,
``lower.rematerializable``): a register predicted affine in %tid.x comes back from the save
area as ``base + stride * x`` (so loads through a pointer that advances per tile are
consecutive), and a register defined once is computed again after a stop rather than saved.
What must hold: the interpreter's bytes on every launch (diff mode), also where the affine
prediction is wrong for some lanes (they run again scalar)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import jit, load_ptx
from crane.backends.sim.ptx.jit import engine
from crane.backends.sim.ptx.jit.affine import lane_strides
from crane.backends.sim.ptx.jit.liveness import live_after
from crane.backends.sim.ptx.jit.lower import lower_kernel, rematerializable
from crane.backends.sim.ptx.parser import parse_module

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: a tile loop around two barriers (the shape of a tiled matmul): each tile, every lane loads
#: its element through %rd4, a pointer that advances by the grid's size per tile (saved across
#: the barriers), stages it in shared memory and adds it and lane 0's to its sum; ``skew``
#: (0 or 1) makes the odd lanes read one element later (the same stride in %tid.x for the
#: analysis, not at run time: those lanes fail the affine check)
TILES = (
    HEAD
    + """
.visible .entry tiles(.param .u64 in, .param .u64 out, .param .u32 m, .param .u32 skew)
{
    .reg .pred %p<4>;
    .reg .f32 %f<8>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<10>;
    .shared .align 4 .b8 sh[1024];
    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [out];
    ld.param.u32 %r1, [m];
    ld.param.u32 %r15, [skew];
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r3, %r2, %r4;
    mov.u32 %r12, %r5;
    and.b32 %r16, %r4, %r15;
    setp.eq.s32 %p3, %r16, 0;
    @%p3 bra START;
    add.s32 %r5, %r5, 1;
START:
    mul.wide.s32 %rd3, %r5, 4;
    add.s64 %rd4, %rd1, %rd3;
    mov.u32 %r6, %nctaid.x;
    mul.lo.s32 %r7, %r2, %r6;
    mul.wide.s32 %rd5, %r7, 4;
    mov.u32 %r8, sh;
    shl.b32 %r9, %r4, 2;
    add.s32 %r10, %r8, %r9;
    mov.f32 %f1, 0f00000000;
    mov.u32 %r11, 0;
LOOP:
    ld.global.f32 %f2, [%rd4];
    st.shared.f32 [%r10], %f2;
    bar.sync 0;
    ld.shared.f32 %f3, [%r8];
    add.f32 %f1, %f1, %f2;
    add.f32 %f1, %f1, %f3;
    bar.sync 0;
    add.s64 %rd4, %rd4, %rd5;
    add.s32 %r11, %r11, 1;
    setp.lt.s32 %p2, %r11, %r1;
    @%p2 bra LOOP;
    mul.wide.s32 %rd6, %r12, 4;
    add.s64 %rd7, %rd2, %rd6;
    st.global.f32 [%rd7], %f1;
    ret;
}
"""
)


pytestmark = pytest.mark.usefixtures("compile_every_launch")


def test_lane_strides_of_the_tile_loop():
    fn = parse_module(TILES).functions["tiles"]
    names = {r.uid: r.name for r in fn.regs}
    got = {names[u]: c for u, c in lane_strides(fn).items()}
    assert got["%r5"] == 1 and got["%rd3"] == 4 and got["%rd4"] == 4 and got["%r10"] == 4
    assert got["%r7"] == 0 and got["%r11"] == 0 and got["%rd5"] == 0 and got["%r2"] == 0
    assert "%f1" not in got and "%f2" not in got  # loaded: varying


def test_tile_pointer_load_is_consecutive_not_gathered():
    """The affine restore's point: after the second barrier, the next tile's load through
    %rd4 (restored as ``base + 4 * x``) is a consecutive masked vector load of 32-bit words
    in the optimized driver (the float only moves to shared memory: LLVM loads it as an
    integer); restored word by word it was a gather (as the first tile's load still is: the
    skew's branch leaves %r5 a choice of two values). No other 32-bit load of the kernel could
    be a consecutive masked one (the save area's words are 64-bit)."""
    fn = parse_module(TILES).functions["tiles"]
    offsets = {id(p): off for p, off in zip(fn.params, (0, 8, 16, 20), strict=True)}
    low = lower_kernel(fn, offsets, lambda v: 0 if v.space == "shared" else None, 24)
    driver = str(engine.optimize(low.ir_text()).get_function(low.name))
    assert re.search(r"@llvm\.masked\.load\.v\d+[fi]32", driver)


@pytest.mark.parametrize(
    "m,blocks,threads,skew",
    [(4, 4, 128, 0), (3, 3, 64, 0), (5, 2, 96, 1), (2, 4, 32, 0), (6, 2, 40, 1)],
)
def test_tile_loop_same_as_interpreter(dev, monkeypatch, m, blocks, threads, skew):
    """Diff mode (every byte against the interpreter): block sizes that are no multiple of
    the vector width, and (``skew``) odd lanes whose pointer the affine restore mispredicts."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(TILES + f"\n// {m} {blocks} {threads} {skew}\n")
    lanes = blocks * threads
    data = (np.arange(m * lanes + 1, dtype=np.float32) % 7) + 0.5
    pin, out = dev.upload(data), dev.zeros(lanes, np.float32)
    dev.launch(prog, "tiles", blocks, threads, [Ptr(pin), Ptr(out), np.uint32(m), np.uint32(skew)])
    got = dev.download(out, lanes, np.float32)
    g = np.arange(lanes)
    own = g + (skew * (g % threads % 2))
    first = g - g % threads
    want = sum(data[own + k * lanes] + data[first + k * lanes] for k in range(m))
    assert np.allclose(got, want, rtol=1e-6)
    assert "tiles" in {name for name, _ in jit.stats()["compiled"]}


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
