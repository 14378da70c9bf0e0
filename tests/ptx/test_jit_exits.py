"""A yield where a loop around barriers is left (``jit/exits.py``): the loop's exit path becomes
a region of its own, so the vector rounds of the loop's last region no longer carry it. What
must hold: the interpreter's bytes on every launch (diff mode: the tile loop of
``test_jit_affine``, the shared-memory reductions of ``test_shared``), and no yield where the
exit path touches no memory or the kernel has warp-level instructions."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr
from test_jit_affine import HEAD, TILES
from test_jit_warp import WARPSUM

from crane.backends.sim.ptx import jit, load_ptx
from crane.backends.sim.ptx.jit.exits import with_exit_yields
from crane.backends.sim.ptx.jit.regions import region_blocks, stop_indices
from crane.backends.sim.ptx.jit.spin import YIELD_OP
from crane.backends.sim.ptx.parser import Instr, Label, parse_module

#: a tree reduction in shared memory (the benchmark's shape): a loop around a barrier, left
#: into ``if (tid == 0) out[ctaid] = s[0]``; with ``ret`` alone after the loop when ``bare``
TREE = (
    HEAD
    + """
.visible .entry tree(.param .u64 out, .param .u64 inp)
{
    .reg .pred %p<4>;
    .reg .f32 %f<6>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<8>;
    .shared .align 4 .b8 s[1024];
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [inp];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.s32 %r4, %r2, %r3, %r1;
    mul.wide.u32 %rd3, %r4, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    mov.u32 %r5, s;
    shl.b32 %r6, %r1, 2;
    add.s32 %r7, %r5, %r6;
    st.shared.f32 [%r7], %f1;
    bar.sync 0;
    shr.u32 %r8, %r3, 1;
LOOP:
    setp.ge.u32 %p1, %r1, %r8;
    @%p1 bra SKIP;
    shl.b32 %r9, %r8, 2;
    add.s32 %r10, %r7, %r9;
    ld.shared.f32 %f2, [%r7];
    ld.shared.f32 %f3, [%r10];
    add.f32 %f4, %f2, %f3;
    st.shared.f32 [%r7], %f4;
SKIP:
    bar.sync 0;
    shr.u32 %r8, %r8, 1;
    setp.ne.s32 %p2, %r8, 0;
    @%p2 bra LOOP;
    setp.ne.s32 %p3, %r1, 0;
    @%p3 bra END;
    ld.shared.f32 %f5, [s];
    mul.wide.u32 %rd5, %r2, 4;
    add.s64 %rd6, %rd1, %rd5;
    st.global.f32 [%rd6], %f5;
END:
    ret;
}
"""
)


pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _yields(fn) -> list[int]:
    return [i for i, s in enumerate(fn.body) if isinstance(s, Instr) and s.opcode == YIELD_OP]


def test_yield_after_the_loop_leaves_the_exit_path_to_a_region():
    fn = with_exit_yields(parse_module(TREE).functions["tree"])
    (y,) = _yields(fn)
    assert fn.body[y - 1].opcode == "bra" and fn.body[y - 1].guard is not None
    body = fn.body
    labels = {s.name: i for i, s in enumerate(body) if isinstance(s, Label)}
    last_barrier = [i for i in stop_indices(body) if body[i].opcode.startswith("bar")][-1]
    blocks = region_blocks(body, labels, last_barrier + 1)
    reached = {body[i].opcode for b in blocks.values() for i in b.instrs}
    assert "st.global.f32" not in reached and YIELD_OP in reached


def test_tile_loop_gets_its_yield():
    assert len(_yields(with_exit_yields(parse_module(TILES).functions["tiles"]))) == 1


def test_no_yield_for_a_bare_exit_or_a_warp_kernel():
    bare = TREE.replace("    ld.shared.f32 %f5, [s];\n", "").replace(
        "    st.global.f32 [%rd6], %f5;\n", ""
    )
    fn = parse_module(bare).functions["tree"]
    assert with_exit_yields(fn) is fn
    warp = parse_module(WARPSUM).functions["warpsum"]
    assert with_exit_yields(warp) is warp


@pytest.mark.parametrize("blocks,threads", [(3, 256), (2, 64), (4, 32)])
def test_tree_same_as_interpreter(dev, monkeypatch, blocks, threads):
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(TREE + f"\n// {blocks} {threads}\n")
    data = (np.arange(blocks * threads, dtype=np.float32) % 13) * 0.5
    pin, out = dev.upload(data), dev.zeros(blocks, np.float32)
    dev.launch(prog, "tree", blocks, threads, [Ptr(out), Ptr(pin)])
    want = data.reshape(blocks, threads).sum(axis=1)
    assert np.allclose(dev.download(out, blocks, np.float32), want)
    assert "tree" in {name for name, _ in jit.stats()["compiled"]}


#: lanes leave a loop around a barrier at different rounds (lane t after t % 4 + 1 turns, each
#: adding t to its own shared word) and store their word: the ones that left wait at the yield
#: while the others are at the barrier (exited lanes no longer count at a barrier)
LEAVE = (
    HEAD
    + """
.visible .entry leave(.param .u64 out)
{
    .reg .pred %p<3>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<6>;
    .shared .align 4 .b8 s[1024];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    and.b32 %r2, %r1, 3;
    add.s32 %r2, %r2, 1;
    mov.u32 %r3, 0;
    mov.u32 %r4, s;
    shl.b32 %r5, %r1, 2;
    add.s32 %r6, %r4, %r5;
    st.shared.u32 [%r6], %r3;
LOOP:
    ld.shared.u32 %r7, [%r6];
    add.s32 %r7, %r7, %r1;
    st.shared.u32 [%r6], %r7;
    bar.sync 0;
    add.s32 %r3, %r3, 1;
    setp.lt.u32 %p1, %r3, %r2;
    @%p1 bra LOOP;
    ld.shared.u32 %r8, [%r6];
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r8;
    ret;
}
"""
)


@pytest.mark.parametrize("threads", [32, 256])
def test_divergent_exits_same_as_interpreter(dev, monkeypatch, threads):
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    fn = with_exit_yields(parse_module(LEAVE).functions["leave"])
    assert len(_yields(fn)) == 1
    prog = load_ptx(LEAVE + f"\n// {threads}\n")
    out = dev.zeros(threads, np.uint32)
    dev.launch(prog, "leave", 1, threads, [Ptr(out)])
    t = np.arange(threads, dtype=np.uint32)
    assert (dev.download(out, threads, np.uint32) == t * (t % 4 + 1)).all()
    assert "leave" in {name for name, _ in jit.stats()["compiled"]}
