"""The guest side of the vsock path: ``crane vsock-bridge --port P``.

Inside a VM whose host has vhost-vsock, the guest reaches the host at CID 2
(``VMADDR_CID_HOST``); gRPC's wheel cannot dial vsock, so this bridge listens on a loopback TCP
port in the guest and splices each connection to ``AF_VSOCK`` (CID 2, port P), where craned's
vsock listener (:mod:`crane.daemon.vsock`) identifies the VM by its CID. The guest's programs
use ``CRANE_DAEMON=vm://127.0.0.1:LOCAL_PORT``. Nothing the guest sends says who it is; a
connection reset by a migration resets the bridged connection too, and the guest's resume
dials the bridge again, which dials the host anew (the VM may have another CID there; the host
resolves it again).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable

from crane.wire.splice import splice

__all__ = ["HOST_CID", "VsockBridge", "dial_vsock"]

log = logging.getLogger("crane.vsock")

#: The host, as a guest addresses it over vsock (``VMADDR_CID_HOST``).
HOST_CID = 2


def dial_vsock(port: int, cid: int = HOST_CID, timeout: float = 10.0) -> socket.socket:
    """A connected ``AF_VSOCK`` stream socket to ``cid``:``port`` (OSError says why not)."""
    family = getattr(socket, "AF_VSOCK", None)
    if family is None:
        raise OSError("this Python has no AF_VSOCK (Linux only)")
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect((cid, port))
        s.settimeout(None)
    except OSError:
        s.close()
        raise
    return s


class VsockBridge:
    """Listens on ``listen`` (host, port) and splices each connection to ``dial()``'s socket
    (by default vsock CID 2 at ``port``)."""

    def __init__(
        self,
        port: int,
        listen: tuple[str, int] = ("127.0.0.1", 7000),
        dial: Callable[[], socket.socket] | None = None,
    ) -> None:
        self.dial = dial or (lambda: dial_vsock(port))
        self.target = f"vsock cid {HOST_CID} port {port}" if dial is None else "its upstream"
        self._sock = socket.create_server(listen)
        self.address = self._sock.getsockname()[:2]
        self._stopped = threading.Event()

    def serve_forever(self) -> None:
        log.info("vsock bridge: %s:%d -> %s", *self.address, self.target)
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                raise
            threading.Thread(target=self._bridge, args=(conn,), daemon=True).start()

    def start(self) -> VsockBridge:
        """Serve on a thread of its own (tests, embedding)."""
        threading.Thread(target=self.serve_forever, name="vsock-bridge", daemon=True).start()
        return self

    def _bridge(self, conn: socket.socket) -> None:
        try:
            up = self.dial()
        except OSError as e:
            log.warning("vsock bridge: cannot reach %s: %s", self.target, e)
            conn.close()
            return
        splice(conn, up)

    def close(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
