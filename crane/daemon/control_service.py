"""The Control service (``crane devices``, ``crane ps``, ``crane checkpoint``, ``crane restore``):
thin translation between RPCs and the session manager."""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc

from crane import __version__
from crane.api.errors import ProtocolError
from crane.daemon.callers import Callers
from crane.daemon.checkpoints import BOUNDARY_WAIT_S
from crane.daemon.domains import DomainSockets
from crane.daemon.profiles import session_profile
from crane.daemon.render import device_info, session_info
from crane.daemon.sessions import SessionManager
from crane.host.logs import bind
from crane.v1 import control_pb2
from crane.wire.handlers import unary

__all__ = ["ControlServicer", "control_handler"]

log = logging.getLogger("craned")


class ControlServicer:
    """Devices: any identified caller. Sessions: an operator sees all, a tenant its own.
    Checkpoint and restore, attaching and detaching domains: operators only."""

    def __init__(
        self,
        sessions: SessionManager,
        backend_note: str,
        callers: Callers,
        domains: DomainSockets | None = None,
    ) -> None:
        self.sessions = sessions
        self.backend_note = backend_note
        self.callers = callers
        self.domains = domains

    def AttachDomain(
        self, request: control_pb2.AttachDomainRequest, context: grpc.ServicerContext
    ) -> control_pb2.AttachDomainReply:
        bind(domain=request.domain)  # the call's lines are about that domain
        caller = self.callers.operator(context, f"attaching domain {request.domain!r}")
        path, tenant, already = self._domains().attach(request.domain, request.tenant)
        if not already:
            log.info("domain %s attached by %s", request.domain, caller)
        return control_pb2.AttachDomainReply(path=str(path), tenant=tenant, already=already)

    def DetachDomain(
        self, request: control_pb2.DetachDomainRequest, context: grpc.ServicerContext
    ) -> control_pb2.DetachDomainReply:
        bind(domain=request.domain)
        caller = self.callers.operator(context, f"detaching domain {request.domain!r}")
        detached, path = self._domains().detach(request.domain)
        if detached:
            log.info("domain %s detached by %s", request.domain, caller)
        return control_pb2.DetachDomainReply(detached=detached, path=str(path))

    def _domains(self) -> DomainSockets:
        if self.domains is None:  # a domain socket's own Control service
            raise ProtocolError("PERMISSION_DENIED", "domains are attached on the daemon's socket")
        return self.domains

    def ListDevices(self, request: Any, context: grpc.ServicerContext) -> Any:
        caller = self.callers.identify(context)
        out = control_pb2.ListDevicesReply(daemon_version=__version__, backend=self.backend_note)
        mgr = self.sessions
        sessions = mgr.list()
        for d in mgr.devices:
            count = sum(1 for s in sessions if s.device is d)
            out.devices.append(device_info(d, d.ledger.used(), count))
        names = sorted(mgr.quotas.tenants) if caller.operator else [caller.tenant]
        with mgr.table.lock:
            held = {n: mgr.table.tenant_sessions(n) for n in names}
        out.tenants.extend(mgr.quotas.usage(names, held))
        return out

    def ListSessions(self, request: Any, context: grpc.ServicerContext) -> Any:
        caller = self.callers.identify(context)
        mgr = self.sessions
        return control_pb2.ListSessionsReply(
            sessions=[
                session_info(s, mgr.table, mgr.expiry)
                for s in mgr.listing(caller, request.domain or None)
            ]
        )

    def GetProfile(
        self, request: control_pb2.ProfileRequest, context: grpc.ServicerContext
    ) -> control_pb2.ProfileReply:
        """Profiles of the sessions the caller may see (a tenant its own, an operator all);
        a session it may not see is answered as one that does not exist."""
        caller = self.callers.identify(context)
        mgr = self.sessions
        visible = mgr.listing(caller)
        if request.session_id:
            visible = [s for s in visible if s.id == request.session_id]
            if not visible:
                raise ProtocolError("NOT_FOUND", f"no session {request.session_id} here")
        return control_pb2.ProfileReply(
            profiles=[
                session_profile(s, mgr.table, mgr.expiry, mgr.profile_window_s, request.top)
                for s in visible
            ]
        )

    def Checkpoint(
        self, request: control_pb2.CheckpointRequest, context: grpc.ServicerContext
    ) -> control_pb2.CheckpointReply:
        self.callers.operator(context, f"checkpoint of session {request.session_id}")
        t0 = time.monotonic()
        counts, state, path = self.sessions.checkpoint(
            request.session_id, request.path, request.release, _boundary_wait(context)
        )
        return control_pb2.CheckpointReply(
            bytes=counts.bytes,
            memory_bytes=counts.memory_bytes,
            seconds=time.monotonic() - t0,
            state=state.value,
            path=str(path),
        )

    def Restore(
        self, request: control_pb2.RestoreRequest, context: grpc.ServicerContext
    ) -> control_pb2.RestoreReply:
        self.callers.operator(context, "restore")
        t0 = time.monotonic()
        session, done_seq = self.sessions.restore(
            request.path, request.device, request.accept_lower_limits
        )
        return control_pb2.RestoreReply(
            session_id=session.id, seconds=time.monotonic() - t0, done_seq=done_seq
        )


def _boundary_wait(context: grpc.ServicerContext) -> float:
    """How long a checkpoint may wait for the session's call in progress: the caller's
    deadline less a margin for the writing and the answer (so that the caller hears the reason
    rather than its own time-out); without a deadline, the daemon's default."""
    left = context.time_remaining()
    if left is None or left > 1e6:  # gRPC answers a huge number when there is no deadline
        return BOUNDARY_WAIT_S
    return max(left - min(2.0, 0.2 * left), 0.05)


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
            "AttachDomain": unary(
                servicer.AttachDomain,
                control_pb2.AttachDomainRequest,
                control_pb2.AttachDomainReply,
            ),
            "DetachDomain": unary(
                servicer.DetachDomain,
                control_pb2.DetachDomainRequest,
                control_pb2.DetachDomainReply,
            ),
            "GetProfile": unary(
                servicer.GetProfile, control_pb2.ProfileRequest, control_pb2.ProfileReply
            ),
        },
    )
