"""The guest's device-VA allocator (architecture invariant 2).

The guest chooses every device address, inside the window the daemon granted at session open,
so allocations need no round trip and a restored session finds its memory at the same addresses.
Device memory is committed in large *chunks* (2 MiB granularity, like the VMM API's): mapping a
chunk is the only operation that asks the daemon (it can run out of device memory), and
``cuMemAlloc`` sub-allocates inside chunks locally. Chunk sizes grow geometrically (2 MiB up to
``max_chunk``) so small programs commit little while large ones make few round trips; one empty
chunk of at most ``max_chunk`` bytes is kept for reuse, the others (and every dedicated chunk of
a large allocation) are released so ``cuMemGetInfo`` reflects frees.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Chunk", "FreeList", "VaAllocator", "VaError"]


class VaError(Exception):
    """Bad request to the allocator (zero size, unknown address, window exhausted)."""


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class FreeList:
    """Sorted, coalesced free ranges ``(start, size)`` with first-fit aligned takes."""

    def __init__(self, start: int, size: int) -> None:
        self.ranges: list[tuple[int, int]] = [(start, size)] if size else []

    def take(self, size: int, align: int = 1) -> int | None:
        for i, (off, n) in enumerate(self.ranges):
            start = _round_up(off, align)
            pad = start - off
            if n - pad >= size:
                rest = []
                if pad:
                    rest.append((off, pad))
                if n - pad > size:
                    rest.append((start + size, n - pad - size))
                self.ranges[i : i + 1] = rest
                return start
        return None

    def give(self, start: int, size: int) -> None:
        r = self.ranges
        i = bisect.bisect_left(r, (start, 0))
        r.insert(i, (start, size))
        if i + 1 < len(r) and start + size == r[i + 1][0]:
            r[i] = (start, size + r[i + 1][1])
            del r[i + 1]
        if i > 0 and r[i - 1][0] + r[i - 1][1] == start:
            r[i - 1] = (r[i - 1][0], r[i - 1][1] + r[i][1])
            del r[i]


@dataclass
class Chunk:
    """A mapped range of device memory and the free space inside it."""

    addr: int
    size: int
    used: int = 0
    free: FreeList = field(init=False)

    def __post_init__(self) -> None:
        self.free = FreeList(0, self.size)

    def take(self, size: int, align: int) -> int | None:
        off = self.free.take(size, align)
        if off is not None:
            self.used += size
        return off

    def give(self, off: int, size: int) -> None:
        self.free.give(off, size)
        self.used -= size


class VaAllocator:
    """Sub-allocates device memory inside chunks mapped at guest-chosen addresses."""

    def __init__(
        self,
        base: int,
        size: int,
        map_chunk: Callable[[int, int], None],
        unmap_chunk: Callable[[int], None],
        *,
        granularity: int = 2 << 20,
        align: int = 256,
        max_chunk: int = 64 << 20,
    ) -> None:
        self.base, self.size = base, size
        self.granularity, self.align, self.max_chunk = granularity, align, max_chunk
        self._map, self._unmap = map_chunk, unmap_chunk
        self.chunks: dict[int, Chunk] = {}
        self._chunk_starts: list[int] = []
        self._va_free = FreeList(base, size)  # unmapped parts of the window
        self._allocs: dict[int, tuple[int, int, int]] = {}  # addr -> (size, reserved, chunk)
        self._alloc_starts: list[int] = []
        self._next_chunk = granularity
        self._spare: int | None = None  # an empty chunk kept for reuse

    # ---- public --------------------------------------------------------------------------
    def alloc(self, size: int) -> int:
        """Return the address of a new allocation of ``size`` bytes (maps a chunk if needed)."""
        if size <= 0:
            raise VaError(f"cannot allocate {size} bytes")
        need = _round_up(size, self.align)
        for chunk in self.chunks.values():
            if chunk.size - chunk.used >= need:
                off = chunk.take(need, self.align)
                if off is not None:
                    return self._record(chunk, chunk.addr + off, size, need)
        chunk = self._new_chunk(need)
        off = chunk.take(need, self.align)
        assert off == 0
        return self._record(chunk, chunk.addr, size, need)

    def free(self, addr: int) -> int:
        """Release an allocation; returns its size."""
        entry = self._allocs.pop(addr, None)
        if entry is None:
            raise VaError(f"{addr:#x} is not the start of an allocation")
        size, reserved, caddr = entry
        del self._alloc_starts[bisect.bisect_left(self._alloc_starts, addr)]
        chunk = self.chunks[caddr]
        chunk.give(addr - caddr, reserved)
        if chunk.used == 0:
            if chunk.size > self.max_chunk:  # a dedicated large chunk: give it back now
                self._release_chunk(caddr)
                return size
            if self._spare is not None and self._spare != caddr:
                self._release_chunk(self._spare)
            self._spare = caddr
        return size

    def find(self, addr: int) -> tuple[int, int] | None:
        """The (start, size) of the allocation containing ``addr``, or None."""
        i = bisect.bisect_right(self._alloc_starts, addr) - 1
        if i < 0:
            return None
        start = self._alloc_starts[i]
        size = self._allocs[start][0]
        return (start, size) if addr < start + size else None

    def check(self, addr: int, size: int) -> bool:
        """True if ``[addr, addr+size)`` lies inside one allocation."""
        hit = self.find(addr)
        return hit is not None and addr + size <= hit[0] + hit[1]

    @property
    def mapped_bytes(self) -> int:
        return sum(c.size for c in self.chunks.values())

    def allocations(self) -> list[tuple[int, int]]:
        return [(a, self._allocs[a][0]) for a in self._alloc_starts]

    # ---- internals -----------------------------------------------------------------------
    def _record(self, chunk: Chunk, addr: int, size: int, reserved: int) -> int:
        if self._spare == chunk.addr:
            self._spare = None
        self._allocs[addr] = (size, reserved, chunk.addr)
        bisect.insort(self._alloc_starts, addr)
        return addr

    def _new_chunk(self, need: int) -> Chunk:
        exact = _round_up(need, self.granularity)
        sizes = [max(exact, min(self._next_chunk, self.max_chunk))]
        if sizes[0] != exact:
            sizes.append(exact)  # the device may have room for what we need but not more
        last_error: Exception | None = None
        for csize in sizes:
            addr = self._take_va(csize)
            try:
                self._map(addr, csize)
            except Exception as e:
                self._give_va(addr, csize)
                last_error = e
                continue
            self._next_chunk = min(self._next_chunk * 2, self.max_chunk)
            chunk = Chunk(addr, csize)
            self.chunks[addr] = chunk
            bisect.insort(self._chunk_starts, addr)
            return chunk
        assert last_error is not None
        raise last_error

    def _release_chunk(self, addr: int) -> None:
        chunk = self.chunks.pop(addr)
        del self._chunk_starts[bisect.bisect_left(self._chunk_starts, addr)]
        self._unmap(addr)
        self._give_va(addr, chunk.size)

    def _take_va(self, size: int) -> int:
        addr = self._va_free.take(size, self.granularity)
        if addr is None:
            raise VaError(f"the session's VA window has no free range of {size} bytes")
        return addr

    def _give_va(self, addr: int, size: int) -> None:
        self._va_free.give(addr, size)
