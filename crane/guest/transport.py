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

import collections
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import grpc

from crane.api.errors import TransportError
from crane.api.generated.cuda_enums import CUresult
from crane.api.ops import Op
from crane.v1 import guest_pb2, guest_pb2_grpc
from crane.wire.address import CHANNEL_OPTIONS, default_address, is_vm, to_grpc_target
from crane.wire.batch_flags import EXPECTS_REPLY
from crane.wire.channel import TlsFiles, open_channel
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
#: Bytes of sent batches kept for a resend before the sender waits for an acknowledgement.
MAX_UNACKED_BYTES = 256 << 20
#: First pause before asking the daemons again for a session none can serve yet (doubles to 1 s).
RESUME_FIRST_RETRY_S = 0.005
#: How long a VM's guest (a ``vm://`` daemon) keeps asking its one address for its session
#: while nothing there can serve it yet (the forward is down, or reaches a daemon the session
#: has not reached): the VM is moving, and the address will reach the destination's daemon.
VM_RESUME_GRACE_S = 120.0
#: gRPC codes after which the session may still exist elsewhere (parked, moved): try Resume.
_RESUMABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN}
)


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
        alternates: Sequence[str] = (),
        tls: TlsFiles | None = None,
    ) -> None:
        """Open a session. ``direct``: carry calls straight to the session's worker (True),
        through the daemon (False), or directly when reachable (None; ``CRANE_DIRECT=0``
        forces the relay). ``alternates``: daemons where the session may be restored. ``tls``:
        certificate and CA for tcp:// daemons (None: from ``$CRANE_TLS_*``)."""
        self.address = address or default_address()
        env_alt = [a for a in os.environ.get("CRANE_DAEMON_ALTERNATES", "").split(",") if a]
        self.addresses = list(dict.fromkeys([self.address, *alternates, *env_alt]))
        self.resume_timeout = float(os.environ.get("CRANE_RESUME_TIMEOUT_S", "600"))
        grace = os.environ.get("CRANE_VM_RESUME_GRACE_S", "")
        self.vm_grace = float(grace) if grace else VM_RESUME_GRACE_S
        self._vm_deadline = 0.0
        self._direct_pref = direct
        self._tls = tls  # for tcp:// daemons (None: $CRANE_TLS_*), the first and any other
        self._channel = open_channel(self.address, tls)
        stub = guest_pb2_grpc.GuestStub(self._channel)
        try:
            self.opened = stub.OpenSession(
                guest_pb2.OpenSessionRequest(
                    fingerprint=fingerprint(), client=client or _describe_self(), device=device
                ),
                timeout=60,
                # a VM's forward (QEMU's guestfwd starts a socat per connection) can drop the
                # first connection while the host is loaded: keep trying within the deadline
                wait_for_ready=is_vm(self.address),
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
        self._broken: TransportError | None = None
        self.done_seq = 0
        self._unacked: collections.deque[tuple[int, int, guest_pb2.CallBatch]] = collections.deque()
        self._unacked_bytes = 0
        self._ack_wanted = 0
        self._resume_deadline: float | None = None
        self.resumes = 0
        self._direct_channel: grpc.Channel | None = None
        self._presence: grpc.Call | None = None
        self.path = "relay"
        self._responses = self._open_calls(stub, self._requests)
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
            # a subchannel of its own: one shared with an earlier channel to the same socket
            # path (the session's previous worker here) would inherit its reconnection back-off
            ch = grpc.insecure_channel(
                to_grpc_target(target),
                options=[*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)],
            )
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

    def _open_calls(
        self, stub: guest_pb2_grpc.GuestStub, requests: queue.SimpleQueue
    ) -> Iterator[guest_pb2.ReplyBatch]:
        calls = self._calls_stub(stub, self._direct_pref)
        if calls is not stub:
            # the daemon never sees our calls: a stream held open to it says we are alive, and
            # its end (this process gone) has the daemon stop a worker stuck in a kernel
            self._presence = stub.Presence(
                guest_pb2.PresenceRequest(
                    session_id=self.opened.session_id, resume_token=self.opened.resume_token
                )
            )
        return calls.Calls(
            self._request_iter(requests),
            metadata=(
                ("crane-session", self.opened.session_id),
                ("crane-token-bin", self.opened.resume_token),
            ),
        )

    def _end_presence(self) -> None:
        """Cancel and drop the presence stream (as :meth:`close` does the call stream: a call
        collected at interpreter exit could hang the process)."""
        presence, self._presence = self._presence, None
        if presence is not None:
            with contextlib.suppress(Exception):
                presence.cancel()

    # ---- resume -------------------------------------------------------------------------------
    def _resume(self, cause: TransportError) -> TransportError | None:
        """Find the session again and carry on with a new stream; an error if it is gone."""
        sid = self.opened.session_id
        if self._resume_deadline is None:
            self._resume_deadline = time.monotonic() + self.resume_timeout
            self._vm_deadline = time.monotonic() + self.vm_grace
            log.info("session %s: call stream broke (%s); resuming", sid, cause.message)
        if self._direct_channel is not None:
            # its worker is gone or refused us: a later session worker at the same socket path
            # must get a fresh connection, not this channel's reconnection back-off
            self._direct_channel.close()
            self._direct_channel = None
        # A daemon holds a Resume while its session switches over, so the redirect comes at
        # once; what is left to wait for here is a parked session's restore: retry soon, then
        # back off.
        delay = RESUME_FIRST_RETRY_S
        parked_seen = False
        while not self._closed:
            waiting = False
            gone: list[str] = []  # why daemons that knew the session no longer do
            addrs = list(dict.fromkeys([self.address, *self.addresses]))  # where it broke first
            i = 0
            while i < len(addrs):
                addr = addrs[i]
                i += 1
                # a VM's one address may reach another daemon now (the VM moved): it is
                # worth asking again until the grace ends, whatever it answered before
                vm_wait = is_vm(addr) and time.monotonic() < self._vm_deadline
                # the daemon the stream broke on is connected already: ask it first, on that
                # channel (a migrated session's redirect comes from it); a vm:// address gets
                # a new connection, which reaches whichever daemon the VM's forward reaches now
                reuse = addr == self.address and not is_vm(addr)
                ch = self._channel if reuse else open_channel(addr, self._tls)
                stub = guest_pb2_grpc.GuestStub(ch)
                try:
                    opened = stub.Resume(
                        guest_pb2.ResumeRequest(
                            session_id=sid,
                            resume_token=self.opened.resume_token,
                            fingerprint=fingerprint(),
                        ),
                        timeout=10,
                    )
                except grpc.RpcError as e:
                    if not reuse:
                        ch.close()
                    if e.code() in (grpc.StatusCode.NOT_FOUND,):
                        # migrated away: that daemon says where to (tried next, no alternates)
                        to = dict(e.trailing_metadata() or ()).get("crane-moved-to")
                        if vm_wait and (to or e.details().startswith("no session ")):
                            # a VM's guest reaches no other address: its session moved with
                            # (or ahead of) the VM, whose forward will reach it here
                            waiting = True
                            continue
                        if to and to not in addrs[i:]:
                            addrs.insert(i, to)
                            if to not in self.addresses:
                                self.addresses.append(to)
                        elif not to and e.details():
                            # why it left: its parked entry timed out, its worker died
                            gone.append(e.details())
                        continue
                    if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        # parked there (retry), or that daemon is down: only worth waiting for
                        # if some daemon said the session is parked
                        md = dict(e.trailing_metadata() or ())
                        parked_seen = parked_seen or md.get("crane-parked") == "1"
                        waiting = waiting or parked_seen or vm_wait
                        continue
                    return _transport_error(e, f"session {sid} cannot resume on {addr}")
                self._switch(addr, ch, stub, opened)
                return None
            if not waiting:
                return _gone(cause, sid, gone)
            if time.monotonic() > self._resume_deadline:
                return TransportError(
                    cause.result, f"{cause.message}; session {sid} was not restored in time"
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        return cause

    def _switch(
        self,
        addr: str,
        ch: grpc.Channel,
        stub: guest_pb2_grpc.GuestStub,
        opened: guest_pb2.OpenSessionReply,
    ) -> None:
        """New stream on ``addr``; resend every kept batch with calls after ``done_seq``."""
        old_direct, old_channel = self._direct_channel, self._channel
        self._direct_channel = None
        # ended only once the new stream's presence is open: a daemon that saw none open for a
        # moment would take this guest for gone and stop a worker it is still using
        old_presence, self._presence = self._presence, None
        self.path = "relay"
        self.address, self._channel = addr, ch
        self.opened = opened
        with self._inflight_cv:
            self._inflight = 0  # frees a sender blocked on the dead stream's backpressure
            self._inflight_cv.notify_all()
        with self._lock:
            old, self._requests = self._requests, queue.SimpleQueue()
            for last, _, batch in list(self._unacked):
                if last > self.done_seq:
                    self._requests.put((batch, 0))
            old.put(None)
            self._responses = self._open_calls(stub, self._requests)
        with self._inflight_cv:
            self._inflight = 0  # bulk batches of the old stream will never be sent there
            self._inflight_cv.notify_all()
        self.resumes += 1
        if old_presence is not None:
            with contextlib.suppress(Exception):
                old_presence.cancel()
        for c in (old_direct, old_channel):
            if c is not None and c is not ch:
                c.close()
        log.info("session %s resumed on %s (%s)", opened.session_id, addr, self.path)

    # ---- sending ------------------------------------------------------------------------------
    def _request_iter(self, requests: queue.SimpleQueue) -> Iterator[guest_pb2.CallBatch]:
        for batch, size in iter(requests.get, None):
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
            want, self._ack_wanted = self._ack_wanted, 0
        if want:
            self._wait_until(lambda: self.done_seq >= want)
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
        last = batch.calls[-1].seq
        self._unacked.append((last, size, batch))
        self._unacked_bytes += size
        if self._unacked_bytes > MAX_UNACKED_BYTES and not batch.flags & EXPECTS_REPLY:
            batch.flags |= EXPECTS_REPLY  # the worker answers it with its done_seq
            self._ack_wanted = last
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
        self._wait_until(lambda: seq in self._replies)
        with self._cv:
            return self._replies.pop(seq)

    def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Read replies (one thread at a time) until ``ready()`` holds; resume on a break."""
        while True:
            with self._cv:
                if ready():
                    return
                if self._broken is not None:
                    raise self._broken
                if self._reading:
                    self._cv.wait()
                    continue
                self._reading = True
            batch = None
            broken = None
            try:
                responses = self._responses
                if responses is None:  # closed: nothing more will arrive
                    raise StopIteration
                batch = next(responses)
                self._resume_deadline = None
            except grpc.RpcError as e:
                broken = _transport_error(e, "the session's call stream broke")
                if e.code() in _RESUMABLE and not self._closed:
                    broken = self._resume(broken)
            except StopIteration:
                # not closed by us: the session ended there; its daemon says why on Resume
                broken = TransportError(
                    CUresult.CUDA_ERROR_NO_DEVICE, "the daemon ended the session's call stream"
                )
                if not self._closed:
                    broken = self._resume(broken)
            with self._cv:
                self._reading = False
                if broken is not None:
                    self._broken = broken
                elif batch is not None:
                    self._absorb(batch)
                self._cv.notify_all()

    def _absorb(self, batch: guest_pb2.ReplyBatch) -> None:
        if batch.stdout:
            os.write(1, batch.stdout)
        before = self.done_seq
        self.done_seq = max(self.done_seq, batch.done_seq)
        for r in batch.replies:
            reply = CallReply(r.result, r.out, r.data, r.detail)
            if r.seq in self._expect:
                self._expect.discard(r.seq)
                self._replies[r.seq] = reply
            elif r.seq > before or r.seq == 0:
                self._async_errors.append((r.seq, reply))
            # else: a repeated answer after a resume, already delivered
        if self.done_seq > before:
            with self._lock:
                while self._unacked and self._unacked[0][0] <= self.done_seq:
                    self._unacked_bytes -= self._unacked.popleft()[1]

    def take_async_error(self, before: int) -> CallReply | None:
        """The earliest failed asynchronous call with a sequence number below ``before``."""
        with self._cv:
            for i, (seq, reply) in enumerate(self._async_errors):
                if seq < before:
                    del self._async_errors[i]
                    return reply
        return None

    # ---- lifecycle ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._timer_wake.set()
        self.flush()
        self._requests.put(None)
        # End the call while gRPC's threads are alive and drop it: a call object collected at
        # interpreter exit cancels itself under a lock that a finished daemon thread may hold,
        # which hung guest processes at exit (1 run in ~15).
        responses, self._responses = self._responses, None
        with contextlib.suppress(Exception):
            responses.cancel()
        del responses
        self._end_presence()
        if self._direct_channel is not None:
            self._direct_channel.close()
        self._channel.close()


def _gone(cause: TransportError, sid: str, why: list[str]) -> TransportError:
    """The session no longer exists anywhere: the device is lost to this guest, whichever way
    it found out (its direct socket closed, its relay stream ended, or a Resume told it).
    ``CUDA_ERROR_NO_DEVICE`` (cudart: cudaErrorNoDevice) on every path, with the daemon's
    reason when one gave it (a dead worker's is "session S ended: its worker process exited")."""
    # a daemon that never knew the session says "no session ... on this daemon": no reason
    known = [w for w in why if not w.startswith("no session ")]
    if known:
        return TransportError(CUresult.CUDA_ERROR_NO_DEVICE, "; ".join(dict.fromkeys(known)))
    return TransportError(
        CUresult.CUDA_ERROR_NO_DEVICE, f"{cause.message}; no daemon knows session {sid} any more"
    )


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
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # the daemon, or the caller's tenant, is at its limit of sessions: the device is busy,
        # as a GPU in exclusive-process mode answers a second process
        result = CUresult.CUDA_ERROR_DEVICE_UNAVAILABLE
    return TransportError(result, f"{what}: {code.name if code else '?'}: {details}")


def _describe_self() -> str:
    import socket
    import sys

    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{prog} pid {os.getpid()} on {socket.gethostname()}"
