"""The guest side of the CUDA VMM API: reservations (hint honoured or refused, alignment,
fragmentation), physical handles, mappings and the freeing rules, against a fake device."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.guest.va import FreeList, VaAllocator, VaError
from crane.guest.vmm import PROP, Vmm, parse_prop

BASE = 0x2000_0000_0000
WINDOW = 1 << 40
MiB = 1 << 20
G = 2 * MiB
PROP_DEV0 = PROP.pack(1, 0, 1, 0, 0, 0, 0, 0)


class FakeDevice:
    """Committed memory by address, with the calls the VMM state made."""

    def __init__(self, free: int = 1 << 34) -> None:
        self.mem: dict[int, bytearray] = {}
        self.ctx: dict[int, int] = {}
        self.free = free
        self.fail_commit = False
        self.log: list[str] = []

    def commit(self, ctx: int, addr: int, size: int) -> None:
        if self.fail_commit or size > self.free:
            raise CudaError(CUresult.CUDA_ERROR_OUT_OF_MEMORY, "full")
        assert all(addr + size <= a or a + len(m) <= addr for a, m in self.mem.items())
        self.mem[addr] = bytearray(size)
        self.ctx[addr] = ctx
        self.free -= size
        self.log.append(f"commit {addr:#x}")

    def decommit(self, addr: int) -> None:
        self.free += len(self.mem.pop(addr))
        self.log.append(f"decommit {addr:#x}")

    def move(self, dst: int, src: int, size: int) -> None:
        self.mem[dst][:] = self.mem[src]
        self.log.append(f"move {src:#x}->{dst:#x}")

    def save(self, addr: int, size: int) -> bytes:
        self.log.append(f"save {addr:#x}")
        return bytes(self.mem[addr])

    def restore(self, addr: int, data: bytes) -> None:
        self.mem[addr][:] = data
        self.log.append(f"restore {addr:#x}")

    def free_memory(self) -> int:
        return self.free


def _noop_map(addr: int, size: int) -> None:
    pass


def make_va(size: int = WINDOW) -> VaAllocator:
    return VaAllocator(BASE, size, _noop_map, lambda addr: None)


def make() -> tuple[Vmm, FakeDevice]:
    dev = FakeDevice()
    return Vmm(make_va(), dev), dev


def code(e: pytest.ExceptionInfo[CudaError]) -> CUresult:
    return e.value.code  # type: ignore[return-value]


# ---- free list ---------------------------------------------------------------------------------
def test_free_list_take_at_and_take_last() -> None:
    fl = FreeList(0, 100)
    assert fl.take_at(10, 20)
    assert fl.ranges == [(0, 10), (30, 70)]
    assert not fl.take_at(5, 10)  # runs into a taken range
    assert not fl.take_at(95, 10)  # runs past the end
    assert fl.take_last(16, 16) == 80  # the highest aligned fit
    assert fl.ranges == [(0, 10), (30, 50), (96, 4)]
    assert fl.take_last(60) is None
    assert fl.take_last(4) == 96
    assert fl.take_at(0, 10) and fl.ranges == [(30, 50)]


# ---- reservations --------------------------------------------------------------------------------
def test_reserve_honours_a_free_hint_exactly() -> None:
    va = make_va()
    hint = BASE + (512 << 30)
    assert va.reserve(64 * MiB, 0, hint) == hint
    assert va.reservation(hint + 5) == (hint, 64 * MiB)
    # right after it is free too: a second reservation can extend the first contiguously
    assert va.reserve(8 * MiB, 0, hint + 64 * MiB) == hint + 64 * MiB


def test_reserve_refuses_an_occupied_hint_and_picks_another_range() -> None:
    va = make_va()
    hint = BASE + (100 << 30)
    first = va.reserve(16 * MiB, 0, hint)
    again = va.reserve(16 * MiB, 0, hint + 8 * MiB)  # overlaps the first reservation
    assert again != hint + 8 * MiB
    assert again + 16 * MiB <= first or first + 16 * MiB <= again
    # a hint over memory that cuMemAlloc's chunks use is refused too
    a = va.alloc(1000)
    chunk = next(iter(va.chunks))
    got = va.reserve(4 * MiB, 0, chunk)
    assert got != chunk and not (got <= a < got + 4 * MiB)


def test_reserve_without_hint_takes_the_top_of_the_window() -> None:
    va = make_va()
    top = va.reserve(4 * MiB)
    assert top == BASE + WINDOW - 4 * MiB
    a = va.alloc(10 * MiB)  # chunks still grow from the bottom
    assert a == BASE


def test_reserve_alignment_and_bad_requests() -> None:
    va = make_va()
    got = va.reserve(4 * MiB, 1 << 30)
    assert got % (1 << 30) == 0
    # an unaligned hint is not honoured (it cannot be: the caller asked for the alignment)
    got = va.reserve(4 * MiB, 1 << 30, BASE + (1 << 30) + G)
    assert got % (1 << 30) == 0
    # alignments under the granularity still give granularity-aligned ranges
    assert va.reserve(G, 4096) % G == 0
    with pytest.raises(VaError):
        va.reserve(G + 4096)
    with pytest.raises(VaError):
        va.reserve(0)
    with pytest.raises(VaError):
        va.reserve(G, 3 * G)


def test_reserve_in_a_fragmented_window() -> None:
    va = make_va(64 * MiB)
    rs = [va.reserve(8 * MiB, 0, BASE + i * 8 * MiB) for i in range(8)]
    assert rs == [BASE + i * 8 * MiB for i in range(8)]
    with pytest.raises(VaError, match="no free range"):
        va.reserve(G)
    va.unreserve(rs[2], 8 * MiB)
    va.unreserve(rs[5], 8 * MiB)
    # a 16 MiB request fits in neither hole, even with a hint into one
    with pytest.raises(VaError):
        va.reserve(16 * MiB, 0, rs[2])
    # a hint into the second hole is honoured; without a hint the highest hole is used
    assert va.reserve(4 * MiB, 0, rs[5] + 4 * MiB) == rs[5] + 4 * MiB
    assert va.reserve(4 * MiB) == rs[5]
    assert va.reserve(8 * MiB) == rs[2]
    with pytest.raises(VaError):
        va.unreserve(rs[0], 4 * MiB)  # size must match
    va.unreserve(rs[0], 8 * MiB)
    assert va.alloc(100) == rs[0]  # freed reservations go back to the chunk allocator


def test_mappings_are_device_memory_for_range_checks() -> None:
    va = make_va()
    r = va.reserve(8 * MiB, 0, BASE + (1 << 30))
    with pytest.raises(VaError):
        va.add_mapping(r + 6 * MiB, 4 * MiB)  # runs out of the reservation
    va.add_mapping(r, G)
    va.add_mapping(r + G, G)
    with pytest.raises(VaError):
        va.add_mapping(r + G, G)
    assert va.check(r + 10, 100) and va.lookup(r + G + 1) == (r + G, G)
    assert va.find(r) is None  # not a cuMemAlloc allocation: cuMemFree refuses it
    assert not va.check(r + G - 8, 16)  # across two mappings: split by segments
    assert va.segments(r + G - 8, 16) == [(r + G - 8, 8), (r + G, 8)]
    assert va.segments(r + G, 2 * G) is None  # runs into unmapped space
    with pytest.raises(VaError, match="mapped"):
        va.unreserve(r, 8 * MiB)
    assert va.remove_mapping(r) == G
    assert va.mapped_span(r, 2 * G) is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(1, 12), st.integers(0, 40), st.booleans()),
        min_size=1,
        max_size=50,
    )
)
def test_random_reserve_alloc_free_never_overlaps(ops: list[tuple[bool, int, int, bool]]) -> None:
    """Reservations and cuMemAlloc chunks share the window without overlapping, and a hint is
    honoured whenever its range is free."""
    end = BASE + 128 * MiB
    va = make_va(128 * MiB)
    held: dict[int, int] = {}  # reservations and allocations
    for free, n, slot, use_alloc in ops:
        if free and held:
            a = sorted(held)[slot % len(held)]
            if a in va.reservations:
                va.unreserve(a, held.pop(a))
            else:
                va.free(a)
                held.pop(a)
            continue
        size = n * MiB if use_alloc else n * G
        hint = BASE + slot * G
        busy = [(c, ch.size) for c, ch in va.chunks.items()] + list(va.reservations.items())
        hint_free = hint + size <= end and all(hint + size <= b or b + m <= hint for b, m in busy)
        try:
            a = va.alloc(size) if use_alloc else va.reserve(size, 0, hint)
        except VaError:
            assert use_alloc or not hint_free
            continue
        if not use_alloc:
            assert a % G == 0
            assert a == hint or not hint_free
        for b, m in held.items():
            assert a + size <= b or b + m <= a
        held[a] = size


# ---- properties ----------------------------------------------------------------------------------
def test_allocation_properties_are_validated() -> None:
    assert parse_prop(PROP_DEV0, "x") == PROP_DEV0
    compressed = PROP.pack(1, 1, 1, 0, 0, 1, 0, 0)
    assert PROP.unpack(parse_prop(compressed, "x"))[5] == 0  # compression declined, reported
    for raw, err in [
        (PROP.pack(2, 0, 1, 0, 0, 0, 0, 0), CUresult.CUDA_ERROR_INVALID_VALUE),  # managed
        (PROP.pack(1, 0, 1, 1, 0, 0, 0, 0), CUresult.CUDA_ERROR_INVALID_DEVICE),  # device 1
        (PROP.pack(1, 0, 0, 0, 0, 0, 0, 0), CUresult.CUDA_ERROR_INVALID_VALUE),  # no location
        (PROP.pack(1, 0, 2, 0, 0, 0, 0, 0), CUresult.CUDA_ERROR_NOT_SUPPORTED),  # host
    ]:
        with pytest.raises(CudaError) as e:
            parse_prop(raw, "x")
        assert code(e) == err


# ---- handles and mappings ---------------------------------------------------------------------
def test_create_map_unmap_release_in_either_order_frees_memory() -> None:
    vmm, dev = make()
    r = vmm.reserve(8 * MiB, 0, BASE + (2 << 30))
    h1, h2 = vmm.create(G, PROP_DEV0), vmm.create(2 * G, PROP_DEV0)
    assert dev.mem == {}  # committed lazily
    vmm.map(7, r, G, 0, h1)
    vmm.map(7, r + G, 2 * G, 0, h2)
    assert sorted(dev.mem) == [r, r + G] and dev.ctx[r] == 7
    assert vmm.va.check(r, 3 * G - 1) is False and vmm.va.segments(r, 3 * G)
    # release first, then unmap: memory freed by the unmap
    vmm.release(h1)
    assert r in dev.mem
    vmm.unmap(r, G)
    assert r not in dev.mem
    with pytest.raises(CudaError):
        vmm.release(h1)  # released already
    # unmap first, then release: the memory stays (parked) until the release, no copy
    vmm.unmap(r + G, 2 * G)
    assert r + G in dev.mem and not vmm.va.check(r + G, 1)
    vmm.release(h2)
    assert dev.mem == {} and vmm.handles == {} and vmm.parked == {}
    assert not any(x.startswith(("save", "move")) for x in dev.log)
    vmm.address_free(r, 8 * MiB)


def test_unmap_covers_whole_mappings_only() -> None:
    vmm, _ = make()
    r = vmm.reserve(8 * MiB)
    hs = [vmm.create(G, PROP_DEV0) for _ in range(3)]
    for i, h in enumerate(hs):
        vmm.map(0, r + i * G, G, 0, h)
    for bad in [(r, G // 2), (r + G // 2, G), (r, 4 * G)]:
        with pytest.raises(CudaError) as e:
            vmm.unmap(*bad)
        assert code(e) == CUresult.CUDA_ERROR_INVALID_VALUE
    vmm.unmap(r, 2 * G)  # two whole mappings at once
    assert vmm.va.mapping(r) is None and vmm.va.mapping(r + 2 * G) == (r + 2 * G, G)


def test_map_errors() -> None:
    vmm, dev = make()
    r = vmm.reserve(4 * MiB, 0, BASE + (3 << 30))
    h = vmm.create(G, PROP_DEV0)
    big = vmm.create(2 * G, PROP_DEV0)

    def fails(err: CUresult, *args: int) -> None:
        with pytest.raises(CudaError) as e:
            vmm.map(0, *args)
        assert code(e) == err, e.value.message

    V, NS = CUresult.CUDA_ERROR_INVALID_VALUE, CUresult.CUDA_ERROR_NOT_SUPPORTED
    fails(V, r - G, G, 0, h)  # outside the reservation
    fails(V, r + G, 2 * G, 0, big)  # runs past its end
    fails(V, r + 4096, G, 0, h)  # unaligned
    fails(V, r, G, 0, 0xDEAD)  # not a handle
    fails(NS, r, G, 0, big)  # part of a handle
    fails(NS, r, G, G, big)  # at an offset
    vmm.map(0, r, G, 0, h)
    fails(V, r, G, 0, big)  # double map over a mapped range
    fails(NS, r + G, G, 0, h)  # the same handle at a second address (aliasing)
    assert list(dev.mem) == [r]


def test_a_parked_handle_keeps_its_contents_when_mapped_again() -> None:
    vmm, dev = make()
    r1 = vmm.reserve(4 * MiB, 0, BASE + (4 << 30))
    r2 = vmm.reserve(4 * MiB, 0, BASE + (5 << 30))
    h = vmm.create(G, PROP_DEV0)
    vmm.map(0, r1, G, 0, h)
    dev.mem[r1][:4] = b"data"
    vmm.unmap(r1, G)
    vmm.map(0, r1, G, 0, h)  # the same address again: nothing to move
    assert dev.mem[r1][:4] == b"data"
    vmm.unmap(r1, G)
    vmm.map(0, r2, G, 0, h)  # elsewhere: a device-to-device move
    assert r1 not in dev.mem and dev.mem[r2][:4] == b"data"
    assert f"move {r1:#x}->{r2:#x}" in dev.log
    # the device has no room for both copies: go through guest memory
    vmm.unmap(r2, G)
    dev.fail_commit = True
    with pytest.raises(CudaError) as e:
        vmm.map(0, r1, G, 0, h)
    assert code(e) == CUresult.CUDA_ERROR_OUT_OF_MEMORY
    assert vmm.handles[h].saved is not None and dev.mem == {}  # contents kept in the guest
    dev.fail_commit = False
    vmm.map(0, r1, G, 0, h)
    assert dev.mem[r1][:4] == b"data"


def test_parked_memory_gives_way_to_new_mappings_and_reservation_frees() -> None:
    vmm, dev = make()
    r = vmm.reserve(4 * MiB, 0, BASE + (6 << 30))
    a, b = vmm.create(G, PROP_DEV0), vmm.create(G, PROP_DEV0)
    vmm.map(0, r, G, 0, a)
    dev.mem[r][:2] = b"aa"
    vmm.unmap(r, G)  # a is parked at r
    vmm.map(0, r, G, 0, b)  # b wants r: a's contents are saved first
    assert vmm.handles[a].saved is not None and vmm.handles[a].parked_at is None
    vmm.unmap(r, G)  # b parked at r
    vmm.address_free(r, 4 * MiB)  # b saved too
    assert dev.mem == {} and vmm.handles[b].saved is not None
    r2 = vmm.reserve(4 * MiB)
    vmm.map(0, r2 + G, G, 0, a)
    assert dev.mem[r2 + G][:2] == b"aa"


def test_address_free_refuses_mapped_reservations() -> None:
    vmm, _ = make()
    r = vmm.reserve(4 * MiB)
    vmm.map(0, r, G, 0, vmm.create(G, PROP_DEV0))
    with pytest.raises(CudaError) as e:
        vmm.address_free(r, 4 * MiB)
    assert code(e) == CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaError):
        vmm.address_free(r + G, 2 * MiB)


def test_create_checks_free_memory_including_promised_handles() -> None:
    vmm, dev = make()
    dev.free = 10 * G
    vmm.create(6 * G, PROP_DEV0)
    with pytest.raises(CudaError) as e:
        vmm.create(6 * G, PROP_DEV0)  # fits alone, not with the first one's promise
    assert code(e) == CUresult.CUDA_ERROR_OUT_OF_MEMORY
    with pytest.raises(CudaError) as e:
        vmm.create(G + 1, PROP_DEV0)
    assert code(e) == CUresult.CUDA_ERROR_INVALID_VALUE
    # once mapped, a handle's memory is the device's business, no longer a promise
    first = next(iter(vmm.handles))
    vmm.map(0, vmm.reserve(6 * G), 6 * G, 0, first)
    assert dev.free == 4 * G
    second = vmm.create(4 * G, PROP_DEV0)
    with pytest.raises(CudaError):
        vmm.create(G, PROP_DEV0)
    vmm.release(second)
    vmm.create(G, PROP_DEV0)


def test_retain_access_and_properties() -> None:
    vmm, dev = make()
    r = vmm.reserve(4 * MiB)
    h = vmm.create(G, PROP_DEV0)
    vmm.map(0, r, G, 0, h)
    assert vmm.get_access(r) == 0
    vmm.set_access(r, G, 3)
    assert vmm.get_access(r + 100) == 3
    with pytest.raises(CudaError):
        vmm.set_access(r, 2 * G, 3)  # half of it is not mapped
    with pytest.raises(CudaError):
        vmm.get_access(r + G)
    assert vmm.retain(r + 12345) == h
    vmm.release(h)
    vmm.release(h)  # create + retain: two releases
    assert r in dev.mem  # still mapped
    assert vmm.retain(r) == h  # a released but mapped handle can be retained back
    assert vmm.handle(h).prop == PROP_DEV0
    vmm.release(h)
    vmm.unmap(r, G)
    assert dev.mem == {}


def test_destroying_a_context_frees_its_vmm_memory() -> None:
    vmm, dev = make()
    r = vmm.reserve(8 * MiB)
    h1, h2, h3 = (vmm.create(G, PROP_DEV0) for _ in range(3))
    vmm.map(1, r, G, 0, h1)
    vmm.map(2, r + G, G, 0, h2)
    vmm.map(1, r + 2 * G, G, 0, h3)
    vmm.unmap(r + 2 * G, G)  # h3 parked
    vmm.forget_context(1)
    assert list(dev.mem) == [r + G]
    assert vmm.va.mapping(r) is None and h1 in vmm.handles
    vmm.map(2, r, G, 0, h1)  # the handle is still usable
    vmm.release(h3)
