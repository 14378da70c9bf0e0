"""Which allocations may have changed since a mark: what pre-copy and incremental copies need.

Why allocation granularity: the worker sees every write's destination (the call table's
``writes`` names them) but not what a kernel writes, only its parameters. A kernel can write
through any pointer it is given, so every 8-byte parameter value that points into an allocation
marks that allocation. Module variables (``__device__``) can be written by any kernel of their
module, so any launch marks them all (they are small).

Pointers stored *inside* device memory (a table of buffers the kernel follows; cuBLAS's batched
GEMMs take one) are the hard case: the kernel gets only the table. The tracker keeps a graph of
which allocation holds pointers into which, learnt from the bytes it sees: every host-to-device
copy up to :data:`SCAN_LIMIT` bytes (pointer tables are built on the host and uploaded), every
device-to-device copy (the destination inherits the source's pointers), and every allocation a
migration or checkpoint reads (so tables written by kernels are learnt at the next round, and a
restored session learns its tables again). A launch marks what its parameters point into and,
transitively, what those allocations point into. Module variables holding pointers (a
``__device__`` struct of buffers that kernels taking no pointer parameter follow) are learnt
the same way, from uploads into them (``cudaMemcpyToSymbol``) and from a migration's reads of
them, and every launch marks what they point into, since any kernel of the module may follow
them. References are only ever added while an
allocation lives (over-marking costs copying, never correctness). The known gap: a table that
a kernel writes and another kernel follows, both after the last read of the table, is not
learnt in time; docs/design.md lists it.

One exception to "a pointer marks its allocation": memory mapped with the VMM API arrives as
one allocation per mapping, each filling its own chunk, and a program that maps handles back to
back (PyTorch's expandable segments) treats the run as one buffer, so a kernel given a pointer
into one mapping may write into the next. A pointer into a whole-chunk allocation therefore
marks the contiguous run of whole-chunk allocations around it. Ordinary allocations never fill
a chunk exactly unless they are chunk-sized, and marking such a neighbour is only extra copying.
"""

from __future__ import annotations

import bisect
import functools
import struct

import numpy as np

__all__ = ["SCAN_LIMIT", "DirtyTracker", "pointer_slots"]

_U64 = struct.Struct("<Q")


@functools.lru_cache(maxsize=4096)
def pointer_slots(layout: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """Offsets in a kernel's parameter buffer where a pointer can sit, from its layout.

    An 8-byte parameter is one slot. A larger one is a struct (or an array): a pointer member
    is 8-byte aligned inside an 8-byte-aligned struct, so its 8-aligned words are slots; a
    struct aligned to less can hold one only when packed, so all its 4-aligned words are.
    Parameters under 8 bytes hold no pointer. Words that straddle two parameters never count:
    ``f(table, 4096)`` packs the high half of ``table`` beside ``4096``, which can read as an
    address inside some allocation and mark it (and copy it again) every pre-copy round."""
    out: list[int] = []
    for off, size in layout:
        if size == 8:
            out.append(off)
        elif size > 8:
            out.extend(range(off, off + size - 7, 8 if off % 8 == 0 else 4))
    return tuple(out)


#: Host-to-device copies up to this size are scanned for pointers (pointer tables are small;
#: scanning every byte of bulk uploads would cost bandwidth for nothing).
SCAN_LIMIT = 1 << 20


class DirtyTracker:
    """Allocation ranges plus the set of those written since the last :meth:`mark`."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._sizes: list[int] = []
        self.dirty: set[int] = set()
        self.globals_dirty = False
        self._whole: set[int] = set()  # allocations that fill their chunk (VMM mappings)
        self.refs: dict[int, set[int]] = {}  # allocation -> allocations it holds pointers into
        #: allocations that memory outside every allocation (module variables) points into
        self.global_refs: set[int] = set()
        #: (layout, parameter buffer) pairs :meth:`launch` marked for since anything it
        #: follows last changed (the allocations, the pointers learnt, a mark): the same
        #: launch again marks nothing new, and a loop launches the same parameters thousands
        #: of times
        self._launched: set[tuple[tuple[tuple[int, int], ...] | None, bytes]] = set()

    def add(self, addr: int, size: int, whole_chunk: bool = False) -> None:
        """A new allocation: dirty (its contents are whatever the device held)."""
        self._launched.clear()
        i = bisect.bisect_left(self._starts, addr)
        self._starts.insert(i, addr)
        self._sizes.insert(i, size)
        self.dirty.add(addr)
        if whole_chunk:
            self._whole.add(addr)

    def remove(self, addr: int) -> None:
        self._launched.clear()
        i = bisect.bisect_left(self._starts, addr)
        if i < len(self._starts) and self._starts[i] == addr:
            del self._starts[i]
            del self._sizes[i]
        self.dirty.discard(addr)
        self._whole.discard(addr)
        self.refs.pop(addr, None)  # a stale target left in another's set only over-marks
        self.global_refs.discard(addr)

    def find(self, ptr: int) -> int | None:
        """Start of the allocation containing ``ptr``, if any."""
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i >= 0 and ptr < self._starts[i] + self._sizes[i]:
            return self._starts[i]
        return None

    def write(self, ptr: int) -> None:
        a = self.find(ptr)
        if a is not None:
            self.dirty.add(a)

    def write_many(self, ptrs: np.ndarray) -> None:
        """:meth:`write` of every pointer (a run of packed calls' destinations) at once."""
        if not self._starts or not len(ptrs):
            return
        starts = np.array(self._starts, np.uint64)
        ends = starts + np.array(self._sizes, np.uint64)
        p = ptrs.astype(np.uint64, copy=False)
        at = np.searchsorted(starts, p, side="right").astype(np.int64) - 1
        hit = (at >= 0) & (p < ends[np.maximum(at, 0)])
        marked = np.zeros(len(starts), bool)  # (a mask, not np.unique: no sort, no hashing)
        marked[at[hit]] = True
        self.dirty.update(starts[marked].tolist())

    def bounds(self) -> tuple[int, int]:
        """The span of all allocations (where a pointer value can point at all)."""
        if not self._starts:
            return 0, 0
        return self._starts[0], self._starts[-1] + self._sizes[-1]

    @staticmethod
    def pointer_values(addr: int, data: bytes | memoryview, bounds: tuple[int, int]) -> list[int]:
        """The distinct 8-byte-aligned values in ``data`` (stored at ``addr``) that fall inside
        ``bounds``. Pure: a migration's reader thread runs it outside the session's lock and
        hands the result to :meth:`learn` under it."""
        lo, hi = bounds
        skip = -addr % 8  # pointers are 8-byte aligned in device memory
        n = (len(data) - skip) // 8
        if n <= 0 or lo >= hi:
            return []
        values = np.frombuffer(data, dtype="<u8", count=n, offset=skip)
        hits = values[(values >= lo) & (values < hi)]
        return np.unique(hits).tolist() if len(hits) else []

    def learn(self, addr: int, values: list[int]) -> None:
        """Record that the allocation at ``addr`` holds these pointer values (memory outside
        every allocation: a module variable, whose pointers every launch may follow)."""
        if not values:
            return
        self._launched.clear()
        holder = self.find(addr)
        found = self.global_refs if holder is None else self.refs.setdefault(holder, set())
        for v in values:
            a = self.find(v)
            if a is not None and a != holder:
                found.add(a)

    def contents(self, addr: int, data: bytes | memoryview) -> None:
        """Memory read or written whole by a checkpoint, restore or migration round: learn its
        pointers if it belongs to a small allocation (where pointer tables live)."""
        i = bisect.bisect_right(self._starts, addr) - 1
        inside = i >= 0 and addr < self._starts[i] + self._sizes[i]
        if (self._sizes[i] <= SCAN_LIMIT) if inside else (len(data) <= SCAN_LIMIT):
            self.scan(addr, data)  # outside every allocation: a module variable

    def scan(self, addr: int, data: bytes | memoryview) -> None:
        """Learn the pointers that ``data``, now stored at ``addr``, holds into allocations."""
        if self._starts:
            self.learn(addr, self.pointer_values(addr, data, self.bounds()))

    def copied(self, dst: int, src: int) -> None:
        """A device-to-device copy: the destination may now hold the source's pointers."""
        s, d = self.find(src), self.find(dst)
        if s is not None and d is not None and self.refs.get(s):
            self._launched.clear()
            self.refs.setdefault(d, set()).update(self.refs[s])

    def _kernel_write(self, ptr: int) -> None:
        """What a kernel given ``ptr`` may write: its allocation, or a run of mappings, and
        whatever the pointers stored in them lead to."""
        a = self.find(ptr)
        if a is None:
            return
        self._follow(a)
        if a not in self._whole:
            return
        i = bisect.bisect_left(self._starts, a)
        j = i
        while (
            j > 0
            and self._starts[j - 1] in self._whole
            and (self._starts[j - 1] + self._sizes[j - 1] == self._starts[j])
        ):
            j -= 1
            self._follow(self._starts[j])
        j = i
        while (
            j + 1 < len(self._starts)
            and self._starts[j + 1] in self._whole
            and (self._starts[j] + self._sizes[j] == self._starts[j + 1])
        ):
            j += 1
            self._follow(self._starts[j])

    def _follow(self, a: int) -> None:
        """Mark ``a`` and everything reachable from it through stored pointers."""
        if not self.refs:
            self.dirty.add(a)
            return
        seen: set[int] = set()
        todo = [a]
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            self.dirty.add(x)
            todo.extend(self.refs.get(x, ()))

    def launch(self, params: bytes, layout: tuple[tuple[int, int], ...] | None = None) -> None:
        """Mark every allocation a kernel parameter points into, all module variables, and
        what the module variables point into. ``layout`` is the kernel's (offset, size) per
        parameter: only words that lie inside one parameter are read as pointers, so two
        neighbouring scalars never pass for an address. Without it (a caller that does not
        know the kernel), every 4-byte-aligned word is read."""
        self.globals_dirty = True
        params = bytes(params)  # (a no-op for bytes)
        if not self._starts:
            return
        key = (layout, params)
        if key in self._launched:
            return
        if len(self._launched) < 256:
            self._launched.add(key)
        for a in list(self.global_refs):
            self._follow(a)
        lo, hi = self._starts[0], self._starts[-1] + self._sizes[-1]
        at = pointer_slots(layout) if layout is not None else range(0, len(params) - 7, 4)
        for off in at:
            (v,) = _U64.unpack_from(params, off)
            if lo <= v < hi:
                self._kernel_write(v)

    def mark(self) -> tuple[set[int], bool]:
        """(allocations written since the last mark, module variables written); starts anew."""
        out, g = self.dirty, self.globals_dirty
        self._launched.clear()
        self.dirty = set()
        self.globals_dirty = False
        return out, g
