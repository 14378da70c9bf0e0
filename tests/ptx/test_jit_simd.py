"""Regions with loops run W lanes at a time as explicit vectors (``jit/simd.py``): lanes with
different trip counts, divergent branches inside the loop, consecutive, strided and uniform
addresses, partial groups, loads after stores, exits inside the region, faults and the
deadline. What must hold: the interpreter's bytes on every launch (diff mode) and the
interpreter's fault; and that such a region really has the vector form (a function
``simd_<region>`` the driver calls)."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import KernelFault, jit, load_ptx
from crane.backends.sim.ptx.jit import diskcache, engine
from crane.backends.sim.ptx.jit.lower import lower_kernel
from crane.backends.sim.ptx.parser import parse_module

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: a grid-stride loop (``in[i * step]`` summed where it is at most 2: a divergent branch in
#: the loop; lanes run different numbers of iterations) before a barrier, then each lane
#: stores its sum plus its neighbour's from shared memory
GRID_STRIDE = (
    HEAD
    + """
.visible .entry gs(.param .u64 in, .param .u64 out, .param .u32 n, .param .u32 step)
{
    .reg .pred %p<4>;
    .reg .f32 %f<6>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    .shared .align 4 .b8 sh[4096];
    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [out];
    ld.param.u32 %r1, [n];
    ld.param.u32 %r9, [step];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %ctaid.x;
    mad.lo.s32 %r5, %r4, %r3, %r2;
    mov.u32 %r11, %r5;
    mov.f32 %f1, 0f00000000;
    setp.ge.s32 %p1, %r5, %r1;
    @%p1 bra DONE;
LOOP:
    mul.lo.s32 %r10, %r5, %r9;
    mul.wide.s32 %rd3, %r10, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.f32 %f2, [%rd4];
    setp.gt.f32 %p2, %f2, 0f40000000;
    @%p2 bra SKIP;
    add.f32 %f1, %f1, %f2;
SKIP:
    mov.u32 %r6, %nctaid.x;
    mad.lo.s32 %r5, %r6, %r3, %r5;
    setp.lt.s32 %p3, %r5, %r1;
    @%p3 bra LOOP;
DONE:
    shl.b32 %r7, %r2, 2;
    mov.u32 %r8, sh;
    add.s32 %r8, %r8, %r7;
    st.shared.f32 [%r8], %f1;
    bar.sync 0;
    ld.shared.f32 %f3, [%r8+4];
    add.f32 %f4, %f1, %f3;
    mul.wide.s32 %rd5, %r11, 4;
    add.s64 %rd6, %rd2, %rd5;
    st.global.f32 [%rd6], %f4;
    ret;
}
"""
)


pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _lowered(text: str, name: str, nparams: int):
    fn = parse_module(text).functions[name]
    offsets = {id(p): 8 * i for i, p in enumerate(fn.params)}
    return lower_kernel(fn, offsets, lambda v: 0 if v.space == "shared" else None, 8 * nparams)


def test_loop_region_has_the_vector_form(monkeypatch):
    """Region 0 (the loop) gets ``simd_0``, called from the driver; region 1 (loop-free)
    keeps the two-pass form; with ``CRANE_PTX_JIT_SIMD=0`` there is no vector form."""
    low = _lowered(GRID_STRIDE, "gs", 4)
    text = str(low.module)
    assert 'define internal i32 @"simd_0"' in text and '@"simd_1"' not in text
    assert 'call i32 @"simd_0"' in text
    monkeypatch.setenv("CRANE_PTX_JIT_SIMD", "0")
    assert "simd_0" not in str(_lowered(GRID_STRIDE, "gs", 4).module)


def _grid_stride_want(data, blocks, threads, n, step):
    lanes = blocks * threads
    sums = np.zeros(lanes, np.float32)
    for g in range(lanes):
        for i in range(g, n, lanes):
            v = data[i * step]
            if not v > 2.0:
                sums[g] += v
    nxt = np.zeros(lanes, np.float32)
    for g in range(lanes):
        nxt[g] = sums[g + 1] if (g % threads) + 1 < threads else 0.0
    return sums + nxt


@pytest.mark.parametrize(
    "blocks,threads,n,step",
    [(4, 64, 1000, 1), (3, 40, 777, 1), (2, 100, 301, 2), (2, 33, 90, 0), (1, 7, 50, 1)],
)
def test_grid_stride_same_as_interpreter(dev, monkeypatch, blocks, threads, n, step):
    """Consecutive (step 1), strided (2: gathers) and uniform (0) loads; blocks that are no
    multiple of the group width (the last group partial); lanes that leave the loop at
    different iterations. Diff mode: every byte against the interpreter."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(GRID_STRIDE + f"\n// {blocks} {threads} {n} {step}\n")
    data = ((np.arange(n * max(step, 1) + 1) * 7) % 5).astype(np.float32) * 0.75
    lanes = blocks * threads
    pin, out = dev.upload(data), dev.zeros(lanes, np.float32)
    args = [Ptr(pin), Ptr(out), np.uint32(n), np.uint32(step)]
    dev.launch(prog, "gs", blocks, threads, args)
    got = dev.download(out, lanes, np.float32)
    assert np.allclose(got, _grid_stride_want(data, blocks, threads, n, step), rtol=1e-5)
    assert "gs" in {name for name, _ in jit.stats()["compiled"]}


def _fault(dev, prog, args, blocks, threads, monkeypatch, mode: str) -> KernelFault:
    monkeypatch.setenv("CRANE_PTX_JIT", mode)
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "gs", blocks, threads, args)
    return e.value


@pytest.mark.parametrize("n,step,skew", [(1001, 1, 0), (200, 3, 0), (64, 1, 2)])
def test_fault_in_the_loop_same_as_interpreter(dev, monkeypatch, n, step, skew):
    """One lane reads one element past the array (its last iteration; the group's others
    are in bounds), or (``skew``) every lane's address is misaligned: the compiled kernel
    reports the interpreter's fault, address, instruction and PTX line."""
    prog = load_ptx(GRID_STRIDE + f"\n// fault {n} {step} {skew}\n")
    data = np.ones((n - 1) * step + 1 if step else 1, np.float32)
    pin = dev.upload(data)
    out = dev.zeros(128, np.float32)
    args = [Ptr(pin + skew), Ptr(out), np.uint32(n), np.uint32(step)]
    if skew == 0:  # the last index, n - 1, is the one past the array
        args[2] = np.uint32(n)
        data = np.ones((n - 1) * step, np.float32)
        args[0] = Ptr(dev.upload(data))
    got = _fault(dev, prog, args, 2, 64, monkeypatch, "1")
    want = _fault(dev, prog, args, 2, 64, monkeypatch, "0")
    assert got.code == want.code
    assert str(got) == str(want)
    assert "ld.global.f32" in str(got)


#: per lane, a running sum kept in shared memory: a load after a store to the same memory in
#: a loop (the two-pass form cannot take it); odd lanes leave the region early by ``exit``
SCRATCH = (
    HEAD
    + """
.visible .entry sc(.param .u64 out, .param .u32 m)
{
    .reg .pred %p<4>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<6>;
    .shared .align 4 .b8 sh[1024];
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [m];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, sh;
    shl.b32 %r4, %r2, 2;
    add.s32 %r5, %r3, %r4;
    mov.u32 %r6, 0;
    bar.sync 0;
LOOP:
    ld.shared.u32 %r7, [%r5];
    add.s32 %r8, %r2, %r6;
    xor.b32 %r7, %r7, %r8;
    add.s32 %r7, %r7, 3;
    st.shared.u32 [%r5], %r7;
    add.s32 %r6, %r6, 1;
    and.b32 %r9, %r2, 1;
    setp.ne.s32 %p2, %r9, 0;
    setp.gt.u32 %p3, %r6, %r2;
    and.pred %p2, %p2, %p3;
    @%p2 exit;
    setp.lt.u32 %p1, %r6, %r1;
    @%p1 bra LOOP;
    bar.sync 0;
    ld.shared.u32 %r10, [%r5];
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r10;
    ret;
}
"""
)


@pytest.mark.parametrize("threads,m", [(64, 9), (37, 5)])
def test_loads_after_stores_and_exits_same_as_interpreter(dev, monkeypatch, threads, m):
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    low = _lowered(SCRATCH, "sc", 2)
    assert '@"simd_1"' in str(low.module)  # the region after the first barrier
    prog = load_ptx(SCRATCH + f"\n// {threads} {m}\n")
    out = dev.zeros(threads, np.uint32)
    dev.launch(prog, "sc", 1, threads, [Ptr(out), np.uint32(m)])
    got = dev.download(out, threads, np.uint32)
    for t in range(0, threads, 2):  # the odd lanes exited before the store
        v = 0
        for j in range(m):
            v = ((v ^ (t + j)) + 3) & 0xFFFFFFFF
        assert got[t] == v


#: two allocations read in turn through one load (the site's cached allocation misses every
#: iteration: the allocation table, lane by lane)
ALTERNATE = (
    HEAD
    + """
.visible .entry alt(.param .u64 a, .param .u64 b, .param .u64 out, .param .u32 m)
{
    .reg .pred %p<3>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [a];
    ld.param.u64 %rd2, [b];
    ld.param.u64 %rd3, [out];
    ld.param.u32 %r1, [m];
    mov.u32 %r2, %tid.x;
    mul.wide.u32 %rd4, %r2, 4;
    mov.u32 %r3, 0;
    mov.u32 %r4, 0;
    bar.sync 0;
LOOP:
    and.b32 %r5, %r3, 1;
    setp.eq.s32 %p1, %r5, 0;
    selp.b64 %rd5, %rd1, %rd2, %p1;
    add.s64 %rd6, %rd5, %rd4;
    ld.global.u32 %r6, [%rd6];
    add.s32 %r4, %r4, %r6;
    add.s32 %r3, %r3, 1;
    setp.lt.u32 %p2, %r3, %r1;
    @%p2 bra LOOP;
    add.s64 %rd7, %rd3, %rd4;
    st.global.u32 [%rd7], %r4;
    ret;
}
"""
)


def test_alternating_allocations_same_as_interpreter(dev, monkeypatch):
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(ALTERNATE)
    n = 48
    a, b = np.arange(n, dtype=np.uint32), np.arange(n, dtype=np.uint32) * 100
    pa, pb, out = dev.upload(a), dev.upload(b), dev.zeros(n, np.uint32)
    dev.launch(prog, "alt", 1, n, [Ptr(pa), Ptr(pb), Ptr(out), np.uint32(5)])
    assert np.array_equal(dev.download(out, n, np.uint32), 3 * a + 2 * b)


#: after a barrier, a loop of ``n`` iterations (n = 0: 2**32)
SPIN = (
    HEAD
    + """
.visible .entry t(.param .u64 out, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    ld.param.u32 %r2, [n];
    mov.u32 %r1, 0;
    bar.sync 0;
TOP:
    add.s32 %r1, %r1, 1;
    setp.ne.u32 %p1, %r1, %r2;
    @%p1 bra.uni TOP;
    ret;
}
"""
)


def test_deadline_ends_a_loop_in_the_vector_form(dev, monkeypatch):
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    assert '@"simd_1"' in str(_lowered(SPIN, "t", 2).module)
    prog = load_ptx(SPIN)
    out = Ptr(dev.zeros(1, np.uint32))
    dev.launch(prog, "t", 2, 64, [out, np.uint32(3)])  # compiled (and the compile paid)
    t = time.monotonic()
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "t", 2, 64, [out, np.uint32(0)], deadline=t + 0.3)
    assert e.value.code == 702
    assert "bra.uni" in str(e.value)
    assert time.monotonic() - t < 2.0


#: no barrier: the whole kernel is one region, a loop of ``iters + tid.x`` iterations
NO_BARRIER = (
    HEAD
    + """
.visible .entry sp(.param .u64 out, .param .u32 iters)
{
    .reg .pred %p<2>;
    .reg .f32 %f<4>;
    .reg .b32 %r<10>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [iters];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, %tid.y;
    mov.u32 %r4, %ntid.x;
    mad.lo.s32 %r5, %r3, %r4, %r2;
    cvt.rn.f32.u32 %f1, %r5;
    mov.f32 %f2, 0f3F800000;
    add.s32 %r6, %r1, %r2;
    mov.u32 %r7, 0;
    setp.eq.s32 %p1, %r6, 0;
    @%p1 bra END;
L:
    fma.rn.f32 %f1, %f1, 0f3F7FBE77, %f2;
    mul.f32 %f2, %f2, 0f3F000000;
    add.f32 %f2, %f2, 0f3E800000;
    add.s32 %r7, %r7, 1;
    setp.lt.u32 %p1, %r7, %r6;
    @%p1 bra L;
END:
    mul.wide.u32 %rd2, %r5, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.f32 [%rd3], %f1;
    ret;
}
"""
)


@pytest.mark.parametrize("block,iters", [((13, 3, 1), 4), ((40, 1, 1), 0), ((5, 2, 2), 9)])
def test_kernel_without_barriers_same_as_interpreter(dev, monkeypatch, block, iters):
    """A kernel with a loop and no barrier runs in groups too (its driver calls
    ``simd_0``); 2-D and 3-D blocks, trip counts that differ per lane (0 for lane 0)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    assert 'call i32 @"simd_0"' in str(_lowered(NO_BARRIER, "sp", 2).module)
    prog = load_ptx(NO_BARRIER + f"\n// {block} {iters}\n")
    n = block[0] * block[1] * block[2]
    out = dev.zeros(n, np.float32)
    dev.launch(prog, "sp", 1, block, [Ptr(out), np.uint32(iters)])
    assert "sp" in {name for name, _ in jit.stats()["compiled"]}


@pytest.mark.parametrize("lanes", [8, 32])
def test_other_group_widths_same_as_interpreter(dev, monkeypatch, lanes):
    """``CRANE_PTX_JIT_SIMD`` sets the lanes per group (8: a CPU without AVX-512; 32: two
    vectors a register): the same bytes as the interpreter."""
    monkeypatch.setenv("CRANE_PTX_JIT_SIMD", str(lanes))
    assert f"<{lanes} x i32>" in str(_lowered(GRID_STRIDE, "gs", 4).module)
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(GRID_STRIDE + f"\n// lanes {lanes}\n")
    data = ((np.arange(700) * 3) % 5).astype(np.float32)
    pin, out = dev.upload(data), dev.zeros(3 * 45, np.float32)
    dev.launch(prog, "gs", 3, 45, [Ptr(pin), Ptr(out), np.uint32(700), np.uint32(1)])
    got = dev.download(out, 3 * 45, np.float32)
    assert np.allclose(got, _grid_stride_want(data, 3, 45, 700, 1), rtol=1e-5)


def test_llvm_failure_with_the_vector_form_compiles_without_it(dev, monkeypatch):
    """If LLVM rejects a kernel with vector-form regions, it is lowered again without them
    (the kernel still compiles, and gives the interpreter's bytes)."""
    seen = []
    real = jit.compile_ir

    def fussy(text, *args, **kw):
        seen.append("simd_0" in text)
        if "simd_0" in text:
            raise RuntimeError("rejected")
        return real(text, *args, **kw)

    monkeypatch.setattr(jit, "compile_ir", fussy)
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(GRID_STRIDE + "\n// rejected\n")
    data = np.ones(100, np.float32)
    pin, out = dev.upload(data), dev.zeros(64, np.float32)
    dev.launch(prog, "gs", 1, 64, [Ptr(pin), Ptr(out), np.uint32(100), np.uint32(1)])
    assert seen == [True, False]
    assert "gs" in {name for name, _ in jit.stats()["compiled"]}


def test_disk_cache_key_has_the_setting(monkeypatch):
    """Code compiled with and without the vector form is kept apart on disk."""
    monkeypatch.setenv("CRANE_PTX_JIT_SIMD", "1")
    on = diskcache.entry_key("h", "k")
    monkeypatch.setenv("CRANE_PTX_JIT_SIMD", "0")
    assert diskcache.entry_key("h", "k") != on


def test_consecutive_load_in_the_loop_is_one_vector_load_with_a_prefetch():
    """The grid-stride loop's ``in[i]`` (predicted consecutive: step 1, not a parameter) is
    a masked vector load of the group in the optimized code, behind one check, with a
    prefetch of where it will read later; the checked path's gather is there too, for
    groups that break the prediction."""

    def optimized(text: str) -> str:
        low = _lowered(text, "gs", 4)
        return str(engine.optimize(low.ir_text()).get_function(low.name))

    strided = optimized(GRID_STRIDE)  # ``in[i * step]``: no prediction, gathers only
    driver = optimized(GRID_STRIDE.replace("mul.lo.s32 %r10, %r5, %r9;", "mov.u32 %r10, %r5;"))
    loads = re.compile(r"call <16 x i32> @llvm\.masked\.load\.v16i32")
    assert len(loads.findall(driver)) > len(loads.findall(strided))
    assert "@llvm.prefetch" in driver and "@llvm.prefetch" not in strided
    assert re.search(r"@llvm\.masked\.gather\.v16i32", driver)
