"""Every served ``mma.sync`` form in hand-written PTX: the host packs each lane's A, B and C
registers at the positions the PTX ISA's fragment tables give (written out here per form,
independently of the interpreter's table), one warp runs the instruction, and the host unpacks
D the same way and compares with NumPy: exactly where every partial sum is exact (small
integers, or integer-valued floats) and for the integer forms."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import load_ptx
from crane.backends.sim.ptx.narrowfp import NARROW, encode

G = np.arange(32) >> 2  # groupID per lane
T = np.arange(32) & 3  # threadID_in_group per lane


def c16(i):  # the m16n8 C/D fragment: c0..c3
    return G + 8 * (i >= 2), 2 * T + (i & 1)


def c8(i):  # the m8n8 C/D fragment: c0, c1
    return G, 2 * T + i


# form -> (M, N, K, a-type, c-type, A(i), #A, B(i), #B, C(i), #C), element positions per lane
FORMS = {
    "m16n8k8.row.col.f32.f16.f16.f32": (
        16,
        8,
        8,
        "f16",
        "f32",
        lambda i: (G + 8 * (i >= 2), 2 * T + (i & 1)),
        4,
        lambda i: (2 * T + i, G),
        2,
        c16,
        4,
    ),
    "m16n8k16.row.col.f32.bf16.bf16.f32": (
        16,
        8,
        16,
        "bf16",
        "f32",
        lambda i: (G + 8 * ((i % 4) >= 2), 2 * T + (i & 1) + 8 * (i >= 4)),
        8,
        lambda i: (2 * T + (i & 1) + 8 * (i >= 2), G),
        4,
        c16,
        4,
    ),
    "m16n8k16.row.col.f16.f16.f16.f32": (
        16,
        8,
        16,
        "f16",
        "f32",
        lambda i: (G + 8 * ((i % 4) >= 2), 2 * T + (i & 1) + 8 * (i >= 4)),
        8,
        lambda i: (2 * T + (i & 1) + 8 * (i >= 2), G),
        4,
        c16,
        4,
    ),
    "m16n8k4.row.col.f32.tf32.tf32.f32": (
        16,
        8,
        4,
        "tf32",
        "f32",
        lambda i: (G + 8 * i, T),
        2,
        lambda i: (T, G),
        1,
        c16,
        4,
    ),
    "m16n8k8.row.col.f32.tf32.tf32.f32": (
        16,
        8,
        8,
        "tf32",
        "f32",
        lambda i: (G + 8 * (i % 2), T + 4 * (i >= 2)),
        4,
        lambda i: (T + 4 * i, G),
        2,
        c16,
        4,
    ),
    "m8n8k16.row.col.s32.s8.u8.s32": (
        8,
        8,
        16,
        ("s8", "u8"),
        "s32",
        lambda i: (G, 4 * T + i),
        4,
        lambda i: (4 * T + i, G),
        4,
        c8,
        2,
    ),
    "m16n8k16.row.col.s32.u8.s8.s32": (
        16,
        8,
        16,
        ("u8", "s8"),
        "s32",
        lambda i: (G + 8 * (i >= 4), 4 * T + (i % 4)),
        8,
        lambda i: (4 * T + i, G),
        4,
        c16,
        4,
    ),
    "m16n8k32.row.col.s32.s8.s8.s32": (
        16,
        8,
        32,
        "s8",
        "s32",
        lambda i: (G + 8 * ((i // 4) % 2), 4 * T + (i % 4) + 16 * (i >= 8)),
        16,
        lambda i: (4 * T + (i % 4) + 16 * (i >= 4), G),
        8,
        c16,
        4,
    ),
    "m16n8k32.row.col.f32.e4m3.e5m2.f32": (
        16,
        8,
        32,
        ("e4m3", "e5m2"),
        "f32",
        lambda i: (G + 8 * ((i // 4) % 2), 4 * T + (i % 4) + 16 * (i >= 8)),
        16,
        lambda i: (4 * T + (i % 4) + 16 * (i >= 4), G),
        8,
        c16,
        4,
    ),
    "m16n8k16.row.col.f32.e5m2.e5m2.f32": (
        16,
        8,
        16,
        "e5m2",
        "f32",
        lambda i: (G + 8 * (i >= 4), 4 * T + (i % 4)),
        8,
        lambda i: (4 * T + i, G),
        4,
        c16,
        4,
    ),
    "m16n8k4.row.col.f64.f64.f64.f64": (
        16,
        8,
        4,
        "f64",
        "f64",
        lambda i: (G + 8 * i, T),
        2,
        lambda i: (T, G),
        1,
        c16,
        4,
    ),
    "m16n8k8.row.col.f64.f64.f64.f64": (
        16,
        8,
        8,
        "f64",
        "f64",
        lambda i: (G + 8 * (i % 2), T + 4 * (i >= 2)),
        4,
        lambda i: (T + 4 * i, G),
        2,
        c16,
        4,
    ),
    "m16n8k16.row.col.f64.f64.f64.f64": (
        16,
        8,
        16,
        "f64",
        "f64",
        lambda i: (G + 8 * (i % 2), T + 4 * (i // 2)),
        8,
        lambda i: (T + 4 * i, G),
        4,
        c16,
        4,
    ),
}


def _bits(x: np.ndarray, ty: str) -> np.ndarray:
    """Values -> each element's raw bits (uint64)."""
    if ty == "f16":
        return x.astype(np.float16).view(np.uint16).astype(np.uint64)
    if ty == "bf16":
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint64)
    if ty in ("f32", "tf32"):
        return x.astype(np.float32).view(np.uint32).astype(np.uint64)
    if ty == "f64":
        return x.astype(np.float64).view(np.uint64)
    if ty in ("s8", "u8"):
        return (x.astype(np.int64) & 0xFF).astype(np.uint64)
    if ty in NARROW:
        return encode(x, NARROW[ty]).astype(np.uint64)
    return (x.astype(np.int64) & 0xFFFFFFFF).astype(np.uint64)


def _pack(mat, ty, pos, n):
    """Lane registers (32, regs) holding ``mat`` at the fragment positions ``pos(i)``."""
    per = {"f16": 2, "bf16": 2, "s8": 4, "u8": 4, "e4m3": 4, "e5m2": 4}.get(ty, 1)
    width = 32 // per
    regs = np.zeros((32, n // per), np.uint64)
    for i in range(n):
        r, c = pos(i)
        regs[:, i // per] |= _bits(mat[r, c], ty) << np.uint64(width * (i % per))
    return regs


def _kernel(form: str, na: int, nb: int, nc: int, nd: int, wide: bool) -> str:
    b = "b64" if wide else "b32"
    sz = 8 if wide else 4
    lines = []

    def load(prefix, ptr, n):
        names = [f"%{prefix}{j}" for j in range(n)]
        lines.append(f"mul.wide.u32 %rd9, %r1, {n * sz};")
        lines.append(f"add.s64 %rd10, {ptr}, %rd9;")
        for j, nm in enumerate(names):
            lines.append(f"ld.global.{b} {nm}, [%rd10+{j * sz}];")
        return "{" + ", ".join(names) + "}"

    a = load("a", "%rd1", na)
    bb = load("b", "%rd2", nb)
    c = load("c", "%rd3", nc)
    d = "{" + ", ".join(f"%d{j}" for j in range(nd)) + "}"
    lines.append(f"mma.sync.aligned.{form} {d}, {a}, {bb}, {c};")
    lines.append(f"mul.wide.u32 %rd9, %r1, {nd * sz};")
    lines.append("add.s64 %rd10, %rd4, %rd9;")
    for j in range(nd):
        lines.append(f"st.global.{b} [%rd10+{j * sz}], %d{j};")
    body = "\n    ".join(lines)
    return f"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry t(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd)
{{
    .reg .b32 %r<4>;
    .reg .b64 %rd<12>;
    .reg .{b} %a<16>, %b<8>, %c<4>, %d<4>;
    .reg .b32 %h<4>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u64 %rd4, [pd];
    mov.u32 %r1, %laneid;
    {body}
    ret;
}}
"""


@pytest.mark.parametrize("form", list(FORMS))
def test_mma_form(dev, rng, form: str) -> None:
    m, n, k, aty, cty, fa, na, fb, nb, fc, nc = FORMS[form]
    dty = form.split(".")[3]
    aty, bty = aty if isinstance(aty, tuple) else (aty, aty)
    ints = aty in ("s8", "u8")

    def draw(shape, ty):
        if ty == "s8":
            return rng.integers(-128, 128, shape)
        if ty == "u8":
            return rng.integers(0, 256, shape)
        if ty == "s32":
            return rng.integers(-(2**31), 2**31, shape)
        return rng.integers(-8, 9, shape).astype(np.float64) / 4  # exact in every type (FP8 too)

    a, b, c = draw((m, k), aty), draw((k, n), bty), draw((m, n), cty)
    per_d = 2 if dty == "f16" else 1
    nd = nc // per_d if dty == "f16" else nc
    wide = aty == "f64"
    ra, rb, rc = _pack(a, aty, fa, na), _pack(b, bty, fb, nb), _pack(c, cty, fc, nc)
    dt = np.uint64 if wide else np.uint32
    args = [
        dev.upload(ra.astype(dt)),
        dev.upload(rb.astype(dt)),
        dev.upload(rc.astype(dt)),
        dev.zeros(32 * nd, dt),
    ]
    dev.launch(
        load_ptx(_kernel(form, ra.shape[1], rb.shape[1], rc.shape[1], nd, wide)),
        "t",
        1,
        32,
        [Ptr(p) for p in args],
    )
    got_regs = dev.download(args[3], 32 * nd, dt).reshape(32, nd).astype(np.uint64)
    # integers wrap; the floats are small multiples of 1/4: exact in every accumulation order
    want = (a.astype(np.int64) @ b.astype(np.int64) + c).astype(np.int32) if ints else a @ b + c
    for i in range(nc):
        r, col = fc(i)
        if dty == "f16":
            bits = (got_regs[:, i // 2] >> np.uint64(16 * (i % 2))) & np.uint64(0xFFFF)
            got = bits.astype(np.uint16).view(np.float16).astype(np.float64)
        elif dty == "f64":
            got = got_regs[:, i].view(np.float64)
        elif dty == "f32":
            got = got_regs[:, i].astype(np.uint32).view(np.float32).astype(np.float64)
        else:
            got = got_regs[:, i].astype(np.uint32).view(np.int32)
        np.testing.assert_array_equal(got, want[r, col], err_msg=f"element {i}")
