"""The guest's connection to craned: session open, call batching, replies.

Batching (architecture invariant 3, lesson 7 of peers-and-lessons: one gRPC message per call
would cap a guest at ~20k calls/s): calls are appended to the current batch and the batch is
sent when

* a synchronizing call is appended (the caller is about to wait anyway),
* it holds ``MAX_BATCH_CALLS`` calls or ``MAX_CHUNK`` bytes of payload, or
* ``FLUSH_AFTER_S`` has passed since its first call (a timer thread), so work the application
  enqueued without synchronizing still starts promptly.

Calls of the ops :mod:`crane.wire.packed` packs (asynchronous, fixed-size arguments: memsets,
event records, stream waits, ...) go into the batch as 64-byte records instead of ``Call``
messages, which the worker runs a run at a time. So do synchronizing calls with fixed-size
arguments (:meth:`Transport.call`: stream and event synchronizes and queries, ...): with no
plain call waiting in the batch, the batch is written by hand as records only, and the worker
answers such a call with a short answer (``ReplyBatch.answer``) when that is all there is to
say, so the commonest synchronizing call builds and parses no protobuf message on either side.
Both streams carry serialized messages (the gRPC one without serializers).

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
from functools import partial
from operator import contains

import grpc

from crane.api.errors import TransportError
from crane.api.generated.cuda_enums import CUresult
from crane.api.ops import Op
from crane.guest.callq import FULL, SERVED, new_queue
from crane.guest.device_stdout import write_device_output
from crane.guest.ring_bulk import GuestBulk, unstage
from crane.guest.ring_calls import RESUMABLE, RingCalls, connect_ring
from crane.v1 import guest_pb2, guest_pb2_grpc
from crane.wire.address import CHANNEL_OPTIONS, default_address, is_vm, to_grpc_target
from crane.wire.batch_flags import EXPECTS_REPLY, SHORT_ANSWER
from crane.wire.channel import TlsFiles, open_channel
from crane.wire.fingerprint import fingerprint
from crane.wire.packed import RECORD, SYNC_OPS, encode_batch, record_struct, split
from crane.wire.replies import decode_answer
from crane.wire.ring import RingClosed, RingRefused
from crane.wire.status import MAX_CHUNK

__all__ = ["CallReply", "Transport", "TransportError", "worker_target"]

log = logging.getLogger("crane.guest")

MAX_BATCH_CALLS = 1024
_ZEROS = (0,) * 5  # the queue's put takes five arguments (crane.guest.callq)
#: The flags of a batch the guest waits on: answer it, in the short form where it can be.
_WAITED = EXPECTS_REPLY | SHORT_ANSWER
#: A synchronizing op's whole record, by op id (:meth:`Transport.call`).
_RECORDS = {i: record_struct(o).pack for i, o in SYNC_OPS.items()}
#: The gRPC method of the call stream, carried as bytes both ways.
_CALLS = "/crane.v1.Guest/Calls"
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
#: How long a vm:// guest keeps connecting to its forward before opening a session fails.
VM_CONNECT_S = 15.0
#: How long a closing guest waits for room in a full call ring for its last batch.
CLOSE_FLUSH_S = 2.0
#: How many times in a row a guest resumes whose new stream breaks before any reply.
MAX_BARE_RESUMES = 16
#: gRPC codes after which the session may still exist elsewhere (parked, moved): try Resume.
#: NOT_FOUND too: a stream opened just after a Resume answered finds no session when the
#: daemon reaped it in between (its worker died a moment before); Resume then says why.
_RESUMABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.NOT_FOUND,
    }
)


@dataclass(slots=True)
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
        if is_vm(self.address):
            # a VM's forward (QEMU's guestfwd starts a socat per connection) can drop the first
            # connection while the host is loaded: keep connecting for a while; past that (a
            # domain the daemon does not serve closes every connection) the call below fails
            # at once with gRPC's own status instead of waiting out its deadline
            with contextlib.suppress(grpc.FutureTimeoutError):
                grpc.channel_ready_future(self._channel).result(timeout=VM_CONNECT_S)
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
        self._lock = threading.Lock()  # guards the current batch
        #: the batch's packed calls, and every call's sequence number (crane.guest.callq)
        self.queue = new_queue(MAX_BATCH_CALLS)
        self._last_plain = 0  # the seq of the batch's last plain call (0: none)
        self._new_batch()
        self._batch_started = 0.0
        self._expect: set[int] = set()
        #: batches to send (messages, or bytes written by hand) and their sizes
        self._requests: queue.SimpleQueue[tuple[guest_pb2.CallBatch | bytes, int] | None] = (
            queue.SimpleQueue()
        )
        self._inflight = 0
        self._inflight_cv = threading.Condition()
        #: guards replies; taken as ``with self._cv_lock`` (a Condition's own ``with`` costs
        #: two Python calls)
        self._cv_lock = threading.RLock()
        self._cv = threading.Condition(self._cv_lock)
        #: threads waiting on ``_cv`` for another's reading (guarded by it): a reader notifies
        #: only when there are some (Condition.notify_all costs a synchronizing call ~1 us)
        self._waiters = 0
        self._replies: dict[int, CallReply] = {}
        self._async_errors: list[tuple[int, CallReply]] = []
        self._reading = False
        self._broken: TransportError | None = None
        self.done_seq = 0
        #: sent batches kept for a resend: (last seq, size, the batch or its bytes)
        self._unacked: collections.deque[tuple[int, int, guest_pb2.CallBatch | bytes]] = (
            collections.deque()
        )
        self._unacked_bytes = 0
        self._ack_wanted = 0
        self._resume_deadline: float | None = None
        self._bare_resumes = 0  # resumes in a row whose new stream broke before any reply
        self.resumes = 0
        self._direct_channel: grpc.Channel | None = None
        #: the call stream when it goes through the worker's shared-memory ring
        self._ring: RingCalls | None = None
        self._presence: grpc.Call | None = None
        self.path = "relay"
        #: the bytes of staged host-to-device calls the worker may not have run, each when
        #: asked (crane.guest.ring_bulk): what a resend carries inline
        self.staged_sources: dict[int, Callable[[], bytes]] = {}
        self._responses = self._open_calls(stub, self._requests)
        self._closed = False
        self._timer = threading.Thread(target=self._timer_loop, name="crane-flush", daemon=True)
        self._timer_wake = threading.Event()
        self._timer.start()

    def _worker_channel(self, direct: bool | None) -> grpc.Channel | None:
        """The channel to carry calls on when it is the worker's own endpoint and reachable
        (None: the daemon's). A unix daemon's guest may be offered the worker's socket, a tcp
        daemon's the worker's TCP port (``tcp://*:PORT``: on the host it reached the daemon
        by, with the same TLS files); a vm:// guest reaches nothing but its one forward."""
        target = worker_target(self.address, self.opened.direct_address)
        if self._wants_worker(direct) and target:
            # a subchannel of its own: one shared with an earlier channel to the same socket
            # path (the session's previous worker here) would inherit its reconnection back-off
            local = [("grpc.use_local_subchannel_pool", 1)]
            if target.startswith("unix:"):
                ch = grpc.insecure_channel(target, options=[*CHANNEL_OPTIONS, *local])
            else:
                ch = open_channel("tcp://" + target, self._tls, options=local)
            try:
                grpc.channel_ready_future(ch).result(timeout=2)
            except grpc.FutureTimeoutError:
                ch.close()
                log.info("worker endpoint %s unreachable; calls go through the daemon", target)
            else:
                self._direct_channel = ch
                self.path = "direct"
                return ch
        return None

    def _wants_worker(self, direct: bool | None) -> bool:
        """Carry calls to the session's worker itself (not through the daemon)?"""
        if direct is None:
            return os.environ.get("CRANE_DIRECT", "1") != "0"
        return direct

    def _ring_calls(self) -> RingCalls | None:
        """The worker's call ring when it is offered and usable here, else None (one log line
        says why; the worker's gRPC socket or the daemon's relay carries the calls).
        ``CRANE_RING=require`` makes a refusal an error instead (tests, benchmarks)."""
        setting = os.environ.get("CRANE_RING", "1")
        target = self.opened.direct_address
        if setting == "0":
            log.info("call ring not used: CRANE_RING=0")
            return None
        why = ""
        # only a worker's unix socket has a ring beside it (a tcp endpoint is another host's)
        reachable = worker_target(self.address, target).startswith("unix:")
        if not reachable or not self._wants_worker(self._direct_pref):
            why = "the session's worker is not reachable on this host"
        else:
            try:
                return connect_ring(target, self.opened.session_id, self.opened.resume_token)
            except RingRefused as e:
                why = str(e)
        if setting == "require":
            raise TransportError(
                CUresult.CUDA_ERROR_NOT_SUPPORTED, f"CRANE_RING=require: no call ring ({why})"
            )
        if target:
            log.info("call ring not used (%s)", why)
        return None

    def _open_calls(
        self, stub: guest_pb2_grpc.GuestStub, requests: queue.SimpleQueue
    ) -> Iterator[bytes]:
        """The call stream (``stub``: the daemon's): the worker's ring, the worker's own
        endpoint or the daemon's relay; serialized ``ReplyBatch`` messages come out of it."""
        ring = self._ring_calls()
        worker = None if ring is not None else self._worker_channel(self._direct_pref)
        if ring is not None or worker is not None:
            # the daemon never sees our calls: a stream held open to it says we are alive, and
            # its end (this process gone) has the daemon stop a worker stuck in a kernel
            self._presence = stub.Presence(
                guest_pb2.PresenceRequest(
                    session_id=self.opened.session_id, resume_token=self.opened.resume_token
                )
            )
        if ring is not None:
            self._ring, self.path = ring, "ring"
            # batches kept for a resend (a resume) go first, in order
            while True:
                try:
                    item = requests.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    break
                ring.send(item[0])
            return ring
        calls = (worker or self._channel).stream_stream(_CALLS)  # bytes both ways
        return calls(
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
            self._bare_resumes = 0
        else:
            # resumed, and the new stream broke too before a reply came: don't go round forever
            self._bare_resumes += 1
            if self._bare_resumes > MAX_BARE_RESUMES:
                return TransportError(
                    cause.result, f"{cause.message}; session {sid} did not stay resumed"
                )
        if self._direct_channel is not None:
            # its worker is gone or refused us: a later session worker at the same socket path
            # must get a fresh connection, not this channel's reconnection back-off
            self._direct_channel.close()
            self._direct_channel = None
        self._drop_ring()
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
        self._drop_ring()
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
                if last > self.done_seq:  # staged copies go as plain ones (crane.guest.ring_bulk)
                    if type(batch) is bytes:  # written by hand (records only): no staged calls
                        self._requests.put((batch, 0))
                        continue
                    for b in unstage(batch, self.staged_sources, self.done_seq):  # type: ignore[arg-type]
                        self._requests.put((b, 0))
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
    def _request_iter(self, requests: queue.SimpleQueue) -> Iterator[bytes]:
        for batch, size in iter(requests.get, None):
            if size >= BULK_BATCH:
                with self._inflight_cv:
                    self._inflight -= size
                    self._inflight_cv.notify_all()
            yield batch if type(batch) is bytes else batch.SerializeToString()

    def enqueue(
        self, op: Op, args: bytes, data: bytes = b"", *, expect: bool, send: bool = True
    ) -> int:
        """Append a call; returns its sequence number (0 for a queued record: nobody waits
        on an asynchronous call's own). Sends now if the batch is due.

        ``expect``: the caller will wait for this call's reply; the batch is then sent at once,
        unless ``send`` is False (the caller queues more calls and flushes itself). A packed
        op's asynchronous call goes into :attr:`queue` as a record when the queue serves the
        op (crane.guest.callq), else the batch gets a ``Call``.
        """
        if self._broken is not None:
            raise self._broken
        if not expect and op.id in SERVED:
            values = op.unpack(args)
            n = self.queue.put(op.id, *values, *_ZEROS[len(values) :])
            if n == FULL:
                self.flush()
                n = self.queue.put(op.id, *values, *_ZEROS[len(values) :])
            if n > 0:
                if n == 1 or n >= MAX_BATCH_CALLS:
                    self.queued(n)
                return 0  # (a packed call's number is the queue's business: none waits on it)
        with self._lock:
            self._last_plain = seq = self.queue.next_seq()
            call = self._batch_calls.add()  # (fields set one by one: faster than keywords)
            call.seq = seq
            call.op = op.id
            call.args = args
            if data:
                call.data = data
            if expect:
                self._expect.add(seq)
                self._batch.flags |= _WAITED
            self._batch_bytes += len(data) + len(args) + 16
            self._batch_n = n = self._batch_n + 1
            due = (expect and send) or n >= MAX_BATCH_CALLS or self._batch_bytes >= MAX_CHUNK
            want = self._appended_locked(n, due)
        if want:
            self._wait_until(lambda: self.done_seq >= want)
        return seq

    def _appended_locked(self, n: int, due: bool) -> int:
        """After a call was appended (the batch now holds ``n`` of its kind): send the batch if
        ``due``, arm the flush timer for a batch's first call that stays (only then, so
        synchronizing calls never wake the timer thread); the seq the caller must then wait
        to see run (too much unacknowledged: backpressure), else 0."""
        if due:
            self._flush_locked()
        elif n == 1:
            self._batch_started = time.monotonic()
            self._timer_wake.set()
        want = self._ack_wanted
        if want:
            self._ack_wanted = 0
        return want

    def queued(self, n: int) -> None:
        """What follows a record's ``queue.put`` that answered ``n`` > 0 when ``n`` is 1 (arm
        the flush timer) or the queue's capacity (send): the hot paths call ``queue.put``
        themselves and come here only then, or :meth:`enqueue` when it refused."""
        with self._lock:
            want = self._appended_locked(n, n >= MAX_BATCH_CALLS)
        if want:
            self._wait_until(lambda: self.done_seq >= want)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    # ---- bulk copies (crane.guest.ring_bulk) ----------------------------------------------------
    @property
    def bulk(self) -> GuestBulk | None:
        """The call ring's bulk area, when the session is attached through one."""
        ring = self._ring
        return ring.bulk if ring is not None else None

    def enqueue_run(self, op: Op, args: list[bytes], *, ack: bool) -> list[int]:
        """Append calls of ``op`` back to back and send them now; their sequence numbers.
        A synchronous op's calls are each waited for (:meth:`wait`); ``ack``: the worker
        answers the batch with its ``done_seq`` (:meth:`wait_done`)."""
        if self._broken is not None:
            raise self._broken
        with self._lock:
            seqs = []
            for a in args:
                self._last_plain = seq = self.queue.next_seq()
                self._batch_calls.add(seq=seq, op=op.id, args=a)
                self._batch_n += 1
                seqs.append(seq)
                if op.sync:
                    self._expect.add(seq)
                self._batch_bytes += len(a) + 16
            if op.sync or ack:
                self._batch.flags |= _WAITED
            self._flush_locked()
        return seqs

    def wait_done(self, seq: int) -> None:
        """Block until the worker ran every call up to ``seq`` (asynchronous ones included;
        a batch sent with ``ack`` brings the answer)."""
        self._wait_until(lambda: self.done_seq >= seq)

    def _new_batch(self) -> None:
        """Start an empty batch (the caller holds the lock, or is the constructor)."""
        self._batch = guest_pb2.CallBatch()
        self._batch_calls = self._batch.calls  # (looked up once per batch, not per call)
        self._batch_n = 0  # plain calls in it (counted: len() of a repeated field costs a call)
        self._batch_bytes = 0

    def _flush_locked(self) -> None:
        # the queue's records so far; a record another thread puts meanwhile has a later seq
        # than every plain call here (those are numbered under this lock) and waits for the
        # next batch
        recs, last_rec = self.queue.take()
        if not self._batch_n and not recs:
            return
        batch = self._batch
        size = self._batch_bytes + len(recs) // RECORD * (RECORD + 16)
        if recs:
            batch.packed = recs
        last = max(self._last_plain if self._batch_n else 0, last_rec)  # its last call
        self._new_batch()
        self._send_locked(batch, last, size)

    def _send_locked(self, batch: guest_pb2.CallBatch | bytes, last: int, size: int) -> None:
        """Keep ``batch`` (up to seq ``last``, ``size`` bytes about) for a resend and send it.
        Bytes are a batch written by hand, one the guest waits on (the caller holds the
        lock)."""
        self._unacked.append((last, size, batch))
        self._unacked_bytes += size
        if (
            self._unacked_bytes > MAX_UNACKED_BYTES
            and type(batch) is not bytes
            and not batch.flags & EXPECTS_REPLY  # type: ignore[union-attr]
        ):
            batch.flags |= EXPECTS_REPLY  # type: ignore[union-attr]  # answered with done_seq
            self._ack_wanted = last  # (a record's put answers 1 next: queued() waits then)
        if self._ring is not None:
            # straight into shared memory: the ring's own space is the backpressure
            self._ring.send(batch)
            return
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

    def call(self, op: Op, *values: int) -> tuple[int, CallReply]:
        """Make a synchronizing call of an op that travels as a record (``crane.wire.packed.
        SYNC_OPS``: every argument one integer) and wait for its answer: ``(seq, reply)``.

        The record goes after the records queued so far; with no plain call waiting in the
        batch, the batch is the records only, written by hand (no message built), and the
        worker's answer comes short when it can (``SHORT_ANSWER``): the path of every idle
        ``cuStreamSynchronize``. Ordering, resends and errors are :meth:`enqueue`'s."""
        if self._broken is not None:
            raise self._broken
        pack = _RECORDS[op.id]
        with self._lock:
            # numbered first: every record numbered before it is in the queue now (a put
            # numbers and appends at once), so it goes with this batch, ahead of the call
            seq = self.queue.next_seq()
            recs, last_rec = self.queue.take()
            rec = pack(seq, op.id, *values)
            if last_rec > seq:  # records another thread numbered since: keep seq order
                head, tail = split(recs, [seq])
                recs = head + rec + tail
            else:
                recs += rec
            self._expect.add(seq)
            size = len(recs) // RECORD * (RECORD + 16)
            last = max(seq, last_rec)
            if self._batch_n:  # plain calls wait in the batch: the records join them
                batch = self._batch
                batch.packed = recs
                batch.flags |= _WAITED
                last = max(last, self._last_plain)
                size += self._batch_bytes
                self._new_batch()
                self._send_locked(batch, last, size)
            else:
                self._send_locked(encode_batch(_WAITED, recs), last, size)
        replies = self._replies
        self._wait_until(partial(contains, replies, seq))  # (no Python frame per look)
        return seq, replies.pop(seq)  # only this caller takes ``seq`` (a dict's pop is atomic)

    def _timer_loop(self) -> None:
        while not self._closed:
            self._timer_wake.wait()
            self._timer_wake.clear()
            while not self._closed:
                with self._lock:
                    if not self._batch_n and not self.queue.count():
                        break
                    due = self._batch_started + FLUSH_AFTER_S - time.monotonic()
                    if due <= 0:
                        self._flush_locked()
                        break
                time.sleep(max(due, 0.0002))

    # ---- receiving ----------------------------------------------------------------------------
    def wait(self, seq: int) -> CallReply:
        """Block until the reply for ``seq`` arrives."""
        replies = self._replies
        self._wait_until(lambda: seq in replies)
        return replies.pop(seq)  # only this caller takes ``seq`` (a dict's pop is atomic)

    def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Read replies (one thread at a time) until ``ready()`` holds; resume on a break."""
        while True:
            with self._cv_lock:
                if ready():
                    return
                if self._broken is not None:
                    raise self._broken
                if self._reading:
                    self._waiters += 1
                    try:
                        self._cv.wait()
                    finally:
                        self._waiters -= 1
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
            except RingClosed as e:
                broken = TransportError(
                    CUresult.CUDA_ERROR_NO_DEVICE
                    if e.code in RESUMABLE
                    else CUresult.CUDA_ERROR_UNKNOWN,
                    f"the session's call ring ended: {e}",
                )
                if e.code in RESUMABLE and not self._closed:
                    broken = self._resume(broken)
            except StopIteration:
                # not closed by us: the session ended there; its daemon says why on Resume
                broken = TransportError(
                    CUresult.CUDA_ERROR_NO_DEVICE, "the daemon ended the session's call stream"
                )
                if not self._closed:
                    broken = self._resume(broken)
            with self._cv_lock:
                self._reading = False
                if broken is not None:
                    self._broken = broken
                    self.queue.attend(True)  # a put goes enqueue's way, which raises it
                elif batch is not None:
                    self._absorb(batch)
                if self._waiters:
                    self._cv.notify_all()
                if broken is None and ready():  # (saves taking the lock once more)
                    return

    def _absorb(self, raw: bytes) -> None:
        """Take in one serialized ``ReplyBatch`` (the caller holds ``_cv``): a short answer
        (crane.wire.replies) without parsing a message."""
        before = self.done_seq
        short = decode_answer(raw)
        if short is not None:
            seq, done, result, out = short
            self._file(seq, CallReply(result, out, b"", ""), before)
        else:
            batch = guest_pb2.ReplyBatch.FromString(raw)
            stdout = batch.stdout
            if stdout:
                write_device_output(stdout)
            done = batch.done_seq  # (each field read builds an object: read once)
            for r in batch.replies:
                self._file(r.seq, CallReply(r.result, r.out, r.data, r.detail), before)
        if done > before:
            self.done_seq = done
            unacked = self._unacked
            with self._lock:
                while unacked and unacked[0][0] <= done:
                    self._unacked_bytes -= unacked.popleft()[1]

    def _file(self, seq: int, reply: CallReply, before: int) -> None:
        """File the answer to call ``seq`` (``before``: ``done_seq`` before this message):
        for its waiter, as an asynchronous error, or dropped (a repeated answer after a
        resume, already delivered)."""
        if seq in self._expect:
            self._expect.discard(seq)
            self._replies[seq] = reply
        elif seq > before or seq == 0:
            self._async_errors.append((seq, reply))

    def take_async_error(self, before: int) -> CallReply | None:
        """The earliest failed asynchronous call with a sequence number below ``before``."""
        if not self._async_errors:
            # (no lock: the reply the caller waited for was absorbed under it, after or with
            # every error before it, so an error it must see is there already)
            return None
        with self._cv_lock:
            for i, (seq, reply) in enumerate(self._async_errors):
                if seq < before:
                    del self._async_errors[i]
                    return reply
        return None

    # ---- lifecycle ----------------------------------------------------------------------------
    def _drop_ring(self) -> None:
        """Detach from the worker's ring (it is gone, or the session moves on)."""
        with self._lock:  # no batch is being written into it meanwhile (one producer)
            ring, self._ring = self._ring, None
            if ring is not None:
                ring.cancel()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.queue.attend(True)  # (C appending records itself goes enqueue's way from now on)
        self._timer_wake.set()
        ring = self._ring
        if ring is not None:  # what does not fit in the ring soon is not worth a hang at exit
            ring.deadline = time.monotonic() + CLOSE_FLUSH_S
        self.flush()
        self._requests.put(None)
        self._drop_ring()
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


def worker_target(daemon: str, offered: str) -> str:
    """The gRPC target of the worker endpoint ``offered`` as a guest of ``daemon`` reaches it
    ("": none it can reach): a socket only from a unix daemon's guest, a ``tcp://*:PORT`` only
    from a tcp daemon's, on that daemon's host."""
    if not offered:
        return ""
    ours = to_grpc_target(daemon) if not is_vm(daemon) else ""
    if offered.startswith("unix://"):
        return to_grpc_target(offered) if ours.startswith("unix:") else ""
    if offered.startswith("tcp://*:") and ours and not ours.startswith("unix:"):
        return ours.rsplit(":", 1)[0] + ":" + offered.rsplit(":", 1)[1]
    return ""


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
