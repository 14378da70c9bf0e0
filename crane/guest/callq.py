"""The guest's queue of packed calls: where a batch's records (crane.wire.packed) wait, and
where every call's sequence number comes from.

Why a queue of its own: appending a memset's record under the transport's lock cost about as
much Python as the rest of the call. :class:`CQueue` does it in one C call (``callqcore.c``:
the sequence number and the record under the queue's own mutex); :class:`PyQueue` does the same
in Python where the C is not built, with the same answers, so the transport has one code path.

``put(op, a0, a1, a2, a3, a4)`` (unused arguments 0) answers the records now queued (1: the
batch's first, so the transport arms its flush timer; :attr:`cap` or more: send the batch), or
one of :data:`NOT_SERVED` (an op whose arguments are not all unsigned: the caller packs it
itself), :data:`FULL` (nothing appended: send, then put again), :data:`TOO_WIDE` (an argument
does not fit its field, as ``struct.pack`` would refuse it), :data:`ATTENTION` (the transport
has something to do first: it said so with :meth:`attend`). Plain calls take their numbers from
:meth:`next_seq`, so packed and plain calls are numbered in the order they were made, and
:meth:`take` hands the records to the batch being sent.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from crane.api.ops import Kind, Op
from crane.wire.packed import PACKED_OPS, RECORD, record_struct

__all__ = [
    "ATTENTION",
    "FULL",
    "NOT_SERVED",
    "SERVED",
    "TOO_WIDE",
    "CQueue",
    "PyQueue",
    "new_queue",
]

NOT_SERVED, FULL, TOO_WIDE, ATTENTION = -1, -2, -3, -4
#: Arguments a put takes after the op.
MAX_ARGS = 5
_WIDTH = {Kind.HANDLE: 8, Kind.DEVPTR: 8, Kind.SIZE: 8, Kind.U64: 8, Kind.U32: 4}

try:
    from crane.guest._callq import ffi, lib  # type: ignore[import-not-found]
except ImportError:  # not built (a source tree without scripts/setup.sh): PyQueue
    ffi = lib = None


def widths(o: Op) -> tuple[int, ...] | None:
    """The byte widths of ``o``'s arguments when the queue serves it (packed, every argument
    unsigned and one wire field, at most :data:`MAX_ARGS`), else None."""
    if o.id not in PACKED_OPS or len(o.args) > MAX_ARGS:
        return None
    w = tuple(_WIDTH.get(p.kind, 0) for p in o.args)
    return None if 0 in w else w


#: The ops the queue takes (the others' calls are plain ``Call`` messages; a signed argument,
#: say, which the C put cannot even be handed: cffi refuses a negative unsigned value).
SERVED = frozenset(o.id for o in PACKED_OPS.values() if widths(o) is not None)


class PyQueue:
    """The queue in Python (what :class:`CQueue` does, for a guest without the C core)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._seq = 0
        self._recs = bytearray()
        self._attention = False
        self._packers = {
            o.id: (record_struct(o).pack, len(o.args), widths(o))
            for o in PACKED_OPS.values()
            if widths(o) is not None
        }

    def put(self, op: int, *a: int) -> int:
        served = self._packers.get(op)
        if served is None:
            return NOT_SERVED
        if self._attention:
            return ATTENTION
        pack, n, w = served
        if any(x < 0 for x in a):  # (as cffi refuses a negative unsigned argument)
            raise OverflowError("can't convert negative number to unsigned")
        if any(x >> (8 * width) for x, width in zip(a, w, strict=False)):
            return TOO_WIDE
        with self._lock:
            if len(self._recs) >= self.cap * RECORD:
                return FULL
            self._seq = seq = self._seq + 1
            self._recs += pack(seq, op, *a[:n])
            return len(self._recs) // RECORD

    def next_seq(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def count(self) -> int:
        return len(self._recs) // RECORD

    def take(self) -> tuple[bytes, int]:
        """The records queued (oldest first) and the last one's seq (0: none)."""
        with self._lock:
            recs, self._recs = bytes(self._recs), bytearray()
        return recs, int.from_bytes(recs[-RECORD:][:8], "little") if recs else 0

    def attend(self, on: bool) -> None:
        self._attention = on


class CQueue:
    """The queue in C (``callqcore.c``); :attr:`put` is the C function itself, bound."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._mem = ffi.new("char[]", lib.crane_callq_bytes(cap))
        if lib.crane_callq_init(self._mem, cap):
            raise OSError("cannot set up the call queue's mutex")
        for o in PACKED_OPS.values():
            w = widths(o)
            if w is not None:
                lib.crane_callq_layout(self._mem, o.id, bytes(w), len(w))
        self._out = ffi.new("char[]", cap * RECORD)
        self._last = ffi.new("uint64_t *")
        # (a void * converts faster than the char[] it points into: put is the hot path)
        at = ffi.cast("void *", self._mem)
        self.put: Callable[..., int] = functools.partial(lib.crane_callq_put, at)
        #: the next sequence number, for a plain call (the C function itself, bound)
        self.next_seq: Callable[[], int] = functools.partial(lib.crane_callq_next_seq, at)

    def count(self) -> int:
        return int(lib.crane_callq_count(self._mem))

    def take(self) -> tuple[bytes, int]:
        n = lib.crane_callq_take(self._mem, self._out, self.cap, self._last)
        if not n:
            return b"", 0
        return ffi.buffer(self._out, n * RECORD)[:], int(self._last[0])

    def attend(self, on: bool) -> None:
        lib.crane_callq_attend(self._mem, 1 if on else 0)

    def handles(self) -> tuple[int, int]:
        """(the queue's memory, the address of ``crane_callq_put``), for C elsewhere in the
        process that appends records itself (the interposer's fast lane). The memory lives as
        long as this object; the transport keeps it for the process's life."""
        put = ffi.cast("uintptr_t", ffi.addressof(lib, "crane_callq_put"))
        return int(ffi.cast("uintptr_t", self._mem)), int(put)

    def __del__(self) -> None:
        if lib is not None and getattr(self, "_mem", None) is not None:
            lib.crane_callq_destroy(self._mem)


def new_queue(cap: int) -> CQueue | PyQueue:
    """The C queue where it is built, else the Python one."""
    return CQueue(cap) if lib is not None else PyQueue(cap)
