"""Workers' own TCP endpoints: remote guests skip the daemon's relay as local guests do.

A guest on another host reaches the daemon over TCP (mutual TLS). Without this its every call
batch crossed the daemon's process (the relay: one more gRPC hop and two more socket copies per
call). With ``worker_tcp_ports`` configured, each session's worker also listens on a TCP port
the daemon allocates from that range, with the daemon's own certificate, the same client CA and
the same caller rules (:func:`rules`: the worker resolves a client certificate exactly as
:class:`crane.daemon.callers.Callers` does, then applies :func:`~crane.daemon.callers.may_use`
against its one session). The guest is told ``tcp://*:PORT``: the worker's port on whichever
host name it reached the daemon by (so that the daemon's certificate verifies there too).
Sessions of a libvirt domain get none: a VM's session must outlive its connection's resets
while the VM moves, which only the relay's stream tells apart from its guest going away.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crane.daemon.tenants import TenantConfig

__all__ = ["WorkerTcp", "parse_port_range", "tcp_direct_address"]

log = logging.getLogger("craned")


def parse_port_range(value: object) -> range:
    """``"40000-40099"`` or ``[40000, 40099]`` (both ends included) as a range; ``ValueError``
    naming what is wrong otherwise. ``""``/``[]``: empty (no worker endpoints)."""
    if value in ("", [], None):
        return range(0)
    if isinstance(value, str):
        lo, sep, hi = value.partition("-")
        parts: list[object] = [lo.strip(), hi.strip()] if sep else []
    elif isinstance(value, list):
        parts = list(value)
    else:
        parts = []
    try:
        if len(parts) != 2:
            raise ValueError
        start, end = (int(p) for p in parts)  # type: ignore[call-overload]
    except (ValueError, TypeError):
        raise ValueError(
            f"worker_tcp_ports must be 'FIRST-LAST' or [FIRST, LAST], not {value!r}"
        ) from None
    if not 0 < start <= end < 65536:
        raise ValueError(f"worker_tcp_ports {start}-{end}: ports must be 1..65535, FIRST <= LAST")
    return range(start, end + 1)


def tcp_direct_address(port: int) -> str:
    """What a guest is told: the worker's port on the host it reached the daemon by."""
    return f"tcp://*:{port}"


@dataclass
class WorkerTcp:
    """The port range and what each worker's listener needs: where to bind (the daemon's tcp
    listener's host), TLS files ("": plain TCP under ``insecure_tcp``) and the caller rules."""

    host: str
    ports: range
    tls_cert: str = ""
    tls_key: str = ""
    client_ca: str = ""
    tenants: Mapping[str, TenantConfig] = field(default_factory=dict)
    peers: list[str] = field(default_factory=list)
    insecure_tcp: bool = False
    _used: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def allocate(self) -> int:
        """A free port of the range (0: none left, the session uses the relay), held until
        :meth:`free`. A port something else on the host holds is skipped (probed by binding
        it; the worker binds it without SO_REUSEPORT, so a race still fails loudly there)."""
        with self._lock:
            for port in self.ports:
                if port not in self._used and _bindable(self.host, port):
                    self._used.add(port)
                    return port
        log.warning(
            "no free port in worker_tcp_ports %d-%d; the session's remote guest uses the relay",
            self.ports.start,
            self.ports.stop - 1,
        )
        return 0

    def free(self, port: int) -> None:
        with self._lock:
            self._used.discard(port)

    def worker_fields(self, port: int) -> dict[str, Any]:
        """The :class:`crane.host.messages.WorkerConfig` fields of a worker listening on
        ``port``."""
        return {
            "tcp_listen": f"{self.host}:{port}",
            "tcp_rules": rules(
                self.tls_cert,
                self.tls_key,
                self.client_ca,
                self.tenants,
                self.peers,
                self.insecure_tcp,
            ),
        }


def rules(
    cert: str,
    key: str,
    ca: str,
    tenants: Mapping[str, TenantConfig],
    peers: list[str],
    insecure_tcp: bool,
) -> dict[str, Any]:
    """The plain form of what a worker's TCP listener checks (JSON in its configuration):
    its TLS files and what resolves a certificate (the tenants' certificate names and roles,
    the peers). A VM's session gets no listener, so a certificate naming a domain is always
    refused there (crane.daemon.callers.may_use: its domain is not the session's)."""
    return {
        "cert": cert,
        "key": key,
        "ca": ca,
        "tenants": {
            n: {"certs": list(t.certs), "operator": t.operator} for n, t in tenants.items()
        },
        "peers": list(peers),
        "insecure_tcp": insecure_tcp,
    }


def _bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's listeners do
        try:
            s.bind((host.strip("[]"), port))
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EACCES):
                log.warning("worker port %d on %s: %s", port, host, e)
            return False
    return True
