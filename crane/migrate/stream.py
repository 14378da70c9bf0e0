"""The transfer stream's data path: rounds in the checkpoint format, cut into gRPC messages.

Why not the checkpoint file's plumbing as is: the final round is the migration's downtime, and
every byte of the write set was copied five to eight times on its way (a snapshot, a compressed
chunk, a section, a wire buffer, a protobuf message; then a reassembly buffer and two slices on
the destination), measured at ~80 ms on each side for 64 MiB before any byte crossed a socket.
The rounds are still written by :class:`~crane.state.checkpoint.CheckpointWriter` (which stores
a chunk raw, checksummed from the caller's buffer, when zstd would not save enough) and read by
:class:`~crane.state.checkpoint.CheckpointReader`; what this module adds:

* :class:`WireSink` frames each wire message once, as a serialized ``TransferChunk`` (the
  ``data`` field written by hand after the other fields, which protobuf permits): one
  ``bytes.join`` of the writer's pieces, which the gRPC stub sends as is. A message ends after
  each large piece (a chunk's payload), so a section lies inside one message;
* :func:`parse_chunk` is the destination daemon's deserializer: the small fields are parsed by
  protobuf, the data field is a view of the received bytes (protobuf would copy it twice on its
  way to the worker's channel);
* :class:`FrameReader` hands the destination worker a section that lies inside one message as a
  view of it, no copy;
* :class:`Outbox` bounds what the source has queued for the stream.

A view from the backend is valid only until its next call (``Backend.memcpy_dtoh``): the sink
joins the message holding one before it returns. While the guest runs, the caller copies each
chunk under the batch lock instead (the checksum must be of the bytes that are sent).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from crane.migrate.deadline import Stall
from crane.state.checkpoint import MEMORY_CHUNK
from crane.v1 import peer_pb2

__all__ = [
    "READ_CHUNK",
    "WIRE_CHUNK",
    "FrameReader",
    "Outbox",
    "StreamClosed",
    "WireChunk",
    "WireSink",
    "parse_chunk",
]

#: Wire message size: large enough to amortize gRPC's per-message cost, small enough that the
#: destination starts applying while the source still reads.
WIRE_CHUNK = 2 << 20
#: Device memory read per section (<= MEMORY_CHUNK): one section per wire message.
READ_CHUNK = 2 << 20
#: A piece at least this large ends its message (a chunk's payload: the end of its section);
#: a smaller view is copied at once rather than cutting a message early.
_SMALL = 256 << 10
#: Key of TransferChunk.data (field 9, length-delimited).
_DATA_KEY = bytes([(9 << 3) | 2])

assert READ_CHUNK <= MEMORY_CHUNK


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated or overlong varint in a TransferChunk")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


class WireChunk:
    """A received TransferChunk: its small fields (``head``, a parsed message, whose attributes
    this forwards) and its data as a view of the received bytes."""

    __slots__ = ("data", "head")

    def __init__(self, head: peer_pb2.TransferChunk, data: memoryview) -> None:
        self.head = head
        self.data = data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.head, name)


def parse_chunk(raw: bytes) -> WireChunk:
    """Deserialize a TransferChunk without copying its data field (the last one wins, as in
    protobuf); the other fields go to protobuf's own parser."""
    view = memoryview(raw)
    keep: list[memoryview] = []
    data = view[:0]
    pos, n = 0, len(raw)
    while pos < n:
        start = pos
        key, pos = _read_varint(raw, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _read_varint(raw, pos)
        elif wire == 2:
            length, pos = _read_varint(raw, pos)
            if pos + length > n:
                raise ValueError("a TransferChunk field runs past the message")
            if key >> 3 == 9:
                data = view[pos : pos + length]
                pos += length
                continue
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire} in a TransferChunk")
        keep.append(view[start:pos])
    if pos > n:
        raise ValueError("a TransferChunk field runs past the message")
    return WireChunk(peer_pb2.TransferChunk.FromString(b"".join(keep)), data)


class StreamClosed(Exception):
    """The transfer call ended while the source still had messages for it."""


class Outbox:
    """A bounded queue of wire messages for the Transfer call's request iterator.

    Bounded so that a source reading faster than the link sends never holds more than a few
    messages; a put gives up once the call is over (``closed``), so the reader never blocks on
    a stream that nobody drains.
    """

    def __init__(self, depth: int = 8, stall: Stall | None = None) -> None:
        """``stall``: told of every message the stream takes, and of every wait for room (the
        source's deadline on a destination that stopped draining)."""
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=depth)
        self.closed = threading.Event()
        self.waited = 0.0  # seconds the source spent waiting for room (the link is slower)
        self.stall = stall

    def put(self, msg: bytes) -> None:
        try:
            self.q.put_nowait(msg)
            return
        except queue.Full:
            pass
        t = time.perf_counter()
        waiting = self.stall.waiting() if self.stall else contextlib.nullcontext()
        try:
            with waiting:
                while not self.closed.is_set():
                    try:
                        self.q.put(msg, timeout=0.2)
                        return
                    except queue.Full:
                        continue
        finally:
            self.waited += time.perf_counter() - t
        raise StreamClosed("the transfer stream is closed")

    def end(self) -> None:
        """End the request stream (best effort: a closed call needs no end)."""
        try:
            self.q.put_nowait(None)
        except queue.Full:
            self.closed.set()

    def __iter__(self) -> Iterator[bytes]:
        while (msg := self.q.get()) is not None:
            if self.stall is not None:
                self.stall.touch()
            yield msg


class WireSink:
    """A binary stream that cuts what a checkpoint writer writes into TransferChunk messages,
    each serialized once: the header fields by protobuf, then the data field by hand."""

    def __init__(self, out: Outbox, first: dict[str, Any]) -> None:
        self.out = out
        self.first = first  # fields of the stream's first message (identity), sent once
        self.pieces: list[bytes | memoryview] = []
        self.size = 0
        self.round = 0
        self.fresh = False
        self.final = False
        self.sent = 0
        self.messages = 0

    def begin(self, round_: int, fresh: bool, final: bool) -> None:
        self.round, self.fresh, self.final = round_, fresh, final

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Queue ``data`` for the next message; a view is consumed before this returns."""
        n = len(data)
        if isinstance(data, memoryview) and n < _SMALL:
            data = bytes(data)
        if n <= WIRE_CHUNK:
            if n:
                self.pieces.append(data)
                self.size += n
        else:  # a large section (an image, a graph): split across messages
            view = memoryview(data)
            for off in range(0, n, WIRE_CHUNK):
                piece = view[off : off + WIRE_CHUNK]
                self.pieces.append(piece)
                self.size += len(piece)
                if self.size >= WIRE_CHUNK:
                    self._push(False)
        if n >= _SMALL or self.size >= WIRE_CHUNK:
            self._push(False)
        return n

    def flush(self) -> None:
        pass

    def end(self, data_chunks: int = 0, handed_over: bool = False) -> None:
        """End the round (``data_chunks``: its memory chunks sent over the data plane;
        ``handed_over``: its memory went as a descriptor on the hand-over socket)."""
        self._push(True, data_chunks, handed_over=handed_over)

    def push(self, data_follows: bool = False) -> None:
        """Send what is queued now (the round goes on); ``data_follows``: this ends the
        stream's part of a round whose memory follows on the data plane."""
        if self.size or self.first or data_follows:
            self._push(False, data_follows=data_follows)

    def _push(
        self, end: bool, data_chunks: int = 0, data_follows: bool = False, handed_over: bool = False
    ) -> None:
        head = peer_pb2.TransferChunk(
            round=self.round,
            fresh=self.fresh,
            final=self.final,
            end_of_round=end,
            data_chunks=data_chunks,
            data_follows=data_follows,
            handed_over=handed_over,
            **self.first,
        ).SerializeToString()
        msg = b"".join([head, _DATA_KEY, _varint(self.size), *self.pieces]) if self.size else head
        self.first = {}
        self.sent += self.size
        self.messages += 1
        self.pieces.clear()
        self.size = 0
        self.out.put(msg)


class FrameReader:
    """The destination's side: a blocking binary stream fed with wire messages' data by the
    worker's channel loop (``None``: end of round).

    A read that lies inside one message returns a view of it when at least ``min_view`` bytes
    (memory payloads; the caller applies them before the next message is needed), else bytes;
    ``min_view=None`` always returns bytes (a fresh round, replayed by the checkpoint restore,
    which keeps what it reads)."""

    def __init__(self, min_view: int | None) -> None:
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=16)  # bounds the backlog
        self.min_view = min_view
        self._cur = memoryview(b"")
        self._eof = False

    def read(self, n: int) -> bytes | memoryview:
        cur = self._cur
        if len(cur) >= n:
            self._cur = cur[n:]
            out = cur[:n]
            return out if self.min_view is not None and n >= self.min_view else bytes(out)
        parts = [cur] if len(cur) else []
        have = len(cur)
        while have < n and not self._eof:
            data = self.q.get()
            if data is None:
                self._eof = True
            elif data:
                parts.append(memoryview(data))
                have += len(data)
        if have > n:
            last = parts[-1]
            keep = have - n
            parts[-1] = last[: len(last) - keep]
            self._cur = last[len(last) - keep :]
        else:
            self._cur = memoryview(b"")
        if len(parts) == 1:  # the whole read came from one message
            out = parts[0]
            return out if self.min_view is not None and len(out) >= self.min_view else bytes(out)
        return b"".join(parts)

    def drain(self) -> None:
        """Discard the rest of the round, so the feeder never blocks on a reader that quit."""
        self._cur = memoryview(b"")
        while not self._eof:
            if self.q.get() is None:
                self._eof = True
