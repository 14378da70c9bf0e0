"""The guest's connection to craned: session open, call batching, replies.

Batching (architecture invariant 3, lesson 7 of peers-and-lessons: one gRPC message per call
would cap a guest at ~20k calls/s): calls are appended to the current batch and the batch is
sent when

* a synchronizing call is appended (the caller is about to wait anyway),
* it holds ``MAX_BATCH_CALLS`` calls or ``MAX_CHUNK`` bytes of payload, or
* ``FLUSH_AFTER_S`` has passed since its first call (a timer thread), so work the application
  enqueued without synchronizing still starts promptly.

Replies are read by whichever waiting thread gets there first (a leader): single-threaded
programs pay no thread hand-off on the reply path, multi-threaded ones share one stream.
Asynchronous calls that failed come back as replies with their sequence numbers and are raised
at the next synchronizing call, as CUDA reports asynchronous errors.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from crane.api.generated.cuda_enums import CUresult
from crane.api.ops import Op
from crane.api.results import CudaError
from crane.v1 import guest_pb2, guest_pb2_grpc
from crane.wire.address import CHANNEL_OPTIONS, default_address, to_grpc_target
from crane.wire.batch_flags import EXPECTS_REPLY
from crane.wire.fingerprint import fingerprint
from crane.wire.status import MAX_CHUNK

__all__ = ["CallReply", "Transport", "TransportError"]

log = logging.getLogger("crane.guest")

MAX_BATCH_CALLS = 1024
FLUSH_AFTER_S = 0.001
#: Bytes of bulk batches queued for sending before a caller blocks (bounds guest memory).
MAX_INFLIGHT_BYTES = 64 << 20
BULK_BATCH = 256 << 10
#: Small batches queued for sending before a caller waits for the stream to drain.
MAX_QUEUED_BATCHES = 4096


class TransportError(CudaError):
    """The daemon cannot be reached or the session's stream broke."""


@dataclass
class CallReply:
    result: int
    out: bytes
    data: bytes
    detail: str


class Transport:
    """One session's stream to the daemon."""

    def __init__(
        self,
        address: str | None = None,
        device: int = -1,
        client: str = "",
        direct: bool | None = None,
    ) -> None:
        """Open a session. ``direct``: carry calls straight to the session's worker (True),
        through the daemon (False), or directly when reachable (None; ``CRANE_DIRECT=0``
        forces the relay)."""
        self.address = address or default_address()
        self._channel = grpc.insecure_channel(to_grpc_target(self.address), options=CHANNEL_OPTIONS)
        stub = guest_pb2_grpc.GuestStub(self._channel)
        try:
            self.opened = stub.OpenSession(
                guest_pb2.OpenSessionRequest(
                    fingerprint=fingerprint(), client=client or _describe_self(), device=device
                ),
                timeout=60,
            )
        except grpc.RpcError as e:
            self._channel.close()
            raise _transport_error(e, f"cannot open a session on {self.address}") from None
        self._lock = threading.Lock()  # guards the current batch and sequence numbers
        self._seq = 0
        self._batch = guest_pb2.CallBatch()
        self._batch_bytes = 0
        self._batch_started = 0.0
        self._expect: set[int] = set()
        self._requests: queue.SimpleQueue[tuple[guest_pb2.CallBatch, int] | None] = (
            queue.SimpleQueue()
        )
        self._inflight = 0
        self._inflight_cv = threading.Condition()
        self._cv = threading.Condition()  # guards replies
        self._replies: dict[int, CallReply] = {}
        self._async_errors: list[tuple[int, CallReply]] = []
        self._reading = False
        self._broken: CudaError | None = None
        self.done_seq = 0
        self._direct_channel: grpc.Channel | None = None
        self.path = "relay"
        self._responses = self._calls_stub(stub, direct).Calls(
            self._request_iter(),
            metadata=(
                ("crane-session", self.opened.session_id),
                ("crane-token-bin", self.opened.resume_token),
            ),
        )
        self._closed = False
        self._timer = threading.Thread(target=self._timer_loop, name="crane-flush", daemon=True)
        self._timer_wake = threading.Event()
        self._timer.start()

    def _calls_stub(
        self, daemon_stub: guest_pb2_grpc.GuestStub, direct: bool | None
    ) -> guest_pb2_grpc.GuestStub:
        """The stub to carry calls on: the worker's own socket when reachable, else the daemon."""
        if direct is None:
            direct = os.environ.get("CRANE_DIRECT", "1") != "0" and to_grpc_target(
                self.address
            ).startswith("unix:")
        target = self.opened.direct_address
        if direct and target:
            ch = grpc.insecure_channel(to_grpc_target(target), options=CHANNEL_OPTIONS)
            try:
                grpc.channel_ready_future(ch).result(timeout=2)
            except grpc.FutureTimeoutError:
                ch.close()
                log.info("worker socket %s unreachable; calls go through the daemon", target)
            else:
                self._direct_channel = ch
                self.path = "direct"
                return guest_pb2_grpc.GuestStub(ch)
        return daemon_stub

    # ---- sending ------------------------------------------------------------------------------
    def _request_iter(self) -> Iterator[guest_pb2.CallBatch]:
        for batch, size in iter(self._requests.get, None):
            if size >= BULK_BATCH:
                with self._inflight_cv:
                    self._inflight -= size
                    self._inflight_cv.notify_all()
            yield batch

    def enqueue(
        self, op: Op, args: bytes, data: bytes = b"", *, expect: bool, send: bool = True
    ) -> int:
        """Append a call; returns its sequence number. Sends now if the batch is due.

        ``expect``: the caller will wait for this call's reply; the batch is then sent at once,
        unless ``send`` is False (the caller queues more calls and flushes itself).
        """
        if self._broken is not None:
            raise self._broken
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._batch.calls.add(seq=seq, op=op.id, args=args, data=data)
            if expect:
                self._expect.add(seq)
                self._batch.flags |= EXPECTS_REPLY
            self._batch_bytes += len(data) + len(args) + 16
            if (
                (expect and send)
                or len(self._batch.calls) >= MAX_BATCH_CALLS
                or self._batch_bytes >= MAX_CHUNK
            ):
                self._flush_locked()
            elif len(self._batch.calls) == 1:
                # first call of a batch that stays open: arm the flush timer (only then, so
                # that synchronizing calls never wake the timer thread)
                self._batch_started = time.monotonic()
                self._timer_wake.set()
        return seq

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if not self._batch.calls:
            return
        batch, self._batch = self._batch, guest_pb2.CallBatch()
        size = self._batch_bytes
        self._batch_bytes = 0
        # Backpressure, kept off the small-call path: bulk batches are bounded in bytes, small
        # ones in number (a C-level qsize, no lock hand-off per call).
        if size >= BULK_BATCH:
            with self._inflight_cv:
                while self._inflight > MAX_INFLIGHT_BYTES and self._broken is None:
                    self._inflight_cv.wait(0.1)
                self._inflight += size
        else:
            while self._requests.qsize() > MAX_QUEUED_BATCHES and self._broken is None:
                time.sleep(0.0005)
        self._requests.put((batch, size))

    def _timer_loop(self) -> None:
        while not self._closed:
            self._timer_wake.wait()
            self._timer_wake.clear()
            while not self._closed:
                with self._lock:
                    if not self._batch.calls:
                        break
                    due = self._batch_started + FLUSH_AFTER_S - time.monotonic()
                    if due <= 0:
                        self._flush_locked()
                        break
                time.sleep(max(due, 0.0002))

    # ---- receiving ----------------------------------------------------------------------------
    def wait(self, seq: int) -> CallReply:
        """Block until the reply for ``seq`` arrives."""
        while True:
            with self._cv:
                if seq in self._replies:
                    return self._replies.pop(seq)
                if self._broken is not None:
                    raise self._broken
                if self._reading:
                    self._cv.wait()
                    continue
                self._reading = True
            batch = None
            broken = None
            try:
                batch = next(self._responses)
            except grpc.RpcError as e:
                broken = _transport_error(e, "the session's call stream broke")
            except StopIteration:
                broken = TransportError(
                    CUresult.CUDA_ERROR_DEINITIALIZED, "the daemon ended the session"
                )
            with self._cv:
                self._reading = False
                if broken is not None:
                    self._broken = broken
                else:
                    self._absorb(batch)
                self._cv.notify_all()

    def _absorb(self, batch: guest_pb2.ReplyBatch) -> None:
        if batch.stdout:
            os.write(1, batch.stdout)
        self.done_seq = max(self.done_seq, batch.done_seq)
        for r in batch.replies:
            reply = CallReply(r.result, r.out, r.data, r.detail)
            if r.seq in self._expect:
                self._expect.discard(r.seq)
                self._replies[r.seq] = reply
            else:
                self._async_errors.append((r.seq, reply))

    def take_async_error(self, before: int) -> CallReply | None:
        """The earliest failed asynchronous call with a sequence number below ``before``."""
        with self._cv:
            for i, (seq, reply) in enumerate(self._async_errors):
                if seq < before:
                    del self._async_errors[i]
                    return reply
        return None

    # ---- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._timer_wake.set()
        self.flush()
        self._requests.put(None)
        if self._direct_channel is not None:
            self._direct_channel.close()
        self._channel.close()


def _transport_error(e: grpc.RpcError, what: str) -> TransportError:
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    result = (
        CUresult.CUDA_ERROR_NO_DEVICE
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        else CUresult.CUDA_ERROR_UNKNOWN
    )
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        result = CUresult.CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
    return TransportError(result, f"{what}: {code.name if code else '?'}: {details}")


def _describe_self() -> str:
    import socket
    import sys

    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{prog} pid {os.getpid()} on {socket.gethostname()}"
