"""Same-host hand-over: the source worker passes its session's memory descriptor to the
destination worker instead of copying the memory (``SCM_RIGHTS`` over a unix socket).

Why: on one host the data plane still copies every byte, and the destination's first touch of
fresh pages bounds it (1.6-3.7x a raw copy for float noise, docs/benchmarks.md). A backend
whose memory lives in a descriptor (the simulator's memfd, ``Backend.memory_handle``) can hand
it over: the destination maps the same pages over its window in the stopped round, and nothing
moves but the descriptor.

* **Same host, decided twice**: the destination's offer carries its kernel's boot id (equal
  only on the same running kernel; containers share it, hence the second test) and the path
  of a unix socket its worker listens on; the source uses the hand-over only when its own boot
  id matches *and* it can connect to that path. Anything else falls back to the data plane,
  and the source logs why.
* **Authentication, both ways, with the one-time token** the destination's daemon handed the
  source over the authenticated Transfer stream (the data plane's): the source sends a nonce,
  the destination answers an HMAC of it under the token and a nonce of its own, the source
  answers that with its HMAC. The source passes the descriptor only to a peer that proved it
  holds the token, the destination takes one only from a source that did; the token never
  crosses the socket. The socket is created 0600 in the destination daemon's run directory.
* **Ownership** (invariant 6): the descriptor travels in the stopped round only (pre-copy
  rounds carry no memory); the destination maps it after applying that round's graph on its
  own window, and writes nothing into it before the switchover; the source releases no page
  of it once the destination acknowledged (``Backend.disown_memory``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import socket
import struct
import threading
import time
from pathlib import Path

from crane.migrate.dataplane import Acceptor

__all__ = [
    "BOOT_ID_PATH",
    "ENV",
    "TEST_BOOT_ID_ENV",
    "HandoverError",
    "Link",
    "Listener",
    "boot_id",
    "refusal",
]

log = logging.getLogger("crane.worker")

#: Environment (the source's): ``0`` forces the data plane even where memory could be handed
#: over (tests and the benchmark compare the two).
ENV = "CRANE_MIGRATE_HANDOVER"
#: Test-only (never set in production): the boot id a destination daemon reports, so that a
#: test on one host sees a destination "on another host" (the fallback to the data plane).
TEST_BOOT_ID_ENV = "CRANE_TEST_BOOT_ID"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
#: How long a handshake, or the wait for a descriptor's receipt, may take.
HANDSHAKE_S = 10.0
_HELLO = b"CRHO"
_NONCE = 32
_MAC = 32
_FD_HEAD = struct.Struct("<4sIQ")  # magic, round, size of the memory behind the descriptor
_FD_MAGIC = b"CRFD"
_OK = b"\x01"
#: Connections the listener lets handshake at once (a source opens one).
_MAX_HANDSHAKES = 4


class HandoverError(Exception):
    """The hand-over cannot go on (the message says why)."""


def boot_id() -> str:
    """This kernel's boot id ("" where it cannot be read: no hand-over then)."""
    forced = os.environ.get(TEST_BOOT_ID_ENV)
    if forced:
        return forced
    try:
        return Path(BOOT_ID_PATH).read_text().strip()
    except OSError:
        return ""


def refusal(offered_path: str, offered_boot: str, ours: str) -> str:
    """Why memory cannot be handed over to an offer ("" when it may be tried)."""
    if not offered_path:
        return "the destination offered no hand-over socket"
    if not ours or not offered_boot:
        return "a kernel boot id is unknown on one side"
    if offered_boot != ours:
        return "the destination runs on another host (its kernel boot id differs)"
    return ""


def _mac(token: bytes, label: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, label + nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise HandoverError("the peer closed the hand-over connection")
        buf += got
    return bytes(buf)


class Listener:
    """The destination worker's hand-over socket: takes, from an authenticated source, the
    descriptor of its memory for a round (:meth:`take`)."""

    def __init__(self, path: str, token: bytes) -> None:
        self.path = path
        self.token = token
        self.cond = threading.Condition()
        self.fds: dict[int, tuple[int, int]] = {}  # round -> (descriptor, size)
        self.error = ""
        self.closed = False
        self.conns: list[socket.socket] = []
        Path(path).unlink(missing_ok=True)  # a stale one (a worker that was killed)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            old = os.umask(0o177)
            try:
                self.sock.bind(path)
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
            self.sock.listen(_MAX_HANDSHAKES)
        except BaseException:
            self.sock.close()
            raise
        self.acceptor = Acceptor(self.sock, self._serve, _MAX_HANDSHAKES, "hand-over")

    def _handshake(self, conn: socket.socket) -> bool:
        conn.settimeout(HANDSHAKE_S)
        try:
            hello = _recv_exact(conn, len(_HELLO) + _NONCE)
            if not hello.startswith(_HELLO):
                log.warning("hand-over connection refused: not a hand-over")
                return False
            ours = secrets.token_bytes(_NONCE)
            conn.sendall(_mac(self.token, b"dst", hello[len(_HELLO) :]) + ours)
            proof = _recv_exact(conn, _MAC)
        except (OSError, HandoverError) as e:
            log.warning("hand-over connection refused: handshake failed: %s", e)
            return False
        if not hmac.compare_digest(proof, _mac(self.token, b"src", ours)):
            log.warning("hand-over connection refused: wrong token")
            return False
        pid, uid, _ = struct.unpack(
            "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        )
        log.info("hand-over connection from pid %d (uid %d) authenticated", pid, uid)
        conn.sendall(_OK)
        conn.settimeout(None)
        return True

    def _serve(self, conn: socket.socket) -> None:
        try:
            ok = self._handshake(conn)
        finally:
            self.acceptor.handshaken()
        if not ok:
            conn.close()
            return
        with self.cond:
            self.conns.append(conn)
        try:
            while True:
                msg, fds, _, _ = socket.recv_fds(conn, _FD_HEAD.size, 1, socket.MSG_CMSG_CLOEXEC)
                if not msg:
                    for fd in fds:
                        os.close(fd)
                    return  # the source is done with it
                if len(msg) < _FD_HEAD.size:
                    msg += _recv_exact(conn, _FD_HEAD.size - len(msg))
                magic, round_, size = _FD_HEAD.unpack(msg)
                if magic != _FD_MAGIC or len(fds) != 1:
                    for fd in fds:
                        os.close(fd)
                    raise HandoverError(
                        f"a hand-over message without its descriptor ({len(fds)} came)"
                    )
                with self.cond:
                    old = self.fds.pop(round_, None)
                    if old is not None:
                        os.close(old[0])
                    self.fds[round_] = (fds[0], size)
                    self.cond.notify_all()
                conn.sendall(_OK)
        except (OSError, HandoverError) as e:
            if not self.closed:
                self.fail(f"the hand-over connection failed: {e}")
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def fail(self, why: str) -> None:
        with self.cond:
            if not self.error:
                self.error = why
                log.warning("incoming migration's hand-over failed: %s", why)
            self.cond.notify_all()

    def take(self, round_: int, timeout_s: float = HANDSHAKE_S) -> tuple[int, int]:
        """The descriptor of ``round_``'s memory and the size the source gave (the caller
        owns the descriptor now); :class:`HandoverError` if it did not come."""
        end = time.monotonic() + timeout_s
        with self.cond:
            while round_ not in self.fds:
                if self.error:
                    raise HandoverError(self.error)
                left = end - time.monotonic()
                if self.closed or left <= 0:
                    raise HandoverError(
                        f"round {round_}: the source's memory was not handed over "
                        f"within {timeout_s:g} s"
                    )
                self.cond.wait(min(left, 0.5))
            return self.fds.pop(round_)

    def close(self) -> None:
        """Stop listening; descriptors not taken are closed (never mapped here)."""
        with self.cond:
            self.closed = True
            fds, self.fds = list(self.fds.values()), {}
            conns, self.conns = self.conns, []
            self.cond.notify_all()
        with contextlib.suppress(OSError):
            self.sock.close()
        Path(self.path).unlink(missing_ok=True)
        for fd, _ in fds:
            os.close(fd)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)


class Link:
    """The source worker's connection to a destination's hand-over socket, authenticated
    (raises :class:`HandoverError` or ``OSError``: the caller falls back to the data plane)."""

    def __init__(self, path: str, token: bytes, timeout_s: float = HANDSHAKE_S) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout_s)
            self.sock.connect(path)
            nonce = secrets.token_bytes(_NONCE)
            self.sock.sendall(_HELLO + nonce)
            answer = _recv_exact(self.sock, _MAC + _NONCE)
            if not hmac.compare_digest(answer[:_MAC], _mac(token, b"dst", nonce)):
                raise HandoverError("the socket's listener does not hold the destination's token")
            self.sock.sendall(_mac(token, b"src", answer[_MAC:]))
            if _recv_exact(self.sock, 1) != _OK:
                raise HandoverError("the destination refused the hand-over")
        except BaseException:
            self.sock.close()
            raise

    def send(self, round_: int, fd: int, size: int, timeout_s: float = HANDSHAKE_S) -> None:
        """Pass ``fd`` (the memory of ``round_``, ``size`` bytes) and wait for its receipt."""
        self.sock.settimeout(timeout_s)
        try:
            socket.send_fds(self.sock, [_FD_HEAD.pack(_FD_MAGIC, round_, size)], [fd])
            if _recv_exact(self.sock, 1) != _OK:
                raise HandoverError("the destination did not take the memory")
        except OSError as e:
            raise HandoverError(f"handing the memory over failed: {e}") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
