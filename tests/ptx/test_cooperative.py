"""Cooperative launches: grid-wide sync (cooperative_groups this_grid().sync()) as nvcc emits
it — the workspace in %envreg1:%envreg2, an atom.add.release arrival and an ld.acquire spin —
with blocks that arrive late and unevenly, the co-residency and interpreter limits, and the
clean failure of a grid sync outside a cooperative launch."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr, i32

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.api.generated.cuda_enums import CUresult
from crane.backends.sim.ptx import KernelFault, load_ptx
from crane.backends.sim.ptx import program as ptx_program


def _coop(dev, prog, kernel, grid, block, args, **kw):
    ws = dev.alloc(ptx_program.GRID_SYNC_BYTES)
    return dev.launch(prog, kernel, grid, block, args, cooperative=True, grid_workspace=ws, **kw)


@pytest.mark.parametrize(("blocks", "threads", "n"), [(1, 64, 50), (8, 128, 1000), (40, 96, 3840)])
def test_two_phase_reads_other_blocks_writes(program, arch, dev, blocks, threads, n):
    prog = program("grid_sync", arch)
    a, out = dev.zeros(n, np.int32), dev.zeros(n, np.int32)
    _coop(dev, prog, "two_phase", blocks, threads, [a, out, i32(n)])
    i = np.arange(n)
    av = i * 3 + 1
    np.testing.assert_array_equal(
        dev.download(out, n, np.int32), av[n - 1 - i] + av[(i + threads) % n]
    )


@pytest.mark.parametrize("blocks", [2, 13])
def test_blocks_lagging_at_block_barriers_reach_the_grid_barrier(program, arch, dev, rng, blocks):
    """Block b runs b rounds of __syncthreads before the grid sync: early blocks spin while late
    ones are parked at bar.sync, which only the per-block barrier release lets them leave."""
    prog = program("grid_sync", arch)
    t = 128
    x = rng.integers(0, 1000, (blocks, t), dtype=np.int32)
    pin, part, out = dev.upload(x), dev.zeros(blocks, np.int32), dev.zeros(blocks * t, np.int32)
    _coop(dev, prog, "staggered", blocks, t, [pin, part, out])
    v = x.copy()
    for b in range(blocks):
        for _ in range(b):
            v[b] = (v[b] + np.roll(v[b], -1)) & 0xFFFF
    partial = v.sum(axis=1).astype(np.int32)
    ref = partial.sum() + np.repeat(np.roll(partial, -1), t)
    np.testing.assert_array_equal(dev.download(part, blocks, np.int32), partial)
    np.testing.assert_array_equal(dev.download(out, blocks * t, np.int32), ref)


def test_grid_sync_in_a_loop(program, arch, dev, rng):
    prog = program("grid_sync", arch)
    n, iters, t = 700, 9, 64
    x0 = rng.integers(0, 1000, n, dtype=np.int32)
    px, py = dev.upload(x0), dev.zeros(n, np.int32)
    _coop(dev, prog, "stencil", (n + t - 1) // t, t, [px, py, i32(n), i32(iters)])
    cur = x0.astype(np.int64)
    for _ in range(iters):
        cur = (cur * 2 + np.roll(cur, 1) + np.roll(cur, -1)) % 1000003
    res = dev.download(py if iters % 2 else px, n, np.int32)
    np.testing.assert_array_equal(res, cur.astype(np.int32))


def test_grid_is_valid_only_in_a_cooperative_launch(program, dev):
    prog = program("grid_sync", "compute_80")
    out = dev.upload(np.array([7], np.int32))
    dev.launch(prog, "grid_valid", 3, 32, [out])
    assert dev.download(out, 1, np.int32)[0] == 0
    _coop(dev, prog, "grid_valid", 3, 32, [out])
    assert dev.download(out, 1, np.int32)[0] == 1


def test_grid_sync_in_a_normal_launch_fails_cleanly(program, dev):
    """A GPU leaves the workspace pointer 0; nvcc's grid.sync() traps on it (no hang)."""
    prog = program("grid_sync", "compute_80")
    a, out = dev.zeros(64, np.int32), dev.zeros(64, np.int32)
    with pytest.raises(KernelFault) as ei:
        dev.launch(prog, "two_phase", 2, 32, [a, out, i32(64)])
    assert ei.value.code == CUresult.CUDA_ERROR_LAUNCH_FAILED
    assert "cooperative launch" in ei.value.message


def test_grid_larger_than_the_device_keeps_resident_is_refused(program, dev):
    """blocks <= SMs x blocks-per-SM (here limited by shared memory); one more is refused."""
    prog = program("grid_sync", "compute_80")
    a = dev.profile.attributes
    dyn = 100 * 1024
    per_sm = a[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR] // (
        dyn + a[A.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK]
    )
    most = a[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] * per_sm
    assert most == 132 * 2  # h100-80gb: 228 KiB per SM, 1 KiB reserved per block
    out = dev.zeros(most + 1, np.int32)
    _coop(dev, prog, "tag", most, 32, [out], shared=dyn, max_dynamic_shared=dyn)
    assert dev.download(out, most, np.int32).tolist() == list(range(1, most + 1))
    with pytest.raises(KernelFault) as ei:
        _coop(dev, prog, "tag", most + 1, 32, [out], shared=dyn, max_dynamic_shared=dyn)
    assert ei.value.code == CUresult.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
    # threads per SM limit: 2048 / 1024 = 2 blocks per SM
    with pytest.raises(KernelFault) as ei:
        _coop(dev, prog, "tag", 265, 1024, [out])
    assert ei.value.code == CUresult.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE


def test_grid_larger_than_the_interpreter_runs_at_once_is_refused(program, dev, monkeypatch):
    """The interpreter's own limit (all lanes of the grid live at once within BATCH_BYTES) is
    exact: the largest grid it allows runs, one block more is refused."""
    prog = program("grid_sync", "compute_80")
    t = 64
    full = prog.cooperative_max_blocks("two_phase", t)
    assert full >= 132 * (2048 // t)  # the real limit is the device's, not the interpreter's
    monkeypatch.setattr(ptx_program, "BATCH_BYTES", ptx_program.BATCH_BYTES * 5 // full)
    most = prog.cooperative_max_blocks("two_phase", t)
    assert 1 <= most < 132 * (2048 // t)
    n = most * t
    a, out = dev.zeros(n, np.int32), dev.zeros(n, np.int32)
    _coop(dev, prog, "two_phase", most, t, [a, out, i32(n)])
    i = np.arange(n)
    np.testing.assert_array_equal(
        dev.download(out, n, np.int32), (i * 3 + 1)[n - 1 - i] + (((i + t) % n) * 3 + 1)
    )
    with pytest.raises(KernelFault) as ei:
        _coop(dev, prog, "two_phase", most + 1, t, [a, out, i32(n)])
    assert ei.value.code == CUresult.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
    assert "one batch" in ei.value.message


_CHAIN = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry chain(.param .u64 pflag, .param .u64 pout)
{
    .reg .pred %p<4>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pflag];
    ld.param.u64 %rd2, [pout];
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra $Ldone;
    mov.u32 %r2, %ctaid.x;
$Lspin:
    ld.acquire.gpu.global.u32 %r3, [%rd1];
    setp.ne.u32 %p2, %r3, %r2;
    @%p2 bra $Lspin;
    mov.u32 %r4, 0;
    setp.eq.u32 %p3, %r2, 0;
    @%p3 bra $Lfirst;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r4, [%rd4+-4];
$Lfirst:
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd4, %rd2, %rd3;
    add.u32 %r5, %r4, %r2;
    add.u32 %r5, %r5, 1;
    st.global.u32 [%rd4], %r5;
    add.u32 %r6, %r2, 1;
    st.release.gpu.global.u32 [%rd1], %r6;
$Ldone:
    ret;
}
"""


def test_blocks_of_an_ordinary_launch_waiting_on_each_other(dev):
    """cuBLAS's triangular solve: block b spins until block b-1 published its result. Nothing
    in an ordinary launch promises it, but blocks that run at once let it finish; the spinning
    group at the lowest PC starved block 0 forever until a batch whose groups keep looping back
    let its blocks take turns."""
    prog = load_ptx(_CHAIN)
    blocks = 5
    flag, out = dev.zeros(1, np.uint32), dev.zeros(blocks, np.uint32)
    dev.launch(prog, "chain", blocks, 32, [Ptr(flag), Ptr(out)])
    assert dev.download(out, blocks, np.uint32).tolist() == [1, 3, 6, 10, 15]
    assert dev.download(flag, 1, np.uint32).tolist() == [blocks]
