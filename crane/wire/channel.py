"""The one way Crane's clients open a channel to a daemon: identified on unix sockets, mutual
TLS on TCP.

* ``unix://`` addresses: every call carries this process's credential from the daemon's ident
  socket (:mod:`crane.wire.ident`) as metadata, added when the call starts (a stream carries it
  once, at its opening: the calls on a guest's stream pay nothing). Fetched on first use and
  again shortly before it expires.
* ``tcp://`` addresses: TLS with a client certificate when one is configured (``tls`` here, or
  ``$CRANE_TLS_CERT``/``$CRANE_TLS_KEY``/``$CRANE_TLS_CA``), verifying the daemon's certificate
  against that CA; plain TCP otherwise, which only a daemon started with ``insecure_tcp``
  accepts.
* ``vm://`` addresses (a VM's guest): plain HTTP/2 over TCP, no TLS, no ident: the host side
  of the connection is the VM's forward to its domain socket (QEMU ``guestfwd``, or the vsock
  bridge), and that socket says who the guest is; the guest could vouch for nothing itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from crane.wire.address import CHANNEL_OPTIONS, VM_CHANNEL_OPTIONS, is_vm, to_grpc_target
from crane.wire.ident import CREDENTIAL_KEY, IdentError, credential_for, ident_path

__all__ = ["TlsFiles", "open_channel"]

log = logging.getLogger("crane.wire")

ENV_CERT, ENV_KEY, ENV_CA = "CRANE_TLS_CERT", "CRANE_TLS_KEY", "CRANE_TLS_CA"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS client: its certificate and key (presented to the daemon) and the CA
    the daemon's certificate must chain to ("": the system's roots)."""

    cert: str = ""
    key: str = ""
    ca: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("a TLS client certificate needs its key, and a key its certificate")

    def __bool__(self) -> bool:
        return bool(self.cert or self.ca)

    @classmethod
    def from_env(cls) -> TlsFiles:
        """From ``$CRANE_TLS_CERT``, ``$CRANE_TLS_KEY`` and ``$CRANE_TLS_CA`` (empty: none)."""
        env = os.environ
        return cls(env.get(ENV_CERT, ""), env.get(ENV_KEY, ""), env.get(ENV_CA, ""))

    def env(self) -> dict[str, str]:
        """The environment variables that say the same (for a child process)."""
        pairs = ((ENV_CERT, self.cert), (ENV_KEY, self.key), (ENV_CA, self.ca))
        return {k: str(Path(v).resolve()) for k, v in pairs if v}

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))


def open_channel(
    address: str,
    tls: TlsFiles | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A channel to the daemon at ``address`` that identifies this process as it requires;
    ``tls`` None: from the environment; ``options`` go after :data:`CHANNEL_OPTIONS`."""
    target = to_grpc_target(address)
    opts = [*CHANNEL_OPTIONS, *options]
    if is_vm(address):
        return grpc.insecure_channel(
            target, options=[*CHANNEL_OPTIONS, *VM_CHANNEL_OPTIONS, *options]
        )
    if target.startswith("unix:"):
        ch = grpc.insecure_channel(target, options=opts)
        return grpc.intercept_channel(ch, _Identify(ident_path(target[len("unix:") :])))
    tls = tls if tls is not None else TlsFiles.from_env()
    if tls:
        return grpc.secure_channel(target, tls.credentials(), options=opts)
    return grpc.insecure_channel(target, options=opts)


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _Identify(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the credential to each call as it starts. Without one (the ident socket is
    unreachable: the daemon is down, or refused) the call goes out bare, so it fails as the
    daemon answers: unavailable when it is down, unauthenticated with the reason otherwise."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _details(self, d: Any) -> _Details:
        md = list(d.metadata or ())
        try:
            md.append((CREDENTIAL_KEY, credential_for(self.path)))
        except IdentError as e:
            log.debug("%s", e)
        return _Details(d.method, d.timeout, md, d.credentials, d.wait_for_ready, d.compression)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)
