"""A guest that speaks the wire protocol byte by byte, for fuzzing a live daemon.

:class:`crane.guest.session.GuestSession` checks its arguments locally (wrong-kind handles,
ranges outside its allocations) and never sends what a fuzzer wants to send, so this client opens
a session with the same ``OpenSession`` and then writes serialized ``CallBatch`` bytes (or any
bytes at all) on the session's ``Calls`` stream, directly to the worker or through the daemon's
relay, and reads the ``ReplyBatch`` answers on a thread of its own so that a missing answer is a
time-out, never a hang of the test.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator

import grpc

from crane.api.ops import OPS_BY_NAME
from crane.v1 import guest_pb2, guest_pb2_grpc
from crane.wire.address import CHANNEL_OPTIONS, to_grpc_target
from crane.wire.batch_flags import EXPECTS_REPLY, SHORT_ANSWER
from crane.wire.channel import open_channel
from crane.wire.fingerprint import fingerprint
from crane.wire.packed import ARGS_MAX, HEADER, RECORD_OPS
from crane.wire.replies import as_message

__all__ = ["NoAnswer", "RawSession", "StreamEnded"]

_PROBE = OPS_BY_NAME["MEM_GET_INFO"]


class NoAnswer(AssertionError):
    """The session did not answer within the time allowed: a hang, which fails the test."""


class _Overtaken(Exception):
    """The worker ran calls past ``seq`` without answering it: it took ``seq`` for a call that
    ran before (a damaged batch carried a higher sequence number than it was given)."""

    def __init__(self, done_seq: int) -> None:
        super().__init__(f"done_seq {done_seq}")
        self.done_seq = done_seq


class StreamEnded(Exception):
    """The session's call stream ended (the session closed, or its worker died)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class RawSession:
    """One session's call stream, carrying whatever bytes the caller gives it."""

    def __init__(self, address: str, direct: bool, client: str = "fuzz") -> None:
        self.address = address
        self._channel = open_channel(address)  # identified, as any client of the daemon
        stub = guest_pb2_grpc.GuestStub(self._channel)
        self.opened = stub.OpenSession(
            guest_pb2.OpenSessionRequest(fingerprint=fingerprint(), client=client), timeout=60
        )
        self.session_id = self.opened.session_id
        self.window = (self.opened.va_base, self.opened.va_size)
        self._calls_channel = self._channel
        self._presence = None
        if direct and self.opened.direct_address:
            self._calls_channel = grpc.insecure_channel(
                to_grpc_target(self.opened.direct_address),
                options=[*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)],
            )
            self._presence = stub.Presence(
                guest_pb2.PresenceRequest(
                    session_id=self.session_id, resume_token=self.opened.resume_token
                )
            )
        self.path = "direct" if self._calls_channel is not self._channel else "relay"
        self._attach(self.session_id, self.opened.resume_token)
        self.seq = 0
        #: the sequence number of the last exchange's first call
        self.first = 1
        #: send the calls of packed ops (synchronizing ones too) as records (crane.wire.packed),
        #: not Call messages, and ask for short answers (crane.wire.replies)
        self.packs = False

    @classmethod
    def attach(cls, address: str, session_id: str, token: bytes) -> RawSession:
        """The call stream of an existing session (a restored one), through the daemon."""
        self = cls.__new__(cls)
        self.address = address
        self._channel = open_channel(address)
        self._calls_channel = self._channel
        self._presence = None
        self.session_id = session_id
        self.path = "relay"
        self._attach(session_id, token)
        self.seq = 1 << 40  # past anything the restored session ran
        self.first = self.seq + 1
        self.packs = False
        return self

    def _attach(self, sid: str, token: bytes) -> None:
        calls = self._calls_channel.stream_stream(
            "/crane.v1.Guest/Calls",
            request_serializer=None,  # bytes as given: garbage included
            response_deserializer=as_message,  # short answers as messages
        )
        self._out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._in: queue.SimpleQueue[guest_pb2.ReplyBatch | StreamEnded] = queue.SimpleQueue()
        self._responses = calls(
            self._requests(), metadata=(("crane-session", sid), ("crane-token-bin", token))
        )
        self.ended: StreamEnded | None = None
        threading.Thread(target=self._read, name=f"fuzz-read-{sid}", daemon=True).start()

    def _requests(self) -> Iterator[bytes]:
        yield from iter(self._out.get, None)

    def _read(self) -> None:
        try:
            for batch in self._responses:
                self._in.put(batch)
            self._in.put(StreamEnded("the stream ended"))
        except grpc.RpcError as e:
            self._in.put(StreamEnded(f"{e.code().name}: {e.details()}"))

    # ---- sending -----------------------------------------------------------------------------
    def send(self, raw: bytes) -> None:
        if self.ended is None:
            self._out.put(raw)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def batch(self, calls: list[tuple[int, bytes, bytes]], expects: bool = True) -> bytes:
        """Serialized CallBatch of (op id, args, data) calls with fresh sequence numbers."""
        b = guest_pb2.CallBatch(flags=EXPECTS_REPLY if expects else 0)
        for op_id, args, data in calls:
            b.calls.add(seq=self.next_seq(), op=op_id, args=args, data=data)
        return b.SerializeToString()

    def exchange(
        self, calls: list[tuple[int, bytes, bytes]], timeout: float
    ) -> dict[int, guest_pb2.Reply]:
        """Send ``calls`` then a synchronizing probe in one batch; the replies by sequence
        number once the probe's answer is in (:class:`NoAnswer` past ``timeout``,
        :class:`StreamEnded` if the stream ends first). The calls are numbered from
        :attr:`first`: a damaged batch before may have carried a sequence number past the
        fuzzer's count (a flipped bit), after which the worker skips what it takes for calls
        it ran; they are sent again above the ``done_seq`` it reports."""
        try:
            return self._exchange(calls, timeout)
        except _Overtaken as e:
            self.seq = max(self.seq, e.done_seq)
        return self._exchange(calls, timeout)

    def _exchange(
        self, calls: list[tuple[int, bytes, bytes]], timeout: float
    ) -> dict[int, guest_pb2.Reply]:
        self.first = self.seq + 1
        b = guest_pb2.CallBatch(flags=EXPECTS_REPLY | (SHORT_ANSWER if self.packs else 0))
        recs = bytearray()
        for op_id, args, data in [*calls, (_PROBE.id, b"", b"")]:
            seq = self.next_seq()
            o = RECORD_OPS.get(op_id)
            if self.packs and o is not None and not data and len(args) == o.args_size:
                # a packed record (crane.wire.packed), as a guest's transport sends it
                recs += HEADER.pack(seq, op_id) + args + bytes(ARGS_MAX - len(args))
            else:
                b.calls.add(seq=seq, op=op_id, args=args, data=data)
        b.packed = bytes(recs)
        probe = self.seq
        self.send(b.SerializeToString())
        return self.wait_for(probe, timeout)

    def probe(self, timeout: float) -> guest_pb2.Reply:
        """A lone synchronizing call: whether the session still answers."""
        return self.exchange([], timeout)[self.seq]

    def wait_for(self, seq: int, timeout: float) -> dict[int, guest_pb2.Reply]:
        """Replies gathered until the one for ``seq`` arrives."""
        got: dict[int, guest_pb2.Reply] = {}
        deadline = time.monotonic() + timeout
        while True:
            if self.ended is not None:
                raise self.ended
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoAnswer(f"session {self.session_id} ({self.path}): no answer to seq {seq}")
            try:
                item = self._in.get(timeout=left)
            except queue.Empty:
                continue
            if isinstance(item, StreamEnded):
                self.ended = item
                raise item
            for r in item.replies:
                got[r.seq] = r
            if seq in got:
                return got
            if item.done_seq >= seq:  # ran past it: its answer will not come
                raise _Overtaken(item.done_seq)

    def close(self) -> None:
        """End the stream (the session ends with it) and the channels."""
        self._out.put(None)
        with contextlib.suppress(Exception):
            self._responses.cancel()
        if self._presence is not None:
            self._presence.cancel()
        if self._calls_channel is not self._channel:
            self._calls_channel.close()
        self._channel.close()
