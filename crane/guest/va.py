"""The guest's device-VA allocator (architecture invariant 2).

The guest chooses every device address, inside the window the daemon granted at session open,
so allocations need no round trip and a restored session finds its memory at the same addresses.
Device memory is committed in large *chunks* (2 MiB granularity, like the VMM API's): mapping a
chunk is the only operation that asks the daemon (it can run out of device memory), and
``cuMemAlloc`` sub-allocates inside chunks locally. Chunk sizes grow geometrically (2 MiB up to
``max_chunk``) so small programs commit little while large ones make few round trips; one empty
chunk of at most ``max_chunk`` bytes is kept for reuse, the others (and every dedicated chunk of
a large allocation) are released so ``cuMemGetInfo`` reflects frees.

The window is also what the CUDA virtual memory management API hands out
(:mod:`crane.guest.vmm`): :meth:`VaAllocator.reserve` takes a range of it for
``cuMemAddressReserve`` (at the caller's hint when that range is free; otherwise from the top of
the window, away from the chunks that grow from the bottom), and :meth:`VaAllocator.add_mapping`
registers a range mapped there, so that :meth:`VaAllocator.check` (the local validity check of
every copy and memset) and :meth:`VaAllocator.lookup` see it as device memory. :meth:`find` and
:meth:`free` keep meaning ``cuMemAlloc`` allocations only.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Chunk", "FreeList", "VaAllocator", "VaError"]

#: :attr:`VaAllocator.hit` when it holds nothing: a start above every 64-bit address.
_NO_HIT = (1 << 65, 0)


def _nothing() -> None:
    """The default :attr:`VaAllocator.on_forget`."""


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

    def take_at(self, start: int, size: int) -> bool:
        """Take exactly ``[start, start+size)`` if it lies inside one free range."""
        i = bisect.bisect_right(self.ranges, (start, 1 << 64)) - 1
        if i < 0 or size <= 0:
            return False
        off, n = self.ranges[i]
        if start + size > off + n:
            return False
        rest = []
        if start > off:
            rest.append((off, start - off))
        if start + size < off + n:
            rest.append((start + size, off + n - start - size))
        self.ranges[i : i + 1] = rest
        return True

    def take_last(self, size: int, align: int = 1) -> int | None:
        """Take the highest ``align``-aligned range of ``size`` bytes (last fit)."""
        for i in range(len(self.ranges) - 1, -1, -1):
            off, n = self.ranges[i]
            if n < size:
                continue
            start = (off + n - size) // align * align
            if start >= off:
                self.take_at(start, size)
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
        #: VMM address reservations (cuMemAddressReserve): start -> size.
        self.reservations: dict[int, int] = {}
        self._res_starts: list[int] = []
        #: Ranges mapped inside reservations (cuMemMap): start -> size.
        self.mappings: dict[int, int] = {}
        self._map_starts: list[int] = []
        #: ``(start, end)`` of the allocation or mapping :meth:`check` found last, or
        #: :data:`_NO_HIT` (no address is at or above its start) once it may be gone (a free,
        #: an unmap): the next check of the same buffer (a loop's memsets) is two comparisons;
        #: callers on the hottest path compare with it inline.
        self.hit = _NO_HIT
        #: Called whenever a range may be gone (a free, an unmap): whoever keeps its own copy
        #: of what :meth:`check` accepted (the interposer's C fast lane) drops it.
        self.on_forget: Callable[[], None] = _nothing

    # ---- public --------------------------------------------------------------------------
    def alloc(self, size: int, align: int = 0) -> int:
        """Return the address of a new allocation of ``size`` bytes (maps a chunk if needed);
        ``align`` (a power of two, at most the chunk granularity) raises the alignment, and the
        allocation then also owns whole ``align``-sized units (host memory mapped at the same
        address needs whole pages)."""
        if size <= 0:
            raise VaError(f"cannot allocate {size} bytes")
        a = max(self.align, align)
        need = _round_up(size, a)
        for chunk in self.chunks.values():
            if chunk.size - chunk.used >= need:
                off = chunk.take(need, a)
                if off is not None:
                    return self._record(chunk, chunk.addr + off, size, need)
        chunk = self._new_chunk(need)
        off = chunk.take(need, a)
        assert off == 0
        return self._record(chunk, chunk.addr, size, need)

    def free(self, addr: int) -> int:
        """Release an allocation; returns its size."""
        entry = self._allocs.pop(addr, None)
        if entry is None:
            raise VaError(f"{addr:#x} is not the start of an allocation")
        self.hit = _NO_HIT
        self.on_forget()
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
        """True if ``[addr, addr+size)`` lies inside one allocation or one VMM mapping."""
        lo, hi = self.hit
        if lo <= addr and addr + size <= hi:
            return True
        hit = self.find(addr)
        if (hit is None or addr + size > hit[0] + hit[1]) and self.mappings:
            hit = self.mapping(addr)
        if hit is None or addr + size > hit[0] + hit[1]:
            return False
        self.hit = (hit[0], hit[0] + hit[1])
        return True

    def lookup(self, addr: int) -> tuple[int, int] | None:
        """The (start, size) of the allocation or VMM mapping containing ``addr``, or None."""
        return self.find(addr) or (self.mapping(addr) if self.mappings else None)

    # ---- VMM: reservations and mappings ----------------------------------------------------
    def reserve(self, size: int, align: int = 0, hint: int = 0) -> int:
        """Reserve ``size`` bytes of the window (``cuMemAddressReserve``) and return the start.

        ``size`` must be a multiple of the granularity; ``align`` is 0 (the granularity) or a
        power of two (raised to the granularity if smaller). A non-zero ``hint`` is honoured
        when ``[hint, hint+size)`` is aligned, inside the window and wholly free; otherwise (as
        the driver treats it: only a hint) the highest free aligned range is taken."""
        g = self.granularity
        if size <= 0 or size % g:
            raise VaError(f"reservation size {size:#x} is not a positive multiple of {g:#x}")
        if align < 0 or align & (align - 1):
            raise VaError(f"alignment {align:#x} is not a power of two")
        align = max(align, g)
        got: int | None = hint
        if not (hint and hint % align == 0 and self._va_free.take_at(hint, size)):
            got = self._va_free.take_last(size, align)
            if got is None:
                raise VaError(
                    f"the session's VA window has no free range of {size:#x} bytes "
                    f"aligned to {align:#x}"
                )
        self.reservations[got] = size
        bisect.insort(self._res_starts, got)
        return got

    def unreserve(self, addr: int, size: int) -> None:
        """Give a reservation back (``cuMemAddressFree``); it must hold no mapping."""
        if self.reservations.get(addr) != size:
            raise VaError(f"{addr:#x}+{size:#x} is not an address reservation")
        if self.overlaps_mapping(addr, size):
            raise VaError(f"reservation {addr:#x}+{size:#x} still has mapped ranges")
        del self.reservations[addr]
        del self._res_starts[bisect.bisect_left(self._res_starts, addr)]
        self._give_va(addr, size)

    def reservation(self, addr: int) -> tuple[int, int] | None:
        """The (start, size) of the reservation containing ``addr``, or None."""
        return self._containing(self._res_starts, self.reservations, addr)

    def add_mapping(self, addr: int, size: int) -> None:
        """Register ``[addr, addr+size)`` as mapped device memory: inside one reservation,
        overlapping no other mapping."""
        res = self.reservation(addr)
        if size <= 0 or res is None or addr + size > res[0] + res[1]:
            raise VaError(f"{addr:#x}+{size:#x} is not inside one address reservation")
        if self.overlaps_mapping(addr, size):
            raise VaError(f"{addr:#x}+{size:#x} overlaps a mapped range")
        self.mappings[addr] = size
        bisect.insort(self._map_starts, addr)

    def remove_mapping(self, addr: int) -> int:
        """Forget the mapping that starts at ``addr``; returns its size."""
        size = self.mappings.pop(addr, None)
        if size is None:
            raise VaError(f"{addr:#x} is not the start of a mapped range")
        self.hit = _NO_HIT
        self.on_forget()
        del self._map_starts[bisect.bisect_left(self._map_starts, addr)]
        return size

    def overlaps_mapping(self, addr: int, size: int) -> bool:
        """True if any mapped range overlaps ``[addr, addr+size)``."""
        return self._overlapping(self._map_starts, self.mappings, addr, size)

    def mapping(self, addr: int) -> tuple[int, int] | None:
        """The (start, size) of the VMM mapping containing ``addr``, or None."""
        return self._containing(self._map_starts, self.mappings, addr)

    def mapped_span(self, addr: int, size: int) -> list[tuple[int, int]] | None:
        """The mappings, in order, that together cover ``[addr, addr+size)`` without a gap
        (VMM mappings placed back to back form one usable range), or None."""
        out: list[tuple[int, int]] = []
        at, end = addr, addr + size
        while at < end:
            m = self.mapping(at)
            if m is None:
                return None
            out.append(m)
            at = m[0] + m[1]
        return out if size > 0 else None

    def segments(self, addr: int, size: int) -> list[tuple[int, int]] | None:
        """Split ``[addr, addr+size)`` at mapping boundaries when it runs across back-to-back
        VMM mappings: ``[(start, size), ...]``, each inside one mapping. None when the range is
        not covered by mappings (or needs no split)."""
        span = self.mapped_span(addr, size) if self.mappings else None
        if span is None or len(span) < 2:
            return None
        end = addr + size
        return [(max(a, addr), min(a + n, end) - max(a, addr)) for a, n in span]

    @staticmethod
    def _containing(starts: list[int], table: dict[int, int], addr: int) -> tuple[int, int] | None:
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0:
            return None
        start = starts[i]
        size = table[start]
        return (start, size) if addr < start + size else None

    @staticmethod
    def _overlapping(starts: list[int], table: dict[int, int], addr: int, size: int) -> bool:
        i = bisect.bisect_left(starts, addr + size) - 1
        return i >= 0 and starts[i] + table[starts[i]] > addr

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
