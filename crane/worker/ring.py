"""The worker's call ring endpoint: guests on this host send batches through shared memory.

Beside the direct gRPC socket (:mod:`crane.worker.direct`) the worker listens on
``<direct>.ring``. A guest that connects and names the session and its token, as the direct
stream's metadata does, gets a memfd holding two rings (:mod:`crane.wire.ring`) and the socket
stays open as the sign of life. A drain thread then takes batches from the request ring back to
back and runs each through :meth:`WorkerSession.run`, the same lock, engine and accounting the
gRPC stream uses, so ordering, errors, ``done_seq`` and parking behave identically; the reply
messages (the same ``ReplyBatch`` bytes) go to the reply ring. A parked session answers with an
``UNAVAILABLE`` end, which the guest takes as the gRPC path's ``UNAVAILABLE``: it resumes.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import secrets
import socket
import struct
import threading
from collections.abc import Callable

from crane.host.stats import MODE_RING
from crane.wire import ring as wring
from crane.worker.attach import NotAllowed, SessionParked, WorkerSession
from crane.worker.direct import own_socket
from crane.worker.ring_bulk import WorkerBulk, offer_bulk

__all__ = ["RingServer", "start_ring_server"]

log = logging.getLogger("crane.worker")


class RingServer:
    """The handshake listener and, once a guest attached, its drain thread."""

    def __init__(
        self,
        path: str,
        session_id: str,
        token: bytes,
        ws: WorkerSession,
        on_end: Callable[[], None],
        owner_uid: int,
        cap: int,
    ) -> None:
        self.path = path
        self.session_id = session_id
        self._token = token
        self._ws = ws
        self._on_end = on_end
        self._owner_uid = owner_uid
        self._cap = cap
        self._stopped = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        own_socket(path, owner_uid)
        self._sock.listen(4)
        self._conns: list[socket.socket] = []
        self._accept = threading.Thread(target=self._accept_loop, name="ring-accept", daemon=True)
        self._accept.start()

    # ---- handshake -------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            try:
                self._handshake(conn)
            except (OSError, wring.RingRefused) as e:
                log.info("call ring handshake refused: %s", e)
                _refuse(conn, "INVALID_ARGUMENT", str(e))

    def _handshake(self, conn: socket.socket) -> None:
        pid, uid, _ = struct.unpack(
            "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        )
        if uid not in (os.geteuid(), self._owner_uid, 0):
            _refuse(conn, "PERMISSION_DENIED", f"uid {uid} may not attach to this session")
            return
        hello = wring.accept_hello(conn)
        token = hello.get("token", "")
        if hello.get("session") != self.session_id or not (
            isinstance(token, str)
            and secrets.compare_digest(token.encode(), self._token.hex().encode())
        ):
            _refuse(conn, "PERMISSION_DENIED", "wrong session or resume token")
            return
        peer = f"ring pid {pid}"
        if not self._ws.attach(MODE_RING, peer):
            _refuse(
                conn,
                "FAILED_PRECONDITION",
                f"session {self.session_id} already has a call stream",
            )
            return
        fd = wring.Ring.create(self._cap)
        bulk = offer_bulk(self._ws.engine, lambda: wring.peer_alive(conn))  # large copies
        try:
            ring = wring.Ring(fd, wring.REPLIES, lambda: wring.peer_alive(conn))
            conn.settimeout(None)
            extra = [bulk.fd] if bulk is not None else []
            socket.send_fds(conn, [f"OK {self._cap}\n".encode()], [fd, *extra])
        except BaseException:
            if bulk is not None:
                bulk.end()
            raise
        finally:
            os.close(fd)
        if bulk is not None:
            bulk.sent()
        self._conns.append(conn)
        log.info("guest attached through the call ring (%s)", peer)
        threading.Thread(
            target=self._drain, args=(ring, conn, bulk), name="ring-drain", daemon=True
        ).start()

    # ---- the drain -------------------------------------------------------------------------
    def _drain(self, ring: wring.Ring, conn: socket.socket, bulk: WorkerBulk | None) -> None:
        """Run the guest's batches as they come, each one's replies back on the ring."""
        ws = self._ws
        replies = _Replies(ring)
        try:
            while True:
                try:
                    raw = ring.recv()
                except wring.RingClosed:
                    log.info("the guest's call ring closed")
                    return
                try:
                    msgs = ws.run(raw)
                except SessionParked:
                    _end(ring, replies, "UNAVAILABLE", f"session {self.session_id} is parked")
                    return
                except NotAllowed as e:
                    _end(ring, replies, "FAILED_PRECONDITION", str(e))
                    return
                replies.put(msgs)
                if ws.engine.device.closed:
                    _end(ring, replies, "", "the session closed")
                    return
        except wring.RingClosed:
            log.info("the guest's call ring closed while replies were due")
        except Exception:
            log.exception("call ring drain failed")
            with contextlib.suppress(wring.RingClosed):
                ring.end("INTERNAL", "the worker's call ring failed")
        finally:
            if bulk is not None:  # a guest thread streaming into it stops (and resends)
                bulk.end()
            replies.stop()
            # as on the direct stream: a parked (or migrated) session's worker lives until the
            # daemon has its answer and releases it
            if not ws.parked:
                self._on_end()
            ring.close()
            conn.close()

    def stop(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class _Replies:
    """Reply messages onto the ring. Written at once when the queue is empty (the common case:
    no thread hand-off on a synchronizing call's path); a guest that does not read while its
    replies pile up (async errors) must not block the drain, so a writer thread takes over
    until the backlog is gone."""

    def __init__(self, ring: wring.Ring) -> None:
        self._ring = ring
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._backlog: collections.deque[bytes] = collections.deque()
        self._writer: threading.Thread | None = None
        self._stopped = False
        self._error: wring.RingClosed | None = None

    def put(self, msgs: list[bytes]) -> None:
        if not msgs:
            return
        # the common case, without the lock: only this (the drain) thread adds to the backlog,
        # and the writer thread writes only what it finds there, so with the backlog empty
        # this thread is the ring's one writer
        if (
            len(msgs) == 1
            and not self._backlog
            and self._error is None
            and self._ring.try_send(msgs[0])
        ):
            return
        with self._lock:
            if self._error is not None:
                raise self._error
            if not self._backlog and self._try_now(msgs):
                return
            self._backlog.extend(msgs)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, daemon=True)
                self._writer.start()
            self._cv.notify()

    def _try_now(self, msgs: list[bytes]) -> bool:
        """Write every message that fits without waiting; the rest go to the backlog."""
        for i, m in enumerate(msgs):
            if len(m) > self._ring.piece or not self._ring.try_send(m):
                self._backlog.extend(msgs[i:])
                return False
        return True

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                while not self._backlog and not self._stopped:
                    self._cv.wait()
                if not self._backlog:
                    return
                m = self._backlog[0]
            try:
                self._ring.send(m)
            except wring.RingClosed as e:
                with self._lock:
                    self._error = e
                    self._backlog.clear()
                    self._cv.notify_all()
                return
            with self._lock:
                self._backlog.popleft()
                self._cv.notify_all()

    def flush(self) -> None:
        """Wait until the backlog is written (the session's last replies before its end)."""
        with self._lock:
            while self._backlog and self._error is None:
                self._cv.wait(0.1)
            if self._error is not None:
                raise self._error

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._cv.notify_all()


def _end(ring: wring.Ring, replies: _Replies, code: str, message: str) -> None:
    """The stream's end, after every reply before it (one writer on the ring at a time)."""
    with contextlib.suppress(wring.RingClosed):
        replies.flush()
        ring.end(code, message)


def _refuse(conn: socket.socket, code: str, message: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(f"ERR {code} {message}\n".encode())
    conn.close()


def start_ring_server(
    path: str,
    session_id: str,
    token: bytes,
    ws: WorkerSession,
    on_end: Callable[[], None],
    owner_uid: int = -1,
    cap: int = wring.DEFAULT_CAP,
) -> RingServer | None:
    """Listen for ring handshakes on ``path``; None (guests use the gRPC socket) when the ring
    cannot be offered here, with the reason logged once."""
    why = wring.available()
    if why:
        log.info("no call ring for session %s: %s", session_id, why)
        return None
    try:
        return RingServer(path, session_id, token, ws, on_end, owner_uid, cap)
    except OSError as e:
        log.warning("no call ring for session %s: %s: %s", session_id, path, e)
        return None
