"""The worker's wire codec: serialized call batches in, serialized reply batches out.

Error rules of the data path (every call is answered by these, never by a crash):

* asynchronous calls that fail get a reply with their sequence number (the guest surfaces it at
  its next synchronizing call); synchronous calls always get a reply;
* a call refused after a sticky fault is answered with the fault, without a log line (the
  fault was logged when it happened);
* malformed input (undecodable batch, unknown op, bad argument bytes) is answered with
  CUDA_ERROR_INVALID_VALUE / CUDA_ERROR_NOT_SUPPORTED and a log line;
* a call that exhausts the worker's host memory (MemoryError) is answered with
  CUDA_ERROR_OUT_OF_MEMORY and a log line, and the session keeps serving;
* anything else a backend raises is a bug: logged with its traceback, answered with
  CUDA_ERROR_UNKNOWN, and the session keeps serving.

Answers go as ``ReplyBatch`` messages; a batch flagged ``SHORT_ANSWER`` whose whole answer is
one call's result code (no detail) and fixed-size results, with nothing else to say, gets the
short form instead (``ReplyBatch.answer``, :mod:`crane.wire.replies`): the commonest
synchronizing call then costs the worker no protobuf message either way (its batch comes as
records only, :func:`crane.wire.packed.records_only`).

The :class:`CallLog` is how far the session has executed: the guest's last sequence number and
the answers to its last batch that expected one, which a guest that reconnects (after a park or
a migration) may ask for again; the state record carries it.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.engine.dispatch import Bound, Dispatcher, Refused
from crane.engine.runs import FEW, PackedCalls, record_calls
from crane.engine.staged import BulkPort, run_staged
from crane.v1 import guest_pb2
from crane.wire.batch_flags import EXPECTS_REPLY, SHORT_ANSWER, peek_flags
from crane.wire.packed import ARGS_AT, RECORD, records_only
from crane.wire.replies import ANSWER_OUT_MAX, encode_answer, encode_data_reply
from crane.wire.status import MAX_CHUNK

__all__ = ["BatchCodec", "CallLog"]

log = logging.getLogger("crane.worker")

_now = time.monotonic_ns

#: Reads at least this large are sent as their own hand-encoded reply (one copy, not three).
_BULK = 64 << 10
#: Packed calls of one op in a row that go to its run handler (fewer run one by one: a run's
#: NumPy set-up costs about what a few single calls do).
RUN_MIN = 8


@dataclass
class CallLog:
    """How far the session's call stream has executed."""

    #: Calls executed.
    calls: int = 0
    #: Sequence number of the last call executed.
    done_seq: int = 0
    #: The messages answering the last batch that expected a reply: a guest that reconnects
    #: resends that batch if the answer never reached it (see :meth:`BatchCodec.run_batch`).
    last_replies: list[bytes] = field(default_factory=list)


class BatchCodec:
    """Decodes one session's batches, runs each call, encodes the answers."""

    def __init__(
        self, dispatcher: Dispatcher, session_id: str, take_stdout: Callable[[], bytes]
    ) -> None:
        self.dispatcher = dispatcher
        self.session_id = session_id
        self.take_stdout = take_stdout
        self.log = CallLog()
        #: The call ring's bulk area while a guest attached through it (staged copies' bytes).
        self.bulk: BulkPort | None = None

    def run_batch(self, raw: bytes) -> list[bytes]:
        """Execute one serialized CallBatch; return the serialized ReplyBatch messages to send.

        A batch flagged EXPECTS_REPLY always gets at least one message (the sender waits for
        it); others get one only if a call failed or a kernel printed. Its plain calls and its
        packed ones (crane.wire.packed) run in seq order.
        """
        cl = self.log
        bound = self.dispatcher.bound
        try:
            recs = records_only(raw)  # a batch of records only needs no message
            if recs is None:
                batch = guest_pb2.CallBatch.FromString(raw)
                calls: Any = batch.calls
                recs = batch.packed
            elif len(recs) <= FEW * RECORD:
                # a few records (a synchronizing call and what was queued before it): each
                # run as a plain call is (no NumPy set-up), of the ops that travel so only
                calls, recs = record_calls(recs), b""
                bound = self.dispatcher.record_bound
            else:
                calls = ()
            packed = PackedCalls(recs) if recs else None
        except (DecodeError, ValueError) as e:
            log.warning(
                "session %s: malformed call batch (%d bytes): %s", self.session_id, len(raw), e
            )
            replies = guest_pb2.ReplyBatch()
            replies.replies.add(
                seq=0, result=CUresult.CUDA_ERROR_INVALID_VALUE, detail=f"malformed call batch: {e}"
            )
            replies.done_seq = cl.done_seq
            return [replies.SerializeToString()]
        flags = peek_flags(raw)
        expects = bool(flags & EXPECTS_REPLY)
        start = cl.done_seq  # calls at or below it ran before (a batch resent after a resume)
        if expects and _ran_before(calls, packed, start):
            # a resent batch (the guest reconnected): everything in it ran before, its answer
            # may never have arrived; answer again (the guest drops what it already has)
            replies = guest_pb2.ReplyBatch(done_seq=cl.done_seq)
            return [*cl.last_replies, replies.SerializeToString()]
        ans = _Answers(bool(flags & SHORT_ANSWER))
        device = self.dispatcher.device
        invoke = self.dispatcher.invoke
        t = _now()  # accounting: each call's time runs from the previous call's end
        for call in calls:
            seq = call.seq  # (each field read builds an object: read once)
            if packed is not None and packed.next_seq() < seq:  # packed calls come first
                t = self._run_packed(packed, seq, start, ans, t)
                if device.closed:
                    break
            if seq <= start:
                continue
            # one call, inline (no frame of its own: this loop is the worker's hot path)
            op = call.op
            b = bound.get(op)
            try:
                if b is None:
                    raise self._refusal(op)
                if b.staged:  # its bytes are in the bulk area (crane.engine.staged)
                    result = run_staged(invoke, b, call.args, self.bulk)
                else:
                    result = invoke(b, call.args, call.data)
                reply = None
                if b.replies:
                    self._answer(ans, b, seq, result)
            except Exception as e:
                reply = self._failed(seq, op, b, e)
            t = self._ran(seq, op, 1, b is not None, t)
            if reply is not None:
                self._add(ans, reply)
            if device.closed:
                break
        if packed is not None and not device.closed:
            self._run_packed(packed, 1 << 64, start, ans, t)
        out = ans.out
        if ans.short is not None:  # one plain answer, nothing else so far
            text = self.take_stdout()
            if text:
                out.append(self._finish(self._message(ans), text))
            else:
                seq, result, res = ans.short
                out.append(encode_answer(seq, result, res, cl.done_seq))
        elif (ans.replies is not None and len(ans.replies.replies)) or (not out and expects):
            out.append(self._finish(self._message(ans)))
        else:
            text = self.take_stdout()
            if text:
                out.append(
                    guest_pb2.ReplyBatch(done_seq=cl.done_seq, stdout=text).SerializeToString()
                )
        if expects:
            cl.last_replies = out
        return out

    def _run_packed(self, packed: PackedCalls, upto: int, start: int, ans: _Answers, t: int) -> int:
        """Run the packed calls before seq ``upto`` (skipping those at or below ``start``, which
        ran before): runs of :data:`RUN_MIN` or more through the op's run handler where the
        device has one; the rest, and each call a run handler stops before, one by one as
        plain calls run. ``t``: when the previous call ended (accounting); returns the last
        call's end."""
        d = self.dispatcher
        seqs = packed.seqs
        while (run := packed.until(upto)) is not None:
            op, i, end = run
            if seqs[i] <= start:
                i = bisect.bisect_right(seqs, start, i, end)
            b = d.record_bound.get(op)  # (None: refused one by one)
            fn = d.runs.get(op) if b is not None else None
            misses = 0  # runs in a row that stopped at their first call
            while i < end:
                if fn is not None and b is not None and end - i >= RUN_MIN and misses < 2:
                    try:
                        n = d.invoke_run(b, fn, packed.columns(b.op, i, end))
                    except Exception:  # a bug in a run handler: its calls run one by one
                        log.exception("session %s: a run of %s failed", self.session_id, b.op.name)
                        fn, n = None, 0
                    misses = 0 if n else misses + 1
                    if n:
                        i += n
                        t = self._ran(seqs[i - 1], op, n, True, t)
                        if d.device.closed:
                            return t
                        continue
                # one by one: the call a run stopped before, or all of them without a run
                last = end if fn is None or misses >= 2 else i + 1
                t = self._one_by_one(packed, op, b, i, last, ans, t)
                i = last
                if d.device.closed:
                    return t
        return t

    def _one_by_one(
        self, packed: PackedCalls, op: int, b: Bound | None, i: int, end: int, ans: _Answers, t: int
    ) -> int:
        """Packed calls ``[i, end)`` of ``op`` each as a plain call runs (``b`` None: refused:
        an unknown op, or one that does not travel packed; a synchronizing op's are answered);
        returns when the last ended."""
        invoke = self.dispatcher.invoke
        raw, seqs = packed.raw, packed.seqs
        size = b.op.args_size if b is not None else 0
        for k in range(i, end):
            seq = seqs[k]
            try:
                if b is None:
                    raise self._refusal(op)
                at = k * RECORD + ARGS_AT
                result = invoke(b, raw[at : at + size], b"")
                reply = None
                if b.replies:
                    self._answer(ans, b, seq, result)
            except Exception as e:
                reply = self._failed(seq, op, b, e)
            t = self._ran(seq, op, 1, b is not None, t)
            if reply is not None:
                self._add(ans, reply)
            if self.dispatcher.device.closed:
                break
        return t

    def _refusal(self, op: int) -> CudaError:
        """Why a call of ``op`` is not run: no such op, or one that came as a record but does
        not travel so."""
        known = self.dispatcher.bound.get(op)
        why = f"op {known.op.name} cannot travel packed" if known else f"unknown op {op}"
        return CudaError(CUresult.CUDA_ERROR_NOT_SUPPORTED, why)

    def _ran(self, seq: int, op: int, n: int, metered: bool, t: int) -> int:
        """Count ``n`` calls of ``op`` up to ``seq`` as run and, ``metered``, the time since
        ``t`` as theirs (several: each at their mean, in the histogram's bucket of the mean);
        returns the new ``t``."""
        cl = self.log
        cl.calls += n
        cl.done_seq = seq
        meter = self.dispatcher.meter
        if meter is None or not metered:
            return t
        t1 = _now()
        meter.call_ns[op] += t1 - t
        meter.hist[op][((t1 - t) // n).bit_length()] += n  # Meter.RAW_BUCKETS: no clamp needed
        return t1

    def _answer(self, ans: _Answers, b: Bound, seq: int, result: Any) -> None:
        """Add the answer to a call of ``b``'s op (one that replies) that returned ``result``:
        a result code and fixed-size results go as a plain answer (:meth:`_plain`), bytes as
        ``Reply.data`` (a bulk read: a hand-encoded message of its own)."""
        if result is None:  # most synchronizing calls: success, nothing to carry
            self._plain(ans, seq, 0, b"")
        elif isinstance(result, tuple):
            self._plain(ans, seq, 0, b.op.pack_results(*result))
        elif isinstance(result, memoryview) and result.nbytes >= _BULK:
            self._add(ans, encode_data_reply(seq, result, seq))
        elif isinstance(result, bytes | bytearray | memoryview):
            self._add(ans, guest_pb2.Reply(seq=seq, result=0, data=bytes(result)))
        else:  # a result code (a query's CUDA_ERROR_NOT_READY), 0 for anything else
            self._plain(ans, seq, result if isinstance(result, int) else 0, b"")

    def _plain(self, ans: _Answers, seq: int, result: int, out: bytes) -> None:
        """Add an answer without detail or data: kept aside as the batch's short answer while
        it may be its only one, else added to the message."""
        if (
            ans.short is None
            and ans.short_ok
            and ans.replies is None
            and not ans.out
            and len(out) <= ANSWER_OUT_MAX
        ):
            ans.short = (seq, result, out)
            return
        if result or out:
            self._message(ans).replies.add(seq=seq, result=result, out=out)
        else:  # (a field set costs as much as the message's add)
            self._message(ans).replies.add(seq=seq)
        ans.pending += 64 + len(out)

    def _message(self, ans: _Answers) -> guest_pb2.ReplyBatch:
        """The reply message being filled, made when first needed (with the answer kept aside
        as the short one, if any: it came first)."""
        if ans.replies is None:
            ans.replies = guest_pb2.ReplyBatch()
        if ans.short is not None:
            seq, result, out = ans.short
            ans.short = None
            ans.replies.replies.add(seq=seq, result=result, out=out)
            ans.pending += 64 + len(out)
        return ans.replies

    def _add(self, ans: _Answers, reply: guest_pb2.Reply | bytes) -> None:
        """Add one answer, starting a new reply message where one would grow too large."""
        if isinstance(reply, bytes):  # a bulk read, already a serialized ReplyBatch
            if ans.short is not None or (ans.replies is not None and len(ans.replies.replies)):
                ans.out.append(self._finish(self._message(ans)))
                ans.replies = None
                ans.pending = 0
            ans.out.append(reply)
        else:
            self._message(ans).replies.append(reply)
            ans.pending += len(reply.data) + 64
        if ans.pending >= MAX_CHUNK:
            ans.out.append(self._finish(self._message(ans)))
            ans.replies = None
            ans.pending = 0

    def _failed(self, seq: int, op: int, b: Bound | None, e: Exception) -> guest_pb2.Reply:
        """The answer to a call that raised ``e`` (the module docstring's error rules)."""
        if isinstance(e, Refused):
            return self._error(seq, op, b, e.fault, quiet=True)
        if isinstance(e, CudaError):
            return self._error(seq, op, b, e)
        if isinstance(e, MemoryError):  # the worker's host memory, not the device's
            oom = CudaError(CUresult.CUDA_ERROR_OUT_OF_MEMORY, "the worker ran out of host memory")
            return self._error(seq, op, b, oom)
        # a bug in a backend: report, log, keep serving
        what = b.op.name if b is not None else f"op#{op}"
        log.error("session %s: %s failed unexpectedly", self.session_id, what, exc_info=e)
        return self._error(seq, op, b, CudaError(CUresult.CUDA_ERROR_UNKNOWN, repr(e)))

    def _finish(self, replies: guest_pb2.ReplyBatch, text: bytes | None = None) -> bytes:
        """``replies`` serialized with how far the session ran and the device's output since
        the last message (``text``, when the caller took it already)."""
        replies.done_seq = self.log.done_seq
        if text is None:
            text = self.take_stdout()
        if text:
            replies.stdout = text
        return replies.SerializeToString()

    def _error(
        self, seq: int, op: int, b: Bound | None, e: CudaError, quiet: bool = False
    ) -> guest_pb2.Reply:
        code = int(e.code)
        if not quiet:
            log.warning(
                "session %s: seq %d %s -> %s: %s",
                self.session_id,
                seq,
                b.op.name if b is not None else f"op#{op}",
                e.code.name if isinstance(e.code, CUresult) else code,
                e.message,
            )
        return guest_pb2.Reply(seq=seq, result=code, detail=e.message)


class _Answers:
    """The messages answering one batch, as they grow."""

    __slots__ = ("out", "pending", "replies", "short", "short_ok")

    def __init__(self, short_ok: bool) -> None:
        self.out: list[bytes] = []
        #: the message being filled (None until an answer needs one)
        self.replies: guest_pb2.ReplyBatch | None = None
        self.pending = 0  # bytes in ``replies`` so far
        #: the guest reads short answers (crane.wire.replies)
        self.short_ok = short_ok
        #: (seq, result, results): the batch's one answer so far, while it may go short
        self.short: tuple[int, int, bytes] | None = None


def _ran_before(calls: Any, packed: PackedCalls | None, start: int) -> bool:
    """Every call of the batch (plain and packed) is at or below ``start``: it ran before.
    (The first plain call decides for a batch the guest numbered in order, every batch it
    makes; iterating a repeated field builds each element, so that is done only then.)"""
    if calls:
        if calls[0].seq > start or any(c.seq > start for c in calls):
            return False
    elif packed is None:
        return False
    return packed is None or packed.last_seq <= start
