"""gRPC services for migration: ``Peer`` (daemon to daemon) and ``Migration`` (operators).

Thin, like the daemon's other services: refusals are :class:`~crane.api.errors.ProtocolError`
and the RPC boundary (:mod:`crane.wire.handlers`) turns them into gRPC status; the work is in
:mod:`crane.migrate.daemon_side`, over the daemon's :class:`~crane.daemon.host.SessionHost`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

from crane.daemon.callers import Callers
from crane.daemon.host import SessionHost
from crane.daemon.lifecycle import SessionState
from crane.migrate import daemon_side
from crane.migrate.phases import Phase
from crane.migrate.stream import parse_chunk
from crane.v1 import control_pb2, peer_pb2
from crane.wire.handlers import stream_stream, unary, unary_stream

__all__ = ["MigrationServicer", "PeerServicer", "migration_handler", "peer_handler"]

_FIELDS = [
    "phase",
    "round",
    "bytes_sent",
    "memory_bytes",
    "session_bytes",
    "dirty_bytes",
    "rate",
    "est_downtime",
    "downtime",
    "total",
    "error",
    "done_seq",
    "switchover",
    "awaiting",
    "handed_over_bytes",
]


class PeerServicer:
    """Daemon to daemon: only peers (a certificate named in ``peers``, or an operator on a
    unix socket: a daemon on the same host) may hand sessions to this daemon."""

    def __init__(self, host: SessionHost, callers: Callers) -> None:
        self.host = host
        self.callers = callers
        self.incoming = daemon_side.Incoming()

    def Preflight(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.callers.peer(context, "migrating a session here")
        return daemon_side.preflight(self.host, request)

    def Transfer(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        self.callers.peer(context, "migrating a session here")
        local = context.peer().startswith("unix:")
        yield from daemon_side.transfer(self.host, requests, self.incoming, context.cancel, local)

    def Abort(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.callers.peer(context, "aborting a migration")
        ok = daemon_side.abort_incoming(self.host, request.session_id, request.token, self.incoming)
        return peer_pb2.AbortReply(forgotten=ok)


class MigrationServicer:
    """``crane migrate``: operators only."""

    def __init__(self, host: SessionHost, callers: Callers) -> None:
        self.host = host
        self.callers = callers

    def Migrate(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.callers.operator(context, f"migration of session {request.session_id}")
        session = daemon_side.migrate_out(
            self.host,
            request.session_id,
            request.to,
            request.device if request.device else -1,
            request.max_rounds,
            request.stop_bytes,
            request.boundary_wait_s or daemon_side.BOUNDARY_WAIT_S,
            request.accept_lower_limits,
            request.hold,
            request.gate,
            request.hold_timeout_s,
        )
        last = None
        changes = self.host.changes
        seen = changes.version
        while context.is_active():
            st = dict(session.migration)
            if st != last:
                last = st
                yield control_pb2.MigrateProgress(
                    **{k: st[k] for k in _FIELDS if st.get(k) is not None}
                )
            over = Phase(st.get("phase", Phase.PREFLIGHT.value)).over
            if over and session.state is not SessionState.MIGRATING:
                return
            seen = changes.wait(seen, 0.5)

    def _decide(self, request: Any, context: grpc.ServicerContext, what: str, verb: str) -> Any:
        self.callers.operator(context, f"{verb} the migration of session {request.session_id}")
        phase = daemon_side.decide(self.host, request.session_id, what)
        return control_pb2.MigrateDecisionReply(phase=phase)

    def Stop(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._decide(request, context, "s", "stopping")

    def Commit(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._decide(request, context, "c", "committing")

    def Abort(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._decide(request, context, "a", "aborting")


def peer_handler(servicer: PeerServicer) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "crane.v1.Peer",
        {
            "Preflight": unary(
                servicer.Preflight, peer_pb2.PreflightRequest, peer_pb2.PreflightReply
            ),
            "Transfer": stream_stream(
                servicer.Transfer,
                None,
                peer_pb2.TransferAck,
                request_deserializer=parse_chunk,  # the data field stays a view
            ),
            "Abort": unary(servicer.Abort, peer_pb2.AbortRequest, peer_pb2.AbortReply),
        },
    )


def migration_handler(servicer: MigrationServicer) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "crane.v1.Migration",
        {
            "Migrate": unary_stream(
                servicer.Migrate, control_pb2.MigrateRequest, control_pb2.MigrateProgress
            ),
            **{
                name: unary(
                    getattr(servicer, name),
                    control_pb2.MigrateDecision,
                    control_pb2.MigrateDecisionReply,
                )
                for name in ("Stop", "Commit", "Abort")
            },
        },
    )
