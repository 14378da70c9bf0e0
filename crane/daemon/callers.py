"""Who is calling, and what that caller may do: resolved once per RPC from how it connected.

* **unix socket**: the credential its process got from the ident socket
  (:mod:`crane.daemon.ident`: uid, gid, groups as the kernel saw them), sent as metadata.
* **TCP with mutual TLS**: the client certificate's common name and subject alternative names
  (gRPC verified the chain against ``client_ca`` in the handshake).
* **plain TCP** (``insecure_tcp``, development only): tenant ``tcp``, operator.
* **a domain socket** (:mod:`crane.daemon.domains`): that libvirt domain's guest, never an
  operator; a certificate with a SAN URI ``urn:crane:domain:NAME`` is domain NAME's guest too.

Mapping, without ``[tenants.*]``: a unix caller of uid U is tenant ``uid:U``, operator when U is
0 or the daemon's own euid; a certificate is tenant ``cert:NAME`` (its CN, else its first SAN).
With tenants configured: a uid listed in a tenant, else its primary gid, else a supplementary
group; the daemon's euid and root stay operators; anyone else is refused, naming the uid or the
certificate's subject, so an unlisted user cannot sidestep a tenant's quotas. A certificate
whose CN/SAN is in ``peers`` identifies a peer daemon (the Peer service's callers), tenant or
not. Every refusal is a :class:`~crane.api.errors.ProtocolError` (UNAUTHENTICATED,
PERMISSION_DENIED) with a one-line reason; the RPC boundary logs it with the method and peer.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc

from crane.api.errors import ProtocolError
from crane.daemon.domain_names import check_domain_name
from crane.daemon.ident import Signer, UnixIds
from crane.daemon.tenants import TenantConfig
from crane.wire.ident import CREDENTIAL_KEY

__all__ = [
    "DOMAIN_URI_PREFIX",
    "INSECURE_TCP_TENANT",
    "Caller",
    "Callers",
    "cert_domain",
    "from_cert",
    "from_unix",
    "may_use",
]

#: The one tenant of every plain-TCP caller (``insecure_tcp``).
INSECURE_TCP_TENANT = "tcp"
#: A client certificate's SAN URI ``urn:crane:domain:NAME`` makes it libvirt domain NAME's
#: guest (a VM reaching the daemon over virtio-net with mutual TLS).
DOMAIN_URI_PREFIX = "urn:crane:domain:"
_SAN = "x509_subject_alternative_name"  # gRPC's auth context key


@dataclass(frozen=True)
class Caller:
    """One RPC's caller: its tenant ("": none, a peer daemon only), whether it operates the
    daemon, how it was identified ("uid 1001", "cert CN=alice", "peer craned-b"), and whether it
    is a peer daemon (certificate named in ``peers``) or came over a unix socket."""

    tenant: str
    operator: bool
    how: str
    peer: bool = False
    unix: bool = False
    #: A unix caller's uid (None over TCP): it may connect to its session's worker directly.
    uid: int | None = None
    #: The libvirt domain whose guest this is ("": not a VM's guest), as the host knows it.
    domain: str = ""

    def __str__(self) -> str:
        role = ", operator" if self.operator else ""
        return f"{self.how} (tenant {self.tenant or '-'}{role})"


def from_unix(ids: UnixIds, tenants: Mapping[str, TenantConfig], daemon_euid: int) -> Caller | str:
    """The caller a unix socket's ids make, or why they make none (no tenant lists them)."""
    how = f"uid {ids.uid}"
    admin = ids.uid in (0, daemon_euid)
    if not tenants:
        return Caller(f"uid:{ids.uid}", admin, how, unix=True, uid=ids.uid)
    for match in (
        lambda t: ids.uid in t.uids,
        lambda t: ids.gid in t.gids,
        lambda t: any(g in t.gids for g in ids.groups),
    ):
        for t in tenants.values():
            if match(t):
                return Caller(t.name, admin or t.operator, how, unix=True, uid=ids.uid)
    if admin:
        return Caller(f"uid:{ids.uid}", True, how, unix=True, uid=ids.uid)
    return f"uid {ids.uid} (gid {ids.gid}) is in no tenant of this daemon"


def cert_domain(alt_names: Iterable[str]) -> str | None:
    """The libvirt domain a certificate's SAN URI ``urn:crane:domain:NAME`` names (None:
    none); ``ValueError`` when it names an invalid one or several."""
    found = {n[len(DOMAIN_URI_PREFIX) :] for n in alt_names if n.startswith(DOMAIN_URI_PREFIX)}
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(f"the client certificate names several domains: {sorted(found)}")
    (name,) = found
    return check_domain_name(name)


def from_cert(
    common_name: str,
    alt_names: Iterable[str],
    tenants: Mapping[str, TenantConfig],
    peers: Iterable[str],
    domain_tenant: Callable[[str], str] | None = None,
) -> Caller | str:
    """The caller a verified client certificate makes, or why it makes none. A certificate
    naming a domain (:data:`DOMAIN_URI_PREFIX`) is that domain's guest whatever else it names:
    tenant ``domain_tenant(NAME)`` (the domain's configured one, or ``domain:NAME``), never an
    operator nor a peer."""
    names = [n for n in (common_name, *alt_names) if n]
    if not names:
        return "the client certificate names no one (no CN, no SAN)"
    subject = f"CN={common_name}" if common_name else f"SAN={','.join(names)}"
    try:
        domain = cert_domain(alt_names)
    except ValueError as e:
        return f"certificate {subject}: {e}"
    if domain is not None:
        tenant = domain_tenant(domain) if domain_tenant else f"domain:{domain}"
        return Caller(tenant, False, f"cert {subject} of domain {domain}", domain=domain)
    peers = set(peers)
    peer = next((n for n in names if n in peers), "")
    how = f"peer {peer}" if peer else f"cert {subject}"
    if not tenants:
        return Caller(f"cert:{names[0]}", False, how, peer=bool(peer))
    for t in tenants.values():
        if any(n in t.certs for n in names):
            return Caller(t.name, t.operator, how, peer=bool(peer))
    if peer:
        return Caller("", False, how, peer=True)
    nor = " nor one of its peers" if peers else ""
    return f"certificate {subject} is in no tenant of this daemon{nor}"


class Callers:
    """Resolves the caller of each RPC against this daemon's configuration."""

    def __init__(
        self,
        tenants: Mapping[str, TenantConfig] | None = None,
        peers: Iterable[str] = (),
        insecure_tcp: bool = False,
        signer: Signer | None = None,
    ) -> None:
        self.tenants = dict(tenants or {})
        self.peers = list(peers)
        self.insecure_tcp = insecure_tcp
        self.signer = signer or Signer()
        self.euid = os.geteuid()
        #: The tenant of a domain's guest (crane.daemon.domains.DomainSockets.tenant_for).
        self.domain_tenant: Callable[[str], str] | None = None

    def identify(self, context: grpc.ServicerContext, *, tenant: bool = True) -> Caller:
        """Who is calling (refused: UNAUTHENTICATED or PERMISSION_DENIED with the reason).
        ``tenant``: the caller must be some tenant (every service but the Peer service)."""
        caller = self._resolve(context)
        if tenant and not caller.tenant:
            raise ProtocolError(
                "PERMISSION_DENIED", f"{caller.how} is a peer daemon, not a tenant of this daemon"
            )
        return caller

    def _resolve(self, context: grpc.ServicerContext) -> Caller:
        peer = context.peer()
        if peer.startswith("unix:"):
            credential = dict(context.invocation_metadata()).get(CREDENTIAL_KEY)
            if not credential:
                raise ProtocolError(
                    "UNAUTHENTICATED",
                    "unix caller sent no credential (fetch one from the daemon's "
                    "<socket>.ident socket; crane's clients do)",
                )
            try:
                ids = self.signer.verify(credential)
            except (ValueError, KeyError, TypeError) as e:
                raise ProtocolError("UNAUTHENTICATED", f"unix caller refused: {e}") from None
            found = from_unix(ids, self.tenants, self.euid)
        else:
            auth = context.auth_context()
            if auth.get("transport_security_type") == [b"ssl"]:
                cn = b"".join(auth.get("x509_common_name", [])).decode(errors="replace")
                sans = [s.decode(errors="replace") for s in auth.get(_SAN, [])]
                found = from_cert(cn, sans, self.tenants, self.peers, self.domain_tenant)
            elif self.insecure_tcp:
                return Caller(INSECURE_TCP_TENANT, True, f"insecure tcp {peer}", peer=True)
            else:
                raise ProtocolError("UNAUTHENTICATED", f"{peer} presented no certificate")
        if isinstance(found, str):
            raise ProtocolError("PERMISSION_DENIED", found)
        return found

    def operator(self, context: grpc.ServicerContext, what: str) -> Caller:
        """The caller, who must be an operator to do ``what``."""
        caller = self.identify(context)
        if not caller.operator:
            raise ProtocolError(
                "PERMISSION_DENIED", f"{what} needs the operator role; {caller} is not one"
            )
        return caller

    def peer(self, context: grpc.ServicerContext, what: str) -> Caller:
        """The caller, who must be a peer daemon: a certificate named in ``peers``, or an
        operator on a unix socket (a daemon on the same host)."""
        try:
            caller = self.identify(context, tenant=False)
        except ProtocolError as e:
            if e.status != "PERMISSION_DENIED":
                raise
            why = f"{what} is for peer daemons; {e.message}"
            raise ProtocolError("PERMISSION_DENIED", why) from None
        if not (caller.peer or (caller.unix and caller.operator)):
            raise ProtocolError(
                "PERMISSION_DENIED", f"{what} is for peer daemons; {caller} is not one here"
            )
        return caller


def may_use(caller: Caller, owner: str, sid: str, domain: str = "") -> None:
    """Refuse ``caller`` acting on session ``sid`` of tenant ``owner`` (and of libvirt domain
    ``domain``, "" for none) unless it is that tenant's and that domain's, or an operator (the
    resume token alone is not enough: a VM's guest cannot take another VM's session)."""
    if caller.operator:
        return
    if caller.domain != domain:
        theirs = f"domain {domain}" if domain else "no domain (a host process's)"
        ours = f"domain {caller.domain}" if caller.domain else "no domain"
        raise ProtocolError(
            "PERMISSION_DENIED",
            f"session {sid} belongs to {theirs}; {caller} is of {ours}",
        )
    if caller.tenant != owner:
        raise ProtocolError(
            "PERMISSION_DENIED", f"session {sid} belongs to another tenant than {caller}"
        )
