"""The call ring's bulk area: the bytes of large copies, beside the call ring, not in it.

A bulk copy's calls (``MEMCPY_HTOD_STAGED``, ``MEMCPY_DTOH_STAGED``) travel in the call ring
without their bytes; the bytes stream through one of two byte FIFOs in a memfd of their own
(``bulkcore.c``, built into :mod:`crane.wire._bulkcore`), in the order of the calls: FIFO
:data:`H2D` from the guest to the worker, :data:`D2H` back. Each side copies with one C memcpy
per step, the GIL released, straight between its own buffer (the application's host memory, the
device memory's mapping) and the shared FIFO, so the two copies of a transfer run at once.

The worker makes the area at the ring's handshake and sends its descriptor with the ring's
(``SCM_RIGHTS``, a second descriptor); a guest that gets none copies through the ring's
messages as before. Either side ends the area with :meth:`BulkArea.close_streams`: the other's
waits end (bytes already published stay readable), and a side whose peer died learns it from
the ring's handshake socket (``alive``), looked at every :data:`POLL_MS`.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Callable
from typing import Any

from crane.wire.ring import RingClosed, laid_out_memfd
from crane.wire.status import MAX_CHUNK

__all__ = [
    "D2H",
    "DEFAULT_BULK_CAP",
    "H2D",
    "STAGED_MAX",
    "BulkArea",
    "bulk_available",
]

#: Bytes of each FIFO: enough that neither side waits on the other's per-call work (a call's
#: decode and dispatch take tens of microseconds, 20 GiB/s fills 1 MiB in 50), small enough to
#: stay in a server's last-level cache.
DEFAULT_BULK_CAP = 8 << 20
H2D = 0  # guest -> worker
D2H = 1  # worker -> guest
#: The most bytes one staged call moves, per FIFO. Few calls per copy keep the worker's
#: per-call work (decode, dispatch, tracking: tens of microseconds, in which it copies
#: nothing) off the copy's time: 16 MiB pieces made 64 MiB uploads 5% faster than 4 MiB ones.
#: A resend carries the call's bytes inline, so the limit is what one call may carry on every
#: path: 16 MiB fits a gRPC message (64 MiB) for an upload; a read's reply is held to
#: ``MAX_CHUNK`` by the worker, so staged reads are too.
STAGED_MAX = {H2D: 16 << 20, D2H: MAX_CHUNK}
#: How long one C wait lasts before the caller looks whether its peer is still there.
POLL_MS = 100

try:
    from crane.wire._bulkcore import ffi, lib  # type: ignore[import-not-found]
except ImportError as _e:  # not built (a source tree without scripts/setup.sh)
    ffi = lib = None
    _missing = str(_e)
else:
    _missing = ""


def bulk_available() -> str:
    """Empty when the bulk area can be used here, else why not."""
    if lib is None:
        return f"the bulk area's C core is not built ({_missing})"
    return ""


def _address(buf: Any) -> Any:
    """A cffi pointer to ``buf``'s bytes (a buffer object or a cffi pointer)."""
    if isinstance(buf, ffi.CData):
        return ffi.cast("char *", buf)
    return ffi.from_buffer("char[]", buf)


def _init_bulk(cap: int) -> Callable[[mmap.mmap], int]:
    def init(m: mmap.mmap) -> int:
        with ffi.from_buffer(m) as base:
            return int(lib.crane_bulk_init(base, cap))

    return init


class BulkArea:
    """One side's mapping of a bulk area."""

    def __init__(self, fd: int, alive: Callable[[], bool]) -> None:
        if lib is None:
            raise OSError(bulk_available())
        size = os.fstat(fd).st_size
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._base = ffi.from_buffer(self._map)
        cap = lib.crane_bulk_check(self._base, size)
        if cap == 0:
            self.close()
            raise OSError("the shared memory is not a bulk area")
        self.cap = int(cap)
        self._alive = alive
        self.closed = False

    @staticmethod
    def create(cap: int = DEFAULT_BULK_CAP) -> int:
        """A new memfd laid out as a bulk area; the caller owns the descriptor."""
        if lib is None:
            raise OSError(bulk_available())
        fd = laid_out_memfd("crane-bulk", lib.crane_bulk_bytes(cap), _init_bulk(cap))
        if fd < 0:
            raise OSError(f"cannot lay out a bulk area of {cap} bytes")
        return fd

    def put(self, which: int, src: Any, n: int) -> None:
        """Write ``n`` bytes of ``src`` (a buffer, a cffi pointer, or None: zeros) into FIFO
        ``which``; :class:`RingClosed` when the area closed or the peer is gone first."""
        ptr = _address(src) if src is not None else ffi.NULL
        self._move(lib.crane_bulk_put, which, ptr, n)

    def get(self, which: int, dst: Any, n: int) -> None:
        """Read ``n`` bytes of FIFO ``which`` into ``dst`` (a writable buffer, a cffi pointer,
        or None: discard); :class:`RingClosed` when they cannot all come."""
        ptr = _address(dst) if dst is not None else ffi.NULL
        self._move(lib.crane_bulk_get, which, ptr, n)

    def _move(self, fn: Any, which: int, ptr: Any, n: int) -> None:
        base, done = self._base, 0
        while done < n:
            if base is None:
                raise RingClosed("UNAVAILABLE", "the bulk area is closed")
            at = ptr + done if ptr != ffi.NULL else ffi.NULL
            k = fn(base, self.cap, which, at, n - done, POLL_MS)
            if k == -errno.EPROTO:
                raise RingClosed("DATA_LOSS", "the bulk area is corrupt")
            done += k
            if done < n and k == 0:
                if self.closed or lib.crane_bulk_closed(base):
                    raise RingClosed("UNAVAILABLE", "the bulk area was closed")
                if not self._alive():
                    raise RingClosed("UNAVAILABLE", "the peer's end of the bulk area closed")

    def head(self, which: int) -> int:
        """How many bytes have been written into FIFO ``which`` so far (its producer's
        position: the next :meth:`put` starts there)."""
        base = self._base
        if base is None:
            raise RingClosed("UNAVAILABLE", "the bulk area is closed")
        return int(lib.crane_bulk_head(base, which))

    def peek(self, which: int, pos: int, n: int) -> bytes:
        """The ``n`` bytes written into FIFO ``which`` at position ``pos``, read back by their
        producer: valid while the consumer has not taken them (it takes a staged call's bytes
        only when it runs the call), so a resend can carry them after the area closed."""
        if self._map.closed or not 0 <= n <= self.cap:
            raise ValueError("the bytes are no longer in the bulk area")
        base = int(lib.crane_bulk_data_offset(self.cap, which))
        at = pos % self.cap
        first = min(n, self.cap - at)
        return self._map[base + at : base + at + first] + self._map[base : base + n - first]

    def close_streams(self) -> None:
        """End every wait on the area, on both sides (a stream that ends, a guest leaving)."""
        base = self._base
        if base is not None:
            lib.crane_bulk_close(base)

    def close(self) -> None:
        """Stop using the area; a copy in another thread keeps its own reference to the
        mapping (:meth:`_move` holds ``base``), so it is unmapped only when that returns
        (``ffi.release`` here would unmap it under a copy in flight)."""
        self.closed = True
        self._base = None
        with contextlib.suppress(BufferError):  # a copy in flight holds it: goes with it
            self._map.close()
