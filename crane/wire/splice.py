"""Byte splicing between two connected stream sockets: the vsock bridges' one job.

gRPC's wheel cannot dial or serve ``vsock:`` addresses, so both sides of a vsock path are
bridges that carry a gRPC connection's bytes unchanged between an ``AF_VSOCK`` socket and a
socket gRPC can use (:mod:`crane.daemon.vsock` on the host, :mod:`crane.wire.vsock_bridge` in
the guest). A splice copies both ways until both have ended: an orderly end of one direction is
passed on as a half-close (``shutdown(SHUT_WR)``), and an error on either socket (a reset: the
VM migrated) ends both at once, so neither side waits on a connection that cannot carry on.
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["BUFFER", "splice"]

#: Bytes read at a time (gRPC splits payloads at 4 MiB; larger reads only cost memory).
BUFFER = 256 << 10


def splice(a: socket.socket, b: socket.socket) -> tuple[int, int]:
    """Copy ``a`` → ``b`` and ``b`` → ``a`` until both directions end, then close both; the
    bytes carried each way. Blocks: run it on a thread of its own per connection."""
    counts = [0, 0]
    other = threading.Thread(target=_pump, args=(b, a, counts, 1), name="splice", daemon=True)
    other.start()
    try:
        _pump(a, b, counts, 0)
        other.join()
    finally:
        for s in (a, b):
            s.close()
    return counts[0], counts[1]


def _pump(src: socket.socket, dst: socket.socket, counts: list[int], i: int) -> None:
    try:
        while True:
            data = src.recv(BUFFER)
            if not data:
                break
            dst.sendall(data)
            counts[i] += len(data)
    except OSError:
        # reset or failed: nothing more can pass either way, so end both (wakes the other pump)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        return
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)  # the orderly end of this direction, passed on
