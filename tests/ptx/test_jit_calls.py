"""The CUDA runtime's device calls in compiled kernels: ``assert`` (``call __assertfail``)
and ``printf`` (``call vprintf``, :mod:`crane.backends.sim.ptx.jit.printing`).

A kernel that carries an ``assert`` (a framework's index checks) compiles and runs at native
speed while every check passes; a thread that fails one fails the launch with
CUDA_ERROR_ASSERT (710) and prints the interpreter's line for it, in the fast lane loop over
many blocks on every core and after a barrier in 2-D blocks. A kernel that prints compiles,
every lane's line is the interpreter's, and the lines come as a GPU orders them (block by
block, a warp's lines a call at a time in lane order) whatever the cores did: a large grid
on every core, a loop after a barrier in 2-D blocks with the return value used, strings in
global, shared and local memory, and a bad string pointer failing the launch as the
interpreter fails it."""

from __future__ import annotations

import re

import numpy as np
import pytest
from ptxdev import Ptr, i32, i64

from crane.backends.sim.ptx import KernelFault, jit

pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _launch(dev, prog, name, grid, block, args, mode: str, monkeypatch):
    """(fault or None, printed lines) of one launch in CRANE_PTX_JIT ``mode``."""
    monkeypatch.setenv("CRANE_PTX_JIT", mode)
    dev.printed.clear()
    try:
        dev.launch(prog, name, grid, block, args)
    except KernelFault as e:
        return e, list(dev.printed)
    return None, list(dev.printed)


def _compiled(prog, name: str) -> bool:
    return isinstance(jit._cache.get((prog.source_hash, name)), jit.CompiledKernel)


def _gather(dev, n: int, m: int, bad: int | None):
    rng = np.random.default_rng(3)
    ix = rng.integers(0, m, n, dtype=np.int64)
    if bad is not None:
        ix[bad] = m + 5
    src = rng.standard_normal(m).astype(np.float32)
    return ix, src, dev.upload(ix), dev.upload(src), dev.zeros(n, np.float32)


def test_a_gather_with_its_index_checks_compiles_and_runs(program, arch, dev, monkeypatch):
    prog = program("faults", arch)
    n, m = 1 << 16, 5000
    ix, src, pix, psrc, pdst = _gather(dev, n, m, None)
    args = [Ptr(pix), Ptr(psrc), Ptr(pdst), i32(n), i32(m)]
    fault, out = _launch(dev, prog, "gather_checked", (n // 256, 1, 1), (256, 1, 1), args,
                         "1", monkeypatch)  # fmt: skip
    assert fault is None and out == []
    assert _compiled(prog, "gather_checked"), jit.stats()["refused"]
    assert np.array_equal(dev.download(pdst, n, np.float32), src[ix])


@pytest.mark.parametrize("bad", [0, 40000, (1 << 16) - 1])
def test_a_failed_index_check_fails_the_launch_as_the_interpreter_does(
    program, arch, dev, monkeypatch, bad
):
    prog = program("faults", arch)
    n, m = 1 << 16, 5000
    got = []
    for mode in ("1", "0"):
        _, _, pix, psrc, pdst = _gather(dev, n, m, bad)
        args = [Ptr(pix), Ptr(psrc), Ptr(pdst), i32(n), i32(m)]
        got.append(_launch(dev, prog, "gather_checked", (n // 256, 1, 1), (256, 1, 1), args,
                           mode, monkeypatch))  # fmt: skip
    assert _compiled(prog, "gather_checked"), jit.stats()["refused"]
    (cf, cout), (inf, iout) = got
    assert cf is not None and inf is not None and cf.code == inf.code == 710
    assert cout == iout and len(cout) == 1  # one failing thread: the same line both ways
    assert str(cf) == str(inf)
    line = cout[0]
    assert f"block [{bad // 256},0,0], thread [{bad % 256},0,0]" in line
    assert "faults.cu:" in line and "gather_checked" in line
    assert line.endswith("Assertion `j >= 0 && j < m` failed.\n")


def test_an_assert_after_a_barrier_in_2d_blocks_names_the_thread(program, arch, dev, monkeypatch):
    prog = program("faults", arch)
    grid, block = (3, 2, 1), (16, 8, 1)
    w, h = grid[0] * block[0], grid[1] * block[1]
    vals = np.arange(w * h, dtype=np.int32).reshape(h, w) % 50
    p, out = dev.upload(vals), dev.zeros(w * h, np.int32)
    args = [Ptr(p), Ptr(out), i32(100)]
    fault, printed = _launch(dev, prog, "assert_2d", grid, block, args, "1", monkeypatch)
    assert fault is None and printed == []
    assert _compiled(prog, "assert_2d"), jit.stats()["refused"]
    want = vals + (np.arange(w) % block[0])[None, :]
    assert np.array_equal(dev.download(out, w * h, np.int32).reshape(h, w), want)
    x, y = 2 * 16 + 7, 1 * 8 + 3  # block (2, 1), thread (7, 3)
    vals[y, x] = 1000
    p = dev.upload(vals)
    args = [Ptr(p), Ptr(out), i32(100)]
    fault, printed = _launch(dev, prog, "assert_2d", grid, block, args, "1", monkeypatch)
    assert fault is not None and fault.code == 710
    assert len(printed) == 1 and "block [2,1,0], thread [7,3,0]" in printed[0]
    assert printed[0].endswith("Assertion `v < limit` failed.\n")
    assert printed[0].strip() in str(fault)


def test_an_assert_in_a_loop_names_a_thread_that_fails_it(program, arch, dev, monkeypatch):
    """Lanes run one after another here, in lockstep in the interpreter (and on a GPU), so
    the first failing thread may differ (diff mode compares the fault code only); the one
    named must fail the check, and the launch fails with CUDA_ERROR_ASSERT either way."""
    prog = program("faults", arch)
    grid, block, n, limit = 4, 256, 8192, 12
    p = (np.arange(n) % 13).astype(np.int32)
    args = [Ptr(dev.upload(p)), Ptr(dev.zeros(grid * block, np.int32)), i32(n), i32(limit)]
    fault, printed = _launch(dev, prog, "assert_in_loop", grid, block, args, "1", monkeypatch)
    assert _compiled(prog, "assert_in_loop"), jit.stats()["refused"]
    assert fault is not None and fault.code == 710 and len(printed) == 1
    b, t = (int(x) for x in re.findall(r"\[(\d+),0,0\]", printed[0]))
    mine = p[b * block + t :: grid * block]
    assert (mine >= limit).any()
    fault, _ = _launch(dev, prog, "assert_in_loop", grid, block, args, "diff", monkeypatch)
    assert fault is not None and fault.code == 710


def test_a_large_grid_prints_in_thread_order(program, arch, dev, monkeypatch):
    prog = program("printf", arch)
    n, every = 1 << 17, 997
    v = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    args = [Ptr(dev.upload(v)), i32(n), i32(every)]
    fault, out = _launch(dev, prog, "sparse_print", n // 256, 256, args, "1", monkeypatch)
    assert fault is None and _compiled(prog, "sparse_print"), jit.stats()["refused"]
    assert out == [f"v[{i}] = {v[i]:.3f}\n" for i in range(0, n, every)]
    _, interpreted = _launch(dev, prog, "sparse_print", n // 256, 256, args, "0", monkeypatch)
    assert out == interpreted


def test_a_loop_after_a_barrier_prints_a_warp_at_a_time(program, arch, dev, monkeypatch):
    prog = program("printf", arch)
    grid, block, rounds = (2, 1, 1), (8, 6, 1), 3  # 48 threads: a warp and a part
    nt = block[0] * block[1]
    out = dev.zeros(grid[0] * nt, np.int32)
    args = [Ptr(out), i32(rounds)]
    fault, lines = _launch(dev, prog, "loop_print", grid, block, args, "1", monkeypatch)
    assert fault is None and _compiled(prog, "loop_print"), jit.stats()["refused"]
    want = [
        f"b{b} t{t} r{r} s={(t + r) % nt * 10}\n"
        for b in range(grid[0])
        for warp in range(0, nt, 32)
        for r in range(rounds)
        for t in range(warp, min(warp + 32, nt))
    ]
    assert lines == want
    assert (dev.download(out, grid[0] * nt, np.int32) == 4 * rounds).all()  # 4 arguments each
    _, interpreted = _launch(dev, prog, "loop_print", grid, block, args, "0", monkeypatch)
    assert sorted(lines) == sorted(interpreted)


def test_strings_in_every_space_and_a_bad_one(program, arch, dev, monkeypatch):
    prog = program("printf", arch)
    g = dev.upload(np.frombuffer(b"global\0", np.uint8))
    fault, lines = _launch(dev, prog, "string_spaces", 1, 3, [Ptr(g), i64(0)], "1", monkeypatch)
    assert fault is None and _compiled(prog, "string_spaces"), jit.stats()["refused"]
    loc = ["".join(chr(ord("A") + k + t) for k in range(7)) for t in range(3)]
    assert lines == [f"global|abcdefg|{loc[t]}\n" for t in range(3)]
    got = [
        _launch(dev, prog, "string_spaces", 1, 3, [Ptr(g), i64(1 << 30)], mode, monkeypatch)
        for mode in ("1", "0")
    ]
    (cf, cout), (inf, iout) = got
    assert cf is not None and inf is not None and cf.code == inf.code == 700
    assert cout == iout == []
