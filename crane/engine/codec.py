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

The :class:`CallLog` is how far the session has executed: the guest's last sequence number and
the answers to its last batch that expected one, which a guest that reconnects (after a park or
a migration) may ask for again; the state record carries it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.engine.dispatch import Bound, Dispatcher, Refused
from crane.engine.staged import BulkPort, run_staged
from crane.v1 import guest_pb2
from crane.wire.batch_flags import EXPECTS_REPLY, peek_flags
from crane.wire.replies import encode_data_reply
from crane.wire.status import MAX_CHUNK

__all__ = ["BatchCodec", "CallLog"]

log = logging.getLogger("crane.worker")

_now = time.monotonic_ns

#: Reads at least this large are sent as their own hand-encoded reply (one copy, not three).
_BULK = 64 << 10


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
        it); others get one only if a call failed or a kernel printed.
        """
        cl = self.log
        out: list[bytes] = []
        replies = guest_pb2.ReplyBatch()
        pending = 0
        try:
            batch = guest_pb2.CallBatch.FromString(raw)
        except DecodeError as e:
            log.warning(
                "session %s: malformed call batch (%d bytes): %s", self.session_id, len(raw), e
            )
            replies.replies.add(
                seq=0, result=CUresult.CUDA_ERROR_INVALID_VALUE, detail=f"malformed call batch: {e}"
            )
            replies.done_seq = cl.done_seq
            return [replies.SerializeToString()]
        expects = bool(peek_flags(raw) & EXPECTS_REPLY)
        calls = batch.calls
        start = cl.done_seq  # calls at or below it ran before (a batch resent after a resume)
        # (the first call decides for a batch the guest numbered in order, every batch it
        # makes; iterating a repeated field builds each element, so it is done once, below)
        if calls and calls[0].seq <= start and not any(c.seq > start for c in calls) and expects:
            # a resent batch (the guest reconnected): everything in it ran before, its answer
            # may never have arrived; answer again (the guest drops what it already has)
            replies.done_seq = cl.done_seq
            return [*cl.last_replies, replies.SerializeToString()]
        device = self.dispatcher.device
        bound, invoke = self.dispatcher.bound, self.dispatcher.invoke
        meter = self.dispatcher.meter
        if meter is not None:  # accounting: each call's time runs from the previous call's end
            m_ns, m_hist, t = meter.call_ns, meter.hist, _now()
        for call in calls:
            seq = call.seq  # (each field read builds an object: read once)
            if seq <= start:
                continue
            # one call, inline (no frame of its own: this loop is the worker's hot path)
            op = call.op
            b = bound.get(op)
            try:
                if b is None:
                    raise CudaError(CUresult.CUDA_ERROR_NOT_SUPPORTED, f"unknown op {op}")
                if b.staged:  # its bytes are in the bulk area (crane.engine.staged)
                    result = run_staged(invoke, b, call.args, self.bulk)
                else:
                    result = invoke(b, call.args, call.data)
                if not b.replies:
                    reply = None
                elif result is None:  # most synchronizing calls: success, nothing to carry
                    replies.replies.add(seq=seq)
                    pending += 64
                    reply = None
                else:
                    reply = self._reply(b, call, result)
            except Refused as r:
                reply = self._error(call, b, r.fault, quiet=True)
            except CudaError as e:
                reply = self._error(call, b, e)
            except MemoryError:  # the worker's host memory, not the device's: the call fails
                reply = self._error(
                    call,
                    b,
                    CudaError(
                        CUresult.CUDA_ERROR_OUT_OF_MEMORY, "the worker ran out of host memory"
                    ),
                )
            except Exception as e:  # a bug in a backend: report, log, keep serving
                what = b.op.name if b is not None else f"op#{call.op}"
                log.exception("session %s: %s failed unexpectedly", self.session_id, what)
                reply = self._error(call, b, CudaError(CUresult.CUDA_ERROR_UNKNOWN, repr(e)))
            cl.calls += 1
            cl.done_seq = seq
            if meter is not None and b is not None:
                t1 = _now()
                ns, t = t1 - t, t1
                m_ns[op] += ns
                m_hist[op][ns.bit_length()] += 1  # Meter.RAW_BUCKETS: no clamp needed
            if isinstance(reply, bytes):  # a bulk read, already a serialized ReplyBatch
                if len(replies.replies):
                    out.append(self._finish(replies))
                    replies = guest_pb2.ReplyBatch()
                    pending = 0
                out.append(reply)
            elif reply is not None:
                replies.replies.append(reply)
                pending += len(reply.data) + 64
            if pending >= MAX_CHUNK:
                out.append(self._finish(replies))
                replies = guest_pb2.ReplyBatch()
                pending = 0
            if device.closed:
                break
        if len(replies.replies) or (not out and expects):
            out.append(self._finish(replies))
        else:
            text = self.take_stdout()
            if text:
                out.append(
                    guest_pb2.ReplyBatch(done_seq=cl.done_seq, stdout=text).SerializeToString()
                )
        if expects:
            cl.last_replies = out
        return out

    def _finish(self, replies: guest_pb2.ReplyBatch) -> bytes:
        replies.done_seq = self.log.done_seq
        text = self.take_stdout()
        if text:
            replies.stdout = text
        return replies.SerializeToString()

    def _reply(self, b: Bound, call: guest_pb2.Call, result: Any) -> guest_pb2.Reply | bytes:
        """The answer to a call that succeeded (a bulk read: a serialized ReplyBatch)."""
        if isinstance(result, memoryview) and result.nbytes >= _BULK:
            return encode_data_reply(call.seq, result, call.seq)
        reply = guest_pb2.Reply(seq=call.seq, result=0)
        if isinstance(result, tuple):
            reply.out = b.op.pack_results(*result)
        elif isinstance(result, bytes | bytearray | memoryview):
            reply.data = bytes(result)
        elif isinstance(result, int) and result:
            reply.result = result
        return reply

    def _error(
        self, call: guest_pb2.Call, b: Bound | None, e: CudaError, quiet: bool = False
    ) -> guest_pb2.Reply:
        code = int(e.code)
        if not quiet:
            log.warning(
                "session %s: seq %d %s -> %s: %s",
                self.session_id,
                call.seq,
                b.op.name if b is not None else f"op#{call.op}",
                e.code.name if isinstance(e.code, CUresult) else code,
                e.message,
            )
        return guest_pb2.Reply(seq=call.seq, result=code, detail=e.message)
