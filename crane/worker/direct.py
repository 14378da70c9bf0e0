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

__all__ = ["start_direct_server"]

log = logging.getLogger("crane.worker")


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

    def Calls(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        md = dict(context.invocation_metadata())
        if md.get("crane-session") != session_id or not secrets.compare_digest(
            md.get("crane-token-bin", b""), token
        ):
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
    os.chmod(path, 0o600)
    if owner_uid >= 0 and owner_uid != os.geteuid():
        try:
            os.chown(path, owner_uid, -1)
        except OSError as e:  # a daemon not running as root: its own user's guests only
            log.warning("direct socket %s stays this user's: %s", path, e)
    return server
