"""The daemons' side of live migration: the source's watcher and the destination's receiver.

Source: ``migrate_out`` moves the session to ``migrating``, tells its worker to migrate (the
worker streams to the destination itself) and watches the worker's progress file, woken by a
byte the worker writes to a FIFO after each update (the switchover is on the guest's clock: a
poll interval would add to every downtime). Done: the session becomes ``migrated`` (a tombstone
answers the guest's ``Resume`` with a redirect) and its worker is released. Failed: back to the
state it had, the guest never noticed. The downtime reported is the guest's: from the moment the
worker stopped the session to the moment this daemon can redirect the guest to the destination
(which acknowledged the final round, so it is ready to serve it).

Destination: ``preflight`` answers every reason it cannot take the session; ``transfer`` relays
each round to a worker it starts for the session (a fresh one for every fresh round) and
acknowledges each applied round; the session joins the daemon's table, ``ready``, only with the
final round's acknowledgement. A stream that ends earlier stops that worker: nothing is left.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from crane.daemon.errors import DaemonError
from crane.daemon.sessions import Session, SessionManager, adopt_record
from crane.device.layout import WINDOW_SLOTS, window_base
from crane.state.preflight import check_code, refusals
from crane.v1 import peer_pb2
from crane.wire.fingerprint import fingerprint
from crane.worker.channel import ChannelClosed, Tag

__all__ = [
    "abort_incoming",
    "changes",
    "migrate_out",
    "preflight",
    "transfer",
    "wait_switchover",
]

log = logging.getLogger("craned")

#: How often the watcher looks at the worker without being woken (its exit; a lost wake-up).
POLL_S = 0.05
#: Scheduling priority of a migrated session's worker while it exits (see :func:`_settle`).
RELEASE_NICE = 10
#: Longest a guest's Resume waits for a switchover in progress before it is told to retry.
SWITCHOVER_WAIT_S = 10.0
#: Test-only: seconds the destination sleeps between committing an incoming session and sending
#: the final acknowledgement. Why: the switchover window is a few milliseconds, too short to kill
#: a daemon inside it deterministically; fault tests widen it with this variable and wait for the
#: log line below. Never set in production (unset or 0: no delay).
TEST_DELAY_FINAL_ACK_ENV = "CRANE_TEST_DELAY_FINAL_ACK_S"


class Changes:
    """A counter bumped on every migration update, for waiters (progress streams, resumes)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.version = 0

    def bump(self) -> None:
        with self.cond:
            self.version += 1
            self.cond.notify_all()

    def wait(self, seen: int, timeout: float) -> int:
        """Block until the counter differs from ``seen`` (or ``timeout``); its value."""
        with self.cond:
            self.cond.wait_for(lambda: self.version != seen, timeout)
            return self.version


changes = Changes()


def wait_switchover(mgr: SessionManager, sid: str, timeout: float = SWITCHOVER_WAIT_S) -> bool:
    """Wait while ``sid`` is stopped for its switchover (the guest's Resume comes moments before
    the worker's "done" reaches us); True if there was one to wait for."""
    deadline = time.monotonic() + timeout
    waited = False
    seen = changes.version
    while True:
        with mgr._lock:
            s = mgr._sessions.get(sid)
        phase = s.migration.get("phase") if s is not None and s.state == "migrating" else None
        if phase not in ("stopping", "done"):
            return waited
        left = deadline - time.monotonic()
        if left <= 0:
            return waited
        waited = True
        seen = changes.wait(seen, min(left, POLL_S))


# ---- source --------------------------------------------------------------------------------
def migrate_out(
    mgr: SessionManager, sid: str, to: str, device: int, max_rounds: int, stop_bytes: int
) -> Session:
    """Start moving ``sid`` to ``to``; progress lands in ``session.migration``."""
    session = mgr.get(sid)
    with mgr._lock:
        session.require("ready", "running")
        before = session.state
        session.state = "migrating"
        session.location = f"-> {to}"
        session.migration = {"phase": "preflight"}
    progress = session.stats_path.with_suffix(".migrate")
    progress.unlink(missing_ok=True)
    wake = _Wake(session.stats_path.with_suffix(".migrate-wake"))
    identity = session.record()  # id, token, window; what the guest was told (told, device)
    req = {
        "to": to,
        "device": device,
        "max_rounds": max_rounds,
        "stop_bytes": stop_bytes,
        "identity": identity,
        "wake": str(wake.path) if wake.path else "",
    }
    try:
        with session.channel_lock:
            session.worker.channel.send(Tag.MIGRATE, json.dumps(req).encode())
    except ChannelClosed as e:
        wake.close()
        _settle(mgr, session, before, {"phase": "failed", "error": f"worker gone: {e}"})
        return session
    threading.Thread(
        target=_watch,
        args=(mgr, session, before, progress, wake),
        name=f"migrate-{sid}",
        daemon=True,
    ).start()
    return session


class _Wake:
    """A FIFO the worker writes a byte to after each progress update; the watcher sleeps on it.

    The watcher holds a write end too, so the FIFO never reads as closed while the worker has
    it shut between updates. Without a FIFO (the file system refuses one) the watcher polls."""

    def __init__(self, path: Path) -> None:
        self.path: Path | None = path
        self.rfd = self.wfd = -1
        try:
            path.unlink(missing_ok=True)
            os.mkfifo(path, 0o600)
            self.rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            self.wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            log.warning("no wake-up FIFO at %s (%s); polling the migration's progress", path, e)
            self.close()

    def wait(self, timeout: float) -> None:
        if self.rfd < 0:
            time.sleep(timeout)
            return
        if select.select([self.rfd], [], [], timeout)[0]:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.rfd, 4096):
                    pass

    def close(self) -> None:
        for fd in (self.rfd, self.wfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.rfd = self.wfd = -1
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _watch(mgr: SessionManager, session: Session, before: str, path: Path, wake: _Wake) -> None:
    try:
        while True:
            st = _read(path)
            exited = session.worker.proc.poll() is not None
            if exited:
                st = _read(path) or st
            if st is not None:
                if st.get("phase") in ("done", "failed"):
                    break
                session.migration = {**session.migration, **st}
                changes.bump()
            if exited:
                st = {
                    "phase": "failed",
                    "error": "the session's worker exited during the migration",
                }
                break
            wake.wait(POLL_S)
    finally:
        wake.close()
    path.unlink(missing_ok=True)
    _settle(mgr, session, before, st)


def _settle(mgr: SessionManager, session: Session, before: str, st: dict[str, Any]) -> None:
    to = session.location.removeprefix("-> ")
    if st.get("phase") == "done":
        if "stopped_at" in st:  # the guest's downtime ends now: it can be redirected
            st = {**st, "switchover": st.get("downtime"), "downtime": _since(st["stopped_at"])}
        if "started_at" in st:
            st["total"] = _since(st["started_at"])
        released = _releasing_now(session.id)  # before the session can be moved back here
        with mgr._lock:
            session.migration = {**session.migration, **st}
            session.state = "migrated"
            session.location = f"moved to {to}"
            mgr.remember_moved(session, to)  # redirects its guest for moved_ttl_s
            if mgr._sessions.get(session.id) is session:
                mgr._sessions.pop(session.id)
        changes.bump()
        log.info(
            "session %s migrated to %s: downtime %.1f ms (destination acknowledged after "
            "%.1f ms); releasing its worker",
            session.id,
            to,
            1e3 * float(st.get("downtime") or 0),
            1e3 * float(st.get("switchover") or 0),
        )
        # Freeing the worker's memory (all of the session's pages) takes the kernel a while
        # (~80 ms per GiB here), just when the guest reconnects to the destination and the
        # destination takes its first calls: let it yield to them.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, session.worker.proc.pid, RELEASE_NICE)
        _release(mgr, session, released)
        return
    session.migration = {**session.migration, **st}
    log.warning("migration of session %s to %s failed: %s", session.id, to, st.get("error"))
    with mgr._lock:
        session.location = ""
        if session.state == "migrating":
            session.state = before
    changes.bump()
    if session.worker.proc.poll() is not None:
        mgr.close(session, "worker exited during a migration")


_releasing: dict[str, threading.Event] = {}  # session id -> set once its worker is released
_releasing_lock = threading.Lock()


def _releasing_now(sid: str) -> threading.Event:
    done = threading.Event()
    with _releasing_lock:
        _releasing[sid] = done
    return done


def _release(mgr: SessionManager, session: Session, done: threading.Event | None = None) -> None:
    """``mgr._release``, visible to :func:`_wait_released` until it is over."""
    done = done or _releasing_now(session.id)
    try:
        mgr._release(session)
    finally:
        done.set()
        with _releasing_lock:
            if _releasing.get(session.id) is done:
                del _releasing[session.id]


def _wait_released(sid: str, timeout: float = 30.0) -> None:
    """Wait until a release of ``sid``'s previous worker here is over: it unlinks the session's
    stats file and direct socket by path, which a new worker for the same session reuses."""
    with _releasing_lock:
        done = _releasing.get(sid)
    if done is not None and not done.wait(timeout):
        raise DaemonError("UNAVAILABLE", f"session {sid}'s previous worker here is still exiting")


def _since(t: float) -> float:
    """Seconds since ``t`` on the monotonic clock the worker read it from (same host)."""
    return max(time.monotonic() - float(t), 0.0)


# ---- destination ---------------------------------------------------------------------------
def _refusals(
    mgr: SessionManager, sid: str, slot: int, mem_needed: int, told: dict[int, int], device: int
) -> list[str]:
    out: list[str] = []
    if not 0 <= device < len(mgr.devices):
        return [f"no device {device} on this daemon"]
    dev = mgr.devices[device]
    with mgr._lock:
        live = mgr._sessions.get(sid)
        if live is not None and live.state != "parked":
            out.append(f"session {sid} is already {live.state} on this daemon")
        if not 0 <= slot < WINDOW_SLOTS:
            out.append(f"VA window slot {slot} out of range")
        for other in mgr._sessions.values():
            if other.slot == slot and other is not live:
                out.append(
                    f"VA window slot {slot} ({window_base(slot):#x}) is taken by session {other.id}"
                )
        if slot in mgr._starting:
            out.append(f"VA window slot {slot} is being opened on this daemon")
    # what the destination's device reports, whichever backend drives it
    return out + refusals(dev.destination(), told=told, mem_needed=mem_needed)


def preflight(mgr: SessionManager, req: peer_pb2.PreflightRequest) -> peer_pb2.PreflightReply:
    device = max(req.device, 0)
    why = _refusals(mgr, req.session_id, req.slot, req.mem_needed, dict(req.told), device)
    if req.fingerprint != fingerprint():
        why.insert(
            0,
            f"protocol fingerprint mismatch: source {req.fingerprint!r}, destination "
            f"{fingerprint()!r}; the two daemons come from different Crane builds",
        )
    reply = peer_pb2.PreflightReply()
    if device < len(mgr.devices):
        dev = mgr.devices[device]
        reply.cc_major, reply.cc_minor, reply.profile = dev.cc[0], dev.cc[1], dev.label
        where = dev.destination().where
        for d in req.module_digests:
            path = mgr.module_cache / bytes(d).hex()
            if path.exists():
                why += check_code(bytes(d), path.read_bytes(), dev.cc, where)
            else:
                reply.missing_digests.append(d)
    reply.refusals.extend(why)
    return reply


def transfer(
    mgr: SessionManager, requests: Iterator[peer_pb2.TransferChunk]
) -> Iterator[peer_pb2.TransferAck]:
    """Relay rounds to a worker for the incoming session; acknowledge each once applied."""
    session: Session | None = None
    slot: int | None = None
    committed = False
    in_round = False
    ident: dict[str, Any] = {}
    device = 0
    try:
        for chunk in requests:
            if not ident:
                ident = json.loads(chunk.identity_json)
                device = max(chunk.device, 0)
                told = {int(k): int(v) for k, v in ident.get("told", {}).items()}
                why = _refusals(mgr, ident["id"], int(ident["slot"]), 0, told, device)
                if why:
                    raise DaemonError("FAILED_PRECONDITION", "; ".join(why))
                with mgr._lock:
                    slot = int(ident["slot"])
                    mgr._starting.add(slot)
            if not in_round:
                if chunk.fresh:
                    if session is not None:
                        mgr._release(session)
                    # the session may be coming back: its last stay's files (same paths) must
                    # be gone before this one's are made
                    _wait_released(ident["id"])
                    session = mgr._start(
                        ident["id"],
                        int(ident["slot"]),
                        mgr.devices[device],
                        ident.get("client", ""),
                        bytes.fromhex(ident["token"]),
                        ident.get("uuid_seed"),
                    )
                    session.state = "incoming"
                    adopt_record(session, ident)  # it answers with what its guest was told
                if session is None:
                    raise DaemonError("FAILED_PRECONDITION", "the first round must be fresh")
                begin = {"round": chunk.round, "fresh": chunk.fresh, "final": chunk.final}
                session.worker.channel.send(Tag.MIGRATE_IN, json.dumps(begin).encode())
                in_round = True
            assert session is not None
            if chunk.data:
                session.worker.channel.send(Tag.MIGRATE_DATA, chunk.data)
            if not chunk.end_of_round:
                continue
            in_round = False
            answer = mgr._control(session, Tag.MIGRATE_IN_END, {})
            if "error" in answer:
                raise DaemonError(
                    "FAILED_PRECONDITION", f"round {chunk.round} refused: {answer['error']}"
                )
            if chunk.final:
                with mgr._lock:
                    old = mgr._sessions.get(session.id)
                    if old is not None and old.state != "parked":
                        raise DaemonError("ALREADY_EXISTS", f"session {session.id} appeared here")
                    session.state = "ready"
                    mgr._sessions[session.id] = session
                    mgr.moved.pop(session.id, None)
                    committed = True
                mgr._watch(session)
                log.info(
                    "session %s migrated in (round %d), window %#x",
                    session.id,
                    chunk.round,
                    session.va_base,
                )
                delay = float(os.environ.get(TEST_DELAY_FINAL_ACK_ENV) or 0)
                if delay > 0:
                    log.warning("test hook: delaying the final acknowledgement by %.1f s", delay)
                    time.sleep(delay)
            yield peer_pb2.TransferAck(round=chunk.round, done_seq=answer.get("done_seq", 0))
    except ChannelClosed as e:
        raise DaemonError("ABORTED", f"the incoming session's worker exited: {e}") from None
    finally:
        if not committed and session is not None:
            _release(mgr, session)
            log.info("incoming migration of %s ended before switchover; released", session.id)
        if slot is not None:
            with mgr._lock:
                mgr._starting.discard(slot)


def abort_incoming(mgr: SessionManager, sid: str, token: bytes) -> bool:
    """Forget a session that switched over here but whose source never heard the ack."""
    with mgr._lock:
        s = mgr._sessions.get(sid)
    if s is None or not secrets.compare_digest(token, s.token) or s.state != "ready":
        return False
    if s.stats.read()[3] != 0:  # a guest attached directly: it is in use here
        return False
    mgr.close(s, "its migration was aborted by the source")
    return True
