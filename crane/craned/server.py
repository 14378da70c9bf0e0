"""The one place craned's gRPC server is built and bound, and its services wired."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from crane.daemon.control_service import ControlServicer, control_handler
from crane.daemon.guest_service import GuestServicer, guest_handler
from crane.daemon.sessions import SessionManager
from crane.host.diagnostics import DiagnosticsServicer, diagnostics_handler
from crane.migrate.peer_service import (
    MigrationServicer,
    PeerServicer,
    migration_handler,
    peer_handler,
)
from crane.wire.address import CHANNEL_OPTIONS, to_grpc_target

__all__ = ["build_server"]

log = logging.getLogger("craned")


def build_server(
    sessions: SessionManager, listen: list[str], backend_note: str
) -> tuple[grpc.Server, list[str]]:
    """Build, bind and return the server (not started) and the addresses actually bound."""
    # Each guest's call stream holds one thread for its lifetime; leave room for control RPCs.
    server = grpc.server(
        ThreadPoolExecutor(max_workers=sessions.max_sessions * 2 + 8, thread_name_prefix="rpc"),
        options=CHANNEL_OPTIONS,
    )
    server.add_generic_rpc_handlers(
        (
            guest_handler(GuestServicer(sessions)),
            control_handler(ControlServicer(sessions, backend_note)),
            diagnostics_handler(DiagnosticsServicer()),
            peer_handler(PeerServicer(sessions)),
            migration_handler(MigrationServicer(sessions)),
        )
    )
    bound: list[str] = []
    for address in listen:
        target = to_grpc_target(address)
        if target.startswith("unix:"):
            path = Path(target[len("unix:") :])
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                os.unlink(path)  # a stale socket from a previous run
        port = server.add_insecure_port(target)
        if port == 0 and not target.startswith("unix:"):
            raise OSError(f"cannot listen on {address}")
        if target.startswith("unix:"):
            bound.append("unix://" + target[len("unix:") :])
        else:
            host = target.rsplit(":", 1)[0]
            bound.append(f"tcp://{host}:{port}")
    return server, bound
