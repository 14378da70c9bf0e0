"""The allocation check of compiled global accesses (``irtypes.alloc_hit``): ``addr - lo <
room`` with ``room`` made of the bounds alone, so the vectorized lane loops compare each
address once. What must hold: the test is exact at every edge (the last byte of an
allocation, one past it, below it, an empty cache, an access wider than the allocation), a
launch at those edges leaves the interpreter's bytes or fault (diff mode), and a saxpy's
vectorized lane loop has one 64-bit comparison per access and vector (three before)."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from ptxdev import Ptr
from test_jit_affine import HEAD

from crane.backends.sim.ptx import KernelFault, jit, load_ptx
from crane.backends.sim.ptx.jit import engine
from crane.backends.sim.ptx.jit.irtypes import alloc_hit
from crane.backends.sim.ptx.jit.lower import lower_kernel
from crane.backends.sim.ptx.parser import parse_module

#: nvcc's saxpy (``if (i < n) y[i] = a * x[i] + y[i]``), as -O3 orders it
SAXPY = (
    HEAD
    + """
.visible .entry saxpy(.param .u32 n, .param .f32 a, .param .u64 x, .param .u64 y)
{
    .reg .pred %p<2>;
    .reg .f32 %f<5>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<8>;
    ld.param.u32 %r2, [n];
    ld.param.f32 %f1, [a];
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.s32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd3, %rd2;
    cvta.to.global.u64 %rd4, %rd1;
    mul.wide.s32 %rd5, %r1, 4;
    add.s64 %rd6, %rd4, %rd5;
    ld.global.f32 %f2, [%rd6];
    add.s64 %rd7, %rd3, %rd5;
    ld.global.f32 %f3, [%rd7];
    fma.rn.f32 %f4, %f2, %f1, %f3;
    st.global.f32 [%rd7], %f4;
DONE:
    ret;
}
"""
)

M64 = (1 << 64) - 1


pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _hit_fn(lanes: int):
    """``i32 hit(i64 *w)``: w = [lo, hi, nbytes, addr x lanes]; bit j: lane j's test (the
    compiled code: its engine must outlive the calls)."""
    from llvmlite import ir

    i64 = ir.IntType(64)
    mod = ir.Module()
    f = ir.Function(mod, ir.FunctionType(ir.IntType(32), [i64.as_pointer()]), "hit")
    b = ir.IRBuilder(f.append_basic_block())
    w = [b.load(b.gep(f.args[0], [ir.Constant(i64, i)])) for i in range(3 + lanes)]
    lo, hi, n, addrs = w[0], w[1], w[2], w[3:]
    if lanes == 1:
        b.ret(b.zext(alloc_hit(b, addrs[0], lo, hi, n), ir.IntType(32)))
        return engine.compile_ir(str(mod), "hit")
    vt = ir.VectorType(i64, lanes)

    def splat(v):
        vec = ir.Constant(vt, ir.Undefined)
        for j in range(lanes):
            vec = b.insert_element(vec, v, ir.Constant(ir.IntType(32), j))
        return vec

    vec = ir.Constant(vt, ir.Undefined)
    for j, a in enumerate(addrs):
        vec = b.insert_element(vec, a, ir.Constant(ir.IntType(32), j))
    got = alloc_hit(b, vec, splat(lo), splat(hi), splat(n))
    b.ret(b.zext(b.bitcast(got, ir.IntType(lanes)), ir.IntType(32)))
    return engine.compile_ir(str(mod), "hit")


def _cases():
    lo, hi = 0x2000_0000_1000, 0x2000_0000_1040
    for lo_, hi_ in ((lo, hi), (0, 0), (lo, lo + 2), (M64 - 15, M64), (0, 64)):
        for n in (1, 4, 8, 16):
            for a in (
                lo_ - 1, lo_, lo_ + 1, hi_ - n - 1, hi_ - n, hi_ - n + 1, hi_ - 1, hi_,
                hi_ + 1, 0, M64, M64 - 3, lo_ - (1 << 63),
            ):  # fmt: skip
                yield lo_, hi_, n, a & M64


def test_alloc_hit_is_exact_at_every_edge():
    """Against its definition (``lo <= addr`` and ``addr + nbytes <= hi``, unbounded
    integers), scalar and as a vector of 4 addresses."""
    one, four_lanes = _hit_fn(1), _hit_fn(4)
    scalar, vector = one.fn, four_lanes.fn
    cases = list(_cases())
    for lo, hi, n, a in cases:
        want = lo <= a and a + n <= hi
        words = (ctypes.c_uint64 * 4)(lo, hi, n, a)
        assert bool(scalar(ctypes.addressof(words))) == want, (hex(lo), hex(hi), n, hex(a))
    for i in range(0, len(cases) - 3, 4):
        four = cases[i : i + 4]
        lo, hi, n, _ = four[0]
        addrs = [a for *_, a in four]
        want = sum(1 << j for j, a in enumerate(addrs) if lo <= a and a + n <= hi)
        words = (ctypes.c_uint64 * 7)(lo, hi, n, *addrs)
        assert vector(ctypes.addressof(words)) == want


def lowered(text: str, name: str):
    """Kernel ``name`` of module ``text`` lowered (its parameters where the loader puts them)."""
    k = load_ptx(text).kernels[name]
    fn = parse_module(text).functions[name]
    offsets = {id(p): off for p, (off, _) in zip(fn.params, k.params, strict=True)}
    return lower_kernel(fn, offsets, lambda v: None, k.param_bytes)


def test_saxpy_lane_loop_compares_each_address_once():
    """The fast driver's vectorized lane loop: one 64-bit vector comparison per address
    (x; y, loaded and stored through one register and so one site) and vector width the
    vectorizer chose: two, where each access took three (six with a site per access)."""
    low = lowered(SAXPY, "saxpy")
    assert low.sites == 2  # x, and y's load and store
    driver = str(engine.optimize(low.ir_text(), (low.name,)).get_function(low.fast))
    widths = set(re.findall(r"<(\d+) x float>", driver))
    assert widths, "the lane loop is not vectorized"
    compares = re.findall(r"icmp \w+ <\d+ x i64>", driver)
    assert 0 < len(compares) <= 2 * len(widths)


@pytest.mark.parametrize("n", [256, 1000, 4096])
def test_saxpy_up_to_the_allocation_end_same_as_interpreter(dev, monkeypatch, n):
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(SAXPY + f"\n// {n}\n")
    rng = np.random.default_rng(n)
    hx, hy = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x, y = dev.upload(hx), dev.upload(hy)  # each exactly n floats
    dev.launch(prog, "saxpy", (n + 255) // 256, 256, [np.uint32(n), np.float32(1.5), x, y])
    want = (np.float64(1.5) * hx + hy).astype(np.float32)  # fma: one rounding
    assert np.allclose(dev.download(y, n, np.float32), want, rtol=1e-6, atol=1e-6)
    assert "saxpy" in {name for name, _ in jit.stats()["compiled"]}


@pytest.mark.parametrize("shift,code", [(4, 700), (1, 716)])
def test_saxpy_one_past_the_end_faults_as_interpreted(dev, monkeypatch, shift, code):
    """x passed 4 bytes on (the last lane reads 4 bytes past x's allocation, into the gap
    before the next: allocations start 256-aligned) or 1 byte on (misaligned): the
    interpreter's fault (diff mode compares it)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(SAXPY + f"\n// fault {shift}\n")
    n = 500
    x = dev.upload(np.ones(n, np.float32))
    y = dev.upload(np.ones(n, np.float32))
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "saxpy", 2, 256, [np.uint32(n), np.float32(1.0), Ptr(x + shift), y])
    assert e.value.code == code


#: one register, two allocations: ``b[i] = a[i]`` through %rd1 alone (a's address, then b's):
#: the load and the store share a site whose cached allocation changes between them
REUSE = (
    HEAD
    + """
.visible .entry reuse(.param .u64 a, .param .u64 b)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd2, [a];
    ld.param.u64 %rd3, [b];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd1, %rd2, %rd4;
    ld.global.u32 %r2, [%rd1];
    add.s64 %rd1, %rd3, %rd4;
    st.global.u32 [%rd1], %r2;
    ret;
}
"""
)


@pytest.mark.parametrize("short", [False, True])
def test_one_site_for_two_allocations_same_as_interpreter(dev, monkeypatch, short):
    """The shared site's cache holds a's allocation, then b's, lane after lane; b one word
    short: the last lane's store faults, as interpreted."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(REUSE + f"\n// {short}\n")
    n = 200
    a = dev.upload(np.arange(n, dtype=np.uint32) * 7)
    b = dev.zeros(n - 1 if short else n, np.uint32)
    if short:
        with pytest.raises(KernelFault) as e:
            dev.launch(prog, "reuse", 1, n, [a, b])
        assert e.value.code == 700
        return
    dev.launch(prog, "reuse", 1, n, [a, b])
    assert np.array_equal(dev.download(b, n, np.uint32), np.arange(n, dtype=np.uint32) * 7)
    assert "reuse" in {name for name, _ in jit.stats()["compiled"]}
