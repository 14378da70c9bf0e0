"""Integer intrinsics and 64-bit arithmetic, bit-exact against NumPy/Python references."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import blocks, i32

M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF


def s32(x: int) -> int:
    x &= M32
    return x - (1 << 32) if x >> 31 else x


def s64(x: int) -> int:
    x &= M64
    return x - (1 << 64) if x >> 63 else x


def byte_perm(x: int, y: int, s: int) -> int:
    src = x | (y << 32)
    out = 0
    for k in range(4):
        sel = (s >> (4 * k)) & 7
        out |= ((src >> (8 * sel)) & 0xFF) << (8 * k)
    return out


def ffs(x: int, bits: int) -> int:
    x &= (1 << bits) - 1
    return (x & -x).bit_length()


def clz(x: int, bits: int) -> int:
    return bits - (x & ((1 << bits) - 1)).bit_length()


def brev(x: int, bits: int) -> int:
    return int(f"{x & ((1 << bits) - 1):0{bits}b}"[::-1], 2)


def tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def intops32_ref(x: int, y: int) -> list[int]:
    sx, sy = s32(x), s32(y)
    o = [0] * 24
    o[0] = (x * y) >> 32
    o[1] = (sx * sy) >> 32
    o[2] = bin(x).count("1")
    o[3] = clz(x, 32)
    o[4] = brev(x, 32)
    o[5] = byte_perm(x, y, 0x5140)
    o[6] = byte_perm(x, y, y & 0x7777)
    o[7] = ffs(sx, 32)
    o[8] = (x >> (y & 31)) & 0x3FF
    o[9] = (x & ~(0xFF << 8)) | ((y & 0xFF) << 8)
    n = sx & 31
    o[10] = (((y << 32) | x) << n) >> 32
    o[11] = ((y << 32) | x) >> n
    o[12] = tdiv(sx, sy) if sy else 0
    o[13] = (sx - tdiv(sx, sy) * sy) if sy else 0
    o[14] = x // y if y else 0
    o[15] = x % y if y else 0
    o[16] = max(sx, sy) ^ min(x, y)
    o[17] = abs(sx)
    o[18] = abs(sx - sy) + 7
    o[19] = (sx >> (y & 31)) + (x << (y & 15))
    o[20] = byte_perm(x, 0, 0x0123)
    o[21] = s32(x & 0xFF if (x & 0xFF) < 128 else (x & 0xFF) - 256) * s32(
        (y >> 16) if (y >> 16) < 32768 else (y >> 16) - 65536
    )
    o[22] = x * y + (x ^ y)
    o[23] = 5 + sum(((x >> (8 * k)) & 0xFF) * ((y >> (8 * k)) & 0xFF) for k in range(4))
    return [v & M32 for v in o]


@pytest.mark.parametrize("n", (1, 300))
def test_intops32(program, arch, dev, rng, n):
    prog = program("intops", arch)
    a = rng.integers(0, 2**32, n, dtype=np.uint32)
    b = rng.integers(0, 2**32, n, dtype=np.uint32)
    special = [0, 1, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 31, 32, 0xFFFFFFE0]
    for i, (x, y) in enumerate((p, q) for p in special for q in special):
        if i < n:
            a[i], b[i] = x, y
    pa, pb, po = dev.upload(a), dev.upload(b), dev.zeros(24 * n, np.uint32)
    dev.launch(prog, "intops32", blocks(n, 128), 128, [pa, pb, po, i32(n)])
    out = dev.download(po, 24 * n, np.uint32).reshape(n, 24)
    for i in range(n):
        ref = intops32_ref(int(a[i]), int(b[i]))
        assert [int(v) for v in out[i]] == ref, (i, hex(a[i]), hex(b[i]))


def intops64_ref(x: int, y: int) -> list[int]:
    sx, sy = s64(x), s64(y)
    o = [0] * 16
    o[0] = x * y
    o[1] = (x * y) >> 64
    o[2] = (sx * sy) >> 64
    o[3] = x // y if y else 0
    o[4] = x % y if y else 0
    o[5] = tdiv(sx, sy) if sy else 0
    o[6] = (sx - tdiv(sx, sy) * sy) if sy else 0
    o[7] = bin(x).count("1") + 100 * clz(y, 64)
    o[8] = brev(x, 64)
    o[9] = x << (y & 63)
    o[10] = sx >> (y & 63)
    o[11] = x + y + (1 if x < y else 0)
    o[12] = (x & M32) * (y >> 32)
    o[13] = s32(x) * s32(y)
    o[14] = ffs(sx, 64)
    o[15] = (x >> 7) ^ ((y << 9) & M64) ^ (~x & M64)
    return [v & M64 for v in o]


@pytest.mark.parametrize("n", (1, 200))
def test_intops64(program, arch, dev, rng, n):
    prog = program("intops", arch)
    a = rng.integers(0, 2**64, n, dtype=np.uint64)
    b = rng.integers(0, 2**64, n, dtype=np.uint64)
    b[: n // 4] >>= np.uint64(40)  # small divisors take the 32-bit division path
    special = [0, 1, M64, 1 << 63, (1 << 63) - 1, 0xFFFFFFFF, 1 << 32]
    for i, (x, y) in enumerate((p, q) for p in special for q in special):
        if i < n:
            a[i], b[i] = x, y
    pa, pb, po = dev.upload(a), dev.upload(b), dev.zeros(16 * n, np.uint64)
    dev.launch(prog, "intops64", blocks(n, 64), 64, [pa, pb, po, i32(n)])
    out = dev.download(po, 16 * n, np.uint64).reshape(n, 16)
    for i in range(n):
        ref = intops64_ref(int(a[i]), int(b[i]))
        assert [int(v) for v in out[i]] == ref, (i, hex(a[i]), hex(b[i]))
