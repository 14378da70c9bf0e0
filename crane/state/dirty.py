"""Which allocations may have changed since a mark: what pre-copy and incremental copies need.

Why allocation granularity: the worker sees every write's destination (the call table's
``writes`` names them) but not what a kernel writes, only its parameters. A kernel can write
through any pointer it is given, so every 8-byte parameter value that points into an allocation
marks that allocation; a pointer stored *inside* device memory and followed by a kernel is
covered because the allocation holding it was itself passed (or its pointee was), which is the
usual CUDA shape. Module variables (``__device__``) can be written by any kernel of their module,
so any launch marks them all (they are small).
"""

from __future__ import annotations

import bisect
import struct

__all__ = ["DirtyTracker"]


class DirtyTracker:
    """Allocation ranges plus the set of those written since the last :meth:`mark`."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._sizes: list[int] = []
        self.dirty: set[int] = set()
        self.globals_dirty = False

    def add(self, addr: int, size: int) -> None:
        """A new allocation: dirty (its contents are whatever the device held)."""
        i = bisect.bisect_left(self._starts, addr)
        self._starts.insert(i, addr)
        self._sizes.insert(i, size)
        self.dirty.add(addr)

    def remove(self, addr: int) -> None:
        i = bisect.bisect_left(self._starts, addr)
        if i < len(self._starts) and self._starts[i] == addr:
            del self._starts[i]
            del self._sizes[i]
        self.dirty.discard(addr)

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

    def launch(self, params: bytes) -> None:
        """Mark every allocation a kernel parameter points into, and all module variables."""
        self.globals_dirty = True
        if not self._starts:
            return
        lo, hi = self._starts[0], self._starts[-1] + self._sizes[-1]
        n = len(params) // 8
        for (v,) in struct.iter_unpack("<Q", params[: n * 8]) if n else ():
            if lo <= v < hi:
                self.write(v)
        # parameters are 4-byte aligned at least; an 8-byte pointer is 8-byte aligned, but a
        # struct parameter may place one at offset 4 mod 8
        if len(params) >= 12:
            for (v,) in struct.iter_unpack("<Q", params[4 : 4 + ((len(params) - 4) // 8) * 8]):
                if lo <= v < hi:
                    self.write(v)

    def mark(self) -> tuple[set[int], bool]:
        """(allocations written since the last mark, module variables written); starts anew."""
        out, g = self.dirty, self.globals_dirty
        self.dirty = set()
        self.globals_dirty = False
        return out, g
