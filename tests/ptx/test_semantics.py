"""Instruction semantics in hand-written PTX: corners nvcc's output does not pin down.

Each case is a body run by every thread on four u32 inputs ``%r2..%r5`` (per-thread random,
plus special values), writing eight u32 results ``%r10..%r17``; a Python function gives the
expected results per thread.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import KernelFault, load_ptx

M32 = 0xFFFFFFFF

TEMPLATE = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry t(.param .u64 pin, .param .u64 pout)
{{
    .reg .pred %p<8>;
    .reg .b16 %h<8>;
    .reg .b32 %r<40>;
    .reg .b64 %rd<40>;
    .reg .f32 %f<16>;
    .reg .f64 %fd<8>;
    .shared .align 8 .b8 sh[2048];
    ld.param.u64 %rd1, [pin];
    ld.param.u64 %rd2, [pout];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 16;
    add.s64 %rd4, %rd1, %rd3;
    mul.wide.u32 %rd5, %r1, 32;
    add.s64 %rd6, %rd2, %rd5;
    ld.global.v4.u32 {{%r2, %r3, %r4, %r5}}, [%rd4];
    mov.u32 %r10, 0; mov.u32 %r11, 0; mov.u32 %r12, 0; mov.u32 %r13, 0;
    mov.u32 %r14, 0; mov.u32 %r15, 0; mov.u32 %r16, 0; mov.u32 %r17, 0;
{body}
    st.global.v4.u32 [%rd6], {{%r10, %r11, %r12, %r13}};
    st.global.v4.u32 [%rd6+16], {{%r14, %r15, %r16, %r17}};
    ret;
}}
"""

SPECIAL = [0, 1, 2, 31, 32, 33, 0x7FFFFFFF, 0x80000000, M32, 0xFFFFFFE0, 0x12345678, 0xFF00FF00]


def run_case(dev, body: str, ref, rng, threads: int = 64, inputs=None):
    prog = load_ptx(TEMPLATE.format(body=body))
    if inputs is None:
        inputs = rng.integers(0, 2**32, (threads, 4), dtype=np.uint64).astype(np.uint32)
        for i in range(min(threads, len(SPECIAL) ** 2)):
            inputs[i, 0] = SPECIAL[i % len(SPECIAL)]
            inputs[i, 1] = SPECIAL[i // len(SPECIAL)]
    threads = inputs.shape[0]
    pin = dev.upload(inputs)
    pout = dev.zeros(8 * threads, np.uint32)
    dev.launch(prog, "t", 1, threads, [Ptr(pin), Ptr(pout)])
    out = dev.download(pout, 8 * threads, np.uint32).reshape(threads, 8)
    for t in range(threads):
        exp = ref(*[int(v) for v in inputs[t]], t)
        for k, e in enumerate(exp):
            if e is None:
                continue
            assert int(out[t, k]) == e & M32, (
                t,
                k,
                [hex(int(v)) for v in inputs[t]],
                hex(int(out[t, k])),
                hex(e & M32),
            )
    return out


def s32(x):
    x &= M32
    return x - (1 << 32) if x >> 31 else x


def f2u(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def u2f(x: int) -> float:
    return struct.unpack("<f", struct.pack("<I", x & M32))[0]


def test_carry_chains(dev, rng):
    body = """
    add.cc.u32 %r10, %r2, %r4;
    addc.cc.u32 %r11, %r3, %r5;
    addc.u32 %r12, 0, 0;
    sub.cc.u32 %r13, %r2, %r4;
    subc.cc.u32 %r14, %r3, %r5;
    subc.u32 %r15, 0, 0;
    mov.b64 %rd10, {%r2, %r3};
    mov.b64 %rd11, {%r4, %r5};
    add.cc.u64 %rd12, %rd10, %rd11;
    addc.u64 %rd13, 0, 0;
    cvt.u32.u64 %r16, %rd13;
    """

    def ref(a, b, c, d, t):
        x = (b << 32) | a
        y = (d << 32) | c
        s = x + y
        diff = (x - y) % (1 << 64)
        borrow = 1 if x < y else 0
        return [
            s & M32,
            (s >> 32) & M32,
            s >> 64,
            diff & M32,
            diff >> 32,
            -borrow,
            (x + y) >> 64,
            0,
        ]

    run_case(dev, body, ref, rng)


def test_multiword_multiply_with_mad_carry(dev, rng):
    """``mad.cc``/``madc``: libdevice's double-precision argument reduction (``sin``/``cos``
    of large doubles) multiplies 64-bit words into 128 bits with this very chain; a module
    with it once failed to load ('mad.cc unsupported'), and every kernel in it with it."""
    body = """
    mov.b64 %rd10, {%r2, %r3};
    mov.b64 %rd11, {%r4, %r5};
    mad.lo.cc.u32 %r10, %r2, %r4, %r4;
    madc.hi.cc.u32 %r11, %r2, %r4, %r2;
    madc.hi.u32 %r12, %r2, %r5, 0;
    mad.lo.cc.u32 %r11, %r2, %r5, %r11;
    madc.hi.cc.u32 %r12, %r3, %r4, %r12;
    madc.hi.u32 %r13, %r3, %r5, 0;
    mad.lo.cc.u32 %r11, %r3, %r4, %r11;
    madc.lo.cc.u32 %r12, %r3, %r5, %r12;
    addc.u32 %r13, %r13, 0;
    mad.lo.cc.u64 %rd12, %rd10, %rd11, %rd10;
    madc.hi.u64 %rd13, %rd10, %rd11, 0;
    mov.b64 {%r14, %r15}, %rd12;
    mov.b64 {%r16, %r17}, %rd13;
    """

    def ref(a, b, c, d, t):
        x = (b << 32) | a
        y = (d << 32) | c
        w = x * y + ((a << 32) | c)  # the first chain's addend: lo word c, hi word a
        v = x * y + x
        return [(w >> (32 * k)) & M32 for k in range(4)] + [(v >> (32 * k)) & M32 for k in range(4)]

    run_case(dev, body, ref, rng)


def test_mad_carry_signed_high_half(dev, rng):
    """``madc.hi.s32`` adds to the *signed* product's high word; the carry out is the
    adder's, on the bits."""
    body = """
    add.cc.u32 %r20, %r4, %r5;
    madc.hi.cc.s32 %r10, %r2, %r3, %r4;
    addc.u32 %r11, 0, 0;
    mad.hi.cc.s32 %r12, %r2, %r3, %r5;
    addc.u32 %r13, 0, 0;
    """

    def ref(a, b, c, d, t):
        cin = (c + d) >> 32
        hi = ((s32(a) * s32(b)) >> 32) & M32
        r1 = hi + c + cin
        r2 = hi + d
        return [r1 & M32, r1 >> 32, r2 & M32, r2 >> 32, 0, 0, 0, 0]

    run_case(dev, body, ref, rng)


def test_glued_register_declarations(dev, rng):
    """``.reg.b32 f;`` (no space after ``.reg``), as cuda_fp16.h's inline assembly for
    ``hsqrt`` writes it: ptxas takes it, and a module using it once failed to load."""
    body = """
    {.reg.b32         f;
     .reg.b16         r;
      mov.b32         f, %r2;
      mov.b16         r, 7;
      cvt.u32.u16     %r11, r;
      add.u32         %r10, f, %r11;
    }
    """

    def ref(a, b, c, d, t):
        return [a + 7, 7, 0, 0, 0, 0, 0, 0]

    run_case(dev, body, ref, rng)


def test_shifts_clamp(dev, rng):
    body = """
    shl.b32 %r10, %r2, %r3;
    shr.u32 %r11, %r2, %r3;
    shr.s32 %r12, %r2, %r3;
    and.b32 %r20, %r3, 63;
    mov.b64 %rd10, {%r2, %r2};
    shl.b64 %rd11, %rd10, %r20;
    shr.s64 %rd12, %rd10, %r20;
    mov.b64 {%r13, %r14}, %rd11;
    mov.b64 {%r15, %r16}, %rd12;
    """

    def ref(a, b, c, d, t):
        sh = b
        x64 = (a << 32) | a
        sx64 = x64 - (1 << 64) if x64 >> 63 else x64
        n = b & 63
        l64 = (x64 << n) & (2**64 - 1)
        r64 = (sx64 >> n) & (2**64 - 1)
        return [
            (a << sh) if sh < 32 else 0,
            (a >> sh) if sh < 32 else 0,
            (s32(a) >> min(sh, 31)),
            l64 & M32,
            l64 >> 32,
            r64 & M32,
            r64 >> 32,
            0,
        ]

    run_case(dev, body, ref, rng)


def _bfe(a, pos, ln, signed):
    pos &= 0xFF
    ln &= 0xFF
    if signed:
        sbit_pos = min(pos + ln - 1, 31)
        sbit = 0 if ln == 0 else (a >> sbit_pos) & 1
    else:
        sbit = 0
    r = 0
    for i in range(32):
        if i < ln and pos + i <= 31:
            r |= ((a >> (pos + i)) & 1) << i
        else:
            r |= sbit << i
    return r


def _bfi(f, b, pos, ln):
    pos &= 0xFF
    ln &= 0xFF
    r = b
    for i in range(ln):
        if pos + i > 31:
            break
        r = (r & ~(1 << (pos + i))) | (((f >> i) & 1) << (pos + i))
    return r


def test_bitfields(dev, rng):
    body = """
    bfe.u32 %r10, %r2, %r4, %r5;
    bfe.s32 %r11, %r2, %r4, %r5;
    and.b32 %r20, %r4, 31;
    and.b32 %r21, %r5, 15;
    bfe.s32 %r12, %r2, %r20, %r21;
    bfi.b32 %r13, %r2, %r3, %r4, %r5;
    bfi.b32 %r14, %r2, %r3, %r20, %r21;
    bfind.u32 %r15, %r2;
    bfind.s32 %r16, %r2;
    bfind.shiftamt.u32 %r17, %r3;
    """

    def bfind(x, signed):
        if signed and x >> 31:
            x = ~x & M32
        return x.bit_length() - 1 if x else M32

    def ref(a, b, c, d, t):
        return [
            _bfe(a, c, d, False),
            _bfe(a, c, d, True),
            _bfe(a, c & 31, d & 15, True),
            _bfi(a, b, c, d),
            _bfi(a, b, c & 31, d & 15),
            bfind(a, False),
            bfind(a, True),
            (31 - (b.bit_length() - 1)) if b else M32,
        ]

    inputs = rng.integers(0, 2**32, (128, 4), dtype=np.uint64).astype(np.uint32)
    inputs[:64, 2] &= 63
    inputs[:64, 3] &= 63
    run_case(dev, body, ref, rng, inputs=inputs)


def _prmt(a, b, c, mode):
    src = a | (b << 32)
    byte = lambda i: (src >> (8 * i)) & 0xFF  # noqa: E731
    s = c & 3
    tabs = {
        "f4e": [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]],
        "b4e": [[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]],
        "rc8": [[0] * 4, [1] * 4, [2] * 4, [3] * 4],
        "ecl": [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]],
        "ecr": [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]],
        "rc16": [[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]],
    }
    if mode is None:
        out = 0
        for k in range(4):
            sel = (c >> (4 * k)) & 0xF
            v = byte(sel & 7)
            if sel & 8:
                v = 0xFF if v & 0x80 else 0
            out |= v << (8 * k)
        return out
    return sum(byte(tabs[mode][s][k]) << (8 * k) for k in range(4))


def test_prmt_modes(dev, rng):
    modes = [None, "f4e", "b4e", "rc8", "ecl", "ecr", "rc16"]
    lines = []
    for k, m in enumerate(modes):
        suffix = f".{m}" if m else ""
        lines.append(f"    prmt.b32{suffix} %r{10 + k}, %r2, %r3, %r4;")
    lines.append("    lop3.b32 %r17, %r2, %r3, %r4, 0xE8;")  # majority function

    def ref(a, b, c, d, t):
        out = [_prmt(a, b, c, m) for m in modes]
        return [*out, (a & b) | (a & c) | (b & c)]

    run_case(dev, "\n".join(lines), ref, rng)


def test_bit_counts_and_funnel(dev, rng):
    body = """
    popc.b32 %r10, %r2;
    clz.b32 %r11, %r2;
    brev.b32 %r12, %r2;
    mov.b64 %rd10, {%r2, %r3};
    popc.b64 %r13, %rd10;
    clz.b64 %r14, %rd10;
    shf.l.clamp.b32 %r15, %r2, %r3, %r4;
    shf.r.wrap.b32 %r16, %r2, %r3, %r4;
    mul24.lo.s32 %r17, %r2, %r3;
    """

    def ref(a, b, c, d, t):
        x = (b << 32) | a
        n = min(c, 32)
        lc = ((((b << 32) | a) << n) >> 32) & M32
        rw = (((b << 32) | a) >> (c & 31)) & M32
        s24 = lambda v: (v & 0xFFFFFF) - (1 << 24) if v & 0x800000 else v & 0xFFFFFF  # noqa: E731
        return [
            bin(a).count("1"),
            32 - a.bit_length(),
            int(f"{a:032b}"[::-1], 2),
            bin(x).count("1"),
            64 - x.bit_length(),
            lc,
            rw,
            s24(a) * s24(b),
        ]

    run_case(dev, body, ref, rng)


def test_integer_division_corners(dev, rng):
    body = """
    div.u32 %r10, %r2, %r3;
    rem.u32 %r11, %r2, %r3;
    div.s32 %r12, %r2, %r3;
    rem.s32 %r13, %r2, %r3;
    mul.hi.s32 %r14, %r2, %r3;
    mul.hi.u32 %r15, %r2, %r3;
    mov.b64 %rd11, {%r4, %r5};
    mad.wide.u32 %rd10, %r2, %r3, %rd11;
    mov.b64 {%r16, %r17}, %rd10;
    """

    def ref(a, b, c, d, t):
        sa, sb = s32(a), s32(b)
        if b == 0:  # what NVIDIA GPUs return
            q, r, sq, sr = M32, a, -1, sa
        else:
            q, r = a // b, a % b
            sq = abs(sa) // abs(sb) * (1 if (sa >= 0) == (sb >= 0) else -1)
            sr = sa - sq * sb
        w = (a * b + ((d << 32) | c)) & (2**64 - 1)
        return [q, r, sq, sr, (sa * sb) >> 32, (a * b) >> 32, w & M32, w >> 32]

    run_case(dev, body, ref, rng)


def test_float_compare_select(dev, rng):
    body = """
    mov.b32 %f1, %r2;
    mov.b32 %f2, %r3;
    setp.lt.f32 %p1, %f1, %f2;
    setp.ltu.f32 %p2, %f1, %f2;
    setp.ne.f32 %p3, %f1, %f2;
    setp.neu.f32 %p4, %f1, %f2;
    setp.nan.f32 %p5|%p6, %f1, %f2;
    setp.ge.and.f32 %p7, %f1, %f2, !%p5;
    selp.u32 %r10, 1, 0, %p1;
    selp.u32 %r11, 1, 0, %p2;
    selp.u32 %r12, 1, 0, %p3;
    selp.u32 %r13, 1, 0, %p4;
    selp.u32 %r14, 1, 0, %p6;
    selp.u32 %r15, 1, 0, %p7;
    testp.normal.f32 %p1, %f1;
    selp.u32 %r16, 1, 0, %p1;
    copysign.f32 %f3, %f1, %f2;
    mov.b32 %r17, %f3;
    """
    vals = [0.0, -0.0, 1.0, -2.5, float("nan"), float("inf"), 1e-40, -3e38]
    inputs = np.array(
        [[f2u(x), f2u(y), 0, 0] for x in vals for y in vals], dtype=np.uint32
    ).reshape(-1, 4)

    def ref(a, b, c, d, t):
        x, y = u2f(a), u2f(b)
        nan = math.isnan(x) or math.isnan(y)
        normal = math.isfinite(x) and abs(x) >= 2**-126
        return [
            int(x < y),
            int(nan or x < y),
            int(not nan and x != y),
            int(nan or x != y),
            int(not nan),
            int(x >= y and not nan),
            int(normal),
            f2u(math.copysign(y, x)) if not math.isnan(y) else None,
        ]

    run_case(dev, body, ref, rng, inputs=inputs)


def _f16(h: int) -> float:
    return float(np.uint16(h & 0xFFFF).view(np.float16))


def _bf16(h: int) -> float:
    return u2f((h & 0xFFFF) << 16)


def test_half_precision_set_and_setp(dev, rng):
    """The PTX ISA's half precision comparisons: packed halves compare low with low and high
    with high (p|q, or one result per half of d), 1.0 in a half destination, 0xffff per half
    in .u32 from packed halves, all ones in .u16; .ftz flushes f16 subnormals first (CUB's
    radix sort of halves uses ``set.nan.f16.f16``)."""
    body = """
    set.lt.f16x2.f16x2 %r10, %r2, %r3;
    set.nan.u32.f16x2 %r11, %r2, %r3;
    mov.b32 {%h1, %h2}, %r2;
    mov.b32 {%h3, %h4}, %r3;
    set.nan.f16.f16 %h5, %h1, %h3;
    set.gtu.u16.f16 %h6, %h2, %h4;
    mov.b32 %r12, {%h5, %h6};
    setp.ge.f16x2 %p1|%p2, %r2, %r3;
    selp.u32 %r13, 1, 0, %p1;
    selp.u32 %r14, 2, 0, %p2;
    or.b32 %r13, %r13, %r14;
    set.le.and.bf16x2.bf16x2 %r14, %r2, %r3, %p1;
    set.eq.ftz.s32.f16x2 %r15, %r2, %r3;
    set.ne.bf16.bf16 %h7, %h1, %h3;
    setp.equ.bf16x2 %p3|%p4, %r2, %r3;
    selp.u32 %r16, 1, 0, %p3;
    selp.u32 %r17, 2, 0, %p4;
    or.b32 %r16, %r16, %r17;
    cvt.u32.u16 %r17, %h7;
    """
    halves = [0x0000, 0x8000, 0x0001, 0x3C00, 0xBC00, 0x7C00, 0x7E00, 0x3F80, 0xFF80, 0x7FC0]
    words = [lo | (hi << 16) for lo in halves for hi in halves[::3]]
    inputs = rng.integers(0, 2**32, (len(words) * 4, 4), dtype=np.uint64).astype(np.uint32)
    for i in range(len(inputs)):
        inputs[i, 0] = words[i % len(words)]
        inputs[i, 1] = words[(i * 7 + i // len(words)) % len(words)]

    def parts(w: int, conv, ftz: bool = False) -> list[float]:
        out = [conv(w), conv(w >> 16)]
        return [0.0 if ftz and abs(v) < 2**-14 else v for v in out]

    def pack(t0: bool, t1: bool, one: int) -> int:
        return (one if t0 else 0) | ((one if t1 else 0) << 16)

    def ref(a, b, c, d, t):
        fa, fb = parts(a, _f16), parts(b, _f16)
        ba, bb = parts(a, _bf16), parts(b, _bf16)
        za, zb = parts(a, _f16, True), parts(b, _f16, True)
        nan = [math.isnan(x) or math.isnan(y) for x, y in zip(fa, fb, strict=True)]
        bnan = [math.isnan(x) or math.isnan(y) for x, y in zip(ba, bb, strict=True)]
        ge = [x >= y for x, y in zip(fa, fb, strict=True)]
        return [
            pack(fa[0] < fb[0], fa[1] < fb[1], 0x3C00),
            pack(nan[0], nan[1], 0xFFFF),
            (0x3C00 if nan[0] else 0) | ((0xFFFF if nan[1] or fa[1] > fb[1] else 0) << 16),
            int(ge[0]) | (2 * int(ge[1])),
            pack(ba[0] <= bb[0] and ge[0], ba[1] <= bb[1] and ge[0], 0x3F80),
            pack(za[0] == zb[0], za[1] == zb[1], 0xFFFF),
            int(bnan[0] or ba[0] == bb[0]) | (2 * int(bnan[1] or ba[1] == bb[1])),
            0x3F80 if (not bnan[0] and ba[0] != bb[0]) else 0,
        ]

    run_case(dev, body, ref, rng, inputs=inputs)


def test_int_saturating_cvt(dev, rng):
    body = """
    cvt.sat.s8.s32 %h1, %r2;
    cvt.s32.s8 %r10, %h1;
    cvt.sat.u8.s32 %h2, %r2;
    cvt.u32.u16 %r11, %h2;
    cvt.sat.u16.u32 %h3, %r2;
    cvt.u32.u16 %r12, %h3;
    cvt.s16.s32 %h4, %r2;
    cvt.s32.s16 %r13, %h4;
    mov.b32 %f1, %r3;
    cvt.rni.s32.f32 %r14, %f1;
    cvt.rzi.u32.f32 %r15, %f1;
    cvt.rmi.s32.f32 %r16, %f1;
    cvt.rn.f16.f32 %h5, %f1;
    cvt.u32.u16 %r17, %h5;
    """
    fv = [0.5, 1.5, 2.5, -0.5, -1.5, -7.7, 3e9, -3e9, float("nan"), 65519.0, 65520.0, 1e-7]
    inputs = rng.integers(0, 2**32, (len(fv) * 4, 4), dtype=np.uint64).astype(np.uint32)
    for i in range(inputs.shape[0]):
        inputs[i, 1] = f2u(fv[i % len(fv)])

    def ref(a, b, c, d, t):
        sa = s32(a)
        x = u2f(b)
        sat = lambda v, lo, hi: max(lo, min(hi, v))  # noqa: E731

        def f2i(v, mode, lo, hi):
            if math.isnan(v):
                return 0
            return sat(int(mode(v)), lo, hi)

        h = int(np.array([x], np.float32).astype(np.float16).view(np.uint16)[0])
        return [
            sat(sa, -128, 127),
            sat(sa, 0, 255),
            sat(a, 0, 65535),
            s32(((a & 0xFFFF) ^ 0x8000) - 0x8000),
            f2i(x, lambda v: float(np.rint(v)), -(2**31), 2**31 - 1),
            f2i(x, math.trunc, 0, 2**32 - 1),
            f2i(x, math.floor, -(2**31), 2**31 - 1),
            h,
        ]

    with np.errstate(over="ignore"):
        run_case(dev, body, ref, rng, inputs=inputs)


def test_warp_vote_match_redux_shfl_clamp(dev, rng):
    body = """
    and.b32 %r20, %r2, 3;
    setp.eq.u32 %p1, %r20, 0;
    vote.sync.uni.pred %p2, %p1, 0xffffffff;
    selp.u32 %r10, 1, 0, %p2;
    match.any.sync.b32 %r11, %r20, 0xffffffff;
    redux.sync.min.u32 %r12, %r2, 0xffffffff;
    redux.sync.xor.b32 %r13, %r2, 0x0000ffff;
    shfl.sync.up.b32 %r14|%p3, %r2, 3, 0x1800, 0xffffffff;
    selp.u32 %r15, 1, 0, %p3;
    shfl.sync.idx.b32 %r16, %r2, %r3, 0x1f, 0xffffffff;
    mov.u32 %r21, %laneid;
    mov.u32 %r22, %lanemask_lt;
    add.u32 %r17, %r21, %r22;
    """
    threads = 64
    inputs = rng.integers(0, 2**32, (threads, 4), dtype=np.uint64).astype(np.uint32)
    inputs[:32, 0] &= ~np.uint32(3)  # first warp: uniform predicate

    def ref(a, b, c, d, t):
        w = t // 32
        lane = t % 32
        warp = inputs[w * 32 : (w + 1) * 32, 0].astype(np.int64)
        keys = warp & 3
        mask = sum(1 << i for i in range(32) if keys[i] == (a & 3))
        p = keys == 0
        seg = (lane // 8) * 8  # c = 0x1800: segments of 8 lanes
        src = lane - 3
        ok = src >= seg
        xr = 0
        for i in range(16):
            xr ^= int(warp[i])
        return [
            int(p.all() or (~p).all()),
            mask,
            int(warp.min()),
            xr,
            int(warp[src]) if ok else a,
            int(ok),
            int(warp[b & 31]),
            lane + ((1 << lane) - 1),
        ]

    run_case(dev, body, ref, rng, inputs=inputs)


def test_mixed_generic_windows_in_one_instruction(dev, rng):
    # even lanes point into shared memory, odd lanes into global memory, through one ld/st
    body = """
    mov.u64 %rd20, sh;
    cvta.shared.u64 %rd21, %rd20;
    mul.wide.u32 %rd22, %r1, 8;
    add.s64 %rd23, %rd21, %rd22;
    add.s64 %rd24, %rd4, 8;
    and.b32 %r20, %r1, 1;
    setp.eq.u32 %p1, %r20, 0;
    selp.b64 %rd25, %rd23, %rd24, %p1;
    st.u32 [%rd25], %r2;
    ld.u32 %r10, [%rd25];
    isspacep.shared %p2, %rd25;
    selp.u32 %r11, 1, 0, %p2;
    cvta.to.shared.u64 %rd26, %rd23;
    cvt.u32.u64 %r12, %rd26;
    atom.add.u32 %r13, [%rd25], 5;
    ld.u32 %r14, [%rd25];
    """

    def ref(a, b, c, d, t):
        return [a, int(t % 2 == 0), 8 * t, a, a + 5, 0, 0, 0]

    run_case(dev, body, ref, rng)


def test_atomics_long_runs(dev, rng):
    # every thread hits one shared word with inc/dec/exch/cas and one global float with red.add
    body = """
    mov.u32 %r20, sh;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 st.shared.u32 [%r20], 7;
    @%p1 st.shared.u32 [%r20+4], 3;
    @%p1 st.shared.u32 [%r20+8], 0;
    bar.sync 0;
    atom.shared.inc.u32 %r10, [%r20], 9;
    atom.shared.dec.u32 %r11, [%r20+4], 5;
    atom.shared.exch.b32 %r12, [%r20+8], %r1;
    bar.sync 0;
    ld.shared.u32 %r13, [%r20];
    ld.shared.u32 %r14, [%r20+4];
    ld.shared.u32 %r15, [%r20+8];
    atom.shared.cas.b32 %r16, [%r20+12], %r1, 1000;
    bar.red.popc.u32 %r17, 0, %p1;
    """
    threads = 100

    def inc(k):
        v = 7
        for _ in range(k):
            v = 0 if v >= 9 else v + 1
        return v

    def dec(k):
        v = 3
        for _ in range(k):
            v = 5 if (v == 0 or v > 5) else v - 1
        return v

    def ref(a, b, c, d, t):
        return [inc(t), dec(t), 0 if t == 0 else t - 1, inc(threads), dec(threads), threads - 1,
                0 if t == 0 else 1000, 1]  # fmt: skip

    inputs = np.zeros((threads, 4), np.uint32)
    run_case(dev, body, ref, rng, inputs=inputs)


def test_exit_and_guarded_ret(dev, rng):
    body = """
    and.b32 %r20, %r1, 3;
    setp.eq.u32 %p1, %r20, 1;
    setp.eq.u32 %p2, %r20, 2;
    mov.u32 %r10, 11;
    @%p1 bra $L_done;
    mov.u32 %r11, 22;
    @%p2 bra $L_done;
    mov.u32 %r12, 33;
$L_done:
    setp.eq.u32 %p3, %r20, 3;
    @%p3 mov.u32 %r13, 44;
    """

    def ref(a, b, c, d, t):
        k = t & 3
        return [11, 0 if k == 1 else 22, 33 if k in (0, 3) else 0, 44 if k == 3 else 0, 0, 0, 0, 0]

    run_case(dev, body, ref, rng)


def test_cp_async_global_to_shared(dev, rng):
    body = """
    mov.u32 %r20, sh;
    mul.lo.u32 %r21, %r1, 16;
    add.u32 %r22, %r20, %r21;
    cp.async.ca.shared.global [%r22], [%rd4], 16;
    cp.async.commit_group;
    cp.async.wait_group 0;
    ld.shared.v4.u32 {%r10, %r11, %r12, %r13}, [%r22];
    cp.async.cg.shared.global [%r22], [%rd4], 16, 4;
    cp.async.wait_all;
    ld.shared.v4.u32 {%r14, %r15, %r16, %r17}, [%r22];
    """

    def ref(a, b, c, d, t):
        return [a, b, c, d, a, 0, 0, 0]

    run_case(dev, body, ref, rng)


def test_cp_async_register_src_size_and_ignore_src(dev, rng):
    """cuBLAS's tile loads: the bytes read come from a register (0, 4, 8 or 12 here, the rest
    zero-filled) and a lane reading none may hold an address nothing maps (here 0); the
    ignore-src predicate form reads nothing where it is true."""
    body = """
    mov.u32 %r20, sh;
    mul.lo.u32 %r21, %r1, 16;
    add.u32 %r22, %r20, %r21;
    and.b32 %r23, %r1, 3;
    shl.b32 %r24, %r23, 2;
    setp.eq.u32 %p1, %r23, 0;
    selp.b64 %rd20, 0, %rd4, %p1;
    cp.async.cg.shared.global.L2::128B [%r22], [%rd20], 16, %r24;
    cp.async.wait_all;
    ld.shared.v4.u32 {%r10, %r11, %r12, %r13}, [%r22];
    setp.eq.u32 %p2, %r23, 1;
    cp.async.ca.shared.global [%r22], [%rd4], 16, %p2;
    ld.shared.v4.u32 {%r14, %r15, %r16, %r17}, [%r22];
    """

    def ref(a, b, c, d, t):
        k = t & 3
        read = [a, b, c, d][:k] + [0] * (4 - k)
        return read + ([0, 0, 0, 0] if k == 1 else [a, b, c, d])

    run_case(dev, body, ref, rng)


def test_kernel_parameter_addresses(dev, rng):
    # CUB's pattern: the .param-space address of a kernel parameter (mov of its name), loads
    # through it, and its generic form (cvta.param) read by a plain ld
    body = """
    mov.u64 %rd20, pout;
    ld.param.u64 %rd21, [%rd20];
    cvta.param.u64 %rd22, %rd20;
    ld.u64 %rd23, [%rd22];
    mov.u64 %rd24, pin;
    cvta.param.u64 %rd25, %rd24;
    ld.u32 %r20, [%rd25+8];
    setp.eq.u64 %p1, %rd21, %rd2;
    setp.eq.u64 %p2, %rd23, %rd2;
    selp.u32 %r10, 1, 0, %p1;
    selp.u32 %r11, 1, 0, %p2;
    cvt.u32.u64 %r12, %rd20;
    isspacep.param %p3, %rd22;
    selp.u32 %r13, 1, 0, %p3;
    isspacep.global %p4, %rd22;
    selp.u32 %r14, 1, 0, %p4;
    cvta.to.param.u64 %rd26, %rd22;
    cvt.u32.u64 %r15, %rd26;
    setp.eq.u32 %p5, %r20, %r20;
    cvt.u32.u64 %r21, %rd2;
    setp.eq.u32 %p6, %r20, %r21;
    selp.u32 %r16, 1, 0, %p6;
    """

    def ref(a, b, c, d, t):
        return [1, 1, 8, 1, 0, 8, 1, 0]

    run_case(dev, body, ref, rng)


def test_store_through_kernel_parameter_address_faults(dev):
    prog = load_ptx(
        TEMPLATE.format(
            body="""
    mov.u64 %rd20, pout;
    cvta.param.u64 %rd21, %rd20;
    st.u64 [%rd21], %rd1;
    """
        )
    )
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "t", 1, 4, [Ptr(dev.zeros(16, np.uint32)), Ptr(dev.zeros(32, np.uint32))])
    assert e.value.code == 700 and "read-only" in str(e.value)


def test_load_past_kernel_parameters_faults(dev):
    prog = load_ptx(
        TEMPLATE.format(
            body="""
    mov.u64 %rd20, pout;
    ld.param.u64 %rd21, [%rd20+64];
    """
        )
    )
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "t", 1, 4, [Ptr(dev.zeros(16, np.uint32)), Ptr(dev.zeros(32, np.uint32))])
    assert e.value.code == 700 and "outside the 16 bytes of kernel parameters" in str(e.value)
