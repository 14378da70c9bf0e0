"""gRPC servicers: thin translation between RPCs and the session manager.

Exceptions become gRPC status in exactly one place (:func:`_status_on_error`). The ``Calls``
stream is a relay: the guest's serialized call batches go to the session's worker unparsed and
the worker's serialized replies come back unparsed, so the daemon does no per-call work.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from crane import __version__
from crane.daemon.errors import DaemonError
from crane.daemon.gpu_inventory import gpu_status
from crane.daemon.sessions import Session, SessionManager, SessionMoved
from crane.device.layout import CHUNK_GRANULARITY, GUEST_SPAN
from crane.migrate.daemon_side import wait_switchover
from crane.v1 import common_pb2, control_pb2, guest_pb2
from crane.wire.batch_flags import EXPECTS_REPLY, peek_flags
from crane.wire.fingerprint import fingerprint
from crane.wire.handlers import unary
from crane.wire.status import DRIVER_VERSION, MAX_CHUNK
from crane.worker.channel import ChannelClosed, Tag

__all__ = ["control_handler", "guest_handler"]

log = logging.getLogger("craned")


def _status_on_error(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except DaemonError as e:
            log.warning("%s refused for %s: %s", fn.__name__, context.peer(), e.message)
            context.abort(getattr(grpc.StatusCode, e.status), e.message)

    return wrapper


class GuestServicer:
    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions

    @_status_on_error
    def OpenSession(
        self, request: guest_pb2.OpenSessionRequest, context: grpc.ServicerContext
    ) -> guest_pb2.OpenSessionReply:
        if request.fingerprint != fingerprint():
            raise DaemonError(
                "FAILED_PRECONDITION",
                f"protocol fingerprint mismatch: guest {request.fingerprint!r}, daemon "
                f"{fingerprint()!r}; the guest library and craned come from different Crane "
                "builds",
            )
        return _opened(self.sessions.open(request.device, request.client))

    @_status_on_error
    def Resume(
        self, request: guest_pb2.ResumeRequest, context: grpc.ServicerContext
    ) -> guest_pb2.OpenSessionReply:
        if request.fingerprint != fingerprint():
            raise DaemonError("FAILED_PRECONDITION", "protocol fingerprint mismatch")
        sid, token = request.session_id, request.resume_token
        try:
            try:
                return _opened(self.sessions.resume(sid, token))
            except DaemonError as e:
                # stopped for a switchover to another daemon: the redirect is moments away, so
                # wait for it here rather than have the guest back off and poll
                if e.status != "UNAVAILABLE" or not wait_switchover(self.sessions, sid):
                    raise
            return _opened(self.sessions.resume(sid, token))
        except DaemonError as e:
            if isinstance(e, SessionMoved):  # migrated away: send the guest there
                context.set_trailing_metadata((("crane-moved-to", e.to),))
            if e.status == "UNAVAILABLE":  # parked here: tell it apart from "daemon down"
                context.set_trailing_metadata((("crane-parked", "1"),))
            raise

    def Calls(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        md = dict(context.invocation_metadata())
        token = md.get("crane-token-bin")
        try:
            session = self.sessions.attach(md.get("crane-session"), token, context.peer())
        except DaemonError as e:
            log.warning("call stream refused for %s: %s", context.peer(), e.message)
            context.abort(getattr(grpc.StatusCode, e.status), e.message)
        context.add_callback(lambda: self.sessions.close(session, "stream ended"))
        ch = session.worker.channel
        try:
            for raw in requests:
                with session.channel_lock:  # a checkpoint waits for the batch to be answered
                    if session.state == "parked":
                        context.abort(grpc.StatusCode.UNAVAILABLE, f"{session.id} is parked")
                    while session.pending:
                        yield session.pending.pop(0)
                    ch.send(Tag.BATCH, raw)
                    if peek_flags(raw) & EXPECTS_REPLY:
                        # the guest waits: forward answers up to this batch's last one
                        while True:
                            tag, frame = ch.recv()
                            if tag == Tag.CLOSE:
                                return
                            yield frame
                            if tag == Tag.REPLY_LAST:
                                break
                    else:
                        # asynchronous batch: forward only what is already there (failures)
                        while ch.readable():
                            tag, frame = ch.recv()
                            if tag == Tag.CLOSE:
                                return
                            yield frame
        except ChannelClosed:
            if session.state in ("parked", "checkpointing", "migrating", "migrated"):
                context.abort(grpc.StatusCode.UNAVAILABLE, f"session {session.id} is parked")
            if session.state == "running":
                log.error("session %s: worker exited unexpectedly", session.id)
                context.abort(
                    grpc.StatusCode.UNAVAILABLE, f"session {session.id}: its worker process exited"
                )
        finally:
            self.sessions.close(session, "stream ended")


def _opened(s: Session) -> guest_pb2.OpenSessionReply:
    return guest_pb2.OpenSessionReply(
        session_id=s.id,
        resume_token=s.token,
        va_base=s.va_base,
        va_size=GUEST_SPAN,
        device=s.identity,
        driver_version=DRIVER_VERSION,
        chunk_granularity=CHUNK_GRANULARITY,
        max_batch_bytes=MAX_CHUNK,
        daemon_version=__version__,
        direct_address=f"unix://{s.direct_socket}" if s.direct_socket else "",
    )


class ControlServicer:
    def __init__(self, sessions: SessionManager, backend_note: str) -> None:
        self.sessions = sessions
        self.backend_note = backend_note

    def ListDevices(self, request: Any, context: grpc.ServicerContext) -> Any:
        out = control_pb2.ListDevicesReply(daemon_version=__version__, backend=self.backend_note)
        sessions = self.sessions.list()
        for d in self.sessions.devices:
            util, mig = -1, "n/a"
            if d.backend == "cuda":
                status = gpu_status(int(d.arg))
                util, mig = status.utilization_pct, status.mig_mode
            out.devices.append(
                common_pb2.DeviceInfo(
                    index=d.index,
                    backend=d.backend,
                    name=d.name,
                    uuid=d.uuid,
                    total_mem=d.total_mem,
                    used_mem=d.ledger.used(),
                    cc_major=d.cc[0],
                    cc_minor=d.cc[1],
                    profile=d.arg,
                    sessions=sum(1 for s in sessions if s.device is d),
                    utilization_pct=util,
                    mig_mode=mig,
                    driver_version=d.driver_version,
                )
            )
        return out

    def ListSessions(self, request: Any, context: grpc.ServicerContext) -> Any:
        return control_pb2.ListSessionsReply(
            sessions=[self.sessions.info(s) for s in self.sessions.listing()]
        )

    @_status_on_error
    def Checkpoint(
        self, request: control_pb2.CheckpointRequest, context: grpc.ServicerContext
    ) -> control_pb2.CheckpointReply:
        t0 = time.monotonic()
        counts, state = self.sessions.checkpoint(request.session_id, request.path, request.release)
        return control_pb2.CheckpointReply(
            bytes=counts["bytes"],
            memory_bytes=counts["memory_bytes"],
            seconds=time.monotonic() - t0,
            state=state,
        )

    @_status_on_error
    def Restore(
        self, request: control_pb2.RestoreRequest, context: grpc.ServicerContext
    ) -> control_pb2.RestoreReply:
        t0 = time.monotonic()
        session, answer = self.sessions.restore(request.path, request.device)
        return control_pb2.RestoreReply(
            session_id=session.id,
            seconds=time.monotonic() - t0,
            done_seq=answer.get("done_seq", 0),
        )


def guest_handler(servicer: GuestServicer) -> grpc.GenericRpcHandler:
    """The Guest service; ``Calls`` carries raw bytes (the daemon never parses a batch)."""
    return grpc.method_handlers_generic_handler(
        "crane.v1.Guest",
        {
            "OpenSession": unary(
                servicer.OpenSession, guest_pb2.OpenSessionRequest, guest_pb2.OpenSessionReply
            ),
            "Calls": grpc.stream_stream_rpc_method_handler(servicer.Calls),
            "Resume": unary(servicer.Resume, guest_pb2.ResumeRequest, guest_pb2.OpenSessionReply),
        },
    )


def control_handler(servicer: ControlServicer) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "crane.v1.Control",
        {
            "ListDevices": unary(
                servicer.ListDevices, control_pb2.ListDevicesRequest, control_pb2.ListDevicesReply
            ),
            "ListSessions": unary(
                servicer.ListSessions,
                control_pb2.ListSessionsRequest,
                control_pb2.ListSessionsReply,
            ),
            "Checkpoint": unary(
                servicer.Checkpoint, control_pb2.CheckpointRequest, control_pb2.CheckpointReply
            ),
            "Restore": unary(
                servicer.Restore, control_pb2.RestoreRequest, control_pb2.RestoreReply
            ),
        },
    )
