"""The unix-socket ident handshake, daemon side: peer credentials turned into a signed
credential a caller presents with its gRPC calls.

Why: grpcio does not tell a server who is at the other end of a unix socket (``context.peer()``
is ``"unix:"``; ``auth_context()`` has no uid, with ``local_server_credentials`` neither). So
next to each unix listener craned serves ``<socket>.ident``, a plain ``AF_UNIX`` stream socket:
each connection's ``SO_PEERCRED`` (pid, uid, gid, read by the kernel at ``connect``, which a
caller cannot forge), plus the supplementary groups from ``/proc/<pid>/status``, are signed with
an HMAC key made at start (memory only: a credential dies with the daemon) and sent back with
an expiry. The client (:mod:`crane.wire.ident`) sends it as metadata on the unix socket's calls
and :class:`~crane.daemon.callers.Callers` verifies it; which tenant those ids are is decided
there, per call, from the configuration.

One thread accepts and answers (one short write per connection, a send time-out): nothing a
caller does on this socket can block the daemon.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CREDENTIAL_TTL_S", "IdentServer", "Signer", "UnixIds"]

log = logging.getLogger("craned")

#: A credential's lifetime; clients fetch a new one before it ends.
CREDENTIAL_TTL_S = 3600.0
_TAG = 32  # bytes of HMAC-SHA256
_SEND_TIMEOUT_S = 1.0
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class UnixIds:
    """Who connected to a unix socket, as the kernel saw it."""

    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


class Signer:
    """Issues and verifies credentials with a key that lives only in this process."""

    def __init__(self, ttl_s: float = CREDENTIAL_TTL_S) -> None:
        self._key = secrets.token_bytes(32)
        self.ttl_s = ttl_s

    def _tag(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()

    def issue(self, ids: UnixIds, now: float | None = None) -> bytes:
        exp = (time.time() if now is None else now) + self.ttl_s
        body = {"pid": ids.pid, "uid": ids.uid, "gid": ids.gid, "groups": list(ids.groups)}
        payload = json.dumps({**body, "exp": exp}, separators=(",", ":")).encode()
        return payload + self._tag(payload)

    def verify(self, credential: bytes, now: float | None = None) -> UnixIds:
        """The ids a credential vouches for; ``ValueError`` says why it is not accepted."""
        payload, tag = credential[:-_TAG], credential[-_TAG:]
        if len(credential) <= _TAG or not hmac.compare_digest(tag, self._tag(payload)):
            raise ValueError("its credential is not one this daemon issued (daemon restarted?)")
        body = json.loads(payload)
        if float(body["exp"]) < (time.time() if now is None else now):
            raise ValueError("its credential expired")
        groups = tuple(int(g) for g in body["groups"])
        return UnixIds(int(body["pid"]), int(body["uid"]), int(body["gid"]), groups)


def supplementary_groups(pid: int) -> tuple[int, ...]:
    """The ``Groups:`` of ``/proc/<pid>/status`` (empty when the process is gone already)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return tuple(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()


class IdentServer:
    """Serves credentials on ``path`` (mode 0666, like the gRPC socket beside it: who may
    reach them is the directory's business, what each caller may do the daemon's)."""

    def __init__(self, path: Path, signer: Signer) -> None:
        if len(str(path).encode()) > 107:  # sun_path holds 108 bytes with the NUL
            raise OSError(f"ident socket path too long for a unix socket: {path}")
        self.path = path
        self.signer = signer
        path.unlink(missing_ok=True)  # a stale one from a previous run
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        os.chmod(path, 0o666)
        self._sock.listen(128)
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name="ident", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stopped:
                    return
                time.sleep(0.01)  # e.g. out of descriptors: do not spin
                continue
            with conn:
                try:
                    self._answer(conn)
                except OSError as e:
                    log.debug("ident: answering a caller failed: %s", e)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(_SEND_TIMEOUT_S)
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        pid, uid, gid = _PEERCRED.unpack(raw)
        ids = UnixIds(pid, uid, gid, supplementary_groups(pid))
        credential = base64.b64encode(self.signer.issue(ids)).decode()
        reply = {"credential": credential, "expires_in": self.signer.ttl_s}
        conn.sendall(json.dumps(reply).encode() + b"\n")

    def close(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self.path.unlink(missing_ok=True)
