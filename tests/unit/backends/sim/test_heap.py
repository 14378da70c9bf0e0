"""The device heap's allocator: alignment, first fit, coalescing on free, exhaustion."""

from __future__ import annotations

from crane.backends.sim.ptx.heap import ALIGN, DeviceHeap


def test_blocks_are_aligned_and_disjoint() -> None:
    h = DeviceHeap(0x1000, 1024)
    a, b, c = h.alloc(1), h.alloc(17), h.alloc(0)
    assert [a, b, c] == [0x1000, 0x1010, 0x1030]
    assert all(x % ALIGN == 0 for x in (a, b, c)) and h.used == 64


def test_exhaustion_returns_null_and_free_makes_room() -> None:
    h = DeviceHeap(0x1000, 64)
    blocks = [h.alloc(16) for _ in range(4)]
    assert h.alloc(1) == 0
    assert h.free(blocks[1])
    assert h.alloc(16) == blocks[1]
    assert h.alloc(32) == 0


def test_free_coalesces_both_neighbours() -> None:
    h = DeviceHeap(0x1000, 96)
    a, b, c = h.alloc(32), h.alloc(32), h.alloc(32)
    h.free(a)
    h.free(c)
    assert h.alloc(64) == 0  # two holes of 32, not adjacent
    h.free(b)  # joins both
    assert h.alloc(96) == 0x1000


def test_free_of_unknown_or_twice_is_refused() -> None:
    h = DeviceHeap(0x1000, 64)
    a = h.alloc(8)
    assert not h.free(a + 16)
    assert h.free(a) and not h.free(a)
