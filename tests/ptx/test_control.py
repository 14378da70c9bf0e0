"""Divergence, data-dependent loops, early exit, switch, non-inlined device functions,
constant/global/local memory and generic pointers."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import blocks, f32, fma32_ref, i32


def _collatz(x: int, cap: int) -> int:
    if x == 0:
        return -1
    s = 0
    while x != 1:
        x = 3 * x + 1 if x & 1 else x >> 1
        s += 1
        if s >= cap:
            return -2
    return s


@pytest.mark.parametrize(("n", "cap"), [(1, 1000), (500, 1000), (2000, 60)])
def test_collatz_data_dependent_loop(program, arch, dev, rng, n, cap):
    prog = program("control", arch)
    x = rng.integers(0, 100000, n, dtype=np.uint32)
    x[0] = 0
    px, po = dev.upload(x), dev.zeros(n, np.int32)
    dev.launch(prog, "collatz", blocks(n, 128), 128, [px, po, i32(n), i32(cap)])
    assert list(dev.download(po, n, np.int32)) == [_collatz(int(v), cap) for v in x]


@pytest.mark.parametrize(("rows", "rowlen"), [(1, 5), (300, 17)])
def test_find_first_early_return(program, arch, dev, rng, rows, rowlen):
    prog = program("control", arch)
    data = rng.integers(-3, 8, (rows, rowlen), dtype=np.int32)
    pd, pw = dev.upload(data), dev.zeros(rows, np.int32)
    dev.launch(prog, "find_first", blocks(rows, 64), 64, [pd, i32(rowlen), i32(5), pw, i32(rows)])
    ref = [next((j for j in range(rowlen) if data[r, j] == 5), -1) for r in range(rows)]
    assert list(dev.download(pw, rows, np.int32)) == ref


@pytest.mark.parametrize("n", (8, 1000))
def test_switch(program, arch, dev, rng, n):
    prog = program("control", arch)
    v = rng.integers(-(10**6), 10**6, n, dtype=np.int32)
    pv, po = dev.upload(v), dev.zeros(n, np.int32)
    dev.launch(prog, "switcher", blocks(n, 64), 64, [pv, po, i32(n)])

    def ref(x: int) -> int:
        k = x & 7
        return [
            x * 3,
            x - 100,
            x ^ 0x5A5A,
            -x,
            (x << 3) & 0xFFFFFFFF,
            int(x / 7),
            int(np.fmod(x, 11)),
            42,
        ][k]

    got = dev.download(po, n, np.int32)
    assert [int(g) for g in got] == [
        np.int32(np.uint32(ref(int(x)) & 0xFFFFFFFF).view(np.int32)) for x in v
    ]


@pytest.mark.parametrize("n", (1, 77, 1000))
def test_noinline_device_functions(program, arch, dev, rng, n):
    prog = program("devfunc", arch)
    v = rng.integers(-100, 100, n, dtype=np.int32)
    pv, po, pf = dev.upload(v), dev.zeros(3 * n, np.int32), dev.zeros(n, np.float32)
    dev.launch(prog, "use_devfuncs", blocks(n, 64), 64, [pv, po, pf, i32(n)])
    out = dev.download(po, 3 * n, np.int32).reshape(n, 3)
    for i, x in enumerate(v.astype(np.int64)):
        r = 3 * x * x - 2 * x + 1 if x & 1 else -(x * x + x + 1)
        for k in range(int(x) & 3):
            r += x * k * k + k + 1
        seg = v[(i // 8) * 8 : min((i // 8) * 8 + 8, n)]
        assert list(out[i]) == [np.int32(r), seg.min(), seg.max()], i
    a = v.astype(np.float32)
    b = (v * 3).astype(np.float32)

    def mix(a, b, t):
        return fma32_ref(b - a, np.float32(t), a)

    ref = mix(a, b, 0.25) + mix(b, a, 0.5)
    assert np.array_equal(dev.download(pf, n, np.float32), ref)


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


@pytest.mark.parametrize("n", (1, 70))
def test_recursion_direct_mutual_and_local_frames(program, arch, dev, rng, n):
    prog = program("recursion", arch)
    v = rng.integers(0, 3000, n, dtype=np.int32)
    v[0] = 12345 if n > 1 else v[0]
    pv, po = dev.upload(v), dev.zeros(4 * n, np.int32)
    dev.launch(prog, "use_recursion", blocks(n, 64), 64, [pv, po, i32(n)])
    out = dev.download(po, 4 * n, np.int32).reshape(n, 4)
    for i, x in enumerate(v.tolist()):
        m = x % 50
        want = [_fib(x % 20), int(x % 500 % 2 == 0), sum(map(int, str(x))), m * (m + 1) // 2]
        assert list(out[i]) == want, (i, x)


def test_recursion_depth_and_stack_overflow(program, arch, dev):
    from crane.backends.sim.ptx import KernelFault

    prog = program("recursion", arch)
    po = dev.zeros(1, np.int64)
    dev.launch(prog, "deep", 1, 1, [np.int64(600).tobytes(), po])
    assert int(dev.download(po, 1, np.int64)[0]) == 600 * 601 // 2
    with pytest.raises(KernelFault, match="call stack overflow"):
        dev.launch(prog, "deep", 1, 1, [np.int64(5000).tobytes(), po])


@pytest.mark.parametrize("n", (4, 500))
def test_constant_and_global_variables(program, arch, dev, rng, n):
    prog = program("memspaces", arch)
    names = {v.name: v for v in prog.variables}
    assert names["coef"].space == "const" and names["coef"].size == 32
    assert names["counter"].init == (100).to_bytes(4, "little")
    syms = dev.symbols(prog)
    lookup = np.array([1, -2, 3, 4], np.int32)
    dev.mem.write(syms["lookup"], lookup.tobytes())
    x = rng.standard_normal(n).astype(np.float32)
    px, po = dev.upload(x), dev.zeros(n, np.float32)
    dev.launch(prog, "use_const", blocks(n, 128), 128, [px, po, i32(n)])
    coef = np.arange(1, 9, dtype=np.float32)
    table = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    acc = np.zeros(n, np.float32)
    for k in range(8):
        acc = fma32_ref(coef[k] * x, np.float32(lookup[k & 3]), acc)
    assert np.allclose(dev.download(po, n, np.float32), acc + table[np.arange(n) & 3], rtol=1e-6)
    counter = np.frombuffer(dev.mem.read(syms["counter"], 4), np.int32)[0]
    assert counter == 100 + n


@pytest.mark.parametrize("n", (3, 1000))
def test_local_stack_array(program, arch, dev, rng, n):
    prog = program("memspaces", arch)
    x = rng.integers(-1000, 1000, n, dtype=np.int32)
    px, po = dev.upload(x), dev.zeros(n, np.int32)
    dev.launch(prog, "local_array", blocks(n, 64), 64, [px, po, i32(n)])
    ref = []
    for i, v in enumerate(x.astype(np.int64)):
        arr = [v * k + (k ^ i) for k in range(16)]
        idx = int(v) & 15
        arr[idx] += 1000
        ref.append(np.int32(sum(arr[(k * 7 + idx) & 15] * (k + 1) for k in range(16))))
    assert list(dev.download(po, n, np.int32)) == ref


@pytest.mark.parametrize("bs", (32, 100))
def test_generic_pointers_shared_local_global(program, arch, dev, rng, bs):
    prog = program("memspaces", arch)
    g = np.zeros(2 * bs, np.int32)
    g[:bs] = rng.integers(0, 100, bs)
    pg = dev.upload(g)
    dev.launch(prog, "generic_ptrs", 1, bs, [pg, i32(bs)])
    out = dev.download(pg, 2 * bs, np.int32)
    t = np.arange(bs)
    assert np.array_equal(out[:bs], g[:bs] + 1000)
    loc = np.array([1, 2, 3, 4])[t & 3] + 100
    assert np.array_equal(out[bs:], ((t + 1) % bs + 10) + loc * 7)


def test_float_param_f32(program, arch, dev):
    prog = program("vector_add", arch)
    py = dev.upload(np.ones(4, np.float32))
    px = dev.upload(np.arange(4, dtype=np.float32))
    dev.launch(prog, "saxpy", 1, 4, [i32(4), f32(-1.0), px, py])
    assert list(dev.download(py, 4, np.float32)) == [1.0, 0.0, -1.0, -2.0]
