"""The unix-socket ident handshake, client side: who this process is, vouched for by craned.

grpcio does not expose a unix-socket peer's credentials to the server (``context.peer()`` is
just ``"unix:"``, ``auth_context()`` has no uid), so craned serves a small plain stream socket
next to each unix listener (``<socket>.ident``). Connecting to it is the whole request: craned
reads the connection's ``SO_PEERCRED`` (pid, uid, gid), answers one JSON line with a short-lived
credential it signed (:data:`CREDENTIAL_KEY` carries it on every call over the unix socket) and
closes. The credential is opaque here; only its lifetime matters, to fetch a new one in time.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from dataclasses import dataclass

__all__ = [
    "CREDENTIAL_KEY",
    "IDENT_SUFFIX",
    "IdentError",
    "credential_for",
    "fetch",
    "ident_path",
]

#: gRPC metadata key of the credential (binary: ``-bin``).
CREDENTIAL_KEY = "crane-credential-bin"
#: The ident socket's path is the unix listener's path plus this.
IDENT_SUFFIX = ".ident"
#: Longest answer the daemon sends (a credential is ~200 bytes).
MAX_REPLY = 64 << 10
#: Fetch a new credential when less than this fraction of its lifetime is left.
REFRESH_LEFT = 0.25
TIMEOUT_S = 5.0


class IdentError(Exception):
    """No credential: the ident socket is unreachable or refused (the message says why)."""


def ident_path(socket_path: str) -> str:
    """The ident socket served next to the unix listener at ``socket_path``."""
    return socket_path + IDENT_SUFFIX


def fetch(path: str, timeout: float = TIMEOUT_S) -> tuple[bytes, float]:
    """A fresh credential from the ident socket at ``path`` and its lifetime in seconds."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            data = b""
            while len(data) < MAX_REPLY:
                part = s.recv(4096)
                if not part:
                    break
                data += part
    except OSError as e:
        raise IdentError(f"cannot reach the daemon's ident socket {path}: {e}") from None
    try:
        reply = json.loads(data)
        if "error" in reply:
            raise IdentError(f"the daemon refused to identify this process: {reply['error']}")
        return base64.b64decode(reply["credential"]), float(reply["expires_in"])
    except (ValueError, KeyError, TypeError) as e:
        raise IdentError(f"malformed answer from the ident socket {path}: {e!r}") from None


@dataclass
class _Held:
    credential: bytes
    refresh_at: float  # time.monotonic()
    socket_id: tuple[int, int, int]  # the ident socket it came from (a restart makes a new one)


_held: dict[str, _Held] = {}
_lock = threading.Lock()


def credential_for(path: str) -> bytes:
    """This process's credential for the daemon whose ident socket is ``path``: the one held,
    or a new one when it is near its expiry or the socket is not the one it came from (a
    restarted daemon signs with a new key). One per daemon for the whole process."""
    now = time.monotonic()
    try:
        st = os.stat(path)
    except OSError as e:
        raise IdentError(f"cannot reach the daemon's ident socket {path}: {e}") from None
    socket_id = (st.st_dev, st.st_ino, st.st_ctime_ns)
    with _lock:
        held = _held.get(path)
        if held is not None and now < held.refresh_at and held.socket_id == socket_id:
            return held.credential
    credential, lifetime = fetch(path)
    with _lock:
        _held[path] = _Held(credential, now + lifetime * (1 - REFRESH_LEFT), socket_id)
    return credential
