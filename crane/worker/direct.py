"""The worker's own call-stream endpoint: guests on the same host skip the daemon's relay.

The daemon offers each session's worker socket in OpenSessionReply.direct_address; a guest that
can reach it (same host, same filesystem view) carries its call stream straight to the process
that executes it, so a synchronizing call costs one gRPC round trip and nothing more, and bulk
copies are not copied through the daemon. Guests that cannot reach it (a VM behind one forwarded
port, a remote host) use the daemon's address and its relay; both paths run the same engine.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc

from crane.api.errors import ProtocolError
from crane.host.diagnostics import DiagnosticsServicer, diagnostics_handler
from crane.host.stats import MODE_DIRECT
from crane.wire.address import CHANNEL_OPTIONS
from crane.wire.handlers import stream_stream
from crane.worker.attach import SessionParked, WorkerSession

__all__ = ["own_socket", "start_direct_server", "start_tcp_server"]

log = logging.getLogger("crane.worker")


def _calls(
    session_id: str,
    token: bytes,
    ws: WorkerSession,
    on_end: Callable[[], None],
    check: Callable[[grpc.ServicerContext], None] | None = None,
) -> Callable[[Iterator[bytes], grpc.ServicerContext], Iterator[bytes]]:
    """The session's ``Calls`` handler; ``check`` refuses a caller (a ProtocolError) before
    the token is even looked at (the TCP endpoint's certificate rules)."""

    def Calls(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        if check is not None:
            try:
                check(context)
            except ProtocolError as e:
                log.warning("refused a guest at this worker's endpoint (%s): %s", context.peer(), e)
                raise
        md = dict(context.invocation_metadata())
        if md.get("crane-session") != session_id or not secrets.compare_digest(
            md.get("crane-token-bin", b""), token
        ):
            log.warning(
                "refused a guest at this worker's endpoint (%s): wrong token", context.peer()
            )
            raise ProtocolError("PERMISSION_DENIED", "wrong session or resume token")
        if not ws.attach(MODE_DIRECT, f"direct {context.peer()}"):
            raise ProtocolError(
                "FAILED_PRECONDITION", f"session {session_id} already has a call stream"
            )
        log.info("guest attached directly (%s)", context.peer())
        try:
            for raw in requests:
                try:
                    msgs = ws.run(raw)
                except SessionParked:
                    raise ProtocolError("UNAVAILABLE", f"session {session_id} is parked") from None
                yield from msgs
                if ws.engine.device.closed:
                    return
        finally:
            # A parked (or migrated) session's worker must live until the daemon has its
            # answer and releases it; ending here would race the reply on the channel.
            if not ws.parked:
                on_end()

    return Calls


def start_direct_server(
    path: str,
    session_id: str,
    token: bytes,
    ws: WorkerSession,
    on_end: Callable[[], None],
    owner_uid: int = -1,
) -> grpc.Server:
    """Serve ``crane.v1.Guest/Calls`` for this one session on ``unix:path``, which only this
    process's user and ``owner_uid`` (the session's opener, -1: none) may connect to: the
    daemon checked the opener's tenant, the token alone must not let another user in."""
    Calls = _calls(session_id, token, ws, on_end)
    server = grpc.server(
        ThreadPoolExecutor(max_workers=2, thread_name_prefix="direct"), options=CHANNEL_OPTIONS
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler("crane.v1.Guest", {"Calls": stream_stream(Calls)}),
            diagnostics_handler(DiagnosticsServicer()),
        )
    )
    server.add_insecure_port(f"unix:{path}")
    server.start()
    own_socket(path, owner_uid)
    return server


def own_socket(path: str, owner_uid: int) -> None:
    """Let only this process's user and ``owner_uid`` (-1: nobody else) connect to ``path``."""
    os.chmod(path, 0o600)
    if owner_uid >= 0 and owner_uid != os.geteuid():
        try:
            os.chown(path, owner_uid, -1)
        except OSError as e:  # a daemon not running as root: its own user's guests only
            log.warning("worker socket %s stays this user's: %s", path, e)


def start_tcp_server(
    address: str,
    session_id: str,
    token: bytes,
    ws: WorkerSession,
    on_end: Callable[[], None],
    credentials: grpc.ServerCredentials | None,
    check: Callable[[grpc.ServicerContext], None],
) -> grpc.Server | None:
    """Serve ``crane.v1.Guest/Calls`` for this one session on TCP ``address`` (HOST:PORT the
    daemon allocated) for remote guests: mutual TLS with ``credentials`` (None: plain TCP, a
    daemon under ``insecure_tcp``), every stream's caller passed through ``check`` (the
    daemon's own certificate rules and tenancy, crane.daemon.worker_tcp). Only the call
    stream: no diagnostics here. None (logged) when the port cannot be bound: the guest
    finds it unreachable and uses the relay."""
    server = grpc.server(
        ThreadPoolExecutor(max_workers=2, thread_name_prefix="direct-tcp"),
        # never share a port with another listener: a second worker on it would steal calls
        options=[*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)],
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "crane.v1.Guest",
                {"Calls": stream_stream(_calls(session_id, token, ws, on_end, check))},
            ),
        )
    )
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as e:  # grpcio raises where older versions returned 0
        log.warning(
            "cannot listen on %s (%s); the session's remote guest uses the relay", address, e
        )
        return None
    if port == 0:
        log.warning("cannot listen on %s; the session's remote guest uses the relay", address)
        return None
    server.start()
    log.info("serving the session's remote guest on tcp %s", address)
    return server
