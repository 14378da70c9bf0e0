"""Device malloc/free and new/delete on the simulated GPU: blocks outlive a launch, are freed
by a later one (and can then be reused), exhaustion yields NULL, and a bad free faults."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import blocks, i32

from crane.backends.sim.ptx.heap import DeviceHeap

HEAP = 1 << 20


@pytest.fixture
def heap(dev):
    return DeviceHeap(dev.alloc(HEAP), HEAP)


def test_blocks_persist_across_launches_and_are_reused(program, arch, dev, heap):
    prog = program("heap", arch)
    n, length = 200, 16
    slots, sums = dev.zeros(n, np.uint64), dev.zeros(n, np.int64)
    dev.launch(prog, "alloc_blocks", blocks(n, 64), 64, [slots, i32(n), i32(length)], heap=heap)
    ptrs = dev.download(slots, n, np.uint64)
    assert (ptrs != 0).all() and len(set(ptrs.tolist())) == n and (ptrs % 16 == 0).all()
    assert heap.used == n * 64
    dev.launch(prog, "sum_and_free", blocks(n, 64), 64, [slots, i32(n), i32(length), sums],
               heap=heap)  # fmt: skip
    want = [i * 1000 * length + length * (length - 1) // 2 for i in range(n)]
    assert list(dev.download(sums, n, np.int64)) == want
    assert heap.used == 0
    # everything was coalesced back: one block of the whole heap fits again
    assert heap.alloc(HEAP) == heap.base


def test_exhausted_heap_returns_null(program, arch, dev, heap):
    prog = program("heap", arch)
    out = dev.zeros(1, np.uint64)
    dev.launch(prog, "too_big", 1, 1, [np.uint64(HEAP + 1), out], heap=heap)
    assert int(dev.download(out, 1, np.uint64)[0]) == 0
    dev.launch(prog, "too_big", 1, 1, [np.uint64(HEAP // 2), out], heap=heap)
    assert int(dev.download(out, 1, np.uint64)[0]) == heap.base and heap.used == 0


def test_new_and_delete(program, arch, dev, heap):
    prog = program("heap", arch)
    out = dev.zeros(64, np.int32)
    dev.launch(prog, "linked_list", 1, 64, [i32(10), out], heap=heap)
    assert list(dev.download(out, 64, np.int32)) == [45 * t for t in range(64)]
    assert heap.used == 0


def test_free_of_a_foreign_pointer_faults(program, arch, dev, heap):
    from crane.backends.sim.ptx import KernelFault

    prog = program("heap", arch)
    slots, sums = dev.upload(np.array([heap.base + 48], np.uint64)), dev.zeros(1, np.int64)
    with pytest.raises(KernelFault, match="not a block of the device heap"):
        dev.launch(prog, "sum_and_free", 1, 1, [slots, i32(1), i32(1), sums], heap=heap)
