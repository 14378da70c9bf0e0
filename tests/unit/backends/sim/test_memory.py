"""Simulated device memory: chunks, allocations, validated ranges and per-lane accesses."""

from __future__ import annotations

import numpy as np
import pytest

from crane.backends.sim.memory import MemoryFault, SimMemory

BASE = 0x2000_0000_0000
MiB = 1 << 20


@pytest.fixture
def mem() -> SimMemory:
    m = SimMemory(BASE, 1 << 40)
    m.map_chunk(BASE, 4 * MiB)
    yield m
    m.close()


def test_terabyte_window_costs_nothing_until_touched(mem: SimMemory) -> None:
    assert mem.size == 1 << 40 and mem.mapped_bytes == 4 * MiB


def test_round_trip_copy_and_fill(mem: SimMemory) -> None:
    mem.alloc(BASE, 4096)
    mem.alloc(BASE + 4096, 4096)
    data = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)
    mem.write(BASE, data.tobytes())
    assert mem.read(BASE, 4096) == data.tobytes()
    mem.copy(BASE + 4096, BASE, 4096)
    assert mem.read(BASE + 4096, 4096) == data.tobytes()
    mem.copy(BASE + 1, BASE, 100)  # overlapping: memmove semantics
    assert mem.read(BASE + 1, 100) == data[:100].tobytes()
    mem.fill(BASE, 0xBEEF, 2, 3)
    assert mem.read(BASE, 6) == bytes.fromhex("efbeefbeefbe")
    mem.fill(BASE, 0x12345678, 4, 2)
    assert mem.read(BASE, 8) == bytes.fromhex("7856341278563412")
    mem.fill(BASE, 0x1FF, 1, 3)
    assert mem.read(BASE, 3) == b"\xff\xff\xff"


def test_ranges_outside_allocations_fault(mem: SimMemory) -> None:
    mem.alloc(BASE, 1000)
    with pytest.raises(MemoryFault, match="runs 1 bytes past"):
        mem.read(BASE, 1001)
    with pytest.raises(MemoryFault, match="not inside any allocation"):
        mem.write(BASE + 1000, b"x")
    with pytest.raises(MemoryFault):
        mem.alloc(BASE + 500, 10)  # overlap
    with pytest.raises(MemoryFault, match="not inside a mapped chunk"):
        mem.alloc(BASE + 4 * MiB, 10)
    with pytest.raises(MemoryFault, match="still holds"):
        mem.unmap_chunk(BASE)


def test_chunk_rules(mem: SimMemory) -> None:
    with pytest.raises(MemoryFault, match="aligned"):
        mem.map_chunk(BASE + 4 * MiB + 1, 2 * MiB)
    with pytest.raises(MemoryFault, match="overlaps"):
        mem.map_chunk(BASE + 2 * MiB, 2 * MiB)
    with pytest.raises(MemoryFault, match="outside"):
        mem.map_chunk(BASE - 2 * MiB, 2 * MiB)
    assert mem.unmap_chunk(BASE) == 4 * MiB


def test_an_allocation_may_span_chunks_mapped_back_to_back(mem: SimMemory) -> None:
    """Module variables larger than 2 MiB are committed as consecutive 2 MiB chunks."""
    mem.map_chunk(BASE + 4 * MiB, 2 * MiB)
    mem.alloc(BASE + 3 * MiB, 3 * MiB)  # crosses into the chunk mapped right after
    mem.write(BASE + 5 * MiB, b"x")
    mem.free(BASE + 3 * MiB)
    mem.map_chunk(BASE + 8 * MiB, 2 * MiB)  # a gap at 6-8 MiB
    with pytest.raises(MemoryFault, match="not inside a mapped chunk"):
        mem.alloc(BASE + 5 * MiB, 4 * MiB)
    with pytest.raises(MemoryFault, match="not inside a mapped chunk"):
        mem.alloc(BASE + 9 * MiB, 2 * MiB)  # past the last chunk


def test_lane_offsets(mem: SimMemory) -> None:
    mem.alloc(BASE, 1024)
    mem.alloc(BASE + 2048, 1024)
    lanes = np.array([BASE, BASE + 4, BASE + 2048, BASE + 3068], np.uint64)
    assert list(mem.offsets(lanes, 4)) == [0, 4, 2048, 3068]
    with pytest.raises(MemoryFault) as e:
        mem.offsets(np.array([BASE, BASE + 1024], np.uint64), 4)
    assert e.value.kind == "illegal" and e.value.address == BASE + 1024
    with pytest.raises(MemoryFault) as e:
        mem.offsets(np.array([BASE + 2], np.uint64), 4)
    assert e.value.kind == "misaligned"


def test_close_while_a_view_is_still_held() -> None:
    """A transport thread finishing its last replies (views of device memory, not copies)
    may outlive the backend's close at a worker's exit: close must not raise, and may be
    called again."""
    mem = SimMemory(BASE, 4 << 20)
    mem.map_chunk(BASE, 2 << 20)
    mem.alloc(BASE, 4096)
    view = memoryview(mem.view(BASE, 16))
    mem.close()
    mem.close()
    assert len(mem.buf) == 0
    view.release()
