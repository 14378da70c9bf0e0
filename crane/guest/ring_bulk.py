"""Bulk copies over the call ring: the bytes go through the ring's bulk area, not the calls.

A copy of at least :data:`BULK_MIN` bytes on a session attached through the call ring is sent
as ``MEMCPY_HTOD_STAGED`` / ``MEMCPY_DTOH_STAGED`` calls (pieces of at most ``STAGED_MAX``,
all in one batch) and its bytes stream through the bulk area (:mod:`crane.wire.ring_bulk`): the
guest copies the application's buffer into the FIFO with C memcpys, the GIL released, while the
worker copies the previous bytes to the device, and back the other way. No bytes object is
made on either side.

Ordering: one thread at a time streams (:attr:`GuestBulk.lock`), from sending its calls to the
last byte, so the FIFO's bytes follow the calls' order; the calls themselves are ordered with
every other call by the batch they travel in.

Resends (a resume after a park or a migration): the worker takes a staged call's bytes out of
the FIFO only when it runs the call, so the bytes of every call it did not run are still there
and the guest reads them back (:meth:`crane.wire.ring_bulk.BulkArea.peek`; the mapping outlives
the attachment); the transport resends such a call as a plain ``MEMCPY_HTOD`` with the bytes
inline (:func:`unstage`), on whichever path the session resumed. An upload therefore returns as
soon as its bytes are in the FIFO, as an asynchronous copy should, except when the area closed
under it: it then waits until the worker ran it, its source (the caller's) kept meanwhile. A
staged read that did not come through the FIFO is resent as a plain ``MEMCPY_DTOH``, whose reply
carries the bytes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from crane.api.ops import OPS_BY_NAME
from crane.v1 import guest_pb2
from crane.wire import packed
from crane.wire.ring import Ring, RingClosed, peer_alive
from crane.wire.ring_bulk import D2H, H2D, STAGED_MAX, BulkArea, bulk_available
from crane.wire.ring_bulk import ffi as bulk_ffi
from crane.wire.status import MAX_CHUNK

if TYPE_CHECKING:
    from crane.guest.transport import Transport

__all__ = ["BULK_MIN", "GuestBulk", "attach_bulk", "dtoh", "htod", "unstage"]

log = logging.getLogger("crane.guest")

#: Copies at least this large go through the bulk area (smaller ones gain nothing: their bytes
#: ride in the batch the call is in anyway). ``CRANE_RING_BULK_MIN`` overrides; 0 turns it off.
BULK_MIN = int(os.environ.get("CRANE_RING_BULK_MIN", 256 << 10))

_HTOD = OPS_BY_NAME["MEMCPY_HTOD"]
_DTOH = OPS_BY_NAME["MEMCPY_DTOH"]
_HTOD_STAGED = OPS_BY_NAME["MEMCPY_HTOD_STAGED"]
_DTOH_STAGED = OPS_BY_NAME["MEMCPY_DTOH_STAGED"]
_STAGED_IDS = frozenset({_HTOD_STAGED.id, _DTOH_STAGED.id})


class GuestBulk:
    """The guest's mapping of one attachment's bulk area."""

    def __init__(self, area: BulkArea) -> None:
        self.area = area
        #: held from sending a copy's calls to its last byte (the FIFOs' order is the calls')
        self.lock = threading.Lock()

    def end(self) -> None:
        """Stop every wait on the area (the attachment ends); the worker sees it too."""
        self.area.close_streams()


def attach_bulk(ring: Ring, sock: socket.socket) -> GuestBulk | None:
    """The bulk area the worker sent with the ring (its descriptor in ``ring.extra_fds``),
    or None: copies then travel in the calls."""
    fds, ring.extra_fds = ring.extra_fds, []
    try:
        if not fds:
            return None
        if bulk_available():
            log.info("call ring without its bulk area: %s", bulk_available())
            return None
        try:
            return GuestBulk(BulkArea(fds[0], lambda: peer_alive(sock)))
        except (OSError, ValueError) as e:
            log.info("call ring without its bulk area: %s", e)
            return None
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _pieces(size: int, fifo: int) -> list[tuple[int, int]]:
    most = STAGED_MAX[fifo]
    return [(off, min(most, size - off)) for off in range(0, size, most)]


def htod(t: Transport, bulk: GuestBulk, dst: int, view: memoryview, stream: int) -> None:
    """Copy ``view`` to device address ``dst`` in ``stream`` order. Returns once its bytes
    are in the bulk area (the worker runs the copy when it gets there; its errors come at the
    next synchronizing call, as any copy's): until the worker ran them, a resend reads them
    back from the area. When the area closed first, the copy waits for the worker to have
    run it (resent with the caller's bytes, which stay valid meanwhile)."""
    pieces = _pieces(view.nbytes, H2D)
    sources = t.staged_sources
    with bulk.lock:
        done = t.done_seq
        for seq in [s for s in sources if s <= done]:  # ran: never resent
            del sources[seq]
        seqs = t.enqueue_run(
            _HTOD_STAGED, [_HTOD_STAGED.pack(dst + off, n, stream) for off, n in pieces], ack=True
        )  # ack: the worker's done_seq comes back (resent batches ask it too), so sources go
        for seq, (off, n) in zip(seqs, pieces, strict=True):
            sources[seq] = view[off : off + n].tobytes  # while it streams: the caller's bytes
        try:
            start = bulk.area.head(H2D)
            bulk.area.put(H2D, view, view.nbytes)
        except RingClosed:
            pass  # the attachment ended: resent with the caller's bytes, waited for below
        else:
            for seq, (off, n) in zip(seqs, pieces, strict=True):
                sources[seq] = functools.partial(bulk.area.peek, H2D, start + off, n)
            return
    try:
        t.wait_done(seqs[-1])
    finally:
        for seq in seqs:
            sources.pop(seq, None)


def dtoh(
    t: Transport, bulk: GuestBulk, src: int, size: int, stream: int, out: memoryview
) -> list[tuple[int, int, int, bool]]:
    """Read ``size`` device bytes at ``src`` into ``out`` in ``stream`` order. Returns each
    piece's ``(seq, offset, size, arrived)``: the caller settles every ``seq`` (its error, if
    any), and takes the piece from its reply's data where it did not arrive here."""
    pieces = _pieces(size, D2H)
    with bulk.lock:
        seqs = t.enqueue_run(
            _DTOH_STAGED, [_DTOH_STAGED.pack(src + off, n, stream) for off, n in pieces], ack=False
        )
        base = bulk_ffi.from_buffer("char[]", out, require_writable=True)
        arrived = True
        got = []
        for seq, (off, n) in zip(seqs, pieces, strict=True):
            if arrived:
                try:
                    bulk.area.get(D2H, base + off, n)
                except RingClosed:
                    arrived = False  # resent as plain reads: the replies carry the bytes
            got.append((seq, off, n, arrived))
        bulk_ffi.release(base)
    return got


def unstage(
    batch: guest_pb2.CallBatch, sources: dict[int, Callable[[], bytes]], done_seq: int
) -> list[guest_pb2.CallBatch]:
    """``batch`` as it can be resent on any path: its staged calls after ``done_seq`` as
    plain copies (bytes inline, from ``sources``: each call's bytes when asked; those before
    ``done_seq`` ran and are left out), in batches of at most about ``MAX_CHUNK`` bytes."""
    if not any(c.op in _STAGED_IDS for c in batch.calls):
        return [batch]
    out = [guest_pb2.CallBatch(flags=batch.flags)]
    size = 0
    last: list[int] = []  # each piece's last plain call: its packed calls go with it
    for c in batch.calls:
        if c.op in _STAGED_IDS and c.seq <= done_seq:
            continue  # it ran: the worker would skip it, and its source may be gone
        if c.op == _HTOD_STAGED.id:
            dst, n, stream = _HTOD_STAGED.unpack(c.args)
            data = sources[c.seq]()  # the caller's bytes, or the bulk area's copy of them
            call = guest_pb2.Call(seq=c.seq, op=_HTOD.id, args=_HTOD.pack(dst, stream), data=data)
        elif c.op == _DTOH_STAGED.id:
            call = guest_pb2.Call(seq=c.seq, op=_DTOH.id, args=c.args)
            n = _DTOH_STAGED.unpack(c.args)[1]
        else:
            call, n = c, len(c.data)
        if size and size + n > MAX_CHUNK:
            last.append(out[-1].calls[-1].seq)
            out.append(guest_pb2.CallBatch(flags=batch.flags))
            size = 0
        out[-1].calls.append(call)
        size += n
    if batch.packed:  # each packed call in the piece that keeps it between the same calls
        for piece, recs in zip(out, packed.split(batch.packed, last), strict=True):
            piece.packed = recs
    return out
