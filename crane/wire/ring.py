"""The call ring: two shared-memory SPSC rings (requests, replies) between a guest and its
worker on one host, and the handshake that hands the memory over.

The C core (``ringcore.c``, built by ``shm_build.py`` into :mod:`crane.wire._ringcore`) writes
and waits; this module frames messages on it. A message is one record, or, when larger than a
record may be, consecutive records flagged :data:`MORE` but the last. A record flagged
:data:`END` closes the stream: its payload is ``CODE message`` (code as gRPC names it, empty for
a plain end). Waits time out every :data:`POLL_MS` so that a peer that died (its handshake
socket closed) is noticed: the wait then raises :class:`RingClosed`.

Handshake (a unix socket beside the worker's direct socket, ``<direct>.ring``): the guest sends
one JSON line ``{"session": id, "token": hex}``; the worker answers ``OK <cap>\\n`` with the
memfd attached (``SCM_RIGHTS``), or ``ERR <CODE> <message>\\n``. The socket then stays open for
the session's life: its end is how either side learns the other is gone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import select
import socket
import time
from collections.abc import Callable

__all__ = [
    "DEFAULT_CAP",
    "END",
    "MORE",
    "REPLIES",
    "REQUESTS",
    "Ring",
    "RingClosed",
    "RingRefused",
    "accept_hello",
    "available",
    "connect",
    "peer_alive",
    "ring_socket_path",
]

#: Bytes of each of the two rings (a power of two is not required, a multiple of 8 is).
DEFAULT_CAP = 16 << 20
MORE = 1
END = 2
REQUESTS = 0  # guest -> worker
REPLIES = 1  # worker -> guest
#: How often a wait looks whether its peer is still there (milliseconds).
POLL_MS = 100
#: Messages up to this size are received into a buffer kept for the purpose (one C call, one
#: copy into the resulting ``bytes``); larger ones into a buffer of their own.
SMALL_MESSAGE = 64 << 10
#: Microseconds a waiter spins, yielding the core at each look, before it parks
#: (``CRANE_RING_SPIN`` overrides; 0 parks at once). Long enough to catch a synchronizing
#: call's answer and the next call of a guest that calls back to back, so neither side pays a
#: futex wake-up on that path (2-40 us each on a 2-core VM); a yielding spinner lets a peer on
#: its own core run (ringcore.c, park_wait, has the measurements).
DEFAULT_SPIN = 50

try:
    from crane.wire._ringcore import ffi, lib  # type: ignore[import-not-found]
except ImportError as _e:  # not built (a source tree without scripts/setup.sh)
    ffi = lib = None
    _missing = str(_e)
else:
    _missing = ""


def available() -> str:
    """Empty when the ring can be used here, else why not."""
    if lib is None:
        return f"the ring's C core is not built ({_missing})"
    if not hasattr(os, "memfd_create"):
        return "this system has no memfd_create"
    return ""


def _spin_setting() -> int:
    """``CRANE_RING_SPIN`` in microseconds (0 to 1 s), :data:`DEFAULT_SPIN` when unset or not
    a number (a bad value must not fail every call: the C takes an unsigned 32-bit count)."""
    raw = os.environ.get("CRANE_RING_SPIN", "")
    try:
        return max(0, min(int(raw), 1_000_000)) if raw else DEFAULT_SPIN
    except ValueError:
        return DEFAULT_SPIN


class RingClosed(Exception):
    """The peer is gone (its socket closed) or ended the stream; ``code`` says how."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message


class RingRefused(Exception):
    """The handshake failed: the guest uses another transport."""


def ring_socket_path(direct_socket: str) -> str:
    """The ring's handshake socket beside a worker's direct socket."""
    return direct_socket + ".ring"


def peer_alive(sock: socket.socket) -> bool:
    """False once the peer closed its end (an EOF is readable, or the socket hung up)."""
    try:
        p = select.poll()
        p.register(sock.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
        events = p.poll(0)
        if not events:
            return True
        if events[0][1] & (select.POLLHUP | select.POLLERR):
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except (OSError, ValueError):
        return False


def laid_out_memfd(name: str, size: int, init: Callable[[mmap.mmap], int]) -> int:
    """A new memfd of ``size`` bytes laid out by ``init(mapping)`` (0: done); the caller owns
    the descriptor. -1 when ``init`` refuses (the call ring and the bulk area both start this
    way)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size, mmap.MAP_SHARED) as m:
            rc = init(m)
    except BaseException:
        os.close(fd)
        raise
    if rc:
        os.close(fd)
        return -1
    return fd


def _init_ring(cap: int) -> Callable[[mmap.mmap], int]:
    def init(m: mmap.mmap) -> int:
        with ffi.from_buffer(m) as base:
            return int(lib.crane_ring_init(base, cap))

    return init


class Ring:
    """One side's view of a mapped ring pair: sends on one ring, receives on the other."""

    def __init__(self, fd: int, side_sends: int, alive: Callable[[], bool]) -> None:
        if lib is None:
            raise RingRefused(available())
        size = os.fstat(fd).st_size
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._base = ffi.from_buffer(self._map)
        cap = lib.crane_ring_check(self._base, size)
        if cap == 0:
            ffi.release(self._base)
            self._map.close()
            raise RingRefused("the shared memory is not a call ring")
        self.cap = cap
        self.max_record = int(lib.crane_ring_max_record(cap))
        #: messages larger than this go in pieces (the batches the guest makes fit in one)
        self.piece = self.max_record
        self._tx = side_sends
        self._rx = 1 - side_sends
        self._alive = alive
        self.spin = _spin_setting()
        self._flags = ffi.new("uint32_t *")
        self._small = ffi.new("char[]", SMALL_MESSAGE)
        self.closed = False
        #: descriptors that came with the ring (the bulk area's: crane.wire.ring_bulk), the
        #: receiver's to take and close
        self.extra_fds: list[int] = []

    @staticmethod
    def create(cap: int = DEFAULT_CAP) -> int:
        """A new memfd laid out as a ring pair; the caller owns the descriptor."""
        if lib is None:
            raise RingRefused(available())
        fd = laid_out_memfd("crane-call-ring", lib.crane_ring_bytes(cap), _init_ring(cap))
        if fd < 0:
            raise RingRefused(f"cannot lay out a ring of {cap} bytes")
        return fd

    def send(
        self,
        payload: bytes | bytearray | memoryview,
        flags: int = 0,
        deadline: Callable[[], float] | None = None,
    ) -> None:
        """Write one message (in pieces if large); :class:`RingClosed` if the peer is gone, or
        still has no room at ``deadline()`` (``time.monotonic()``, asked at each wait: it may
        be set while this waits; 0: wait while the peer lives)."""
        base = self._base  # (held for the calls below: close() never unmaps under them)
        if base is None:
            raise RingClosed("", "the ring is closed")
        n = len(payload)
        src = payload if type(payload) is bytes else ffi.from_buffer(payload)
        if n <= self.piece and (  # one record with room now: the path of every small batch
            lib.crane_ring_write(base, self.cap, self._tx, src, n, flags, 0, 0) == 0
        ):
            return
        src = ffi.from_buffer(payload)
        off = 0
        while True:
            size = min(self.piece, n - off)
            more = MORE if off + size < n else 0
            while True:
                piece, f = src + off, flags | more
                rc = lib.crane_ring_write(
                    base, self.cap, self._tx, piece, size, f, POLL_MS, self.spin
                )
                if rc == 0:
                    break
                if rc == -errno.EPROTO:
                    raise RingClosed("DATA_LOSS", "the call ring is corrupt")
                due = deadline() if deadline is not None else 0.0
                if due and time.monotonic() > due:
                    raise RingClosed("DEADLINE_EXCEEDED", "no room in the call ring in time")
                if self.closed or not self._alive():
                    raise RingClosed("UNAVAILABLE", "the peer's end of the call ring closed")
            off += size
            if off >= n:
                return

    def try_send(self, payload: bytes, flags: int = 0) -> bool:
        """Write a message of one record if it fits now; False (nothing written) otherwise."""
        base = self._base
        if base is None or len(payload) > self.piece:
            return False
        src = payload if type(payload) is bytes else ffi.from_buffer(payload)
        n = len(payload)
        return lib.crane_ring_write(base, self.cap, self._tx, src, n, flags, 0, 0) == 0

    def recv(self) -> bytes:
        """The next message; :class:`RingClosed` when the peer ended the stream or died."""
        pieces: list[bytes] = []
        spin = self.spin
        small = self._small
        base = self._base  # (held for the calls below: close() never unmaps under them)
        if base is None:
            raise RingClosed("UNAVAILABLE", "the call ring is closed")
        while True:
            n = lib.crane_ring_recv(
                base, self.cap, self._rx, POLL_MS, spin, self._flags, small, SMALL_MESSAGE
            )
            if n == -errno.EPROTO:
                raise RingClosed("DATA_LOSS", "the call ring is corrupt")
            if n < 0:
                if self.closed or not self._alive():
                    raise RingClosed("UNAVAILABLE", "the peer's end of the call ring closed")
                spin = 0  # an idle peer: spinning again at each look would be for nothing
                continue
            if n <= SMALL_MESSAGE:  # taken already
                buf: bytes | bytearray = ffi.unpack(small, n)
            else:
                buf = bytearray(n)
                if lib.crane_ring_take(base, self.cap, self._rx, ffi.from_buffer(buf), n):
                    raise RingClosed("DATA_LOSS", "the call ring is corrupt")
            flags = self._flags[0]
            if not flags and not pieces:  # a whole message (the common case)
                return buf if type(buf) is bytes else bytes(buf)
            if flags & END:
                code, _, msg = bytes(buf).decode(errors="replace").partition(" ")
                raise RingClosed(code, msg or "the peer ended the call stream")
            if not flags & MORE and not pieces:
                return bytes(buf)
            pieces.append(bytes(buf))
            if not flags & MORE:
                return b"".join(pieces)

    def end(self, code: str = "", message: str = "") -> None:
        """Tell the peer the stream is over (``code`` as gRPC names it; "" a plain end)."""
        if not self.closed:
            self.send(f"{code} {message}".encode(), END)

    def close(self) -> None:
        """Stop using the ring. A thread inside a C wait on it keeps its own reference to the
        mapping (each method holds ``base`` for its calls), so the mapping is unmapped only
        when the last such call returns (releasing it here unmapped it under a waiting thread:
        a segfault); the wait then sees ``closed`` within a poll."""
        self.closed = True
        self._base = None  # (dropped, not ffi.release()d: see above)
        with contextlib.suppress(BufferError):  # a call in flight holds it: goes with the object
            self._map.close()


# ---- handshake ---------------------------------------------------------------------------------
def connect(
    path: str, session_id: str, token: bytes, timeout: float = 2.0
) -> tuple[Ring, socket.socket]:
    """The guest's side: authenticate on ``path``, map the ring it hands over."""
    why = available()
    if why:
        raise RingRefused(why)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps({"session": session_id, "token": token.hex()}).encode() + b"\n")
        msg, fds, _, _ = socket.recv_fds(sock, 4096, 2)
        if not msg.startswith(b"OK "):
            for fd in fds:
                os.close(fd)
            raise RingRefused(msg.decode(errors="replace").strip() or "the worker closed")
        if not fds:
            raise RingRefused("the worker sent no ring")
        sock.settimeout(None)
        try:
            ring = Ring(fds[0], REQUESTS, lambda: peer_alive(sock))
        except BaseException:
            for fd in fds[1:]:
                os.close(fd)
            raise
        finally:
            os.close(fds[0])
        ring.extra_fds = fds[1:]  # the bulk area's, when the worker sent one
        return ring, sock
    except (OSError, ValueError) as e:
        sock.close()
        raise RingRefused(f"{path}: {e}") from None
    except RingRefused:
        sock.close()
        raise


def accept_hello(conn: socket.socket, timeout: float = 5.0) -> dict:
    """The worker's side: the guest's hello line (``session``, ``token``)."""
    conn.settimeout(timeout)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk or len(data) > 4096:
            raise RingRefused("no hello from the guest")
        data += chunk
    try:
        hello = json.loads(data)
    except ValueError:
        raise RingRefused("a malformed hello") from None
    if not isinstance(hello, dict):
        raise RingRefused("a malformed hello")
    return hello
