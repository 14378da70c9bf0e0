"""The daemons' side of live migration: the source's watcher and the destination's receiver.

Both work through the daemon's :class:`~crane.daemon.host.SessionHost` interface (never its
internals). Source: :func:`migrate_out` claims the session (``migrating``), tells its worker to
migrate (the worker streams to the destination itself) and watches the worker's progress file,
woken by a byte the worker writes to a FIFO after each update (the switchover is on the guest's
clock: a poll interval would add to every downtime). Done: the session becomes ``migrated`` (a
tombstone answers the guest's ``Resume`` with a redirect) and its worker is released. Failed:
back to the state it had, the guest never noticed. The downtime reported is the guest's: from
the moment the worker stopped the session to the moment this daemon can redirect the guest to
the destination (which acknowledged the final round, so it is ready to serve it).

Destination: :func:`preflight` answers every reason it cannot take the session;
:func:`transfer` relays each round to a worker it starts for the session (a fresh one for every
fresh round) and acknowledges each applied round; the session joins the daemon's table,
``ready``, only with the final round's acknowledgement. A stream that ends earlier stops that
worker: nothing is left.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from crane.api.errors import ProtocolError
from crane.daemon.host import SessionHost
from crane.daemon.lifecycle import SessionState
from crane.daemon.session import DaemonSession
from crane.daemon.worker_control import reason, request
from crane.host.channel import ChannelClosed
from crane.host.logs import about, bind, bind_session
from crane.host.messages import (
    DataPlaneOpen,
    DataPlaneReady,
    MigrateRequest,
    RoundApplied,
    RoundBegin,
    RoundEnd,
    Tag,
    encode,
)
from crane.migrate.handover import boot_id
from crane.migrate.phases import Phase
from crane.state.checkpoint import FORMAT_VERSION
from crane.state.preflight import Use, assess, check_code
from crane.state.session_record import SessionRecord
from crane.v1 import peer_pb2
from crane.wire.fingerprint import mismatch

__all__ = ["Incoming", "abort_incoming", "decide", "migrate_out", "preflight", "transfer"]

log = logging.getLogger("craned")

#: How often the watcher looks at the worker without being woken (its exit; a lost wake-up).
POLL_S = 0.05
#: Scheduling priority of a migrated session's worker while it exits (see :func:`_settle`).
RELEASE_NICE = 10
#: Test-only: seconds the destination sleeps between committing an incoming session and sending
#: the final acknowledgement. Why: the switchover window is a few milliseconds, too short to kill
#: a daemon inside it deterministically; fault tests widen it with this variable and wait for the
#: log line below. Never set in production (unset or 0: no delay).
TEST_DELAY_FINAL_ACK_ENV = "CRANE_TEST_DELAY_FINAL_ACK_S"
#: Default longest wait for the guest's call in progress at a batch boundary (MigrateRequest).
BOUNDARY_WAIT_S = 60.0


# ---- source --------------------------------------------------------------------------------
def migrate_out(
    host: SessionHost,
    sid: str,
    to: str,
    device: int,
    max_rounds: int,
    stop_bytes: int,
    boundary_wait_s: float = BOUNDARY_WAIT_S,
    accept_lower_limits: bool = False,
    hold: bool = False,
    gate: bool = False,
    hold_timeout_s: float = 0.0,
) -> DaemonSession:
    """Start moving ``sid`` to ``to``; progress lands in ``session.migration``.
    ``boundary_wait_s``: longest it waits for the guest's call in progress at each batch
    boundary it needs (then it fails and the session carries on here). ``hold``: a two-phase
    switchover, decided by :func:`decide` (``gate``: the final round waits for a Stop too)."""
    session, before = host.claim(sid, "migrate", SessionState.MIGRATING)
    session.location = f"-> {to}"
    host.publish(session, {"phase": Phase.PREFLIGHT.value}, switching=False, fresh=True)
    progress = session.stats_path.with_suffix(".migrate")
    progress.unlink(missing_ok=True)
    wake = _Wake(session.stats_path.with_suffix(".migrate-wake"))
    decisions = _Wake(session.stats_path.with_suffix(".migrate-decide")) if hold else None
    if decisions is not None:
        _DECISIONS[sid] = decisions
    req = MigrateRequest(
        to=to,
        device=device,
        max_rounds=max_rounds,
        stop_bytes=stop_bytes,
        identity=session.record(),  # id, token, window; what the guest was told
        wake=str(wake.path) if wake.path else "",
        boundary_wait_s=boundary_wait_s,
        tls_cert=host.peer_tls.cert,
        tls_key=host.peer_tls.key,
        tls_ca=host.peer_tls.ca,
        # one knob (crane migrate --timeout): the guest's call at a boundary, the destination
        peer_timeout_s=boundary_wait_s,
        accept_lower_limits=accept_lower_limits,
        hold=hold,
        gate=gate and hold,
        hold_timeout_s=hold_timeout_s or HOLD_TIMEOUT_S,
        decide=str(decisions.path) if decisions is not None and decisions.path else "",
    )
    # the relay holds the channel while a batch runs: a kernel that never ends must not hold
    # the migration (and the session in "migrating") with it
    if not session.channel_lock.acquire(timeout=boundary_wait_s):
        wake.close()
        _forget_decisions(sid)
        why = (
            f"migration not started: a relayed call batch did not return within "
            f"{boundary_wait_s:g} s (a kernel that does not finish?); the session stays here "
            "as it was"
        )
        _settle(host, session, before, {"phase": Phase.FAILED.value, "error": why})
        return session
    try:
        session.worker.channel.send(*encode(req))
    except ChannelClosed as e:
        wake.close()
        _forget_decisions(sid)
        failed = {"phase": Phase.FAILED.value, "error": f"worker gone: {e}"}
        _settle(host, session, before, failed)
        return session
    finally:
        session.channel_lock.release()
    threading.Thread(
        target=_watch,
        args=(host, session, before, progress, wake),
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


#: The decision FIFOs of held migrations out of this daemon, by session id.
_DECISIONS: dict[str, _Wake] = {}
#: Default hold limit (MigrateRequest.hold_timeout_s = 0).
HOLD_TIMEOUT_S = 120.0
#: The destination drops a held session this long after the source's own limit would have.
HOLD_MARGIN_S = 5.0
#: Which phases each decision may be given in (the worker reads it when it gets there).
_DECIDABLE = {
    "s": (Phase.PREFLIGHT, Phase.PRECOPY),
    "c": (Phase.HELD,),
    "a": (Phase.PREFLIGHT, Phase.PRECOPY, Phase.STOPPING, Phase.HELD),
}


def _forget_decisions(sid: str) -> None:
    d = _DECISIONS.pop(sid, None)
    if d is not None:
        d.close()


def decide(host: SessionHost, sid: str, what: str) -> str:
    """Deliver a held migration's decision (``"s"`` stop, ``"c"`` commit, ``"a"`` abort) to
    the source worker; the phase it was given in. FAILED_PRECONDITION when the session has no
    held migration, or one in a phase where that decision means nothing (a Commit before the
    destination acknowledged the final round)."""
    session = host.get(sid)
    bind_session(session)
    d = _DECISIONS.get(sid)
    phase = Phase(session.migration.get("phase", Phase.PREFLIGHT.value))
    if d is None or d.wfd < 0 or session.state is not SessionState.MIGRATING:
        raise ProtocolError("FAILED_PRECONDITION", f"session {sid} has no held migration")
    if phase not in _DECIDABLE[what]:
        names = {"s": "stopped", "c": "committed", "a": "aborted"}
        raise ProtocolError(
            "FAILED_PRECONDITION",
            f"the migration of session {sid} is {phase.value}: it cannot be {names[what]} now",
        )
    os.write(d.wfd, what.encode())
    return phase.value


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _watch(
    host: SessionHost, session: DaemonSession, before: SessionState, path: Path, wake: _Wake
) -> None:
    with about(session):  # this thread's lines (the migration's outcome) are about it
        _follow(host, session, before, path, wake)


def _follow(
    host: SessionHost, session: DaemonSession, before: SessionState, path: Path, wake: _Wake
) -> None:
    try:
        while True:
            st = _read(path)
            exited = session.worker.proc.poll() is not None
            if exited:
                st = _read(path) or st
            if st is not None:
                phase = Phase(st.get("phase", Phase.PREFLIGHT.value))
                if phase.over:
                    break
                host.publish(session, st, switching=phase.switching)
            if exited:
                st = {
                    "phase": Phase.FAILED.value,
                    "error": "the session's worker exited during the migration",
                }
                break
            wake.wait(POLL_S)
    finally:
        wake.close()
        _forget_decisions(session.id)
    path.unlink(missing_ok=True)
    _settle(host, session, before, st)


def _settle(
    host: SessionHost, session: DaemonSession, before: SessionState, st: dict[str, Any]
) -> None:
    to = session.location.removeprefix("-> ")
    if st.get("phase") == Phase.DONE.value:
        if "stopped_at" in st:  # the guest's downtime ends now: it can be redirected
            st = {**st, "switchover": st.get("downtime"), "downtime": _since(st["stopped_at"])}
        if "started_at" in st:
            st["total"] = _since(st["started_at"])
        released = host.moved_away(session, to)  # redirects its guest for moved_ttl_s
        host.publish(session, st, switching=True)
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
        host.release(session, released)
        return
    log.warning("migration of session %s to %s failed: %s", session.id, to, st.get("error"))
    session.location = ""
    host.give_back(session, SessionState.MIGRATING, before)
    host.publish(session, st, switching=False)
    if session.worker.proc.poll() is not None:
        host.worker_died(session)  # its guest's Resume hears why
        host.close(session, "worker exited during a migration")


def _since(t: float) -> float:
    """Seconds since ``t`` on the monotonic clock the worker read it from (same host)."""
    return max(time.monotonic() - float(t), 0.0)


# ---- destination ---------------------------------------------------------------------------
def _device_refusals(
    host: SessionHost,
    mem_needed: int,
    told: dict[int, int],
    device: int,
    use: Use | None = None,
    accept_lower: bool = False,
) -> list[str]:
    """What the destination's device reports against what the session needs (hard) and was
    told (refused unless ``accept_lower``), whichever backend drives it."""
    if not 0 <= device < len(host.devices):
        return [f"no device {device} on this daemon"]
    dest = host.devices[device].destination()
    verdict = assess(dest, told=told, mem_needed=mem_needed, use=use)
    if verdict.lower and accept_lower and not verdict.hard:
        log.warning(
            "the operator accepted lower limits on %s than the guest was told: %s",
            dest.where,
            ", ".join(str(x) for x in verdict.lower),
        )
    return verdict.refusals(accept_lower, dest.where)


def _use(raw: str) -> Use | None:
    """The session's use as the source sent it; a malformed record is the source's defect."""
    try:
        return Use.from_json(json.loads(raw)) if raw else None
    except (TypeError, ValueError) as e:
        raise ProtocolError("INVALID_ARGUMENT", f"the pre-flight's use record: {e}") from None


def preflight(host: SessionHost, req: peer_pb2.PreflightRequest) -> peer_pb2.PreflightReply:
    device = max(req.device, 0)
    host.table.settle_slot(req.session_id, req.slot)
    with host.table.lock:
        why = [w for _, w in host.table.slot_refusals(req.session_id, req.slot)]
    why += _device_refusals(
        host, req.mem_needed, dict(req.told), device, _use(req.use_json), req.accept_lower_limits
    )
    build = mismatch(req.fingerprint, "source", "destination", "the two daemons")
    if build:
        why.insert(0, build)
    reply = peer_pb2.PreflightReply()
    if device < len(host.devices):
        dev = host.devices[device]
        reply.cc_major, reply.cc_minor, reply.profile = dev.cc[0], dev.cc[1], dev.label
        where = dev.destination().where
        for d in req.module_digests:
            image = host.images.get(bytes(d))
            if image is not None:
                why += check_code(bytes(d), image, dev.cc, where)
            else:
                reply.missing_digests.append(d)
    reply.refusals.extend(why)
    return reply


class Incoming:
    """The sessions arriving here (a transfer in progress) and which of them their source
    aborted. Why: a source that gave up on a destination that stopped answering (SIGSTOP, a
    partition) asks it to abort, and keeps asking until it answers; woken up, the destination
    may hear that abort before its transfer handler (also woken up) commits the final round it
    had received, and that commit must then be refused rather than leave a session no guest
    will ever use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, bytes] = {}
        self._aborted: set[str] = set()

    def arrive(self, sid: str, token: bytes) -> None:
        with self._lock:
            self._tokens[sid] = token
            self._aborted.discard(sid)

    def leave(self, sid: str) -> None:
        with self._lock:
            self._tokens.pop(sid, None)
            self._aborted.discard(sid)

    def abort(self, sid: str, token: bytes) -> bool:
        """Mark an arriving session aborted; False when none of that id and token arrives."""
        with self._lock:
            have = self._tokens.get(sid)
            if have is None or not secrets.compare_digest(have, token):
                return False
            self._aborted.add(sid)
            return True

    def commit(self, sid: str, admit: Callable[[], None]) -> None:
        """Admit the arrived session unless its source aborted it; either way it no longer
        arrives. One lock with :meth:`abort`, so an abort lands either before (refused here)
        or after (it finds the session admitted, which :func:`abort_incoming` closes)."""
        with self._lock:
            aborted = sid in self._aborted
            self._tokens.pop(sid, None)
            self._aborted.discard(sid)
            if not aborted:
                admit()
        if aborted:
            raise ProtocolError(
                "ABORTED",
                f"the source aborted the migration of session {sid} before its switchover",
            )


def transfer(
    host: SessionHost,
    requests: Iterator[peer_pb2.TransferChunk],
    incoming: Incoming,
    cancel: Callable[[], object] | None = None,
    local: bool = True,
) -> Iterator[peer_pb2.TransferAck]:
    """Relay rounds to a worker for the incoming session; acknowledge each once applied.

    A source that asks for a data plane (``data_streams`` on its first chunk) is answered, at
    the start of each fresh round (a new worker), with an offer: the worker's data port and a
    one-time token (:func:`_offer`); the round's memory then reaches the worker directly, and
    its end names how many chunks to wait for. ``local``: the source called over a unix socket
    (a daemon on this host), so the worker listens on loopback only, without TLS.

    A held migration (``hold`` on the first chunk) is acknowledged at its final round but only
    admitted at the ``commit`` chunk after it; meanwhile the session sits in the table as
    ``incoming``, so a guest that reconnects early is told to retry (crane-parked) rather than
    that it does not exist. No commit within the hold's limit: ``cancel`` ends the stream and
    the session is dropped, as when the source aborts."""
    session: DaemonSession | None = None
    record: SessionRecord | None = None
    claimed: int | None = None  # the window slot held for the session while it arrives
    committed = False
    held: threading.Timer | None = None  # set while the session waits for its commit
    hold = False
    hold_timeout_s = 0.0
    in_round = False
    device = 0
    streams = 0
    handover = False
    replenish = False  # the pool is topped up when the transfer ends (see below)
    try:
        for chunk in requests:
            if chunk.commit:
                if held is None or session is None:
                    raise ProtocolError("FAILED_PRECONDITION", "commit without a held session")
                held.cancel()
                incoming.commit(session.id, functools.partial(host.admit, session))
                committed = True
                log.info("held session %s committed: serving it here", session.id)
                yield peer_pb2.TransferAck(round=chunk.round)
                continue
            if record is None:
                hold, hold_timeout_s = chunk.hold, chunk.hold_timeout_s or HOLD_TIMEOUT_S
                streams = chunk.data_streams
                handover = chunk.handover
                try:
                    ident = {"session": json.loads(chunk.identity_json)}
                    record, _ = SessionRecord.from_meta(ident, FORMAT_VERSION, "the record")
                except (KeyError, TypeError, ValueError) as e:
                    raise ProtocolError(
                        "INVALID_ARGUMENT", f"the migration's session record is malformed: {e}"
                    ) from None
                bind_session(record)  # the rest of this transfer is about the arriving session
                device = max(chunk.device, 0)
                # what it uses was weighed at the pre-flight; the limits it was told again
                why = _device_refusals(
                    host, 0, record.told, device, accept_lower=chunk.accept_lower_limits
                )
                host.table.settle_slot(record.id, record.slot)
                with host.table.lock:
                    why = [w for _, w in host.table.slot_refusals(record.id, record.slot)] + why
                    over = host.table.tenant_refusal(record.tenant, record.id)
                    if not why and not over:
                        claimed = record.slot
                        host.table.claim_slot(claimed, record.tenant)
                if over:
                    raise ProtocolError(
                        "RESOURCE_EXHAUSTED", f"incoming migration of {record.id} refused: {over}"
                    )
                if why:
                    raise ProtocolError("FAILED_PRECONDITION", "; ".join(why))
                incoming.arrive(record.id, record.token)
            if not in_round:
                if chunk.fresh:
                    if session is not None:
                        host.release(session)
                    # the session may be coming back: its last stay's files (same paths) must
                    # be gone before this one's are made
                    host.wait_released(record.id)
                    # a source that may hand its memory over stops right after round 0: the
                    # pool's next worker is then spawned once the transfer is over, not while
                    # its imports (hundreds of ms of CPU) would compete with the stopped round
                    # (2 cores: downtimes of 12-67 ms against 6-16 ms). A data-plane source's
                    # rounds take long enough for the spawn to finish before its stop.
                    session = host.start(
                        record, host.device(device), SessionState.INCOMING, replenish=not handover
                    )
                    replenish = replenish or handover
                    session.adopt(record)  # it answers with what its guest was told
                if session is None:
                    raise ProtocolError("FAILED_PRECONDITION", "the first round must be fresh")
                begin = RoundBegin(chunk.round, chunk.fresh, chunk.final)
                session.worker.channel.send(*encode(begin))
                in_round = True
                if chunk.fresh and (streams or handover):
                    yield _offer(host, session, chunk.round, local, handover)
            assert session is not None
            if chunk.data:
                session.worker.channel.send(Tag.MIGRATE_DATA, chunk.data)
            if chunk.data_follows:  # the stream's part is whole: the worker reads to its end
                session.worker.channel.send(Tag.MIGRATE_DATA, b"")
            if not chunk.end_of_round:
                continue
            in_round = False
            answer = request(session, RoundEnd(chunk.data_chunks, chunk.handed_over))
            if not isinstance(answer, RoundApplied):
                why = reason(answer)
                raise ProtocolError("FAILED_PRECONDITION", f"round {chunk.round} refused: {why}")
            if chunk.final and hold:
                held = _hold(host, session, hold_timeout_s, cancel)
            elif chunk.final:
                incoming.commit(session.id, functools.partial(host.admit, session))
                committed = True
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
            yield peer_pb2.TransferAck(round=chunk.round, done_seq=answer.done_seq)
    except ChannelClosed as e:
        raise ProtocolError("ABORTED", f"the incoming session's worker exited: {e}") from None
    finally:
        if held is not None:
            held.cancel()
        if not committed and session is not None:
            if held is not None:
                with host.table.lock:
                    host.table.remove(session)
            host.release(session)
            Path(_handover_path(session)).unlink(missing_ok=True)  # a worker that was killed
            log.info("incoming migration of %s ended before switchover; released", session.id)
        if replenish:
            host.replenish_workers()
        if claimed is not None:
            with host.table.lock:
                host.table.unclaim_slot(claimed)
        if record is not None and claimed is not None:
            incoming.leave(record.id)


def _offer(
    host: SessionHost, session: DaemonSession, round_: int, local: bool, handover: bool = False
) -> peer_pb2.TransferAck:
    """Open the incoming worker's data plane and say where (:mod:`crane.migrate.dataplane`):
    the token goes to the source over this authenticated stream only; TLS with this daemon's
    own certificate whenever the source reached it over tcp. No data plane (the worker could
    not listen, or TLS files are missing on a tcp transfer): an offer with the reason, and the
    source sends memory in the stream as before. ``handover``: the source could hand its
    memory over (:mod:`crane.migrate.handover`), so the worker also listens on a unix socket
    beside the session's files (same token), and the offer names it and this kernel's boot
    id; the source decides whether it is on this host."""
    token = secrets.token_bytes(32)
    tls = host.peer_tls
    if not local and not tls.cert:
        refusal = "this daemon has no certificate of its own for the data plane's TLS"
        log.warning("incoming migration: no data plane: %s", refusal)
        return peer_pb2.TransferAck(
            round=round_, offer=True, data_refusal=refusal, handover_refusal=refusal
        )
    use_tls = not local
    path = _handover_path(session) if handover else ""
    too_long = len(path) > HANDOVER_PATH_MAX
    msg = DataPlaneOpen(
        bind="127.0.0.1" if local else "*",
        token=token.hex(),
        tls_cert=tls.cert if use_tls else "",
        tls_key=tls.key if use_tls else "",
        tls_ca=tls.ca if use_tls else "",
        handover="" if too_long else path,
    )
    answer = request(session, msg)
    ack = peer_pb2.TransferAck(round=round_, offer=True)
    if not isinstance(answer, DataPlaneReady):
        ack.data_refusal = ack.handover_refusal = reason(answer)
        log.warning("incoming migration: no data plane: %s", ack.data_refusal)
        return ack
    if answer.port:
        ack.data_port, ack.data_token, ack.data_tls = answer.port, token, use_tls
    else:
        ack.data_refusal = answer.error
        log.warning("incoming migration: no data plane: %s", answer.error)
    if handover and answer.handover:
        ack.handover_path, ack.boot_id, ack.data_token = answer.handover, boot_id(), token
    elif handover:
        ack.handover_refusal = (
            f"the run directory is too deep for a unix socket ({path})"
            if too_long
            else answer.handover_error
        )
        log.warning("incoming migration: no hand-over socket: %s", ack.handover_refusal)
    return ack


#: AF_UNIX paths are limited to 108 bytes (the direct socket's rule, crane.daemon.sessions).
HANDOVER_PATH_MAX = 100


def _handover_path(session: DaemonSession) -> str:
    """Where an incoming session's worker listens for a same-host source's memory."""
    return str(session.stats_path.with_suffix(".handover"))


def _hold(
    host: SessionHost,
    session: DaemonSession,
    limit_s: float,
    cancel: Callable[[], object] | None,
) -> threading.Timer:
    """Show a held session in the table (``incoming``: a Resume is told to retry) and arm its
    deadline: no commit within ``limit_s`` (plus a margin, so the source's own limit, which
    aborts cleanly, fires first) cancels the transfer, which drops it."""
    with host.table.lock:
        if host.table.entries().get(session.id) not in (None, session):
            other = host.table.entries()[session.id]
            if other.state is not SessionState.PARKED:
                raise ProtocolError("ALREADY_EXISTS", f"session {session.id} appeared here")
        host.table.add(session)

    def expire() -> None:
        with about(session):
            log.warning(
                "held session %s: no commit within %.0f s; dropping it", session.id, limit_s
            )
            if cancel is not None:
                cancel()

    timer = threading.Timer(limit_s + HOLD_MARGIN_S, expire)
    timer.daemon = True
    timer.start()
    log.info("session %s arrived held: ready, not serving until its commit", session.id)
    return timer


def abort_incoming(host: SessionHost, sid: str, token: bytes, incoming: Incoming) -> bool:
    """Forget a session that switched over here but whose source never heard the ack, or
    refuse the switchover of one still arriving."""
    bind(session=sid)
    if incoming.abort(sid, token):
        log.info("incoming migration of %s aborted by its source", sid)
        return True
    s = host.table.find(sid)
    if s is None or not secrets.compare_digest(token, s.token) or s.state is not SessionState.READY:
        return False
    if s.stats.read()[3] != 0:  # a guest attached directly: it is in use here
        return False
    host.close(s, "its migration was aborted by the source")
    return True
