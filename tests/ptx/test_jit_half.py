"""Half precision compiled: ``cvt.rn.f16.f32`` and ``cvt.f32.f16`` (``__float2half``,
``__half2float``) byte-equal to the interpreter on ties, half subnormals, overflow,
infinities, NaNs with payloads and float32 subnormals under ``.ftz`` (other f16 conversions
stay refused); f16 and bf16 arithmetic (pairs, ``.sat``, ``.relu``); bf16 conversions in every
rounding mode with ``.relu``/``.satfinite``, from float64 and integers, to integers; ``set``
and ``setp`` on halves; and the bf16 intrinsics as nvcc emits them for sm_80 and sm_90."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import jit, load_ptx

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: every test kernel's start: thread i of n (in, out, n parameters), past n: DONE
PROLOGUE = """
    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [out];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
"""


def _on_floats(regs: str, body: str) -> str:
    """A kernel ``t(in, out, n)`` whose thread i (of n) has ``%f1 = in[i]`` (float32), then
    ``body`` (which ends at ``DONE: ret; }``); ``regs`` declares what ``body`` uses."""
    return (
        HEAD
        + """
.visible .entry t(.param .u64 in, .param .u64 out, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<7>;
"""
        + regs
        + PROLOGUE
        + """    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.f32 %f1, [%rd4];
"""
        + body
    )


#: out[i] = (half(x), half_ftz(2 * float(half(x))), float(half(x))) for x = in[i]
ROUND_TRIP = _on_floats(
    ".reg .b16 %rs<3>; .reg .f32 %f<4>;",
    """
    cvt.rn.f16.f32 %rs1, %f1;
    cvt.f32.f16 %f2, %rs1;
    mul.f32 %f3, %f2, 0f40000000;
    cvt.rn.ftz.f16.f32 %rs2, %f3;
    mul.wide.u32 %rd5, %r5, 8;
    add.s64 %rd6, %rd2, %rd5;
    st.global.u16 [%rd6], %rs1;
    st.global.u16 [%rd6+2], %rs2;
    st.global.f32 [%rd6+4], %f2;
DONE:
    ret;
}
""",
)


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(3)
    halves = rng.integers(0, 1 << 16, 2000, dtype=np.uint32).astype(np.uint16)
    exact = halves.view(np.float16).astype(np.float32)
    # halfway between neighbouring halves (ties: to even), and just off them
    up = np.nextafter(exact.astype(np.float16), np.float16(np.inf)).astype(np.float32)
    mid = exact + (up - exact) / 2
    special = np.array(
        [0x7FC00001, 0xFFA00000, 0x7F800001, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001,
         0x80400000, 0x477FE000, 0x477FF000, 0x477FF001, 0x33000000, 0x33000001, 0x32FFFFFF],
        np.uint32,
    ).view(np.float32)  # fmt: skip
    wide = (rng.standard_normal(2000) * 10.0 ** rng.integers(-9, 6, 2000)).astype(np.float32)
    return np.concatenate([special, exact, mid, np.nextafter(mid, np.float32(0)), wide])


def _run(dev, prog, x: np.ndarray, mode: str, monkeypatch) -> bytes:
    monkeypatch.setenv("CRANE_PTX_JIT", mode)
    n = len(x)
    out = dev.zeros(2 * n, np.uint32)
    dev.launch(prog, "t", (n + 127) // 128, 128, [dev.upload(x), Ptr(out), np.uint32(n)])
    return dev.download(out, 2 * n, np.uint32).tobytes()


@pytest.mark.usefixtures("compile_every_launch")
def test_half_round_trip_compiled_same_as_interpreter(dev, monkeypatch):
    prog = load_ptx(ROUND_TRIP)
    x = _inputs()
    got = _run(dev, prog, x, "1", monkeypatch)
    assert isinstance(jit._cache.get((prog.source_hash, "t")), jit.CompiledKernel)
    assert got == _run(dev, prog, x, "0", monkeypatch)
    h = np.frombuffer(got, np.uint16).reshape(-1, 4)[:, 0]
    finite = np.isfinite(x)
    with np.errstate(over="ignore"):  # (large floats become infinite halves)
        want = x[finite].astype(np.float16).view(np.uint16)
    assert np.array_equal(h[finite], want)


@pytest.mark.usefixtures("compile_every_launch")
def test_other_half_conversions_run_interpreted(dev, monkeypatch):
    prog = load_ptx(
        ROUND_TRIP.replace(
            "cvt.f32.f16 %f2, %rs1;", "cvt.rn.f16.bf16 %rs1, %rs1; cvt.f32.f16 %f2, %rs1;"
        )
    )
    x = _inputs()[:256]
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    _run(dev, prog, x, "1", monkeypatch)
    got = jit._cache.get((prog.source_hash, "t"))
    assert isinstance(got, jit.Refusal) and "bf16" in str(got)


#: each thread reads three half2 words a, b, c and writes 14 words: every op on the low halves
#: (.f16) and on both (.f16x2), .sat forms included
ARITH = (
    HEAD
    + """
.visible .entry t(.param .u64 in, .param .u64 out, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b16 %rs<20>;
    .reg .b32 %r<30>;
    .reg .b64 %rd<8>;
"""
    + PROLOGUE
    + """    mul.wide.u32 %rd3, %r5, 12;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.u32 %r6, [%rd4];
    ld.global.u32 %r7, [%rd4+4];
    ld.global.u32 %r8, [%rd4+8];
    mov.b32 {%rs1, %rs2}, %r6;
    mov.b32 {%rs3, %rs4}, %r7;
    mov.b32 {%rs5, %rs6}, %r8;
    add.f16 %rs7, %rs1, %rs3;
    sub.rn.f16 %rs8, %rs1, %rs3;
    mul.f16 %rs9, %rs1, %rs3;
    fma.rn.f16 %rs10, %rs1, %rs3, %rs5;
    fma.rn.sat.f16 %rs11, %rs1, %rs3, %rs5;
    neg.f16 %rs12, %rs1;
    abs.f16 %rs13, %rs3;
    min.f16 %rs14, %rs1, %rs3;
    max.f16 %rs15, %rs1, %rs3;
    add.sat.f16 %rs16, %rs1, %rs3;
    mov.b32 %r9, {%rs7, %rs8};
    mov.b32 %r10, {%rs9, %rs10};
    mov.b32 %r11, {%rs11, %rs12};
    mov.b32 %r12, {%rs13, %rs14};
    mov.b32 %r13, {%rs15, %rs16};
    add.f16x2 %r14, %r6, %r7;
    sub.f16x2 %r15, %r6, %r7;
    mul.rn.f16x2 %r16, %r6, %r7;
    fma.rn.f16x2 %r17, %r6, %r7, %r8;
    fma.rn.sat.f16x2 %r18, %r6, %r7, %r8;
    neg.f16x2 %r19, %r6;
    abs.f16x2 %r20, %r7;
    min.f16x2 %r21, %r6, %r7;
    max.f16x2 %r22, %r6, %r7;
    mul.wide.u32 %rd5, %r5, 56;
    add.s64 %rd6, %rd2, %rd5;
    st.global.v2.u32 [%rd6], {%r9, %r10};
    st.global.v2.u32 [%rd6+8], {%r11, %r12};
    st.global.v2.u32 [%rd6+16], {%r13, %r14};
    st.global.v2.u32 [%rd6+24], {%r15, %r16};
    st.global.v2.u32 [%rd6+32], {%r17, %r18};
    st.global.v2.u32 [%rd6+40], {%r19, %r20};
    st.global.v2.u32 [%rd6+48], {%r21, %r22};
DONE:
    ret;
}
"""
)


def _half_words(n: int) -> np.ndarray:
    """Random half bit patterns (every class: NaNs with payloads, infinities, subnormals,
    zeros) mixed with ordinary values, so that sums cancel and products overflow."""
    rng = np.random.default_rng(11)
    raw = rng.integers(0, 1 << 16, 3 * 2 * n, dtype=np.uint32).astype(np.uint16)
    usual = (rng.standard_normal(3 * 2 * n) * 4).astype(np.float16).view(np.uint16)
    pick = rng.random(3 * 2 * n) < 0.5
    return np.where(pick, raw, usual).view(np.uint32)


#: the same every-op kernel on bfloat16 (``.bf16``, ``.bf16x2``), with ``.relu`` forms
ARITH_BF16 = (
    ARITH.replace(".f16", ".bf16")
    .replace("min.bf16 %rs14", "min.relu.bf16 %rs14")
    .replace("fma.rn.sat.bf16x2", "fma.rn.relu.bf16x2")
    .replace("add.sat.bf16", "fma.rn.relu.bf16 %rs16, %rs1, %rs3, %rs5; //")
)


@pytest.mark.usefixtures("compile_every_launch")
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_half_arithmetic_compiled_same_as_interpreter(dev, monkeypatch, kind):
    prog = load_ptx(ARITH if kind == "f16" else ARITH_BF16)
    n = 4096
    words = _half_words(n) if kind == "f16" else _bf16_words(6 * n, 5).view(np.uint32)

    def run(mode: str) -> bytes:
        monkeypatch.setenv("CRANE_PTX_JIT", mode)
        out = dev.zeros(14 * n, np.uint32)
        args = [dev.upload(words), Ptr(out), np.uint32(n)]
        dev.launch(prog, "t", (n + 127) // 128, 128, args)
        return dev.download(out, 14 * n, np.uint32).tobytes()

    got = run("1")
    assert isinstance(jit._cache.get((prog.source_hash, "t")), jit.CompiledKernel)
    assert got == run("0")
    if kind != "f16":
        return
    # and plainly right where NumPy's float16 arithmetic is exact-then-rounded
    a = words.view(np.uint16)[0::6].view(np.float16)
    c = words.view(np.uint16)[2::6].view(np.float16)
    low = np.frombuffer(got, np.uint32).reshape(n, 14)[:, 0].astype(np.uint16).view(np.float16)
    ok = np.isfinite(a) & np.isfinite(c)
    with np.errstate(all="ignore"):
        want = (a.astype(np.float64) + c.astype(np.float64)).astype(np.float16)
    assert np.array_equal(low[ok].view(np.uint16), want[ok].view(np.uint16))


#: out[i]: bf16 of x in each rounding mode, with .relu and .satfinite, of 2x in float64,
#: the pair form, and the float32 and float64 widening of the first
CVT_BF16 = _on_floats(
    ".reg .b16 %rs<9>; .reg .f32 %f<4>; .reg .f64 %fd<4>;",
    """
    cvt.rn.bf16.f32 %rs1, %f1;
    cvt.rz.bf16.f32 %rs2, %f1;
    cvt.rm.bf16.f32 %rs3, %f1;
    cvt.rp.bf16.f32 %rs4, %f1;
    cvt.rn.relu.bf16.f32 %rs5, %f1;
    cvt.rn.satfinite.bf16.f32 %rs6, %f1;
    cvt.f64.f32 %fd1, %f1;
    mul.f64 %fd2, %fd1, 0d4000000000000001;
    cvt.rn.bf16.f64 %rs7, %fd2;
    cvt.rn.ftz.bf16.f32 %rs8, %f1;
    cvt.rn.bf16x2.f32 %r6, %f1, %f1;
    cvt.f32.bf16 %f2, %rs1;
    cvt.f64.bf16 %fd3, %rs3;
    mul.wide.u32 %rd5, %r5, 32;
    add.s64 %rd6, %rd2, %rd5;
    st.global.v4.u16 [%rd6], {%rs1, %rs2, %rs3, %rs4};
    st.global.v4.u16 [%rd6+8], {%rs5, %rs6, %rs7, %rs8};
    st.global.u32 [%rd6+16], %r6;
    st.global.f32 [%rd6+20], %f2;
    st.global.f64 [%rd6+24], %fd3;
DONE:
    ret;
}
""",
)


@pytest.mark.usefixtures("compile_every_launch")
@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_half_conversions_compiled_same_as_interpreter(dev, monkeypatch, kind):
    """Every rounding mode, .relu, .satfinite, .ftz, float64 and pair forms, widening."""
    prog = load_ptx(CVT_BF16.replace("bf16", kind))
    rng = np.random.default_rng(9)
    raw = rng.integers(0, 1 << 32, 3000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # ties and near-ties of bfloat16 (low half 0x8000 and around) and of f16 (13 bits)
    hi = rng.integers(0, 1 << 16, 1000, dtype=np.uint32) << 16
    ties = np.concatenate([hi | 0x8000, hi | 0x7FFF, hi | 0x8001]).view(np.float32)
    f16 = rng.integers(0, 1 << 16, 1000, dtype=np.uint32).astype(np.uint16).view(np.float16)
    f16 = f16.astype(np.float32).view(np.uint32)
    f16_ties = np.concatenate([f16 | 0x1000, f16 | 0x0FFF, f16 | 0x1001]).view(np.float32)
    special = np.array(
        [0x7FC00001, 0xFFA00000, 0x7F800001, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001,
         0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x00008000, 0x807FFFFF, 0x477FE000, 0x477FF000,
         0x477FF001, 0xC77FF001, 0x33000000, 0xB3000001, 0x387FC000],
        np.uint32,
    ).view(np.float32)  # fmt: skip
    x = np.concatenate([special, ties, f16_ties, raw])
    n = len(x)

    def run(mode: str) -> bytes:
        monkeypatch.setenv("CRANE_PTX_JIT", mode)
        out = dev.zeros(8 * n, np.uint32)
        dev.launch(prog, "t", (n + 127) // 128, 128, [dev.upload(x), Ptr(out), np.uint32(n)])
        return dev.download(out, 8 * n, np.uint32).tobytes()

    got = run("1")
    assert isinstance(jit._cache.get((prog.source_hash, "t")), jit.CompiledKernel)
    assert got == run("0")
    rn = np.frombuffer(got, np.uint16).reshape(-1, 16)[:, 0]
    finite = np.isfinite(x)
    if kind == "f16":
        with np.errstate(over="ignore"):
            want = x.astype(np.float16).view(np.uint16)
    else:
        u = x.view(np.uint32).astype(np.uint64)
        want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    assert np.array_equal(rn[finite], want[finite])


def _bf16_words(n: int, seed: int) -> np.ndarray:
    """bfloat16 bit patterns: every class (NaNs, infinities, subnormals, zeros) and usual
    values, so that sums cancel and products overflow."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    usual = ((rng.standard_normal(n) * 4).astype(np.float32).view(np.uint32) >> 16).astype(
        np.uint16
    )
    return np.where(rng.random(n) < 0.5, raw, usual)


@pytest.mark.usefixtures("compile_every_launch")
@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])  # (bf16 arithmetic: sm_80 on)
def test_nvcc_bf16_kernels_compiled_same_as_interpreter(program, arch, dev, monkeypatch):
    """The intrinsics as nvcc emits them (fma with constants on sm_80, native add/sub/max on
    sm_90, ``set`` and ``setp`` on halves, integer conversions) compile and give the
    interpreter's bytes."""
    prog = program("bf16", arch)
    n = 4096
    a, c = _bf16_words(2 * n, 1), _bf16_words(2 * n, 2)
    c[::4] = a[::4]  # equal operands, and zeros of both signs, for the comparisons
    a[1::8], c[1::8] = 0x8000, 0x0000
    f = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    ints = np.random.default_rng(4).integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    runs = {
        # (bf_ops also rewrites f in place: f lives in the compared buffer, after the bf16s)
        "bf_ops": (
            lambda o: [dev.upload(a), dev.upload(c), Ptr(o), Ptr(o + 2 * n), np.int32(n)],
            3 * n,
        ),
        "bf2_ops": (lambda o: [dev.upload(a), dev.upload(c), Ptr(o), np.int32(n)], 2 * n),
        "bf_convert": (lambda o: [dev.upload(f), Ptr(o), Ptr(o + 2 * n), np.int32(n)], 3 * n),
        "bf_cmp": (lambda o: [dev.upload(a), dev.upload(c), Ptr(o), np.int32(n)], 2 * n),
        "h_cmp": (lambda o: [dev.upload(a), dev.upload(c), Ptr(o), np.int32(n)], 2 * n),
        "bf_int": (lambda o: [dev.upload(ints), Ptr(o), Ptr(o + 2 * n), np.int32(n)], 3 * n),
        "h_int": (lambda o: [dev.upload(ints), Ptr(o), Ptr(o + 2 * n), np.int32(n)], 3 * n),
    }
    for name, (args, words) in runs.items():
        got = []
        for mode in ("1", "0"):
            monkeypatch.setenv("CRANE_PTX_JIT", mode)
            out = dev.zeros(words, np.uint16)
            if name == "bf_ops":
                dev.mem.write(out + 2 * n, f.view(np.uint8))
            dev.launch(prog, name, n // 128, 128, args(out))
            got.append(dev.download(out, words, np.uint16).tobytes())
        compiled = jit._cache.get((prog.source_hash, name))
        assert isinstance(compiled, jit.CompiledKernel), (name, compiled)
        assert got[0] == got[1], name
