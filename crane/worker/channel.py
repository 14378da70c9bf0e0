"""Framed messages over a unix stream socket between craned and a session's worker process.

Why not multiprocessing.Connection or a pipe of pickles: the daemon relays the guest's serialized
``CallBatch`` bytes without parsing them (no Python work per call in the daemon, invariant 4), so
the channel only moves opaque byte strings, as fast as the kernel lets it: a 9-byte header
(tag, length) and the payload, sent with one ``sendall`` when small, and read with
``MSG_WAITALL`` straight into the bytes object that is forwarded (no reassembly copy).

Tags: ``CONFIG`` (daemon→worker, JSON, once), ``BATCH`` (daemon→worker, a CallBatch),
``REPLY`` (worker→daemon, a ReplyBatch to forward), ``REPLY_LAST`` (the last reply to a batch
that expects one: the daemon may read the next batch), ``CLOSE`` (worker→daemon: the guest closed
the session), ``CHECKPOINT``/``RESTORE`` (daemon→worker, JSON) answered by ``CONTROL_REPLY``
(JSON: the result or the error). Batches of purely asynchronous calls flow one way, pipelined:
the worker answers them only if a call failed or a kernel printed, and the daemon forwards such
answers whenever it next looks (they matter at the guest's next synchronizing call, which
always waits).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct

__all__ = ["Channel", "ChannelClosed", "Tag"]

_HEADER = struct.Struct("<BQ")
_MAX_FRAME = 1 << 30


class Tag:
    CONFIG = 1
    BATCH = 2
    REPLY = 3
    REPLY_LAST = 4
    CLOSE = 5
    CHECKPOINT = 6  # daemon→worker, JSON {path, release, identity}
    RESTORE = 7  # daemon→worker, JSON {path}
    CONTROL_REPLY = 8  # worker→daemon, JSON answer to CHECKPOINT / RESTORE / MIGRATE_IN_END
    MIGRATE = 9  # daemon→worker, JSON: migrate this session out (crane.migrate.source)
    MIGRATE_IN = 10  # daemon→worker, JSON {round, fresh}: a migration round begins
    MIGRATE_DATA = 11  # daemon→worker, checkpoint-format bytes of the round
    MIGRATE_IN_END = 12  # daemon→worker: the round is complete; answered by CONTROL_REPLY


class ChannelClosed(Exception):
    """The peer process went away (crashed, exited, or closed its end)."""


class Channel:
    """One end of the daemon↔worker socket. Not thread-safe: one reader, one writer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    def pair(cls) -> tuple[Channel, socket.socket]:
        """A channel for this process and the raw socket to hand to a child process."""
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        return cls(a), b

    def send(self, tag: int, payload: bytes | memoryview = b"") -> None:
        header = _HEADER.pack(tag, len(payload))
        try:
            if len(payload) < 65536:
                self.sock.sendall(header + bytes(payload))
            else:
                self.sock.sendall(header)
                self.sock.sendall(payload)
        except OSError as e:
            raise ChannelClosed(str(e)) from e

    def recv(self) -> tuple[int, bytes]:
        """Block for the next frame; raise :class:`ChannelClosed` at end of stream."""
        tag, length = _HEADER.unpack(self._recv_exact(_HEADER.size))
        if length > _MAX_FRAME:
            raise ChannelClosed(f"frame of {length} bytes exceeds the {_MAX_FRAME} limit")
        return tag, self._recv_exact(length) if length else b""

    def _recv_exact(self, n: int) -> bytes:
        # MSG_WAITALL fills one bytes object in place: no reassembly copy for large frames.
        try:
            data = self.sock.recv(n, socket.MSG_WAITALL)
            while len(data) < n:
                more = self.sock.recv(n - len(data), socket.MSG_WAITALL)
                if not more:
                    raise ChannelClosed("peer closed the channel")
                data += more
        except OSError as e:
            raise ChannelClosed(str(e)) from e
        return data

    def readable(self) -> bool:
        """True if a frame (or end of stream) can be read without blocking."""
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True  # closed: the next recv reports it

    def shutdown(self) -> None:
        """End both directions (a blocked reader wakes up with ChannelClosed)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
