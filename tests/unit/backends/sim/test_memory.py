"""Simulated device memory: chunks, allocations, validated ranges and per-lane accesses."""

from __future__ import annotations

import os
from pathlib import Path

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


# ---- the window on a memfd: released pages, handing the memory to another worker ------------
def _held(m: SimMemory) -> int:
    """Bytes the window's memfd holds in memory (its allocated blocks)."""
    return os.fstat(m.handle()).st_blocks * 512


def test_unmapping_a_chunk_releases_its_pages_and_they_read_zero(mem: SimMemory) -> None:
    """A shared mapping's pages survive MADV_DONTNEED: unmapping must punch them out of the
    memfd, or a session's freed memory would stay charged to the host (and read stale)."""
    mem.alloc(BASE, 4 * MiB)
    mem.fill(BASE, 0x5A, 1, 4 * MiB)
    assert _held(mem) >= 4 * MiB
    mem.free(BASE)
    mem.unmap_chunk(BASE)
    assert _held(mem) == 0
    mem.map_chunk(BASE, 4 * MiB)
    mem.alloc(BASE, 4 * MiB)
    assert not mem.view(BASE, 4 * MiB).any()


def _pair() -> tuple[SimMemory, SimMemory]:
    src, dst = SimMemory(BASE, 1 << 40), SimMemory(BASE, 1 << 40)
    for m in (src, dst):
        m.map_chunk(BASE, 4 * MiB)
        m.alloc(BASE, 4 * MiB)
    return src, dst


def test_adopted_memory_is_the_same_pages_under_the_views_already_held() -> None:
    src, dst = _pair()
    try:
        noise = np.random.default_rng(2).integers(0, 256, 4 * MiB, dtype=np.uint8)
        src.write(BASE, noise)
        dst.fill(BASE, 0x77, 1, 1 * MiB)  # the destination's own restore steps wrote here
        view = dst.view(BASE, 4 * MiB)  # as a kernel (or the PTX compiler's base) holds it
        base_addr = dst.buf.ctypes.data
        own = os.dup(dst.handle())  # to see that the destination's own pages go
        try:
            dst.adopt(os.dup(src.handle()))
            assert os.fstat(own).st_blocks == 0
        finally:
            os.close(own)
        assert dst.buf.ctypes.data == base_addr
        assert np.array_equal(view, noise)  # no copy: the view now shows the source's pages
        dst.claim()
        dst.fill(BASE, 1, 1, 16)
        assert src.read(BASE, 16) == b"\x01" * 16  # one memory, two mappings
    finally:
        src.close()
        dst.close()


def test_only_the_owner_releases_shared_pages() -> None:
    """An adopted window is not released from before the commit (an abort gives the memory
    back to its source untouched), and a source that handed its memory over releases nothing
    after it (the destination's pages now)."""
    src, dst = _pair()
    try:
        src.fill(BASE, 0x42, 1, 4 * MiB)
        dst.adopt(os.dup(src.handle()))
        dst.free(BASE)
        dst.unmap_chunk(BASE)  # not committed to yet: forgotten here, not released
        assert src.read(BASE, 4) == b"\x42" * 4 and _held(src) >= 4 * MiB
        dst.map_chunk(BASE, 4 * MiB)
        dst.alloc(BASE, 4 * MiB)
        dst.claim()
        src.disown()
        src.free(BASE)
        src.unmap_chunk(BASE)
        assert dst.read(BASE, 4) == b"\x42" * 4
        dst.free(BASE)
        dst.unmap_chunk(BASE)  # the owner's unmap releases them
        assert _held(dst) == 0
    finally:
        src.close()
        dst.close()


def test_adopt_refuses_what_is_not_a_sealed_window_of_its_size() -> None:
    m = SimMemory(BASE, 4 * MiB)
    other = SimMemory(BASE, 8 * MiB)
    loose = os.memfd_create("loose", os.MFD_CLOEXEC)
    try:
        os.ftruncate(loose, 4 * MiB)
        with pytest.raises(ValueError, match="holds 8388608 bytes"):
            m.adopt(other.handle())
        with pytest.raises(ValueError, match="not sealed"):
            m.adopt(loose)
        assert m.owns_pages
    finally:
        os.close(loose)
        m.close()
        other.close()


def test_reading_what_was_never_written_commits_nothing(tmp_path: Path) -> None:
    """A read fault on a hole of a shared mapping commits a page: the backend answers a large
    read of a never-written range with zeros without touching it, so a checkpoint or migration
    of a sparse session (or a data plane's zero check) does not fill its memory."""
    from crane.backends.catalog import builtin_model
    from crane.backends.sim.backend import UNTOUCHED_CHECK, SimBackend
    from crane.device.ledger import Ledger

    model = builtin_model("h100-80gb")
    be = SimBackend(
        model,
        model.snapshot(b"\x01" * 16),
        (BASE, 1 << 40),
        Ledger(tmp_path / "l", model.total_mem),
        0,
    )
    try:
        be.map_chunk(BASE, 8 * MiB)
        be.mem_alloc(BASE, 8 * MiB)
        assert be.memory.untouched(BASE, 8 * MiB)
        assert not any(be.memcpy_dtoh(BASE, 8 * MiB, None))
        assert _held(be.memory) == 0
        be.memcpy_htod(BASE + 6 * MiB, b"\x01", None)
        assert be.memory.untouched(BASE, 4 * MiB) and not be.memory.untouched(BASE, 8 * MiB)
        got = be.memcpy_dtoh(BASE + 4 * MiB, 4 * MiB, None)
        assert got[2 * MiB] == 1  # a range written in part is read where it lies
        assert be.memcpy_dtoh(BASE, UNTOUCHED_CHECK - 1, None).nbytes == UNTOUCHED_CHECK - 1
    finally:
        be.close()
