"""VM guests, identified by the host: one unix socket per libvirt domain.

A guest in a VM cannot reach the ident socket (:mod:`crane.daemon.ident`) and anything it sends
as credentials is its own claim. What the host knows is *which socket* its connection came in
on: the domain's QEMU forwards its guest's ``vm://`` address (user networking ``guestfwd``, or
the vsock bridge of :mod:`crane.daemon.vsock`) to ``<run_dir>/domains/<domain>.sock`` and to
nothing else. So every call arriving on that socket is domain NAME's guest: tenant the
domain's configured one (``[domains.NAME] tenant``, or :class:`AttachDomain`'s) or
``domain:NAME``, never an operator, and each session it opens records the domain
(:attr:`crane.daemon.session.DaemonSession.domain`), which only that domain's callers may use.

grpcio cannot add a port to a running server nor tell a handler which listener a call came in
on (``context.peer()`` of a unix socket is ``"unix:"``), so each domain gets a small gRPC
server of its own, serving the Guest and Control services with a :class:`DomainCallers` that
answers every call with the domain's caller. Detaching unlinks the socket (no new
connection can be made) and keeps that server for the connections it has, so the sessions on
it keep running; it is stopped with the daemon.
"""

from __future__ import annotations

import grp
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from crane.api.errors import ProtocolError
from crane.daemon.callers import Caller, Callers
from crane.daemon.domain_names import DOMAIN_NAME_MAX, check_domain_name

__all__ = [
    "DOMAIN_NAME_MAX",
    "DomainCallers",
    "DomainConfig",
    "DomainSockets",
    "check_domain_name",
    "domain_caller",
    "resolve_group",
]

log = logging.getLogger("craned")


_SUN_PATH_MAX = 107


@dataclass(frozen=True)
class DomainConfig:
    """One ``[domains.NAME]`` table: the tenant its guest's sessions belong to."""

    name: str
    tenant: str = ""

    @property
    def effective_tenant(self) -> str:
        return self.tenant or f"domain:{self.name}"

    @classmethod
    def from_table(cls, name: str, table: object) -> DomainConfig:
        try:
            check_domain_name(name)
        except ValueError as e:
            raise ValueError(f"[domains.{name}]: {e}") from None
        if not isinstance(table, dict):
            raise ValueError(f"[domains.{name}] must be a table")
        unknown = set(table) - {"tenant"}
        if unknown:
            raise ValueError(f"[domains.{name}]: unknown keys {sorted(unknown)}; known: ['tenant']")
        tenant = table.get("tenant", "")
        if not isinstance(tenant, str):
            raise ValueError(f"[domains.{name}] tenant must be a string")
        return cls(name, tenant)


def domain_caller(domain: str, tenant: str) -> Caller:
    """Who every call on ``domain``'s socket is: its guest, in ``tenant``, never an operator."""
    return Caller(tenant, False, f"domain {domain}", domain=domain)


class DomainCallers(Callers):
    """The :class:`Callers` of one domain's socket: every call is that domain's guest, whatever
    metadata it carries (a guest's claims are not read)."""

    def __init__(self, domain: str, tenant: str) -> None:
        super().__init__()
        self.caller = domain_caller(domain, tenant)

    def _resolve(self, context: grpc.ServicerContext) -> Caller:
        return self.caller


def resolve_group(group: str | int | None) -> int:
    """The gid of ``domain_socket_group`` (a name or a number; "" or None: root, gid 0)."""
    if group in (None, ""):
        return 0
    if isinstance(group, int) and not isinstance(group, bool):
        if group < 0:
            raise ValueError(f"domain_socket_group must be a group name or gid >= 0, not {group}")
        return group
    if isinstance(group, str):
        if group.isdigit():
            return int(group)
        try:
            return grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"domain_socket_group: no group {group!r} on this host") from None
    raise ValueError(f"domain_socket_group must be a group name or gid, not {group!r}")


#: Builds the gRPC handlers a domain's server serves, for that domain's callers.
HandlersFor = Callable[[Callers], Sequence[grpc.GenericRpcHandler]]


@dataclass
class _Attached:
    config: DomainConfig
    path: Path
    server: grpc.Server


class DomainSockets:
    """The domain sockets this daemon serves (``AttachDomain``/``DetachDomain``, and the
    ``[domains.*]`` of its configuration at start)."""

    def __init__(
        self,
        run_dir: Path,
        handlers_for: HandlersFor,
        configured: dict[str, DomainConfig] | None = None,
        group: int = 0,
        max_workers: int = 32,
        options: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.root = run_dir / "domains"
        self.handlers_for = handlers_for
        self.configured = dict(configured or {})
        self.group = group
        self.max_workers = max_workers
        self.options = list(options)
        self._attached: dict[str, _Attached] = {}
        self._retired: list[grpc.Server] = []  # detached, still serving their connections
        self._lock = threading.Lock()

    def path_of(self, domain: str) -> Path:
        return self.root / f"{domain}.sock"

    def tenant_of(self, domain: str) -> str | None:
        """The tenant of an attached domain's callers (None: not attached)."""
        with self._lock:
            a = self._attached.get(domain)
        return a.config.effective_tenant if a else None

    def tenant_for(self, domain: str) -> str:
        """The tenant of ``domain``'s guest however it connects (its socket, or a certificate
        naming it): the attached domain's, else the configured one's, else ``domain:NAME``."""
        attached = self.tenant_of(domain)
        if attached is not None:
            return attached
        return self.configured.get(domain, DomainConfig(domain)).effective_tenant

    def socket_of(self, domain: str) -> Path | None:
        """The socket of ``domain`` when it is attached here (the vsock bridge's target)."""
        with self._lock:
            a = self._attached.get(domain)
        return a.path if a else None

    def attached(self) -> dict[str, str]:
        """Attached domain -> its socket path."""
        with self._lock:
            return {n: str(a.path) for n, a in self._attached.items()}

    def attach(self, domain: str, tenant: str = "") -> tuple[Path, str, bool]:
        """Serve ``domain``'s socket: (its path, its callers' tenant, whether it was served
        already). ``tenant`` "": the configured one, else ``domain:NAME``. Re-attaching with
        another tenant is refused (its sessions belong to the first)."""
        try:
            check_domain_name(domain)
            if tenant and (not tenant.isprintable() or len(tenant) > 128):
                raise ValueError(f"tenant {tenant[:40]!r} is not a usable tenant name")
        except ValueError as e:
            raise ProtocolError("INVALID_ARGUMENT", str(e)) from None
        with self._lock:
            have = self._attached.get(domain)
            if have is not None:
                if tenant and tenant != have.config.effective_tenant:
                    raise ProtocolError(
                        "ALREADY_EXISTS",
                        f"domain {domain} is attached with tenant {have.config.effective_tenant}"
                        f", not {tenant}; detach it first",
                    )
                return have.path, have.config.effective_tenant, True
            conf = self.configured.get(domain, DomainConfig(domain))
            if tenant:
                conf = DomainConfig(domain, tenant)
            path = self.path_of(domain)
            if len(str(path).encode()) > _SUN_PATH_MAX:
                raise ProtocolError(
                    "INVALID_ARGUMENT",
                    f"socket path {path} is too long for a unix socket (108 bytes): "
                    "a shorter domain name or run directory",
                )
            server = self._serve(conf, path)
            self._attached[domain] = _Attached(conf, path, server)
        log.info("domain %s attached: %s (tenant %s)", domain, path, conf.effective_tenant)
        return path, conf.effective_tenant, False

    def _serve(self, conf: DomainConfig, path: Path) -> grpc.Server:
        from concurrent.futures import ThreadPoolExecutor

        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        path.unlink(missing_ok=True)  # a stale one (a previous run, or detached)
        server = grpc.server(
            ThreadPoolExecutor(self.max_workers, thread_name_prefix=f"dom-{conf.name}"[:15]),
            options=self.options,
        )
        server.add_generic_rpc_handlers(
            tuple(self.handlers_for(DomainCallers(conf.name, conf.effective_tenant)))
        )
        if server.add_insecure_port(f"unix:{path}") == 0:
            raise ProtocolError("INTERNAL", f"cannot listen on {path}")
        server.start()
        try:
            os.chown(path, -1, self.group)
            os.chmod(path, 0o660)
        except OSError as e:
            server.stop(None)
            path.unlink(missing_ok=True)
            raise ProtocolError("INTERNAL", f"cannot set the owner of {path}: {e}") from None
        return server

    def detach(self, domain: str) -> tuple[bool, Path]:
        """Stop accepting connections on ``domain``'s socket (False: it was not attached)."""
        try:
            check_domain_name(domain)
        except ValueError as e:
            raise ProtocolError("INVALID_ARGUMENT", str(e)) from None
        with self._lock:
            a = self._attached.pop(domain, None)
            if a is None:
                return False, self.path_of(domain)
            a.path.unlink(missing_ok=True)
            self._retired.append(a.server)
        log.info("domain %s detached: %s removed (its open connections stay)", domain, a.path)
        return True, a.path

    def attach_configured(self) -> None:
        for name in self.configured:
            self.attach(name)

    def close(self) -> None:
        with self._lock:
            attached, self._attached = list(self._attached.values()), {}
            servers = [a.server for a in attached] + self._retired
            self._retired = []
        for s in servers:
            s.stop(None)
        for a in attached:
            a.path.unlink(missing_ok=True)
