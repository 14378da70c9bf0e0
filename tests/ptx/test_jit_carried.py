"""What a stop saves and a resume point restores (``jit/regions.py`` ``carried``): registers a
region neither reads nor writes stay in the save area untouched through its rounds (a tiled
matmul's tile pointers through its FMA region, its accumulator through its load region). What
must hold: the interpreter's bytes on every launch (diff mode), also where a region writes a
register on one path only, or writes it without reading it."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr
from test_jit_affine import TILES

from crane.backends.sim.ptx import jit, load_ptx
from crane.backends.sim.ptx.jit.liveness import live_after
from crane.backends.sim.ptx.jit.regions import carried, stop_indices
from crane.backends.sim.ptx.parser import parse_module

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: %r3 is set per lane before the first barrier, rewritten by some lanes between the first and
#: second (``@%p1 mov``: written, not read, on one path), carried untouched through the region
#: between the second and third barrier and read after the third; %r6 only ever passes through
PASS = (
    HEAD
    + """
.visible .entry pass(.param .u64 out, .param .u32 cut)
{
    .reg .pred %p<3>;
    .reg .b32 %r<10>;
    .reg .b64 %rd<4>;
    .shared .align 4 .b8 sh[1024];
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [cut];
    mov.u32 %r2, %tid.x;
    add.s32 %r3, %r2, 100;
    mul.lo.s32 %r6, %r2, 7;
    setp.gt.u32 %p2, %r2, 1000;
    @%p2 add.s32 %r6, %r6, 1;
    bar.sync 0;
    setp.lt.u32 %p1, %r2, %r1;
    @%p1 mov.u32 %r3, 9;
    bar.sync 0;
    mov.u32 %r4, sh;
    shl.b32 %r5, %r2, 2;
    add.s32 %r4, %r4, %r5;
    st.shared.u32 [%r4], %r2;
    bar.sync 0;
    add.s32 %r7, %r3, %r6;
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r7;
    ret;
}
"""
)


pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _sets(src: str, name: str):
    fn = parse_module(src).functions[name]
    body = fn.body
    names = {r.uid: r.name for r in fn.regs}
    saved, restored = carried(body, live_after(fn))
    stops = [body[i] for i in stop_indices(body)]
    return (
        [{names[u] for u in saved[id(s)]} for s in stops],
        [{names[u] for u in restored[id(s)]} for s in stops],
    )


def test_tile_loop_carries_what_its_regions_do_not_touch():
    """The tiled loop (``test_jit_affine.TILES``): the region between the two barriers adds
    to the sum only, so the tile pointer and counter are neither restored there nor saved at
    the second barrier; the region after it advances them (restored and saved, at the first
    barrier, which the kernel's start also reaches)."""
    saved, restored = _sets(TILES, "tiles")
    assert {"%rd4", "%r11"} & saved[1] == set()
    assert {"%rd4", "%r11"} & restored[0] == set()
    assert "%f1" in saved[1] and "%f1" in restored[0]
    assert {"%rd4", "%r11"} <= restored[1] and {"%rd4", "%r11"} <= saved[0]


def test_pass_through_register_is_neither_saved_nor_restored():
    saved, restored = _sets(PASS, "pass")
    assert "%r6" in saved[0]  # written before the first barrier
    assert all("%r6" not in s for s in saved[1:]) and all("%r6" not in r for r in restored[:2])
    assert "%r6" in restored[2]  # read after the third
    assert "%r3" in restored[0] and "%r3" in saved[1]  # written on one path: restored too
    assert "%r3" not in restored[1] and "%r3" not in saved[2]


@pytest.mark.parametrize("threads,cut", [(64, 20), (100, 0), (37, 37), (256, 129)])
def test_pass_through_same_as_interpreter(dev, monkeypatch, threads, cut):
    """Diff mode: the lanes that skip the one-path write keep the value their first region
    gave, through a region that never names the register."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(PASS + f"\n// {threads} {cut}\n")
    out = dev.zeros(threads, np.uint32)
    dev.launch(prog, "pass", 2, threads, [Ptr(out), np.uint32(cut)])
    t = np.arange(threads)
    want = np.where(t < cut, 9, t + 100) + 7 * t
    assert np.array_equal(dev.download(out, threads, np.uint32), want.astype(np.uint32))
    assert "pass" in {name for name, _ in jit.stats()["compiled"]}
