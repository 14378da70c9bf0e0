"""Cooperative launches compiled (:mod:`crane.backends.sim.ptx.jit.coop`): every block
resident, a block whose lanes only wait at a yield point suspended while the others run.

The suite's diff mode (every compiled launch also interpreted, the bytes compared) covers the
grid-sync kernels of test_cooperative.py; here the kernels must have been compiled (not left to
the interpreter), and the cases only the cooperative runner makes end: a block waiting on a
*later* block, a grid barrier with more blocks than cores, faults and printf after a grid sync,
and a wait that never ends stopped by the launch's deadline.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from ptxdev import i32

from crane.api.generated.cuda_enums import CUresult
from crane.backends.sim.ptx import KernelFault, jit
from crane.backends.sim.ptx import program as ptx_program

pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _coop(dev, prog, kernel, grid, block, args, **kw):
    """A cooperative launch, with a time limit: a runner that let a block wait for ever
    fails the test with CUDA_ERROR_LAUNCH_TIMEOUT instead of hanging it."""
    ws = dev.alloc(ptx_program.GRID_SYNC_BYTES)
    kw.setdefault("deadline", time.monotonic() + 120)
    return dev.launch(prog, kernel, grid, block, args, cooperative=True, grid_workspace=ws, **kw)


def _compiled(name: str) -> bool:
    st = jit.stats()
    return any(n == name for n, _ in st["compiled"]) or any(n == name for n, _ in st["loaded"])


def test_grid_sync_kernels_compile(program, arch, dev, rng, monkeypatch):
    """nvcc's grid.sync() (an ``atom.add.release`` arrival, an ``ld.acquire`` loop) in a loop
    of grid barriers and after blocks lagging at block barriers: compiled, and leaving the
    interpreter's bytes (test_cooperative.py checks those against NumPy)."""
    prog = program("grid_sync", arch)
    n, t = 1500, 64
    x0 = rng.integers(0, 1000, n, dtype=np.int32)
    blocks = 9
    xs = rng.integers(0, 1000, (blocks, 128), dtype=np.int32)
    cases = (
        ("stencil", (n + t - 1) // t, t, [x0, np.zeros(n, np.int32)], [i32(n), i32(12)]),
        (
            "staggered",
            blocks,
            128,
            [xs, np.zeros(blocks, np.int32), np.zeros(xs.size, np.int32)],
            [],
        ),
    )
    for kernel, grid, block, arrays, scalars in cases:
        got = []
        for mode in ("0", "1"):
            monkeypatch.setenv("CRANE_PTX_JIT", mode)
            ptrs = [dev.upload(a) for a in arrays]
            _coop(dev, prog, kernel, grid, block, [*ptrs, *scalars])
            got.append(
                [dev.download(p, a.size, a.dtype) for p, a in zip(ptrs, arrays, strict=True)]
            )
        for interpreted, compiled in zip(*got, strict=True):
            np.testing.assert_array_equal(compiled, interpreted)
        assert _compiled(kernel), jit.stats()["refused"]


@pytest.mark.parametrize("blocks", [2, 40])
def test_a_block_waits_on_a_later_block(program, dev, blocks):
    """Block 0 spins on a flag the last block sets: the ordinary runner runs block 0 to its
    end first (a wait for ever); the cooperative one suspends it until the last block ran."""
    prog = program("coop_jit", "compute_80")
    flag, out = dev.zeros(1, np.int32), dev.zeros(2, np.int32)
    _coop(dev, prog, "wait_last", blocks, 64, [flag, out])
    assert dev.download(out, 2, np.int32).tolist() == [42 + blocks, 42 + blocks - 1]
    assert _compiled("wait_last"), jit.stats()["refused"]


def test_faults_and_printf_after_a_grid_sync(program, dev, rng):
    """Every block's printf line comes out (each block has context words of its own), and an
    illegal address after the grid barrier is the interpreter's error with its PTX line."""
    prog = program("coop_jit", "compute_80")
    blocks, t = 6, 256
    n = blocks * t * 5 + 37
    x = rng.integers(-100, 100, n, dtype=np.int32)
    pin, part, out = dev.upload(x), dev.zeros(blocks, np.int32), dev.zeros(blocks * t, np.int32)
    lines = _coop(dev, prog, "sums", blocks, t, [pin, i32(n), part, out, i32(-1), i32(1)])
    total = int(x.sum())
    want = sorted(f"block {b} of {blocks}: total {total}\n" for b in range(blocks))
    assert sorted("".join(lines).splitlines(keepends=True)) == want
    owner = np.arange(n) % (blocks * t) // t  # the block whose grid-stride loop reads x[i]
    partial = np.bincount(owner, weights=x, minlength=blocks).astype(np.int64)
    np.testing.assert_array_equal(dev.download(part, blocks, np.int32), partial)
    ref = total - np.repeat(partial, t)
    np.testing.assert_array_equal(dev.download(out, blocks * t, np.int32), ref)
    assert _compiled("sums"), jit.stats()["refused"]
    with pytest.raises(KernelFault) as e:
        _coop(dev, prog, "sums", blocks, t, [pin, i32(n), part, out, i32(4), i32(0)])
    assert e.value.code == CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    assert "PTX line" in e.value.message


def test_a_wait_that_never_ends_stops_at_the_deadline(program, dev, monkeypatch):
    """No block sets the flag: the suspended block is called again and again until the
    launch's time limit, then CUDA_ERROR_LAUNCH_TIMEOUT (no hang, no busy thread left)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")  # (diff mode would interpret it too)
    prog = program("coop_jit", "compute_80")
    flag, out = dev.zeros(1, np.int32), dev.zeros(8, np.int32)
    t = time.monotonic()
    with pytest.raises(KernelFault) as e:
        _coop(dev, prog, "wait_forever", 8, 32, [flag, out], deadline=t + 0.5)
    assert e.value.code == CUresult.CUDA_ERROR_LAUNCH_TIMEOUT
    assert time.monotonic() - t < 5.0
    assert _compiled("wait_forever"), jit.stats()["refused"]


def test_a_grid_too_large_to_hold_compiled_runs_interpreted(program, dev, monkeypatch):
    """Compiled, every block's save area (8 bytes a saved register), resume words and local
    and shared memory are held at once (``jit.cooperative_bytes``); a cooperative grid whose
    compiled state would pass the interpreter's memory bound (``program.BATCH_BYTES``) runs
    interpreted, with the same results."""
    from crane.backends.sim.ptx.jit import coop

    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    prog = program("grid_sync", "compute_80")
    n, t, iters = 640, 64, 3
    held = jit.cooperative_bytes(prog._compiled(prog.kernels["stencil"], (t, 1, 1)), 10, t, 0, 0)
    assert 10 * t * 8 < held < 10 * t * 8 * 64  # (a few saved registers a lane)
    monkeypatch.setattr(jit, "cooperative_bytes", lambda *a: ptx_program.BATCH_BYTES + 1)

    def refuse(*args, **kw):
        raise AssertionError("the cooperative runner took a grid over the bound")

    monkeypatch.setattr(coop, "run_cooperative", refuse)
    monkeypatch.setattr(jit.runner, "run_cooperative", refuse)
    x0 = np.arange(n, dtype=np.int32)
    px, py = dev.upload(x0), dev.zeros(n, np.int32)
    _coop(dev, prog, "stencil", n // t, t, [px, py, i32(n), i32(iters)])
    cur = x0.astype(np.int64)
    for _ in range(iters):
        cur = (cur * 2 + np.roll(cur, 1) + np.roll(cur, -1)) % 1000003
    got = dev.download(py if iters % 2 else px, n, np.int32)
    np.testing.assert_array_equal(got, cur.astype(np.int32))
