"""The guest's call stream over the shared-memory call ring (:mod:`crane.wire.ring`).

It stands where the gRPC stream's request queue and response iterator stand in
:class:`crane.guest.transport.Transport`: :meth:`RingCalls.send` takes the same ``CallBatch``
or its bytes (written straight into the ring by the flushing thread: no sender thread, no
hand-off), and iterating yields the same serialized ``ReplyBatch`` messages. An end of the
stream comes as :class:`crane.wire.ring.RingClosed` with the code the gRPC path would have
raised, so the transport's resume logic treats both paths alike.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

from crane.guest.ring_bulk import attach_bulk
from crane.v1 import guest_pb2
from crane.wire import ring as wring

__all__ = ["RESUMABLE", "RingCalls", "connect_ring"]

#: Ends after which the session may still exist (parked, moved, its worker gone): resume,
#: as the gRPC path does on UNAVAILABLE, CANCELLED and UNKNOWN; "" is a plain end of stream.
RESUMABLE = frozenset({"", "UNAVAILABLE", "CANCELLED", "UNKNOWN", "INTERNAL"})


class RingCalls:
    """One attachment to a worker's call ring."""

    def __init__(self, ring: wring.Ring, sock: socket.socket) -> None:
        self._ring = ring
        self._sock = sock
        #: the bulk area for large copies, when the worker sent one (crane.guest.ring_bulk)
        self.bulk = attach_bulk(ring, sock)
        #: once set (``time.monotonic()``), a send that finds no room by then gives up: a
        #: closing guest must not wait on a worker stuck in a kernel to drain a full ring
        self.deadline = 0.0
        self._deadline = lambda: self.deadline

    def send(self, batch: guest_pb2.CallBatch | bytes) -> None:
        """Write a batch or its bytes (the caller serializes senders). A ring whose worker is
        gone takes nothing; the batch stays in the transport's resend list and the reader's
        next wait sees the end and resumes, as on the gRPC path."""
        raw = batch if type(batch) is bytes else batch.SerializeToString()  # type: ignore[union-attr]
        try:  # (not contextlib.suppress: two calls more on every synchronizing call)
            self._ring.send(raw, 0, self._deadline)
        except wring.RingClosed:
            return

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return self._ring.recv()

    def cancel(self) -> None:
        """Detach: an end record wakes the worker's drain at once (when it fits), and the
        socket's close tells it in any case."""
        if self._ring.closed:
            return
        if self.bulk is not None:
            self.bulk.end()
        self._ring.try_send(b" the guest closed its call stream", wring.END)
        self._ring.close()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def connect_ring(direct_address: str, session_id: str, token: bytes) -> RingCalls:
    """Attach to the ring beside the worker's direct socket (``unix://PATH``);
    :class:`crane.wire.ring.RingRefused` says why not."""
    if not direct_address.startswith("unix://"):
        raise wring.RingRefused(f"{direct_address} is not a unix socket on this host")
    path = wring.ring_socket_path(direct_address[len("unix://") :])
    ring, sock = wring.connect(path, session_id, token)
    return RingCalls(ring, sock)
