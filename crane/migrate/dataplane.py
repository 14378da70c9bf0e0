"""The migration data plane: memory moves over parallel sockets, source worker to destination
worker, beside the Transfer stream that keeps carrying everything else.

Why: one gRPC stream moved a round's memory at 3.5-5.9x the time of a raw gRPC copy of the same
bytes (each byte was framed into a protobuf message, relayed by the destination daemon into the
worker's channel, then parsed out of a checkpoint stream). Here each chunk travels once, over
one of :data:`STREAMS` sockets straight into the destination worker, as a 36-byte header and its
payload (``socket.sendmsg`` of the two: no join, no protobuf), received with ``recv_into`` into
a buffer the worker reuses and written to device memory from it.

* **Chunks** of :data:`CHUNK` bytes (a memory region is cut at that size), each checksummed
  (CRC-32 of the raw bytes, as the checkpoint format's sections, :mod:`crane.state.crc32`) and
  verified on arrival; the header carries its own CRC, so a damaged header is named as such.
* **Zero chunks** travel as a header alone (codec :data:`ZERO`); the destination clears the
  range. Detecting one costs a NumPy scan of 64-bit words (~0.2 ms per chunk).
* **Compression where it pays**: the checkpoint writer's sampler
  (:func:`crane.state.checkpoint.worth_compressing`) decides per chunk, then the chunk is kept
  compressed only where zstd saved 1/8 (:func:`crane.state.checkpoint.pack_chunk`, the same
  rule as a checkpoint's sections). Float noise is sent raw after a ~4 x 32 KiB sample.
* **Authentication**: the destination worker listens on a port and accepts a connection only
  when its first bytes are the one-time token its daemon handed the source over the Transfer
  stream (authenticated: mutual TLS between daemons, or the peer check on a unix socket), and
  speaks TLS with the daemon's own certificate, verifying the source's against the peers' CA,
  whenever the daemons do.
* **Ordering**: a frame names its round; the destination applies a round's chunks only after
  that round's object graph (chunks mapped, allocations made: the Transfer stream's part), and
  the round is acknowledged only once every chunk the source announced at its end is applied.
  Any failure (a checksum, a header, a connection that drops, a write outside the window) is
  recorded and refuses the round, which aborts the migration with the source still running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crane.state.checkpoint import (
    MEMORY_CHUNK,
    CheckpointError,
    pack_chunk,
    unpack_chunk,
    worth_compressing,
)
from crane.state.crc32 import crc32

__all__ = [
    "CHUNK",
    "RAW",
    "STREAMS",
    "TEST_FAULT_ENV",
    "ZERO",
    "ZSTD",
    "Acceptor",
    "DataPlaneError",
    "Frame",
    "Incoming",
    "Into",
    "Receiver",
    "Sender",
    "Timing",
    "decode_header",
    "encode_chunk",
    "is_zero",
    "new_token",
    "unpack",
]

log = logging.getLogger("crane.worker")

#: Parallel sockets: enough to keep a link busy while one sender checksums or compresses
#: (zstd, CRC and socket writes release the GIL), few enough for a 2-core host.
STREAMS = 4
#: Bytes of memory per frame: large chunks amortize the per-frame cost (RDMA migration: 1 MB
#: chunks took 8.7x the time of 1 GB ones); a pre-copy read holds the batch lock for one.
CHUNK = 4 << 20
RAW, ZSTD, ZERO = 0, 1, 2
_MAGIC = 0x43524450  # "CRDP"
_HEAD = struct.Struct("<IIQIII")  # magic, round, addr, raw_len, wire_len, codec
_CRCS = struct.Struct("<II")  # crc of the raw bytes, crc of the header before it
HEADER = _HEAD.size + _CRCS.size
_TOKEN = 32
_ZEROS = bytes(CHUNK)
_ZERO_CRC: dict[int, int] = {}
#: How long a handshake (token, TLS) may take before the connection is dropped.
HANDSHAKE_S = 10.0
#: Test-only fault on the source's data plane (never set in production): ``token`` presents a
#: wrong token (the destination refuses the connections: the source falls back to the stream),
#: ``corrupt`` flips a byte of the third chunk after checksumming it, ``drop`` sends half of the
#: third chunk and closes that connection. Why: these are the destination's checks, which no
#: healthy source triggers.
TEST_FAULT_ENV = "CRANE_TEST_DATAPLANE_FAULT"
_FAULT_AT = 3
#: Connections the destination lets handshake at once (a source opens :data:`STREAMS`).
_MAX_HANDSHAKES = 16

assert CHUNK <= MEMORY_CHUNK


class DataPlaneError(Exception):
    """A data-plane failure: the round it hit is refused (the source keeps the session)."""


def new_token() -> bytes:
    return secrets.token_bytes(_TOKEN)


def is_zero(data: bytes | bytearray | memoryview) -> bool:
    """All bytes zero: NumPy over 64-bit words (~20 GB/s; a memoryview comparison runs at
    ~1 GB/s), after a look at the first bytes that settles dense data at once."""
    v = np.frombuffer(data, np.uint8)
    if v[:64].any():
        return False
    whole = len(v) // 8 * 8
    return not (v[:whole].view(np.uint64).any() or v[whole:].any())


def _zero_crc(n: int) -> int:
    c = _ZERO_CRC.get(n)
    if c is None:
        c = _ZERO_CRC[n] = crc32(memoryview(_ZEROS)[:n])
    return c


def encode_chunk(
    round_: int, addr: int, data: bytes | bytearray | memoryview, level: int | None
) -> tuple[bytes, bytes | bytearray | memoryview]:
    """The frame for one chunk: (header, payload). Zeros: no payload; compressed when
    ``level`` is set, the sampler expects a saving and zstd delivers it; else the raw bytes
    (the caller's buffer, not a copy)."""
    n = len(data)
    if n > CHUNK:
        raise ValueError(f"chunk of {n} bytes exceeds {CHUNK}")
    payload: bytes | bytearray | memoryview
    if is_zero(data):
        codec, payload, crc = ZERO, b"", _zero_crc(n)
    else:
        crc = crc32(data)
        packed = pack_chunk(data, level) if level is not None and worth_compressing(data) else None
        codec, payload = (ZSTD, packed) if packed is not None else (RAW, data)
    head = _HEAD.pack(_MAGIC, round_, addr, n, len(payload), codec)
    return head + _CRCS.pack(crc, crc32(head)), payload


@dataclass(frozen=True)
class Frame:
    round: int
    addr: int
    raw_len: int
    wire_len: int
    codec: int
    crc: int


def decode_header(head: bytes | bytearray | memoryview) -> Frame:
    """A frame's header, checked (magic, its own CRC, sizes)."""
    magic, round_, addr, raw_len, wire_len, codec = _HEAD.unpack_from(head)
    crc, hcrc = _CRCS.unpack_from(head, _HEAD.size)
    if magic != _MAGIC:
        raise DataPlaneError(f"not a data-plane frame (magic {magic:#x})")
    if hcrc != crc32(memoryview(head)[: _HEAD.size]):
        raise DataPlaneError("a frame header's checksum does not match (damaged in transit)")
    if raw_len > CHUNK or wire_len > CHUNK + (CHUNK >> 7) + 4096 or codec not in (RAW, ZSTD, ZERO):
        raise DataPlaneError(f"a frame header is out of range ({raw_len}/{wire_len}/{codec})")
    if (codec == RAW and wire_len != raw_len) or (codec == ZERO and wire_len):
        raise DataPlaneError("a frame's lengths do not fit its codec")
    return Frame(round_, addr, raw_len, wire_len, codec, crc)


def unpack(frame: Frame, payload: bytes | bytearray | memoryview) -> bytes | memoryview | None:
    """The chunk's raw bytes (None: zeros), checksum verified."""
    if frame.codec == ZERO:
        if frame.crc != _zero_crc(frame.raw_len):
            raise DataPlaneError(f"chunk at {frame.addr:#x}: checksum mismatch (zero chunk)")
        return None
    if frame.codec == ZSTD:
        try:
            data: bytes | memoryview = unpack_chunk(payload, frame.raw_len)
        except CheckpointError as e:
            raise DataPlaneError(f"chunk at {frame.addr:#x}: {e}") from None
        if len(data) != frame.raw_len:
            raise DataPlaneError(f"chunk at {frame.addr:#x}: decompressed to {len(data)} bytes")
    else:
        data = memoryview(payload)
    if crc32(data) != frame.crc:
        raise DataPlaneError(
            f"chunk at {frame.addr:#x}+{frame.raw_len:#x}: checksum mismatch (damaged in transit)"
        )
    return data


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    n = len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise DataPlaneError("the source closed a data connection mid-frame")
        got += k


def _recv_frame_start(sock: socket.socket, view: memoryview) -> bool:
    """Read a frame's header; False when the connection closed cleanly before it."""
    k = sock.recv_into(view, len(view))
    if k == 0:
        return False
    _recv_exact(sock, view[k:])
    return True


def _sendmsg(sock: socket.socket, parts: list[bytes | bytearray | memoryview]) -> None:
    """Send header and payload without joining them (``sendmsg``; TLS sockets lack it)."""
    if isinstance(sock, ssl.SSLSocket):
        for p in parts:
            if len(p):
                sock.sendall(p)
        return
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


@dataclass(frozen=True)
class TlsPaths:
    cert: str
    key: str
    ca: str


def server_context(tls: TlsPaths) -> ssl.SSLContext:
    """The destination's side: its daemon's certificate, the source's verified against the
    peers' CA (mutual TLS, as the Peer service)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls.cert, tls.key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(tls.ca)
    return ctx


def client_context(tls: TlsPaths) -> ssl.SSLContext:
    """The source's side: its daemon's certificate; the destination's verified against the CA
    (its name is checked by the token, which only the Transfer stream's peer holds)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    if tls.ca:
        ctx.load_verify_locations(tls.ca)
    else:
        ctx.load_default_certs()
    if tls.cert:
        ctx.load_cert_chain(tls.cert, tls.key)
    return ctx


# ---- destination ---------------------------------------------------------------------------
Apply = Callable[[int, bytes | memoryview | None, int], None]


class Incoming:
    """A raw chunk's payload still in its socket, for the device to read straight into its
    memory (a :class:`crane.backends.base.StagedSource`): :meth:`read_into` receives the bytes
    into the buffer it is given (the simulator's device memory itself, validated first) and
    verifies their checksum there, raising :class:`DataPlaneError` on a mismatch, so a damaged
    chunk refuses the round before anything learns from its bytes."""

    def __init__(self, sock: socket.socket, frame: Frame) -> None:
        self.sock = sock
        self.frame = frame
        self.filled: memoryview | None = None  # where the bytes landed, once they did

    def __len__(self) -> int:
        return self.frame.raw_len

    def read_into(self, dst: Any) -> None:
        if self.filled is not None:
            raise DataPlaneError("a chunk's payload was read twice")
        view = memoryview(dst).cast("B")
        if len(view) != self.frame.raw_len:
            raise DataPlaneError(f"a chunk's buffer holds {len(view)} of {self.frame.raw_len}")
        _recv_exact(self.sock, view)
        self.filled = view
        if crc32(view) != self.frame.crc:
            f = self.frame
            raise DataPlaneError(
                f"chunk at {f.addr:#x}+{f.raw_len:#x}: checksum mismatch (damaged in transit)"
            )


#: Writes a raw chunk straight from its socket: ``into(addr, incoming)`` must call
#: ``incoming.read_into`` once with the destination's buffer (see :class:`Incoming`).
Into = Callable[[int, Incoming], None]


@dataclass
class Timing:
    """Seconds spent per step, summed over the threads (the per-round log line): where a
    round's time goes beyond the wire."""

    read: float = 0.0  # source: device memory into the send buffer (batch lock included)
    encode: float = 0.0  # source: zero scan, sample, compression, checksum
    send: float = 0.0  # source: socket writes; destination: socket reads (and checksum)
    apply: float = 0.0  # destination: into device memory (and the dirty tracker)
    wait: float = 0.0  # destination: a chunk waiting for its round's object graph

    def add(self, other: Timing) -> None:
        for k in ("read", "encode", "send", "apply", "wait"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def ms(self) -> str:
        parts = [
            f"{k} {getattr(self, k) * 1e3:.0f}" for k in ("read", "encode", "send", "apply", "wait")
        ]
        shown = [p for p in parts if not p.endswith(" 0")]
        return ", ".join(shown) + " ms" if shown else "each under 1 ms"


class Acceptor:
    """A listener's accept loop: each connection is served on a thread of its own, with at
    most ``limit`` of them still handshaking at once, so that a flood of connections that
    present nothing is refused rather than given a thread each. ``serve`` must call
    :meth:`handshaken` once its connection's handshake is over, whatever its outcome. The
    loop ends when the listener is closed."""

    def __init__(
        self,
        listener: socket.socket,
        serve: Callable[[socket.socket], None],
        limit: int,
        name: str,
    ) -> None:
        self.listener = listener
        self.serve = serve
        self.limit = limit
        self.name = name
        self.lock = threading.Lock()
        self.busy = 0  # handshakes in progress
        threading.Thread(target=self._run, name=f"{name}-accept", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                busy = self.busy
                if busy < self.limit:
                    self.busy += 1
            if busy >= self.limit:
                log.warning("%s connection refused: %d handshakes in progress", self.name, busy)
                sock.close()
                continue
            threading.Thread(
                target=self.serve, args=(sock,), name=f"{self.name}-in", daemon=True
            ).start()

    def handshaken(self) -> None:
        with self.lock:
            self.busy -= 1


class Receiver:
    """The destination worker's listener and its connections' threads.

    ``apply(addr, data, n)`` writes a chunk (``data`` None: ``n`` zero bytes) to device
    memory; it is called only for the round :meth:`open_round` opened, from several threads
    (the caller serializes what must be)."""

    def __init__(
        self,
        apply: Apply,
        token: bytes,
        bind: str = "127.0.0.1",
        tls: TlsPaths | None = None,
        into: Into | None = None,
    ) -> None:
        """``into``: raw chunks go from the socket straight into device memory (one copy,
        made by the kernel) once their round is open; without it they are received into a
        buffer and handed to ``apply``."""
        self.apply = apply
        self.into = into
        self.timing = Timing()
        self.token = token
        self.ctx = server_context(tls) if tls is not None else None
        if bind == "*":  # every address, IPv6 and IPv4 where the host has both
            dual = socket.has_dualstack_ipv6()
            family = socket.AF_INET6 if dual else socket.AF_INET
            self.listener = socket.create_server(
                ("", 0), family=family, backlog=16, dualstack_ipv6=dual
            )
        else:
            self.listener = socket.create_server((bind, 0), backlog=16)
        self.port: int = self.listener.getsockname()[1]
        self.cond = threading.Condition()
        self.round = -1  # the round whose chunks may be applied now
        self.applied: dict[int, int] = {}  # round -> chunks applied
        self.bytes = 0
        self.error = ""
        self.closed = False
        self.conns: list[socket.socket] = []
        self.acceptor = Acceptor(self.listener, self._serve, _MAX_HANDSHAKES, "dataplane")

    def _handshake(self, sock: socket.socket) -> socket.socket | None:
        sock.settimeout(HANDSHAKE_S)
        try:
            if self.ctx is not None:
                sock = self.ctx.wrap_socket(sock, server_side=True)
            got = bytearray(_TOKEN)
            _recv_exact(sock, memoryview(got))
        except (OSError, DataPlaneError, ssl.SSLError) as e:
            log.warning("data-plane connection refused: handshake failed: %s", e)
            sock.close()
            return None
        if not secrets.compare_digest(bytes(got), self.token):
            log.warning("data-plane connection refused: wrong token")
            sock.close()
            return None
        sock.sendall(b"\x01")
        sock.settimeout(None)
        return sock

    def _serve(self, raw: socket.socket) -> None:
        try:
            sock = self._handshake(raw)
        finally:
            self.acceptor.handshaken()
        if sock is None:
            return
        with self.cond:
            self.conns.append(sock)
        head = bytearray(HEADER)
        buf: bytearray | None = None  # compressed payloads (and raw ones without ``into``)
        t = Timing()
        try:
            while True:
                if not _recv_frame_start(sock, memoryview(head)):
                    return  # closed between frames: the source is done with this socket
                frame = decode_header(head)
                t0 = time.perf_counter()
                if frame.codec == RAW and self.into is not None:
                    # the round's graph first (the range must be allocated), then the bytes
                    # from the socket into device memory, checksummed where they landed
                    if not self._await_round(frame.round):
                        return
                    t1 = time.perf_counter()
                    self.into(frame.addr, Incoming(sock, frame))
                    t2 = time.perf_counter()
                    t.wait += t1 - t0
                    t.apply += t2 - t1  # the socket's reads included
                else:
                    if buf is None:
                        buf = bytearray(CHUNK + (CHUNK >> 7) + 4096)
                    payload = memoryview(buf)[: frame.wire_len]
                    _recv_exact(sock, payload)
                    data = unpack(frame, payload)
                    t1 = time.perf_counter()
                    if not self._await_round(frame.round):
                        return
                    t2 = time.perf_counter()
                    self.apply(frame.addr, data, frame.raw_len)
                    t.send += t1 - t0
                    t.wait += t2 - t1
                    t.apply += time.perf_counter() - t2
                with self.cond:
                    self.applied[frame.round] = self.applied.get(frame.round, 0) + 1
                    self.bytes += frame.raw_len
                    self.timing.add(t)
                    t = Timing()
                    self.cond.notify_all()
        except (OSError, ssl.SSLError) as e:
            self.fail(f"a data connection failed: {e}")
        except (DataPlaneError, CheckpointError) as e:
            self.fail(str(e))
        except Exception as e:  # CudaError (outside the window) and bugs: the round fails
            self.fail(f"{getattr(e, 'message', None) or e!r}")
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    def _await_round(self, round_: int) -> bool:
        """Wait until ``round_``'s object graph is applied; False: the plane closed or
        failed meanwhile. A chunk of an older round than the open one is an error."""
        with self.cond:
            while self.round < round_ and not self.closed and not self.error:
                self.cond.wait(0.5)
            if self.closed or self.error:
                return False
            if round_ != self.round:
                raise DataPlaneError(f"a chunk of round {round_} arrived in round {self.round}")
        return True

    def fail(self, why: str) -> None:
        with self.cond:
            if not self.error:
                self.error = why
                log.warning("incoming migration's data plane failed: %s", why)
            self.cond.notify_all()

    def open_round(self, round_: int) -> None:
        """Chunks of ``round_`` may be applied now (its object graph is)."""
        with self.cond:
            self.round = round_
            self.cond.notify_all()

    def wait(self, round_: int, chunks: int, deadline_s: float = 600.0) -> None:
        """Until ``chunks`` chunks of ``round_`` are applied; :class:`DataPlaneError` on any
        failure, a connection that dropped included."""
        end = time.monotonic() + deadline_s
        with self.cond:
            while self.applied.get(round_, 0) < chunks:
                if self.error:
                    raise DataPlaneError(self.error)
                if time.monotonic() > end:
                    raise DataPlaneError(f"round {round_}: chunks missing after {deadline_s} s")
                if self.conns and all(c.fileno() < 0 for c in self.conns):
                    raise DataPlaneError("every data connection closed before the round ended")
                self.cond.wait(0.5)
            if self.error:
                raise DataPlaneError(self.error)
            timing, self.timing = self.timing, Timing()
        log.info("data plane in: round %d, %d chunks; %s", round_, chunks, timing.ms())

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            conns = list(self.conns)
        with contextlib.suppress(OSError):
            self.listener.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)


# ---- source --------------------------------------------------------------------------------
#: Reads a job's bytes: (addr, size) -> the bytes to send (a copy taken under the batch lock
#: while the guest runs), or None when the range is gone (freed under us).
Read = Callable[[int, int, int], bytes | bytearray | memoryview | None]


@dataclass
class Stats:
    chunks: int = 0
    raw: int = 0
    wire: int = 0
    zero: int = 0
    packed: int = 0
    timing: Timing = field(default_factory=Timing)


class Sender:
    """The source worker's sockets and one thread per socket; :meth:`send` queues a chunk,
    :meth:`flush` waits until every queued chunk is written (the round may then end)."""

    def __init__(
        self,
        host: str,
        port: int,
        token: bytes,
        streams: int = STREAMS,
        tls: TlsPaths | None = None,
        connect_timeout_s: float = HANDSHAKE_S,
    ) -> None:
        """Connects all ``streams`` sockets (raises OSError / DataPlaneError: the caller falls
        back to the Transfer stream)."""
        ctx = client_context(tls) if tls is not None else None
        self.fault = os.environ.get(TEST_FAULT_ENV, "")
        if self.fault:
            log.warning("test hook: data-plane fault %r", self.fault)
        if self.fault == "token":
            token = bytes(len(token))
        self.socks: list[socket.socket] = []
        try:
            for _ in range(max(streams, 1)):
                s = socket.create_connection((host, port), timeout=connect_timeout_s)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if ctx is not None:
                    s = ctx.wrap_socket(s)
                s.sendall(token)
                ok = bytearray(1)
                _recv_exact(s, memoryview(ok))
                s.settimeout(None)
                self.socks.append(s)
        except BaseException:
            self.close()
            raise
        self.q: queue.Queue[tuple[int, int, int, int | None, Read] | None] = queue.Queue(
            maxsize=2 * len(self.socks)
        )
        self.error: BaseException | None = None
        self.stats = Stats()
        self.round_chunks = 0  # chunks written since the last flush
        self.seq = 0  # chunks encoded (the test hook's count)
        self.on_sent: Callable[[], object] = lambda: None  # progress (the source's deadline)
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(s,), name="dataplane-out", daemon=True)
            for s in self.socks
        ]
        for t in self.threads:
            t.start()

    def _raise(self) -> None:
        """The first sender failure: a socket's as DataPlaneError, anything else (the batch
        boundary's time-out, a bug) as itself, so the caller reports it as such."""
        e = self.error
        if e is None:
            return
        if isinstance(e, (OSError, DataPlaneError)):
            raise DataPlaneError(f"a data connection failed: {e}") from None
        raise e

    def send(self, round_: int, addr: int, size: int, level: int | None, read: Read) -> None:
        """Queue one chunk (``size`` <= CHUNK) of ``round_``; ``read`` fetches its bytes on a
        sender thread. Raises the first sender failure."""
        self._raise()
        while True:
            try:
                self.q.put((round_, addr, size, level, read), timeout=0.5)
                return
            except queue.Full:
                self._raise()

    def flush(self) -> int:
        """Wait until every queued chunk is on the wire; the chunks sent since the last flush
        (what the destination must apply before acknowledging the round)."""
        self.q.join()
        self._raise()
        with self.lock:
            n, self.round_chunks = self.round_chunks, 0
        return n

    def _run(self, sock: socket.socket) -> None:
        while (job := self.q.get()) is not None:
            try:
                if self.error is None:
                    self._one(sock, *job)
            except BaseException as e:
                self.error = self.error or e
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            finally:
                self.q.task_done()
        self.q.task_done()

    def _one(
        self, sock: socket.socket, round_: int, addr: int, size: int, level: int | None, read: Read
    ) -> None:
        t0 = time.perf_counter()
        data = read(addr, size, round_)
        if data is None:
            return
        t1 = time.perf_counter()
        head, payload = encode_chunk(round_, addr, data, level)
        t2 = time.perf_counter()
        with self.lock:
            self.seq += 1
            nth = self.seq
        if self.fault in ("corrupt", "drop") and nth == _FAULT_AT and len(payload) > 1:
            payload = bytearray(payload)
            if self.fault == "corrupt":
                payload[len(payload) // 2] ^= 0x01
            else:
                sock.sendall(head + payload[: len(payload) // 2])
                sock.close()
                payload = b""  # counted as sent: the destination must notice on its own
        if not (self.fault == "drop" and nth == _FAULT_AT and not payload):
            _sendmsg(sock, [head, payload])
        t3 = time.perf_counter()
        self.on_sent()
        with self.lock:
            self.round_chunks += 1
            st = self.stats
            st.timing.read += t1 - t0
            st.timing.encode += t2 - t1
            st.timing.send += t3 - t2
            st.chunks += 1
            st.raw += size
            st.wire += len(payload) + HEADER
            st.zero += size if not payload else 0
            st.packed += size if payload and len(payload) < size else 0

    def close(self) -> None:
        for _ in getattr(self, "threads", []):
            with contextlib.suppress(queue.Full):
                self.q.put_nowait(None)
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in a send
            with contextlib.suppress(OSError):
                s.close()
        self.socks = []
