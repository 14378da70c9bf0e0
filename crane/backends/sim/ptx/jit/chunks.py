"""A compiled launch's blocks handed to its threads a chunk at a time, in block order.

Why not one contiguous range of blocks per core: the cores are shared (other sessions'
workers, the daemon, the guest's own threads on a small host), so a launch's second thread
often starts late or is descheduled for a while, and with the grid cut in halves the launch
waited for the late half while the first thread idled (a 1M-thread saxpy took longer on two
cores than on one when the other core was busy). A thread that takes the next chunk when it
has run one shares the work as it goes: a thread that never got a core took nothing (its
task is cancelled) and the launch costs what the threads that ran could do.

What stays as it was: chunks go out in block order, so when a block runs every block before
it has been handed out (finished, or running on another thread), and a block that waits on
earlier ones (CUB's decoupled look-back, :mod:`.spin`) waits on blocks that run. After a
fault no chunk is handed out; every lower chunk runs to its end or its own first fault (the
driver stops at a block that faults), so the fault of the lowest chunk that had one is that of
the first faulting block in block order, the one the interpreter, running blocks in order,
reports.
"""

from __future__ import annotations

import threading

__all__ = ["CHUNKS_PER_THREAD", "Chunks", "chunk_size"]

#: chunks per thread of an even split: a late thread's share is what it can still take,
#: each chunk a native call (about 3 µs of Python around it)
CHUNKS_PER_THREAD = 4


def chunk_size(blocks: int, threads: int, most: int) -> int:
    """Blocks per chunk for ``blocks`` over ``threads``: CHUNKS_PER_THREAD chunks each, at
    least one block and at most ``most`` (one native call's worth)."""
    even = -(-blocks // max(1, threads * CHUNKS_PER_THREAD))
    return max(1, min(most, even))


class Chunks:
    """Blocks ``[0, blocks)`` in chunks of ``size``, to whichever thread asks next."""

    def __init__(self, blocks: int, size: int) -> None:
        self.blocks = blocks
        self.size = max(1, size)
        self._next = 0
        self._stopped = False
        self._lock = threading.Lock()

    def take(self) -> tuple[int, int] | None:
        """The next chunk ``(first, end)``, or None when all are out or a thread stopped."""
        with self._lock:
            if self._stopped or self._next >= self.blocks:
                return None
            first = self._next
            self._next = min(first + self.size, self.blocks)
            return first, self._next

    def stop(self) -> None:
        """No more chunks (a fault, or the deadline passed)."""
        with self._lock:
            self._stopped = True
