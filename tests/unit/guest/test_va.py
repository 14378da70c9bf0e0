"""The guest VA allocator: placement, alignment, chunk policy, and no overlaps ever."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crane.guest.va import FreeList, VaAllocator, VaError

BASE = 0x2000_0000_0000
MiB = 1 << 20


class Recorder:
    def __init__(self, fail_above: int | None = None) -> None:
        self.mapped: dict[int, int] = {}
        self.fail_above = fail_above

    def map(self, addr: int, size: int) -> None:
        if self.fail_above is not None and size > self.fail_above:
            raise MemoryError(f"no room for {size}")
        assert addr % (2 * MiB) == 0 and size % (2 * MiB) == 0
        assert all(addr + size <= a or a + s <= addr for a, s in self.mapped.items())
        self.mapped[addr] = size

    def unmap(self, addr: int) -> None:
        del self.mapped[addr]


def make(rec: Recorder, **kw: int) -> VaAllocator:
    return VaAllocator(BASE, 1 << 40, rec.map, rec.unmap, **kw)


def test_small_allocations_share_a_chunk_and_are_aligned() -> None:
    rec = Recorder()
    va = make(rec)
    addrs = [va.alloc(n) for n in (1, 100, 255, 256, 1000)]
    assert all(a % 256 == 0 for a in addrs)
    assert len(rec.mapped) == 1
    assert va.find(addrs[1] + 99) == (addrs[1], 100)
    assert va.find(addrs[1] + 100) is None
    assert va.check(addrs[4], 1000) and not va.check(addrs[4], 1025)
    assert va.find(BASE - 1) is None


def test_chunks_grow_geometrically_and_large_allocations_get_their_own() -> None:
    rec = Recorder()
    va = make(rec, max_chunk=16 * MiB)
    va.alloc(2 * MiB)
    va.alloc(2 * MiB)
    va.alloc(2 * MiB)
    sizes = sorted(rec.mapped.values())
    assert sizes == [2 * MiB, 4 * MiB]  # second chunk doubled and holds two allocations
    big = va.alloc(100 * MiB)
    assert rec.mapped[big] == 100 * MiB


def test_falls_back_to_exact_size_when_the_device_is_nearly_full() -> None:
    rec = Recorder(fail_above=2 * MiB)
    va = make(rec)
    va.alloc(2 * MiB)  # first chunk is 2 MiB anyway
    va.alloc(1 * MiB)  # wants a 4 MiB chunk, device refuses, exact 2 MiB works
    assert sorted(rec.mapped.values()) == [2 * MiB, 2 * MiB]


def test_empty_chunks_are_released_except_one_spare() -> None:
    rec = Recorder()
    va = make(rec, max_chunk=2 * MiB)
    a = [va.alloc(2 * MiB) for _ in range(3)]
    for x in a:
        va.free(x)
    assert len(rec.mapped) == 1
    again = va.alloc(2 * MiB)
    assert again in a and len(rec.mapped) == 1


def test_errors() -> None:
    va = make(Recorder())
    with pytest.raises(VaError):
        va.alloc(0)
    a = va.alloc(10)
    with pytest.raises(VaError):
        va.free(a + 1)
    va.free(a)
    with pytest.raises(VaError):
        va.free(a)


def test_window_exhaustion_is_reported() -> None:
    va = VaAllocator(BASE, 8 * MiB, Recorder().map, Recorder().unmap)
    va.alloc(6 * MiB)
    with pytest.raises(VaError, match="no free range"):
        va.alloc(4 * MiB)


def test_free_list_coalesces() -> None:
    fl = FreeList(0, 100)
    assert fl.take(10) == 0 and fl.take(10) == 10 and fl.take(10) == 20
    fl.give(10, 10)
    fl.give(0, 10)
    fl.give(20, 10)
    assert fl.ranges == [(0, 100)]
    assert fl.take(8, 16) == 0 and fl.take(8, 16) == 16
    assert fl.ranges == [(8, 8), (24, 76)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5 * MiB)), min_size=1, max_size=60))
def test_random_alloc_free_never_overlaps(ops: list[tuple[bool, int]]) -> None:
    rec = Recorder()
    va = make(rec, max_chunk=8 * MiB)
    live: dict[int, int] = {}
    for do_free, size in ops:
        if do_free and live:
            addr = sorted(live)[size % len(live)]
            va.free(addr)
            del live[addr]
        else:
            addr = va.alloc(size)
            assert addr % 256 == 0
            for a, n in live.items():
                assert addr + size <= a or a + n <= addr
            inside = [c for c, n in rec.mapped.items() if c <= addr and addr + size <= c + n]
            assert len(inside) == 1
            live[addr] = size
    assert sorted(live) == [a for a, _ in va.allocations()]


def test_the_last_range_checked_answers_until_it_is_freed_or_unmapped() -> None:
    va = make(Recorder())
    a = va.alloc(4096)
    b = va.alloc(4096)
    assert va.check(a, 4096) and va.hit == (a, a + 4096)
    assert va.check(a + 10, 100) and not va.check(a + 10, 4096) and not va.check(a - 1, 1)
    va.free(a)
    assert not va.check(a, 1) and va.check(b, 4096)  # the freed range no longer answers
    c = va.alloc(100)  # (the freed range reused, smaller)
    assert c == a and va.check(a, 100) and not va.check(a, 101)
    r = va.reserve(2 * MiB)
    va.add_mapping(r, MiB)
    assert va.check(r + 5, 10) and va.hit == (r, r + MiB)
    va.remove_mapping(r)
    assert not va.check(r + 5, 10)
    assert not va.check(0, 0)  # nothing found yet answers nothing
