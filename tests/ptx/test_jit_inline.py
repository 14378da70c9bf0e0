"""Device-function calls and carry arithmetic in compiled kernels
(:mod:`crane.backends.sim.ptx.jit.inline`, :mod:`crane.backends.sim.ptx.jit.ops_carry`).

The PTX suite runs in diff mode (conftest): every compiled launch here also runs interpreted
and the bytes must agree. What is checked beyond that: the kernels compile (before, any call
to a function with a body sent the whole kernel to the interpreter); CUDA's double-precision
``sin``/``cos``/``pow``/``lgamma``, whose slow paths are out-of-line functions with a local
array and a carry chain, agree with NumPy's and Python's; a callee with its own local frame,
several returns and two call sites around a barrier; nvcc's ``__noinline__`` functions with a
struct return and a call from a callee; 128-bit add, subtract and multiply through the carry
flag against Python integers; recursion still runs interpreted, saying why.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from ptxdev import Ptr, blocks, i32

from crane.backends.sim.ptx import jit

pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _compiled(prog, name: str) -> bool:
    return isinstance(jit._cache.get((prog.source_hash, name)), jit.CompiledKernel)


def test_double_math_slow_paths_compile(program, arch, dev):
    prog = program("inline", arch)
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-40, 40, 250), [1e10, -3e15, 1e300, 2.5e7, 1e22, 6.2e5]])
    n = len(x)
    out = dev.zeros(4 * n, np.float64)
    dev.launch(prog, "double_math", blocks(n, 128), 128, [Ptr(dev.upload(x)), Ptr(out), i32(n)])
    got = dev.download(out, 4 * n, np.float64).reshape(n, 4)
    assert np.allclose(got[:, 0], np.sin(x), rtol=0, atol=1e-15)
    assert np.allclose(got[:, 1], np.cos(x), rtol=0, atol=1e-15)
    with np.errstate(over="ignore"):  # (1e300 ** 1.7: inf both ways)
        assert np.allclose(got[:, 2], (np.abs(x) + 0.5) ** 1.7, rtol=1e-15)
    want = [math.lgamma(abs(v) * 1e-3 + 0.25) for v in x]
    assert np.allclose(got[:, 3], want, rtol=1e-14)
    assert _compiled(prog, "double_math")


def test_a_callee_with_a_local_frame_called_twice_around_a_barrier(program, arch, dev):
    prog = program("inline", arch)
    n = 500
    vals = np.random.default_rng(12).integers(0, 1 << 31, n, dtype=np.uint32)
    vals[:3] = (0, 1, 6)

    def digits(v: int, base: int) -> int:
        if v == 0:
            return 1
        ds = []
        while v and len(ds) < 12:
            ds.append(v % base)
            v //= base
        s = 0
        for d in reversed(ds):
            s = s * 3 + d
        return s + len(ds)

    out = dev.zeros(n, np.int32)
    dev.launch(prog, "two_calls", 2, 256, [Ptr(dev.upload(vals)), Ptr(out), i32(n)])
    a = [digits(int(v), 7) for v in vals] + [0] * (512 - n)
    want = [
        (a[i] * 1000 + digits(a[(i // 256) * 256 + (i % 256 + 1) % 256] & 0xFFFFFFFF, 10))
        & 0xFFFFFFFF
        for i in range(n)
    ]
    got = dev.download(out, n, np.int32).astype(np.int64) & 0xFFFFFFFF
    assert got.tolist() == want
    assert _compiled(prog, "two_calls")


def test_nvcc_noinline_functions_compile(program, arch, dev):
    """tests/ptx/kernels/devfunc.cu (test_control checks its values): a struct return, calls
    from divergent code and loops, a callee calling another."""
    prog = program("devfunc", arch)
    n = 100
    vals = np.random.default_rng(13).integers(-50, 50, n, dtype=np.int32)
    out, fout = dev.zeros(3 * n, np.int32), dev.zeros(n, np.float32)
    dev.launch(
        prog,
        "use_devfuncs",
        blocks(n, 64),
        64,
        [Ptr(dev.upload(vals)), Ptr(out), Ptr(fout), i32(n)],
    )
    v = vals.astype(np.float32)
    want = (v + (3 * v - v) * 0.25) + (3 * v + (v - 3 * v) * 0.5)
    assert np.allclose(dev.download(fout, n, np.float32), want, rtol=1e-6)
    assert _compiled(prog, "use_devfuncs")


def test_128_bit_arithmetic_through_the_carry_flag(program, arch, dev):
    prog = program("inline", arch)
    n = 200
    rng = np.random.default_rng(14)
    a = rng.integers(0, 1 << 64, 2 * n, dtype=np.uint64, endpoint=False)
    b = rng.integers(0, 1 << 64, 2 * n, dtype=np.uint64, endpoint=False)
    a[:4] = (2**64 - 1, 2**64 - 1, 0, 0)  # carries and borrows through both halves
    b[:4] = (1, 0, 1, 0)
    out = dev.zeros(6 * n, np.uint64)
    dev.launch(
        prog,
        "carry_chain",
        blocks(n, 64),
        64,
        [Ptr(dev.upload(a)), Ptr(dev.upload(b)), Ptr(out), i32(n)],
    )
    got = dev.download(out, 6 * n, np.uint64).reshape(n, 6)
    m128 = (1 << 128) - 1
    for i in range(n):
        x = int(a[2 * i]) | int(a[2 * i + 1]) << 64
        y = int(b[2 * i]) | int(b[2 * i + 1]) << 64
        s, d, p = (x + y) & m128, (x - y) & m128, int(a[2 * i]) * int(b[2 * i])
        row = [int(v) for v in got[i]]
        assert row[0] | row[1] << 64 == s, i
        assert row[2] | row[3] << 64 == d, i
        assert row[4] | row[5] << 64 == p, i
    assert _compiled(prog, "carry_chain")


def test_recursion_runs_interpreted(program, arch, dev):
    prog = program("inline", arch)
    out = dev.zeros(32, np.int32)
    dev.launch(prog, "recursive", 1, 32, [Ptr(out)])
    fib = [0, 1]
    while len(fib) < 9:
        fib.append(fib[-1] + fib[-2])
    assert dev.download(out, 32, np.int32).tolist() == [fib[t % 9] for t in range(32)]
    refused = dict(jit.stats()["refused"])
    assert "a recursive call to _Z3fibi" in refused["recursive"]
