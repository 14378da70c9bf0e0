"""A worker's TCP endpoint for remote guests, checked exactly as the daemon's tcp listener is.

Built here, above both the daemon's and the worker's packages, so that the worker resolves a
client certificate with the daemon's own code (:class:`crane.daemon.callers.Callers`, from the
rules the daemon put in the worker's configuration: :func:`crane.daemon.worker_tcp.rules`)
and refuses any caller :func:`crane.daemon.callers.may_use` refuses for its one session: a
guest of another tenant or another domain, a peer daemon, however it got the token.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from crane.daemon.callers import Callers, may_use
from crane.daemon.tenants import TenantConfig
from crane.host.messages import WorkerConfig
from crane.worker.attach import WorkerSession
from crane.worker.direct import start_tcp_server

__all__ = ["caller_check", "start_worker_tcp"]


def caller_check(cfg: WorkerConfig) -> Callable[[grpc.ServicerContext], None]:
    """Raises the daemon's refusal (a ProtocolError) for a caller that may not carry the
    calls of ``cfg``'s session."""
    rules: dict[str, Any] = cfg.tcp_rules
    tenants = {
        name: TenantConfig(name=name, certs=list(t["certs"]), operator=bool(t["operator"]))
        for name, t in rules.get("tenants", {}).items()
    }
    # a certificate naming a domain resolves to domain:NAME and is refused by may_use: no
    # VM's session has a TCP endpoint (crane.daemon.worker_tcp)
    callers = Callers(tenants, rules.get("peers", []), bool(rules.get("insecure_tcp")))

    def check(context: grpc.ServicerContext) -> None:
        may_use(callers.identify(context), cfg.tenant, cfg.session_id, cfg.domain)

    return check


def start_worker_tcp(
    cfg: WorkerConfig, ws: WorkerSession, on_end: Callable[[], None]
) -> grpc.Server | None:
    """The endpoint ``cfg.tcp_listen`` asks for (None: none asked, or it could not bind)."""
    if not cfg.tcp_listen:
        return None
    rules = cfg.tcp_rules
    creds = None
    if rules.get("cert"):
        pair = (Path(rules["key"]).read_bytes(), Path(rules["cert"]).read_bytes())
        creds = grpc.ssl_server_credentials(
            [pair], root_certificates=Path(rules["ca"]).read_bytes(), require_client_auth=True
        )
    return start_tcp_server(
        cfg.tcp_listen,
        cfg.session_id,
        bytes.fromhex(cfg.token),
        ws,
        on_end,
        creds,
        caller_check(cfg),
    )
