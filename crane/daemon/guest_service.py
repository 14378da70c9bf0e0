"""The Guest service: open a session, resume it, and relay its call stream to the worker.

``Calls`` is a relay: the guest's serialized call batches go to the session's worker unparsed and
the worker's serialized replies come back unparsed, so the daemon does no per-call work
(invariant 4). Refusals are :class:`~crane.api.errors.ProtocolError`; the RPC boundary
(:mod:`crane.wire.handlers`) turns them into gRPC status.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from crane.api.errors import ProtocolError
from crane.daemon.callers import Callers
from crane.daemon.lifecycle import AWAY, SessionState
from crane.daemon.render import opened
from crane.daemon.session import DaemonSession
from crane.daemon.sessions import SessionManager, worker_exited
from crane.host.channel import ChannelClosed
from crane.host.messages import Tag
from crane.v1 import guest_pb2
from crane.wire.batch_flags import EXPECTS_REPLY, peek_flags
from crane.wire.fingerprint import mismatch
from crane.wire.handlers import stream_stream, unary, unary_stream

__all__ = ["GuestServicer", "guest_handler"]

log = logging.getLogger("craned")


def _same_build(theirs: str) -> None:
    why = mismatch(theirs, "guest", "daemon", "the guest library and craned")
    if why:
        raise ProtocolError("FAILED_PRECONDITION", why)


class GuestServicer:
    """Any identified caller may open a session; it is bound to the caller's tenant, and only
    that tenant (or an operator) may resume it, watch it or carry its calls."""

    def __init__(self, sessions: SessionManager, callers: Callers) -> None:
        self.sessions = sessions
        self.callers = callers

    def OpenSession(
        self, request: guest_pb2.OpenSessionRequest, context: grpc.ServicerContext
    ) -> guest_pb2.OpenSessionReply:
        caller = self.callers.identify(context)
        _same_build(request.fingerprint)
        return opened(self.sessions.open(request.device, request.client, caller), caller)

    def Resume(
        self, request: guest_pb2.ResumeRequest, context: grpc.ServicerContext
    ) -> guest_pb2.OpenSessionReply:
        caller = self.callers.identify(context)
        _same_build(request.fingerprint)
        sid, token = request.session_id, request.resume_token
        try:
            return opened(self.sessions.resume(sid, token, caller), caller)
        except ProtocolError as e:
            # stopped for a switchover to another daemon: the redirect is moments away, so
            # wait for it here rather than have the guest back off and poll
            if e.status != "UNAVAILABLE" or not self.sessions.wait_switchover(sid):
                raise
        return opened(self.sessions.resume(sid, token, caller), caller)

    def Presence(
        self, request: guest_pb2.PresenceRequest, context: grpc.ServicerContext
    ) -> Iterator[guest_pb2.PresenceEvent]:
        """Held open by a direct guest for its life; its end stops the session's worker."""
        caller = self.callers.identify(context)
        gone = threading.Event()
        context.add_callback(gone.set)
        self.sessions.watch_guest(request.session_id, request.resume_token, gone, caller)
        yield from ()

    def Calls(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        caller = self.callers.identify(context)  # once, at the stream's opening
        md = dict(context.invocation_metadata())
        stream = object()  # this stream, as the session knows it (stream_ended)
        session = self.sessions.attach(
            md.get("crane-session"), md.get("crane-token-bin"), context.peer(), caller, stream
        )
        # the RPC ended without this loop noticing (blocked on the worker, a kernel running):
        # the guest's connection broke or the guest cancelled
        context.add_callback(lambda: self.sessions.stream_ended(session, stream, clean=False))
        session.end_stream = context.cancel
        ch = session.worker.channel
        clean = False
        try:
            for raw in requests:
                with session.channel_lock:  # a checkpoint waits for the batch to be answered
                    if session.state is SessionState.PARKED:
                        raise ProtocolError("UNAVAILABLE", f"{session.id} is parked")
                    while session.pending:
                        yield session.pending[0]
                        session.pending.pop(0)  # only once delivered (kept for a VM's guest)
                    ch.send(Tag.BATCH, raw)
                    if peek_flags(raw) & EXPECTS_REPLY:
                        # the guest waits: forward answers up to this batch's last one
                        while True:
                            tag, frame = ch.recv()
                            if tag == Tag.CLOSE:
                                clean = True  # the worker ended the session
                                return
                            try:
                                yield frame
                            except GeneratorExit:  # the stream broke: keep the batch's rest
                                _keep_unsent(session, ch, frame, tag)
                                raise
                            if tag == Tag.REPLY_LAST:
                                break
                    else:
                        # asynchronous batch: forward only what is already there (failures)
                        while ch.readable():
                            tag, frame = ch.recv()
                            if tag == Tag.CLOSE:
                                clean = True  # the worker ended the session
                                return
                            try:
                                yield frame
                            except GeneratorExit:
                                _keep_unsent(session, ch, frame, Tag.REPLY_LAST)
                                raise
            # the guest closed its side: it is done with the session. But gRPC may end the
            # requests of a connection that broke as if the guest had closed them (which of
            # "no more messages" and "cancelled" it notices first is a race), and a VM's
            # connection breaks whenever the VM moves: a domain's session that is migrating or
            # being checkpointed is not taken as done by it (a guest that is done says so with
            # SESSION_CLOSE, which ends the session through its worker)
            clean = not (session.domain and session.state in MOVING)
        except ChannelClosed:
            if session.state in AWAY:
                raise ProtocolError("UNAVAILABLE", f"session {session.id} is parked") from None
            if session.state is SessionState.RUNNING:
                log.error("session %s: worker exited unexpectedly", session.id)
            self.sessions.worker_died(session)
            # whoever noticed first (this stream or the reaper, which may have closed the
            # session already), the guest hears the same: it resumes and is told why
            raise ProtocolError("UNAVAILABLE", worker_exited(session.id)) from None
        finally:
            self.sessions.stream_ended(session, stream, clean)


#: States in which a domain's session outlives its guest's broken connection (see stream_ended).
MOVING = (SessionState.MIGRATING, SessionState.CHECKPOINTING)


def _keep_unsent(session: DaemonSession, ch: Any, frame: bytes, tag: int) -> None:
    """A VM guest's stream broke while ``frame`` (of a batch it waits for, up to its
    ``REPLY_LAST``) was being sent: keep it and the batch's other answers for the stream the
    guest resumes with (the worker's channel must hold no answer of an old batch when the
    next one is sent), while the channel lock is still held. Other sessions end with their
    stream: nothing to keep."""
    if not session.domain:
        return
    session.pending.append(frame)
    try:
        while tag != Tag.REPLY_LAST:
            tag, more = ch.recv()
            if tag == Tag.CLOSE:
                return
            session.pending.append(more)
    except ChannelClosed:
        return


def guest_handler(servicer: GuestServicer) -> grpc.GenericRpcHandler:
    """The Guest service; ``Calls`` carries raw bytes (the daemon never parses a batch)."""
    return grpc.method_handlers_generic_handler(
        "crane.v1.Guest",
        {
            "OpenSession": unary(
                servicer.OpenSession, guest_pb2.OpenSessionRequest, guest_pb2.OpenSessionReply
            ),
            "Calls": stream_stream(servicer.Calls),
            "Resume": unary(servicer.Resume, guest_pb2.ResumeRequest, guest_pb2.OpenSessionReply),
            "Presence": unary_stream(
                servicer.Presence, guest_pb2.PresenceRequest, guest_pb2.PresenceEvent
            ),
        },
    )
