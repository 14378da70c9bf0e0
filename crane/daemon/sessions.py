"""Sessions: who is connected, on which device, in which VA window, served by which worker.

Each session moves through an explicit state machine; operations name the states they accept
and refuse others by name (so a second stream on a session, or a stream on a closing one, gets a
clear error rather than a race):

    opening ──► ready ──► running ──► closing ──► closed
                  └───────────────────────┘ (guest never attached / disconnected)

    ready/running ──► checkpointing ──► ready/running      (Checkpoint)
                                   └──► parked             (Checkpoint with release: the worker
                                                            and its device memory are gone; the
                                                            entry keeps the id, token and window)
    parked ──► restoring ──► ready                         (Restore on this daemon)
    (none) ──► restoring ──► ready                         (Restore of another daemon's session)
    ready/running ──► migrating ──► migrated               (live migration out: crane.migrate;
                               └──► ready/running           a tombstone redirects Resume)
    (none) ──► incoming ──► ready                          (migration in, at the final ack)

A parked session's guest finds its stream broken, asks ``Resume`` (answered UNAVAILABLE while
parked) and reconnects once the session is ready again, here or on another daemon.

Entries for sessions that left do not stay forever (:meth:`SessionManager.expire`, run by a
sweeper thread and on access): a parked entry not restored within ``parked_ttl_s`` is dropped,
freeing its slot and window, and its waiting guest is answered NOT_FOUND with the reason (it
stops waiting and fails its call); a migrated entry redirects for ``moved_ttl_s``. ``crane ps``
lists both until then.

A restore runs the checks a migration's destination runs (crane.state.preflight: limits the
guest was told, free memory, usable code for this device), all at once, before any memory is
written, and the restored session keeps answering with the identity its guest was told.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from crane.backends.factory import WorkerConfig
from crane.daemon.devices import Device
from crane.daemon.errors import DaemonError
from crane.daemon.workers import WorkerPool, WorkerProcess
from crane.device.layout import (
    WINDOW_SIZE,
    WINDOW_SLOTS,
    module_area_base,
    window_base,
)
from crane.state.checkpoint import FORMAT_VERSION, CheckpointError, Head, read_head
from crane.state.preflight import check_code, refusals
from crane.state.told import Told, identity_to_json, told_from_meta, told_to_json
from crane.v1 import common_pb2
from crane.worker.channel import ChannelClosed, Tag
from crane.worker.stats import MODE_DIRECT, SessionStats

__all__ = [
    "Gone",
    "Session",
    "SessionManager",
    "SessionMoved",
    "adopt_record",
]

log = logging.getLogger("craned")


class SessionMoved(DaemonError):
    """The session migrated to another daemon: a resuming guest is redirected there."""

    def __init__(self, sid: str, to: str) -> None:
        super().__init__("NOT_FOUND", f"session {sid} moved to {to}")
        self.to = to


@dataclass
class Session:
    id: str
    token: bytes
    device: Device
    slot: int
    worker: WorkerProcess
    identity: common_pb2.DeviceIdentity
    client: str
    stats: SessionStats
    stats_path: Path
    state: str = "opening"
    peer: str = ""
    direct_socket: Path | None = None
    opened_at: float = field(default_factory=time.time)
    uuid_seed: str = ""
    #: Held by whoever talks on the worker channel (the relay, per batch; a checkpoint).
    channel_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Worker frames a checkpoint read while the relay waited (async failures); relayed next.
    pending: list[bytes] = field(default_factory=list)
    parked_at: str = ""  # the checkpoint file of a parked session
    parked_since: float = 0.0  # time.monotonic() when it was parked
    #: Limits the guest was told at open (kept across moves: the pre-flight compares them).
    told: dict[int, int] = field(default_factory=dict)
    location: str = ""  # migrating: "-> ADDR" (crane ps)
    migration: dict = field(default_factory=dict)  # the latest progress of a migration out

    @property
    def va_base(self) -> int:
        return window_base(self.slot)

    def require(self, *states: str) -> None:
        if self.state not in states:
            raise DaemonError(
                "FAILED_PRECONDITION",
                f"session {self.id} is {self.state}; this needs it {' or '.join(states)}",
            )

    def record(self) -> dict:
        """The session as a checkpoint's META records it (crane.state.told for ``told``)."""
        return {
            "id": self.id,
            "token": self.token.hex(),
            "slot": self.slot,
            "va_base": self.va_base,
            "uuid_seed": self.uuid_seed,
            "client": self.client,
            "told": told_to_json(self.told),
            "device": identity_to_json(self.identity),
        }


@dataclass
class Gone:
    """A session that left this daemon, remembered for a while: migrated away (``to`` is the
    daemon it went to), or parked and never restored (``why`` tells its guest)."""

    session: Session
    since: float  # time.monotonic() when it left
    to: str = ""
    why: str = ""


def _age(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


class SessionManager:
    def __init__(
        self,
        devices: list[Device],
        run_dir: Path,
        pool: WorkerPool,
        max_sessions: int,
        attach_timeout_s: float = 60.0,
        moved_ttl_s: float = 600.0,
        parked_ttl_s: float = 3600.0,
    ) -> None:
        self.attach_timeout_s = attach_timeout_s
        self.moved_ttl_s = moved_ttl_s  # 0: keep forever
        self.parked_ttl_s = parked_ttl_s  # 0: keep until restored
        self.devices = devices
        self.run_dir = run_dir
        self.pool = pool
        self.max_sessions = min(max_sessions, WINDOW_SLOTS)
        self.module_cache = run_dir / "modules"
        self.module_cache.mkdir(parents=True, exist_ok=True)
        (run_dir / "sessions").mkdir(parents=True, exist_ok=True)
        self._sessions: dict[str, Session] = {}
        self._starting: set[int] = set()  # window slots of sessions being opened
        self._lock = threading.Lock()
        #: Sessions migrated away, for Resume redirects and ``crane ps`` (until moved_ttl_s).
        self.moved: dict[str, Gone] = {}
        #: Parked sessions whose entry expired: their guest's Resume is told why (until
        #: moved_ttl_s, like a redirect).
        self.expired: dict[str, Gone] = {}
        self._stop = threading.Event()
        ttls = [t for t in (moved_ttl_s, parked_ttl_s) if t > 0]
        if ttls:
            period = min(max(min(ttls) / 10, 0.05), 5.0)
            threading.Thread(
                target=self._sweep, args=(period,), name="session-expiry", daemon=True
            ).start()

    # ---- lifecycle -----------------------------------------------------------------------
    def open(self, device_index: int, client: str) -> Session:
        if device_index < 0:
            device_index = 0
        if device_index >= len(self.devices):
            raise DaemonError(
                "INVALID_ARGUMENT",
                f"no device {device_index}: this daemon serves {len(self.devices)} device(s)",
            )
        device = self.devices[device_index]
        self.expire()
        with self._lock:
            used = {s.slot for s in self._sessions.values()} | self._starting
            free = [i for i in range(WINDOW_SLOTS) if i not in used]
            if len(self._sessions) + len(self._starting) >= self.max_sessions or not free:
                raise DaemonError(
                    "RESOURCE_EXHAUSTED", f"daemon is at its limit of {self.max_sessions} sessions"
                )
            slot = random.choice(free)
            self._starting.add(slot)
        try:
            session = self._start(uuid.uuid4().hex[:12], slot, device, client)
            with self._lock:
                self._sessions[session.id] = session
            self._watch(session)
        finally:
            with self._lock:
                self._starting.discard(slot)
        log.info(
            "session %s opened on device %d (%s) for %s, window %#x, worker pid %d",
            session.id,
            device.index,
            device.name,
            client or "?",
            session.va_base,
            session.worker.pid,
        )
        return session

    def _start(
        self,
        sid: str,
        slot: int,
        device: Device,
        client: str,
        token: bytes | None = None,
        uuid_seed: str | None = None,
        replenish: bool = True,
    ) -> Session:
        stats_path = self.run_dir / "sessions" / f"{sid}.stats"
        direct = self.run_dir / "sessions" / f"{sid}.sock"
        if len(str(direct)) > 100:  # AF_UNIX paths are limited to 108 bytes
            log.warning("session %s: run dir too deep for a direct socket; relay only", sid)
            direct = None
        token = token or secrets.token_bytes(16)
        uuid_seed = uuid_seed or secrets.token_hex(16)
        cfg = WorkerConfig(
            session_id=sid,
            backend=device.backend,
            profile=device.arg,
            va_base=window_base(slot),
            va_size=WINDOW_SIZE,
            uuid_seed=uuid_seed,
            ledger_path=device.ledger_path,
            ledger_slot=slot,
            module_cache=str(self.module_cache),
            stats_path=str(stats_path),
            token=token.hex(),
            direct_socket=str(direct) if direct else "",
            attach_timeout_s=self.attach_timeout_s,
        )
        worker = self.pool.take(replenish)
        try:
            worker.channel.send(Tag.CONFIG, json.dumps(cfg.to_json()).encode())
            tag, raw = worker.channel.recv()
        except ChannelClosed as e:
            worker.stop()
            raise DaemonError("INTERNAL", f"session worker died while starting: {e}") from None
        if tag != Tag.REPLY:
            worker.stop()
            raise DaemonError("INTERNAL", f"session worker failed: {raw.decode(errors='replace')}")
        identity = common_pb2.DeviceIdentity.FromString(raw)
        session = Session(
            id=sid,
            token=token,
            device=device,
            slot=slot,
            worker=worker,
            identity=identity,
            client=client,
            stats=SessionStats(stats_path),
            stats_path=stats_path,
            state="ready",
            direct_socket=direct,
            uuid_seed=uuid_seed,
            told=dict(identity.attributes),
        )
        return session

    def _watch(self, session: Session) -> None:
        threading.Thread(
            target=self._reap, args=(session,), name=f"reap-{session.id}", daemon=True
        ).start()

    def _reap(self, session: Session) -> None:
        """A worker ends its session by exiting (guest gone, attach timeout, crash)."""
        code = session.worker.proc.wait()
        if session.state not in (
            "closing",
            "closed",
            "checkpointing",
            "parked",
            "restoring",
            "migrating",  # the migration's watcher decides (done: migrated; else closed)
            "migrated",
        ):
            if code:
                log.error("session %s: worker exited with status %s", session.id, code)
            self.close(session, "worker exited")

    def attach(self, sid: str | None, token: bytes | None, peer: str) -> Session:
        """Bind the guest's call stream to its session (one stream at a time)."""
        with self._lock:
            session = self._sessions.get(sid or "")
            if session is None:
                raise DaemonError("NOT_FOUND", f"no session {sid!r} on this daemon")
            if not token or not secrets.compare_digest(token, session.token):
                raise DaemonError("PERMISSION_DENIED", f"wrong resume token for session {sid}")
            session.require("ready")
            if session.stats.read()[3] == MODE_DIRECT:
                raise DaemonError(
                    "FAILED_PRECONDITION", f"session {sid} is attached directly to its worker"
                )
            session.state = "running"
            session.peer = peer
        return session

    def close(self, session: Session, why: str) -> None:
        """Tear a session down: stop its worker (freeing its device memory), forget it.

        A parked (or restoring) session has no stream and no worker to lose: a stream ending
        is what parking causes, so it does not close it.
        """
        with self._lock:
            if session.state in ("closing", "closed", "parked", "restoring", "migrated"):
                return
            session.state = "closing"
        code = self._release(session)
        with self._lock:
            session.state = "closed"
            if self._sessions.get(session.id) is session:
                self._sessions.pop(session.id, None)
        log.info("session %s closed (%s); worker exit status %s", session.id, why, code)

    def _release(self, session: Session) -> int | None:
        """Stop the worker and free what the session held on this host (not its entry)."""
        code = session.worker.stop()
        session.device.ledger.clear(session.slot)
        session.stats.close()
        for path in (session.stats_path, session.direct_socket):
            if path is not None:
                Path(path).unlink(missing_ok=True)
        return code

    # ---- checkpoint, park, restore ---------------------------------------------------------
    def get(self, sid: str) -> Session:
        with self._lock:
            session = self._sessions.get(sid)
        if session is None:
            raise DaemonError("NOT_FOUND", f"no session {sid!r} on this daemon")
        return session

    def _control(self, session: Session, tag: int, request: dict) -> dict:
        """Send a CHECKPOINT/RESTORE to the worker and wait for its answer (channel held)."""
        ch = session.worker.channel
        ch.send(tag, json.dumps(request).encode())
        while True:
            t, raw = ch.recv()
            if t == Tag.CONTROL_REPLY:
                return json.loads(raw)
            if t == Tag.CLOSE:
                raise ChannelClosed("the guest closed the session")
            session.pending.append(raw)  # an asynchronous failure for the relay to forward

    def checkpoint(self, sid: str, path: str, release: bool) -> tuple[dict, str]:
        """Write the session's state to ``path``; with ``release`` park it. Returns the
        worker's counts and the session's state afterwards."""
        session = self.get(sid)
        if not os.path.isabs(path):
            raise DaemonError("INVALID_ARGUMENT", f"checkpoint path {path!r} is not absolute")
        with self._lock:
            session.require("ready", "running")
            before = session.state
            session.state = "checkpointing"
        identity = session.record()
        try:
            with session.channel_lock:
                request = {"path": path, "release": release, "identity": identity}
                answer = self._control(session, Tag.CHECKPOINT, request)
        except ChannelClosed as e:
            with self._lock:
                session.state = before
            self.close(session, "worker exited during a checkpoint")
            raise DaemonError("ABORTED", f"session {sid} ended in the checkpoint: {e}") from None
        if "error" in answer:
            with self._lock:
                session.state = before
            raise DaemonError(
                "FAILED_PRECONDITION", f"checkpoint of {sid} failed: {answer['error']}"
            )
        if not release:
            with self._lock:
                session.state = before
            return answer, before
        with self._lock:
            session.state = "parked"
            session.parked_at = path
            session.parked_since = time.monotonic()
            session.peer = ""
        self._release(session)
        log.info(
            "session %s parked to %s; its device memory is released; its entry waits %s for "
            "a restore",
            sid,
            path,
            f"{self.parked_ttl_s:g} s" if self.parked_ttl_s else "without limit",
        )
        return answer, "parked"

    def restore(self, path: str, device_index: int) -> tuple[Session, dict]:
        """Recreate a checkpointed session here; refuses precisely, leaves nothing behind.

        Before any memory moves it runs a migration destination's checks (all of them, so the
        operator learns everything wrong with this device at once): code for this device's
        architecture in every module, free device memory, and no limit lower than the guest
        was told."""
        device_index = max(device_index, 0)
        if device_index >= len(self.devices):
            raise DaemonError("INVALID_ARGUMENT", f"no device {device_index} on this daemon")
        device = self.devices[device_index]
        dest = device.destination()
        name = os.path.basename(path)
        code_refusals: list[str] = []

        def on_image(digest: bytes, image: bytes) -> None:
            for msg in check_code(digest, image, dest.cc, dest.where):
                kind = "NO_BINARY_FOR_GPU" if "no usable code" in msg else "INVALID_IMAGE"
                code_refusals.append(f"{msg} (CUDA_ERROR_{kind})")

        try:
            with open(path, "rb") as f:
                head = read_head(f, name, on_image)
            ident = head.meta["session"]
            sid, token, slot = ident["id"], bytes.fromhex(ident["token"]), int(ident["slot"])
            told = told_from_meta(head.meta, head.version, name)
            needed = _mem_needed(head)
        except OSError as e:
            raise DaemonError("NOT_FOUND", f"cannot read {path}: {e.strerror or e}") from None
        except CheckpointError as e:
            raise DaemonError("INVALID_ARGUMENT", str(e)) from None
        except (KeyError, TypeError, ValueError) as e:
            raise DaemonError(
                "INVALID_ARGUMENT", f"{path}: META lacks the session or is malformed: {e}"
            ) from None
        if told.note:
            log.warning("restore of %s: %s", sid, told.note)
        if not 0 <= slot < WINDOW_SLOTS:
            raise DaemonError("INVALID_ARGUMENT", f"{path}: window slot {slot} out of range")
        self.expire()
        with self._lock:
            old = self._sessions.get(sid)
            if old is not None and old.state != "parked":
                raise DaemonError(
                    "ALREADY_EXISTS", f"session {sid} is already {old.state} on this daemon"
                )
            for other in self._sessions.values():
                if other.slot == slot and other is not old:
                    raise DaemonError(
                        "FAILED_PRECONDITION",
                        f"VA window slot {slot} ({window_base(slot):#x}) that "
                        f"session {sid} needs is taken by session {other.id} on this daemon",
                    )
            if slot in self._starting:
                raise DaemonError(
                    "FAILED_PRECONDITION", f"VA window slot {slot} is being opened on this daemon"
                )
            if old is None and len(self._sessions) + len(self._starting) >= self.max_sessions:
                raise DaemonError(
                    "RESOURCE_EXHAUSTED", f"daemon is at its limit of {self.max_sessions} sessions"
                )
            self._starting.add(slot)
            if old is not None:
                old.state = "restoring"
        try:
            session = self._start(
                sid,
                slot,
                device,
                ident.get("client", ""),
                token,
                ident.get("uuid_seed"),
                replenish=False,  # after the restore: a worker's start would slow it down
            )
            session.state = "restoring"
            # the pre-flight, against what the device reports (any backend)
            why = code_refusals + refusals(
                device.destination(), told=told.limits, mem_needed=needed
            )
            if why:
                self._release(session)
                raise DaemonError(
                    "FAILED_PRECONDITION", f"restore of {sid} refused: " + "; ".join(why)
                )
            try:
                with session.channel_lock:
                    answer = self._control(session, Tag.RESTORE, {"path": path})
            except ChannelClosed as e:
                answer = {"error": f"the worker exited: {e}"}
            if "error" in answer:
                self._release(session)
                raise DaemonError(
                    "FAILED_PRECONDITION", f"restore of {sid} refused: {answer['error']}"
                )
            _adopt(session, told)
            with self._lock:
                session.state = "ready"
                self._sessions[sid] = session
                self.expired.pop(sid, None)
            self._watch(session)
        except BaseException:
            if old is not None:
                with self._lock:
                    old.state = "parked"
            raise
        finally:
            with self._lock:
                self._starting.discard(slot)
            self.pool.replenish()
        log.info(
            "session %s restored from %s on device %d (%s), window %#x",
            sid,
            path,
            device.index,
            device.name,
            session.va_base,
        )
        return session, answer

    def resume(self, sid: str, token: bytes) -> Session:
        """Where a guest whose stream broke stands: ready to attach, parked (retry), moved
        (redirect), or expired (NOT_FOUND with the reason: the guest stops waiting)."""
        self.expire()
        with self._lock:
            live = self._sessions.get(sid)
            gone = self.moved.get(sid) or self.expired.get(sid) if live is None else None
        if gone is not None:
            if not token or not secrets.compare_digest(token, gone.session.token):
                raise DaemonError("PERMISSION_DENIED", f"wrong resume token for session {sid}")
            if gone.to:
                raise SessionMoved(sid, gone.to)
            raise DaemonError("NOT_FOUND", gone.why)
        session = self.get(sid)
        if not token or not secrets.compare_digest(token, session.token):
            raise DaemonError("PERMISSION_DENIED", f"wrong resume token for session {sid}")
        if session.state in ("parked", "restoring", "checkpointing", "migrating"):
            raise DaemonError("UNAVAILABLE", f"session {sid} is {session.state}; retry")
        session.require("ready", "running")
        return session

    def close_all(self, why: str) -> None:
        self._stop.set()
        for s in self.list():
            self.close(s, why)

    # ---- sessions that left ------------------------------------------------------------------
    def remember_moved(self, session: Session, to: str) -> None:
        """The session now lives on ``to`` (call with the manager's lock held, as the migration
        takes it out of the table): keep a redirect for its guest, and a ``crane ps`` line, for
        ``moved_ttl_s``."""
        self.moved[session.id] = Gone(session, time.monotonic(), to=to)
        self.expired.pop(session.id, None)

    def expire(self, now: float | None = None) -> None:
        """Drop parked entries older than ``parked_ttl_s`` (their guests are told why at their
        next Resume) and redirects older than ``moved_ttl_s``."""
        now = time.monotonic() if now is None else now
        dropped: list[Session] = []
        forgotten: list[Gone] = []
        with self._lock:
            if self.parked_ttl_s > 0:
                for sid, s in list(self._sessions.items()):
                    if s.state == "parked" and now - s.parked_since >= self.parked_ttl_s:
                        del self._sessions[sid]
                        s.state = "closed"
                        why = (
                            f"session {sid} expired on this daemon: it was parked to "
                            f"{s.parked_at} {_age(now - s.parked_since)} ago and not restored "
                            f"within parked_ttl_s={self.parked_ttl_s:g} s"
                        )
                        self.expired[sid] = Gone(s, now, why=why)
                        dropped.append(s)
            if self.moved_ttl_s > 0:
                for table in (self.moved, self.expired):
                    for sid, g in list(table.items()):
                        if now - g.since >= self.moved_ttl_s:
                            del table[sid]
                            if g.to:
                                forgotten.append(g)
        for s in dropped:
            log.warning(
                "session %s: parked to %s %s ago and not restored within parked_ttl_s=%g s; "
                "its entry expired (slot %d freed); a guest still waiting is told at its next "
                "resume and its call fails (CUDA_ERROR_NO_DEVICE); the checkpoint file is kept",
                s.id,
                s.parked_at,
                _age(now - s.parked_since),
                self.parked_ttl_s,
                s.slot,
            )
        for g in forgotten:
            log.info(
                "session %s: forgot its redirect to %s (moved_ttl_s=%g s)",
                g.session.id,
                g.to,
                self.moved_ttl_s,
            )

    def _sweep(self, period: float) -> None:
        while not self._stop.wait(period):
            try:
                self.expire()
            except Exception:  # never let a bug end the sweeper silently
                log.exception("session expiry sweep failed")

    # ---- queries -------------------------------------------------------------------------
    def list(self) -> list[Session]:
        """Sessions on this daemon (parked ones included; not those that migrated away)."""
        with self._lock:
            return list(self._sessions.values())

    def listing(self) -> list[Session]:
        """What ``crane ps`` shows: :meth:`list` plus the migrated-away entries still kept."""
        self.expire()
        with self._lock:
            return list(self._sessions.values()) + [g.session for g in self.moved.values()]

    def info(self, s: Session) -> common_pb2.SessionInfo:
        try:
            calls, mem, _, mode, peer = s.stats.read()
        except ValueError:  # closed under us
            calls, mem, mode, peer = 0, 0, 0, ""
        direct = mode == MODE_DIRECT
        location = s.location
        now = time.monotonic()
        if s.state == "parked":
            location = f"in {s.parked_at}"
            if self.parked_ttl_s > 0:
                left = self.parked_ttl_s - (now - s.parked_since)
                location += f", expires in {_age(left)}"
        elif s.state == "migrated" and self.moved_ttl_s > 0:
            gone = self.moved.get(s.id)
            if gone is not None and gone.session is s:
                location += f", forgotten in {_age(self.moved_ttl_s - (now - gone.since))}"
        return common_pb2.SessionInfo(
            id=s.id,
            peer=peer if direct else s.peer,
            device=s.device.index,
            mem_used=mem,
            calls=calls,
            state="running" if direct and s.state == "ready" else s.state,
            client=s.client,
            opened_at=s.opened_at,
            va_base=s.va_base,
            va_size=WINDOW_SIZE,
            location=location,
        )


def _mem_needed(head: Head) -> int:
    """Device memory the checkpointed session commits (format 1 files: from its graph)."""
    if "mem_needed" in head.meta:
        return int(head.meta["mem_needed"])
    g = head.graph or {}
    window = g.get("window") or [0, 0]
    area = g.get("module_area") or {}
    base = module_area_base((int(window[0]), int(window[1])))
    chunks = sum(int(c["size"]) for c in g.get("chunks", []))
    return chunks + max(int(area.get("chunk_end", base)) - base, 0)


def adopt_record(session: Session, ident: dict) -> None:
    """A session arriving by migration answers with what its guest was told (the source's
    :meth:`Session.record`); a record without it leaves the session as it is."""
    try:
        told = told_from_meta({"session": ident}, FORMAT_VERSION, "the migration's record")
    except ValueError as e:
        log.warning("session %s: %s; answering with this device's identity", session.id, e)
        return
    _adopt(session, told)


def _adopt(session: Session, told: Told) -> None:
    """A restored session answers with what its guest was told, not with this device."""
    if told.identity is not None:
        session.identity = told.identity
        session.told = dict(told.identity.attributes)
    elif told.limits:
        session.told = dict(told.limits)
