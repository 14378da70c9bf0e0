"""Framed messages over a unix stream socket between craned and a session's worker process.

Why not multiprocessing.Connection or a pipe of pickles: the daemon relays the guest's serialized
``CallBatch`` bytes without parsing them (no Python work per call in the daemon, invariant 4), so
the channel only moves opaque byte strings, as fast as the kernel lets it: a 9-byte header
(tag, length) and the payload, sent with one ``sendall`` when small, and read with
``MSG_WAITALL`` straight into the bytes object that is forwarded (no reassembly copy).

What each tag carries is :mod:`crane.host.messages`' business: call batches and their replies
are opaque bytes; everything else is a typed message.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct

__all__ = ["Channel", "ChannelClosed"]

_HEADER = struct.Struct("<BQ")
_MAX_FRAME = 1 << 30


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
