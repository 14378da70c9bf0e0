"""Shared accesses of the vector regions proven in bounds once per block (``jit/proof.py``):
an unguarded ``.shared`` access in a region's first block, through an address computed from
the lane's geometry, parameters and symbols only, runs unchecked in the vector rounds when
every lane of the block passes the check before the first round; a block where one fails runs
its rounds in the scalar form. What must hold: the interpreter's bytes and faults on every
launch (diff mode)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from ptxdev import Ptr
from test_jit_affine import HEAD, TILES

from crane.backends.sim.ptx import jit, load_ptx
from crane.backends.sim.ptx.errors import KernelFault
from crane.backends.sim.ptx.jit import engine
from crane.backends.sim.ptx.jit.lower import KernelLowering, lower_kernel
from crane.backends.sim.ptx.jit.proof import static_accesses
from crane.backends.sim.ptx.parser import parse_module

#: every lane stores its %tid.x in the shared word ``4 * tid.x + skew``; after the barrier it
#: reads that word and the shared word 4 (the same for the whole block) and writes their sum.
#: With more lanes than words (or a misaligned ``skew``), lanes' addresses fall outside.
PROVEN = (
    HEAD
    + """
.visible .entry prv(.param .u64 out, .param .u32 skew)
{
    .reg .b32 %r<10>;
    .reg .b64 %rd<4>;
    .shared .align 4 .b8 sh[512];
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r9, [skew];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, sh;
    shl.b32 %r3, %r1, 2;
    add.s32 %r4, %r2, %r3;
    add.s32 %r4, %r4, %r9;
    st.shared.u32 [%r4], %r1;
    bar.sync 0;
    ld.shared.u32 %r5, [%r4];
    ld.shared.u32 %r6, [%r2+4];
    add.s32 %r7, %r5, %r6;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r7;
    ret;
}
"""
)


pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _lowering(src: str, name: str, offsets) -> KernelLowering:
    fn = parse_module(src).functions[name]
    k = KernelLowering(fn, dict(zip(map(id, fn.params), offsets, strict=True)), _slot, 64)
    k.declare_lookup()
    k.build()
    return k


def _slot(var):
    return 0 if var.space == "shared" else None


def _texts(k: KernelLowering) -> set[str]:
    return {s.text.split(";")[0].strip() for s in k.fn.body if id(s) in k.static_ids}


def test_static_accesses_of_the_tile_loop():
    """``test_jit_affine.TILES``: the row's shared word after the first barrier (through
    %r8, the variable's address) is static; the store of the tile (after a branch in both
    regions that reach it) is not, nor is any global access."""
    k = _lowering(TILES, "tiles", (0, 8, 16, 20))
    assert k.vec_regions and k.static_ids == static_accesses(k)
    got = _texts(k)
    assert any(t.startswith("ld.shared.f32") and "[%r8]" in t for t in got)
    assert not any(t.startswith("st.shared") for t in got)
    assert not any("global" in t for t in got)


def test_static_accesses_exclude_registers_defined_twice():
    """%r4 of PROVEN is defined twice (the skew added to it): neither of its accesses is
    static, the variable's own word (``[%r2+4]``) is."""
    k = _lowering(PROVEN, "prv", (0, 8))
    assert _texts(k) == {"ld.shared.u32 %r6, [%r2+4]"}


def test_proven_accesses_are_plain_vector_loads():
    """The point of the proof: in the optimized driver the vector region's shared loads are
    neither masked nor gathered (before, each was predicated on its own check, and the row's
    word was gathered). The kernel is PROVEN with %r4 defined once (no skew), so both its
    loads are static, and a barrier before the global store (a region whose loads go to the
    save area, as a tiled matmul's FMA region's do). The only 32-bit masked accesses left are
    the stores (committed where the lane's checks passed)."""
    src = PROVEN.replace("    add.s32 %r4, %r4, %r9;\n", "")
    src = src.replace("    mul.wide.u32 %rd2", "    bar.sync 0;\n    mul.wide.u32 %rd2")
    fn = parse_module(src).functions["prv"]
    low = lower_kernel(fn, dict(zip(map(id, fn.params), (0, 8), strict=True)), _slot, 16)
    assert "shared_proof" in low.ir_text()
    driver = str(engine.optimize(low.ir_text()).get_function(low.name))
    assert not re.search(r"@llvm\.masked\.(load|gather)\.v\d+i32", driver)
    assert re.search(r"@llvm\.masked\.store\.v\d+i32", driver)


@pytest.mark.parametrize("defined_once", [True, False])
@pytest.mark.parametrize("blocks,threads,skew", [(2, 128, 0), (3, 100, 0), (2, 129, 0), (1, 64, 2)])
def test_proof_same_as_interpreter(dev, monkeypatch, defined_once, blocks, threads, skew):
    """Diff mode, bytes and faults: in bounds (128 lanes of 4 bytes fill the 512), outside
    for lane 128 of a 129-lane block (the proof fails: the scalar rounds fault as the
    interpreter does, at the first region's store), and misaligned (``skew`` 2)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    src = PROVEN.replace("    add.s32 %r4, %r4, %r9;\n", "") if defined_once else PROVEN
    if defined_once:
        src = src.replace("[%r4]", f"[%r4+{skew}]")
    prog = load_ptx(src + f"\n// {blocks} {threads} {skew} {defined_once}\n")
    out = dev.zeros(threads, np.uint32)
    args = [Ptr(out), np.uint32(skew)]
    if threads > 128 or skew:
        with pytest.raises(KernelFault, match=r"in `st\.shared\.u32"):
            dev.launch(prog, "prv", blocks, threads, args)
        return
    dev.launch(prog, "prv", blocks, threads, args)
    want = np.arange(threads, dtype=np.uint32) + 1
    assert np.array_equal(dev.download(out, threads, np.uint32), want)
    assert "prv" in {name for name, _ in jit.stats()["compiled"]}
