"""The vsock bridges' splice (crane/wire/splice.py) over socketpairs: both ways, half-close
passed on, a reset ending both sides."""

from __future__ import annotations

import socket
import struct
import threading

from crane.wire.splice import splice


def _spliced() -> tuple[socket.socket, socket.socket, threading.Thread, list]:
    left, a = socket.socketpair()
    b, right = socket.socketpair()
    out: list = []
    t = threading.Thread(target=lambda: out.append(splice(a, b)), daemon=True)
    t.start()
    return left, right, t, out


def _read_all(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(1 << 16):
        data += chunk
    return data


def test_bytes_cross_both_ways_and_half_close_is_passed_on() -> None:
    left, right, t, out = _spliced()
    big = bytes(range(256)) * 8192  # 2 MiB: many reads
    sender = threading.Thread(target=lambda: (left.sendall(big), left.shutdown(socket.SHUT_WR)))
    sender.start()
    assert _read_all(right) == big  # EOF arrives: the half-close was passed on
    sender.join()
    right.sendall(b"answer after the other side's half-close")
    right.shutdown(socket.SHUT_WR)
    assert _read_all(left) == b"answer after the other side's half-close"
    t.join(5)
    assert not t.is_alive() and out == [(len(big), 40)]
    left.close()
    right.close()


def test_a_reset_ends_both_sides() -> None:
    left, right, t, _ = _spliced()
    left.sendall(b"x")
    assert right.recv(1) == b"x"
    # an abortive close (SO_LINGER 0) is a reset where TCP is; a socketpair just closes: the
    # splice must end the other side either way, not leave it waiting
    left.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    left.close()
    right.settimeout(5)
    assert _read_all(right) == b""
    right.close()
    t.join(5)
    assert not t.is_alive()
