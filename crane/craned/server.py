"""The one place craned's gRPC server is built and bound, and its services wired.

unix listeners are plain gRPC sockets with an ident socket beside each (who calls is told by
the credential it fetched there: :mod:`crane.daemon.ident`); tcp listeners require mutual TLS
(a client certificate signed by ``client_ca``), or are plain TCP when ``insecure_tcp`` is set.
Domain sockets (:mod:`crane.daemon.domains`) are servers of their own, one per libvirt domain,
serving the Guest and Control services to that domain's guest.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from crane.craned.health import DaemonHealth
from crane.daemon.callers import Callers
from crane.daemon.control_service import ControlServicer, control_handler
from crane.daemon.domains import DomainConfig, DomainSockets
from crane.daemon.guest_service import GuestServicer, guest_handler
from crane.daemon.ident import IdentServer
from crane.daemon.sessions import SessionManager
from crane.host.diagnostics import DiagnosticsServicer, diagnostics_handler
from crane.migrate.peer_service import (
    MigrationServicer,
    PeerServicer,
    migration_handler,
    peer_handler,
)
from crane.wire.address import CHANNEL_OPTIONS, SERVER_KEEPALIVE_OPTIONS, to_grpc_target
from crane.wire.ident import ident_path

__all__ = ["Listening", "ServerTls", "build_server"]

log = logging.getLogger("craned")


@dataclass(frozen=True)
class ServerTls:
    """PEM files of tcp:// listeners: the daemon's certificate and key, and the CA that signs
    its callers' certificates (every caller must present one: mutual TLS)."""

    cert: str
    key: str
    client_ca: str

    def credentials(self) -> grpc.ServerCredentials:
        pair = (Path(self.key).read_bytes(), Path(self.cert).read_bytes())
        return grpc.ssl_server_credentials(
            [pair], root_certificates=Path(self.client_ca).read_bytes(), require_client_auth=True
        )


@dataclass
class Listening:
    """What :func:`build_server` bound: the addresses and the ident sockets beside the unix
    ones (closed with :meth:`close`)."""

    bound: list[str] = field(default_factory=list)
    idents: list[IdentServer] = field(default_factory=list)
    domains: DomainSockets | None = None

    def open_up(self) -> None:
        """unix sockets mode 0666 once they exist (the server started): any local user may
        connect, what each may do is the daemon's call (who may reach the socket at all is the
        directory's permissions)."""
        for b in self.bound:
            if b.startswith("unix://"):
                os.chmod(b[len("unix://") :], 0o666)

    def close(self) -> None:
        if self.domains is not None:
            self.domains.close()
        for ident in self.idents:
            ident.close()
        for b in self.bound:
            if b.startswith("unix://"):
                Path(b[len("unix://") :]).unlink(missing_ok=True)


def build_server(
    sessions: SessionManager,
    listen: list[str],
    backend_note: str,
    callers: Callers,
    tls: ServerTls | None = None,
    domains: dict[str, DomainConfig] | None = None,
    domain_group: int = 0,
    health: DaemonHealth | None = None,
) -> tuple[grpc.Server, Listening]:
    """Build and bind the server (not started); what it bound. A tcp:// address without
    ``tls`` is plain TCP: the caller checked that ``insecure_tcp`` allows it. ``domains``:
    the configured domains (``Listening.domains.attach_configured()`` serves their sockets),
    ``domain_group``: the gid owning domain sockets. ``health``: the statuses the standard
    health service reports on every listener, the domain sockets' included (a fresh one,
    NOT_SERVING until told otherwise, when not given)."""
    health = health or DaemonHealth()
    options = [*CHANNEL_OPTIONS, *SERVER_KEEPALIVE_OPTIONS]
    # Each guest's call stream holds one thread for its lifetime; leave room for control RPCs.
    threads = sessions.max_sessions * 2 + 8
    server = grpc.server(
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rpc"), options=options
    )

    def domain_handlers(domain_callers: Callers) -> list[grpc.GenericRpcHandler]:
        return [
            guest_handler(GuestServicer(sessions, domain_callers)),
            control_handler(ControlServicer(sessions, backend_note, domain_callers)),
            health.handler(),
        ]

    out = Listening()
    out.domains = DomainSockets(
        sessions.run_dir, domain_handlers, domains, domain_group, threads, options
    )
    callers.domain_tenant = out.domains.tenant_for  # certificates naming a domain
    server.add_generic_rpc_handlers(
        (
            guest_handler(GuestServicer(sessions, callers)),
            control_handler(ControlServicer(sessions, backend_note, callers, out.domains)),
            diagnostics_handler(
                DiagnosticsServicer(lambda c: callers.operator(c, "transport diagnostics"))
            ),
            peer_handler(PeerServicer(sessions, callers)),
            migration_handler(MigrationServicer(sessions, callers)),
            health.handler(),
        )
    )
    try:
        for address in listen:
            target = to_grpc_target(address)
            if target.startswith("unix:"):
                path = Path(target[len("unix:") :])
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.exists():
                    os.unlink(path)  # a stale socket from a previous run
                server.add_insecure_port(target)
                out.bound.append("unix://" + str(path))
                out.idents.append(IdentServer(Path(ident_path(str(path))), callers.signer))
                continue
            if tls is not None:
                port = server.add_secure_port(target, tls.credentials())
            else:
                port = server.add_insecure_port(target)
            if port == 0:
                raise OSError(f"cannot listen on {address}")
            host = target.rsplit(":", 1)[0]
            out.bound.append(f"tcp://{host}:{port}")
    except BaseException:
        out.close()
        raise
    return server, out
