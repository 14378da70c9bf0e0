"""gRPC servicers for migration: ``Peer`` (daemon to daemon) and ``Migration`` (operators).

Thin, like the daemon's other servicers: :class:`DaemonError` becomes a gRPC status here, the
work is in :mod:`crane.migrate.daemon_side`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

from crane.daemon.errors import DaemonError
from crane.daemon.sessions import SessionManager
from crane.migrate import daemon_side
from crane.migrate.stream import parse_chunk
from crane.v1 import control_pb2, peer_pb2
from crane.wire.handlers import unary, unary_stream

__all__ = ["migration_handler", "peer_handler"]

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
]


def _abort(context: grpc.ServicerContext, e: DaemonError) -> None:
    context.abort(getattr(grpc.StatusCode, e.status), e.message)


class PeerServicer:
    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions

    def Preflight(self, request: Any, context: grpc.ServicerContext) -> Any:
        return daemon_side.preflight(self.sessions, request)

    def Transfer(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from daemon_side.transfer(self.sessions, requests)
        except DaemonError as e:
            _abort(context, e)

    def Abort(self, request: Any, context: grpc.ServicerContext) -> Any:
        ok = daemon_side.abort_incoming(self.sessions, request.session_id, request.token)
        return peer_pb2.AbortReply(forgotten=ok)


class MigrationServicer:
    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions

    def Migrate(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            session = daemon_side.migrate_out(
                self.sessions,
                request.session_id,
                request.to,
                request.device if request.device else -1,
                request.max_rounds,
                request.stop_bytes,
            )
        except DaemonError as e:
            _abort(context, e)
        last = None
        seen = daemon_side.changes.version
        while context.is_active():
            st = dict(session.migration)
            if st != last:
                last = st
                yield control_pb2.MigrateProgress(
                    **{k: st[k] for k in _FIELDS if st.get(k) is not None}
                )
            if st.get("phase") in ("done", "failed") and session.state != "migrating":
                return
            seen = daemon_side.changes.wait(seen, 0.5)


def peer_handler(servicer: PeerServicer) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "crane.v1.Peer",
        {
            "Preflight": unary(
                servicer.Preflight, peer_pb2.PreflightRequest, peer_pb2.PreflightReply
            ),
            "Transfer": grpc.stream_stream_rpc_method_handler(
                servicer.Transfer,
                request_deserializer=parse_chunk,  # the data field stays a view
                response_serializer=peer_pb2.TransferAck.SerializeToString,
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
        },
    )
