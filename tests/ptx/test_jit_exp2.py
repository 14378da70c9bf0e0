"""``ex2.approx.f32`` compiled gives the interpreter's bits on every kind of input, in the scalar
lane loop and in the vector form (``ptx/exp2poly.py``: the compiler's float64 polynomial, the
interpreter's NumPy ``exp2`` with the polynomial where the two could round apart): every
float32 in [1, 2) whose 2**x lies next to a rounding midpoint, random bit patterns, sweeps
across the underflow to subnormals and zero and the overflow to infinity, NaN payloads,
infinities, zeros and subnormal inputs, with and without ``.ftz``."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import jit, load_ptx
from tests.unit.backends.sim.test_exp2poly import near_midpoints

pytestmark = pytest.mark.usefixtures("compile_every_launch")

PTX = r"""
.version 7.0
.target sm_80
.address_size 64

.visible .entry e2(.param .u64 pa, .param .u64 po, .param .u32 pn)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [po];
    ld.param.u32 %r1, [pn];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.f32 %f1, [%rd4];
    ex2.approx.f32 %f2, %f1;
    ex2.approx.ftz.f32 %f3, %f1;
    mul.wide.u32 %rd5, %r5, 8;
    add.s64 %rd6, %rd2, %rd5;
    st.global.v2.f32 [%rd6], {%f2, %f3};
DONE:
    ret;
}

// a loop of ex2 with uneven trip counts: the vector form (jit/simd.py) takes it
.visible .entry e2loop(.param .u64 pa, .param .u64 po, .param .u32 pn)
{
    .reg .pred %p<3>;
    .reg .b32 %r<9>;
    .reg .f32 %f<5>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [po];
    ld.param.u32 %r1, [pn];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.f32 %f1, [%rd4];
    mov.f32 %f2, 0f00000000;
    and.b32 %r6, %r5, 3;
    add.u32 %r6, %r6, 1;
    mov.u32 %r7, 0;
LOOP:
    ex2.approx.ftz.f32 %f3, %f1;
    add.f32 %f2, %f2, %f3;
    mul.f32 %f1, %f1, 0f3F000000;
    add.u32 %r7, %r7, 1;
    setp.lt.u32 %p2, %r7, %r6;
    @%p2 bra LOOP;
    add.s64 %rd5, %rd2, %rd3;
    st.global.f32 [%rd5], %f2;
DONE:
    ret;
}
"""


SPECIAL = [0.0, -0.0, 1e-45, -1e-45, 1e-39, -1e-39, np.inf, -np.inf, -150.0, -149.0, -149.5]
SPECIAL += [-126.0, 128.0, 127.99999, 0.5, -0.5]


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(11)
    parts = [
        rng.integers(0, 2**32, 60_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        np.linspace(-152, -124, 20_000, dtype=np.float32),  # into subnormals and zero
        np.linspace(127, 129, 5_000, dtype=np.float32),  # to infinity
        rng.uniform(-1, 1, 10_000).astype(np.float32),
        np.array(SPECIAL, np.float32),
        np.array([0x7FC12345, 0xFFC00001, 0x7F800001, 0xFF812345], np.uint32).view(np.float32),
        near_midpoints(2.0**-36).astype(np.float32),  # where two float64 exp2s may round apart
    ]
    return np.concatenate(parts)


def _run(dev, prog, kernel: str, a: np.ndarray, mode: str, per: int, monkeypatch):
    monkeypatch.setenv("CRANE_PTX_JIT", mode)
    n = len(a)
    pa, po = dev.upload(a), dev.zeros(per * n, np.float32)
    dev.launch(prog, kernel, (n + 255) // 256, 256, [pa, Ptr(po), np.int32(n)])
    return dev.download(po, per * n, np.float32)


@pytest.mark.parametrize(("kernel", "per"), [("e2", 2), ("e2loop", 1)])
def test_ex2_compiled_gives_the_interpreters_bits(dev, monkeypatch, kernel: str, per: int) -> None:
    prog = load_ptx(PTX)
    a = _inputs()
    got = _run(dev, prog, kernel, a, "1", per, monkeypatch)
    assert isinstance(jit._cache.get((prog.source_hash, kernel)), jit.CompiledKernel)
    want = _run(dev, prog, kernel, a, "0", per, monkeypatch)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    if kernel == "e2":  # and the values are 2**x, correctly rounded but next to a midpoint
        plain = got.reshape(-1, 2)[:, 0]
        with np.errstate(over="ignore"):
            ref = np.exp2(a.astype(np.float64)).astype(np.float32)
        finite = np.isfinite(ref) & (ref > 1e-30)
        assert np.allclose(plain[finite], ref[finite], rtol=2**-23, atol=0)
        assert np.array_equal(np.isnan(plain), np.isnan(a))


def test_ex2_loops_take_the_vector_form() -> None:
    from crane.backends.sim.ptx.jit.lower import lower_kernel
    from crane.backends.sim.ptx.parser import parse_module

    fn = parse_module(PTX).functions["e2loop"]
    offsets = {id(p): 8 * i for i, p in enumerate(fn.params)}
    low = lower_kernel(fn, offsets, lambda v: None, 8 * len(fn.params))
    assert 'call i32 @"simd_0"' in str(low.module)
    assert "exp2" not in str(low.module)  # no C library call: the polynomial, vectorized
