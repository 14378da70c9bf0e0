"""Narrow-format ``cvt`` (FP8, FP6, FP4, UE8M0, TF32, satfinite f16/bf16), bit-exact.

Two references: NVIDIA's own host emulation in cuda_fp8.h/cuda_fp6.h/cuda_fp4.h (the program
extra_kernels/narrow_cvt.cu built for the host), which the same code compiled to PTX must match
on the simulated GPU; and encoders written here from the format definitions, for the forms and
modifiers no intrinsic produces (.relu, TF32, satfinite f16/bf16).
"""

from __future__ import annotations

import struct
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import PtxError, PtxUnsupported, load_ptx

SRC = Path(__file__).parent / "extra_kernels" / "narrow_cvt.cu"
WORDS = 20


def _inputs(rng) -> np.ndarray:
    """Pairs of f32: special values, every format's boundaries and ties, random magnitudes."""
    special = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        448.0,
        464.0,
        480.0,
        57344.0,
        61440.0,
        7.5,
        7.75,
        28.0,
        30.0,
        6.0,
        5.0,
        0.25,
        0.75,
        2.0**-9,
        2.0**-10,
        3 * 2.0**-11,
        2.0**-16,
        2.0**-17,
        2.0**-126,
        2.0**-127,
        2.0**-149,
        3.0e38,
        1.5,
        2.5,
        0.0625,
        0.03125,
    ]
    vals = [np.float32(v) for v in special] + [np.float32(-v) for v in special]
    bits = [
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0xFFC00001,
        0x7F7FFFFF,
        0x3F808000,
        0x3F810000,
        0x7F000001,
        0x00400000,
        0x00400001,
        0x7F7F0001,
    ]
    vals += [np.uint32(b).view(np.float32) for b in bits]
    mant = rng.integers(0, 2**23, 3000, dtype=np.uint64)
    exps = rng.integers(100, 160, 3000, dtype=np.uint64)  # 2^-27 .. 2^32
    sign = rng.integers(0, 2, 3000, dtype=np.uint64) << np.uint64(31)
    rand = (sign | exps << np.uint64(23) | mant).astype(np.uint32).view(np.float32)
    wide = rng.integers(0, 2**32, 1000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    allv = np.concatenate([np.array(vals, np.float32), rand, wide])
    if allv.size % 2:
        allv = allv[:-1]
    # every special against every other too, in both halves
    sp = np.array(vals, np.float32)
    grid = np.stack(np.meshgrid(sp, sp), -1).reshape(-1)
    return np.concatenate([allv, grid]).astype(np.float32)


@pytest.fixture(scope="module")
def narrow_build(nvcc, tmp_path_factory):
    out = tmp_path_factory.mktemp("narrow")
    built = {}
    for arch in ("compute_90", "compute_100f"):
        p = out / f"narrow_{arch}.ptx"
        r = subprocess.run(
            [nvcc, "-ptx", "-O3", f"-arch={arch}", str(SRC), "-o", str(p)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        # an nvcc older than 12.9 has no compute_100f: that arch's test says so and skips
        built[arch] = p.read_text() if r.returncode == 0 else RuntimeError(r.stderr)
    host = out / "narrow_host"
    subprocess.run(
        [nvcc, "-O2", "-arch=compute_90", "-code=compute_90", str(SRC), "-o", str(host)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    built["host"] = host
    return built


@pytest.mark.parametrize("arch", ["compute_90", "compute_100f"])
def test_cuda_narrow_intrinsics_match_nvidia_host_emulation(dev, rng, narrow_build, arch, tmp_path):
    ptx = narrow_build[arch]
    if isinstance(ptx, RuntimeError):
        if arch == "compute_100f" and "compute_100f" in str(ptx):
            pytest.skip(f"this nvcc cannot build {arch}: {ptx}")
        raise ptx
    if arch == "compute_100f":  # every conversion is one cvt instruction there
        for form in (
            "ue8m0x2.bf16x2",
            "e5m2x2.f16x2",
            "e2m1x2.f32",
            "e3m2x2.f32",
            "ue8m0x2.f32",
            "bf16x2.ue8m0x2",
            "f16x2.e2m1x2",
            "e4m3x2.f16x2",
        ):
            assert form in ptx
    x = _inputs(rng)
    n = x.size // 2
    (tmp_path / "in.bin").write_bytes(x.tobytes())
    subprocess.run(
        [str(narrow_build["host"]), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")],
        check=True,
        timeout=60,
    )
    want = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.uint32).reshape(n, WORDS)
    prog = load_ptx(ptx)
    pin = dev.upload(x)
    pout = dev.zeros(WORDS * n, np.uint32)
    dev.launch(prog, "narrow", (n + 255) // 256, 256, [Ptr(pin), Ptr(pout), np.int32(n)])
    got = dev.download(pout, WORDS * n, np.uint32).reshape(n, WORDS)
    bad = np.argwhere(got != want)
    assert bad.size == 0, [
        (
            int(i),
            int(k),
            hex(int(x[2 * i].view(np.uint32))),
            hex(int(x[2 * i + 1].view(np.uint32))),
            hex(int(got[i, k])),
            hex(int(want[i, k])),
        )
        for i, k in bad[:8]
    ]


# ---- references from the format definitions --------------------------------------------------

FORMATS = {  # name: (exponent bits, mantissa bits, bias, has inf, has nan)
    "e4m3": (4, 3, 7, False, True),
    "e5m2": (5, 2, 15, True, True),
    "e2m3": (2, 3, 1, False, False),
    "e3m2": (3, 2, 3, False, False),
    "e2m1": (2, 1, 1, False, False),
}


def _finite_codes(name):
    eb, mb, bias, has_inf, has_nan = FORMATS[name]
    out = {}
    for code in range(1 << (eb + mb)):
        e, m = code >> mb, code & ((1 << mb) - 1)
        if has_inf and e == (1 << eb) - 1:
            continue  # e5m2: infinities and NaNs
        if has_nan and not has_inf and code == (1 << (eb + mb)) - 1:
            continue  # e4m3: S.1111.111 is NaN
        v = (
            Fraction(m, 1 << mb) * Fraction(2) ** (1 - bias)
            if e == 0
            else ((1 + Fraction(m, 1 << mb)) * Fraction(2) ** (e - bias))
        )
        out[code] = v
    return out


def ref_encode(x: float, name: str, relu: bool) -> int:
    """Round-to-nearest-even, satfinite, from the definition (exact rationals)."""
    eb, mb, _, _, has_nan = FORMATS[name]
    sbit = 1 << (eb + mb)
    codes = _finite_codes(name)
    if x != x:
        return 0x7F if has_nan else max(codes)
    if relu and (x < 0 or (x == 0 and str(x).startswith("-"))):
        x = 0.0
    neg = x < 0 or (x == 0 and struct.pack("<d", x)[7] & 0x80)
    mag = abs(Fraction(x)) if x not in (float("inf"), float("-inf")) else None
    top = max(codes)
    if mag is None or mag >= codes[top]:
        best = top
    else:
        best = min(codes, key=lambda c: (abs(codes[c] - mag), c & 1))
    return best | (sbit if neg else 0)


PAIR = """
.version 8.7
.target sm_100f
.address_size 64
.visible .entry k(.param .u64 pin, .param .u64 pout)
{{
    .reg .b16 %h<4>;
    .reg .b32 %r<8>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pin];
    ld.param.u64 %rd2, [pout];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 8;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.v2.f32 {{%f1, %f2}}, [%rd4];
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd6, %rd2, %rd5;
    {body}
    st.global.u32 [%rd6], %r2;
    ret;
}}
"""


def _run_pairs(dev, body, pairs):
    prog = load_ptx(PAIR.format(body=body))
    x = np.asarray(pairs, np.float32).reshape(-1, 2)
    pin = dev.upload(x)
    pout = dev.zeros(x.shape[0], np.uint32)
    dev.launch(prog, "k", 1, x.shape[0], [Ptr(pin), Ptr(pout)])
    return x, dev.download(pout, x.shape[0], np.uint32)


def _pairs(rng, scale):
    v = (rng.standard_normal(400) * scale).astype(np.float32)
    v[:8] = [0.0, -0.0, np.nan, -np.inf, np.inf, -1e30, 1e30, -1e-30]
    return v


@pytest.mark.parametrize(
    "name,scale", [("e4m3", 100), ("e5m2", 4000), ("e2m3", 3), ("e3m2", 10), ("e2m1", 3)]
)
@pytest.mark.parametrize("relu", [False, True])
def test_f32_pair_to_narrow_with_relu(dev, rng, name, scale, relu):
    r = ".relu" if relu else ""
    if name == "e2m1":
        body = f"cvt.rn.satfinite{r}.e2m1x2.f32 %h1, %f1, %f2;\n    cvt.u32.u16 %r2, %h1;"
        shift, mask = 4, 0xFF
    else:
        body = f"cvt.rn.satfinite{r}.{name}x2.f32 %h1, %f1, %f2;\n    cvt.u32.u16 %r2, %h1;"
        shift, mask = 8, 0xFFFF
    x, got = _run_pairs(dev, body, _pairs(rng, scale))
    for (a, b), g in zip(x, got, strict=True):
        want = (ref_encode(float(a), name, relu) << shift) | ref_encode(float(b), name, relu)
        assert int(g) & mask == want, (name, float(a), float(b), hex(int(g)), hex(want))


def _round_bits(u: int, drop: int, mode: str) -> int:
    """Round the f32 pattern ``u`` (finite, non-negative magnitude bits) to clear ``drop`` low
    bits: rna (ties away), rn (ties even), rz."""
    low = u & ((1 << drop) - 1)
    base = u - low
    half = 1 << (drop - 1)
    if mode == "rz" or low < half:
        return base
    if low > half or mode == "rna" or (base >> drop) & 1:
        return base + (1 << drop)
    return base


@pytest.mark.parametrize("mode", ["rna", "rn", "rz"])
@pytest.mark.parametrize("satfinite", [False, True])
def test_tf32(dev, rng, mode, satfinite):
    sf = ".satfinite" if satfinite else ""
    body = f"cvt.{mode}{sf}.tf32.f32 %r2, %f1;"
    v = rng.integers(0, 2**32, 400, dtype=np.uint64).astype(np.uint32)
    v[:6] = [0x7F7FFFFF, 0xFF7FF000, 0x3F801000, 0x3F803000, 0x7FC00001, 0x00001000]
    x, got = _run_pairs(dev, body, v.view(np.float32))
    for (a, _), g in zip(x, got, strict=True):
        u = int(np.float32(a).view(np.uint32))
        mag = u & 0x7FFFFFFF
        if mag > 0x7F800000:
            want = 0x7FFFFFFF
        elif mag == 0x7F800000:
            want = u
        else:
            r = _round_bits(mag, 13, mode)
            if r >= 0x7F800000 and satfinite:
                r = 0x7F7FE000
            want = r | (u & 0x80000000)
        assert int(g) == want, (hex(u), hex(int(g)), hex(want))


def test_f16_bf16_satfinite_and_relu(dev):
    body = """
    cvt.rn.satfinite.relu.f16x2.f32 %r3, %f1, %f2;
    cvt.rn.satfinite.bf16x2.f32 %r4, %f1, %f2;
    cvt.rz.satfinite.f16.f32 %h1, %f1;
    cvt.u32.u16 %r5, %h1;
    xor.b32 %r2, %r3, 0;
    st.global.u32 [%rd6+256], %r4;
    st.global.u32 [%rd6+512], %r5;
    """
    pairs = [
        (1e6, -1e6),
        (-3.0, np.inf),
        (np.nan, 65520.0),
        (65504.0, -0.0),
        (3.0e38, -np.inf),
        (1.0, 2.0),
        (-1e-8, 70000.0),
        (65519.0, 65520.0),
    ]
    prog = load_ptx(PAIR.format(body=body))
    x = np.asarray(pairs, np.float32)
    pin = dev.upload(x)
    pout = dev.zeros(3 * 64, np.uint32)
    dev.launch(prog, "k", 1, len(pairs), [Ptr(pin), Ptr(pout)])
    out = dev.download(pout, 3 * 64, np.uint32)

    def f16_relu_sat(v):
        if v != v:
            return 0x7FFF
        v = 0.0 if v <= 0 else v  # .relu: negatives and -0 become +0
        return int(np.float16(min(v, 65504.0) if abs(v) > 65504 else v).view(np.uint16))

    def bf16_sat(v):
        if v != v:
            return 0x7FFF
        u = int(np.float32(v).view(np.uint32))
        if abs(v) == np.inf:
            return ((u >> 16) & 0x8000) | 0x7F7F
        r = _round_bits(u & 0x7FFFFFFF, 16, "rn") >> 16
        return (min(r, 0x7F7F)) | ((u >> 16) & 0x8000)

    for t, (a, b) in enumerate(x):
        assert int(out[t]) == (f16_relu_sat(float(a)) << 16) | f16_relu_sat(float(b)), t
        for half, v in ((int(out[64 + t]) >> 16, float(a)), (int(out[64 + t]) & 0xFFFF, float(b))):
            if v != v:  # satfinite keeps NaN a NaN
                assert (half & 0x7F80) == 0x7F80 and half & 0x7F, (t, hex(half))
            else:
                assert half == bf16_sat(v), (t, v, hex(half))
        rz = np.float16(np.clip(np.float32(a), -65504, 65504)) if a == a else np.float16(np.nan)
        if a == a:  # round toward zero: the f16 at or below the magnitude
            r = int(rz.view(np.uint16))
            if abs(float(rz)) > abs(float(a)):
                r -= 1
            assert int(out[128 + t]) == r, (t, float(a), hex(int(out[128 + t])), hex(r))


def test_refused_forms_name_the_instruction():
    for body, what in [
        ("cvt.rs.relu.satfinite.e4m3x4.f32 %r2, {%f1, %f2, %f1, %f2}, %r1;", "cvt"),
        ("cvt.rs.satfinite.f16x2.f32 %r2, %f1, %f2, %r1;", "cvt.rs"),
    ]:
        with pytest.raises((PtxUnsupported, PtxError)) as e:
            load_ptx(PAIR.format(body=body))
        assert what in str(e.value)


def _ref_decode_f16(code: int, name: str, relu: bool) -> int:
    eb, mb, _, has_inf, _ = FORMATS[name]
    sbit = 1 << (eb + mb)
    code &= 2 * sbit - 1
    mag = code & (sbit - 1)
    neg = bool(code & sbit)
    codes = _finite_codes(name)
    if mag not in codes:
        if has_inf and mag == ((1 << eb) - 1) << mb:
            v = float("-inf") if neg else float("inf")
        else:
            return 0x7FFF  # NaN: the canonical f16 NaN
    else:
        v = float(codes[mag]) * (-1 if neg else 1)
    if relu and (neg or v < 0):
        return 0
    return int(np.float16(v).view(np.uint16))


WIDEN = """
.version 8.7
.target sm_100f
.address_size 64
.visible .entry k(.param .u64 pin, .param .u64 pout)
{{
    .reg .b16 %h<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pin];
    ld.param.u64 %rd2, [pout];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd1, %rd3;
    add.s64 %rd5, %rd2, %rd3;
    ld.global.u32 %r3, [%rd4];
    cvt.u16.u32 %h1, %r3;
    {op} %r2, %h1;
    st.global.u32 [%rd5], %r2;
    ret;
}}
"""


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1"])
@pytest.mark.parametrize("relu", [False, True])
def test_narrow_pair_to_f16x2(dev, rng, name, relu):
    """Every code of the format, in both halves, widened exactly (with .relu: negatives to
    +0, NaN to the canonical NaN)."""
    bits = 4 if name == "e2m1" else 8
    eb, mb = FORMATS[name][:2]
    ncodes = 1 << (eb + 1 + mb)
    lo = np.arange(ncodes)
    hi = (lo * 7 + 3) % ncodes
    pairs = ((hi << bits) | lo).astype(np.uint32)
    op = f"cvt.rn{'.relu' if relu else ''}.f16x2.{name}x2"
    prog = load_ptx(WIDEN.format(op=op))
    pin, pout = dev.upload(pairs), dev.zeros(pairs.size, np.uint32)
    dev.launch(prog, "k", 1, pairs.size, [Ptr(pin), Ptr(pout)])
    got = dev.download(pout, pairs.size, np.uint32)
    for p, g in zip(pairs.tolist(), got.tolist(), strict=True):
        want = (_ref_decode_f16(p >> bits, name, relu) << 16) | _ref_decode_f16(
            p & ((1 << bits) - 1), name, relu
        )
        assert g == want, (name, hex(p), hex(g), hex(want))
