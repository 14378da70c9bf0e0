"""Checkpoint, park and restore, as the daemon orchestrates them (the worker does the I/O).

A checkpoint claims the session (``checkpointing``), asks its worker to write the file and
either gives the session back as it was or, with ``release``, parks it: the worker and its
device memory are released and the entry keeps the id, token and window for a restore. A
parked session's guest finds its stream broken, asks ``Resume`` (answered UNAVAILABLE while
parked) and reconnects once the session is ready again, here or on another daemon.

A restore runs the pre-flight a migration's destination runs (:mod:`crane.state.preflight`:
code for this device's architecture in every module, free memory, no limit lower than the guest
was told), all at once and before any memory is written, against what this daemon's device
reports; the restored session keeps answering with the identity its guest was told.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from crane.api.errors import ProtocolError
from crane.daemon.lifecycle import SessionState
from crane.daemon.session import DaemonSession
from crane.daemon.worker_control import reason, request
from crane.device.layout import module_area_base
from crane.host.channel import ChannelClosed
from crane.host.checkpoint_dir import PathRefused
from crane.host.logs import bind_session
from crane.host.messages import Checkpointed, CheckpointRequest, Refused, Restored, RestoreRequest
from crane.state.checkpoint import CheckpointError, Head, read_head
from crane.state.preflight import Use, assess, check_code, refusals
from crane.state.session_record import SessionRecord

if TYPE_CHECKING:
    from crane.daemon.sessions import SessionManager

__all__ = ["BOUNDARY_WAIT_S", "Checkpointed", "checkpoint", "restore"]

log = logging.getLogger("craned")

#: How long a checkpoint waits for the session's call in progress when its caller sets no
#: deadline of its own.
BOUNDARY_WAIT_S = 30.0


def checkpoint(
    mgr: SessionManager, sid: str, path: str, release: bool, wait_s: float = BOUNDARY_WAIT_S
) -> tuple[Checkpointed, SessionState, Path]:
    """Write the session's state to ``path`` (a name inside the checkpoint directory, see
    :mod:`crane.host.checkpoint_dir`); with ``release`` park it. Returns the worker's counts,
    the session's state afterwards and the file's path.

    ``wait_s``: how long the session's call in progress may take to return before the
    checkpoint gives up (it can only start between two batches). A kernel that never ends
    would otherwise hold the request, and the session in ``checkpointing``, forever: past it
    the session goes back to the state it had and the caller gets DEADLINE_EXCEEDED with the
    reason. Writing, once started, is not limited (it makes progress by itself)."""
    rel, full = _confined(mgr, path, write=True)
    session, before = mgr.claim(sid, "checkpoint", SessionState.CHECKPOINTING)
    deadline = time.monotonic() + wait_s
    try:
        # the relay holds the channel while a batch runs; the worker's own lock covers a
        # batch that came directly (the worker refuses at the same deadline)
        if not session.channel_lock.acquire(timeout=wait_s):
            mgr.give_back(session, SessionState.CHECKPOINTING, before)
            raise ProtocolError(
                "DEADLINE_EXCEEDED",
                f"checkpoint not started: a relayed call batch did not return within "
                f"{wait_s:.1f} s (a kernel that does not finish?); the session is left as it was",
            )
        try:
            where = str(mgr.checkpoints.root)
            msg = CheckpointRequest(str(rel), release, session.record(), deadline, where)
            answer = request(session, msg)
        finally:
            session.channel_lock.release()
    except ChannelClosed as e:
        mgr.give_back(session, SessionState.CHECKPOINTING, before)
        mgr.worker_died(session)  # its guest's Resume hears why
        mgr.close(session, "worker exited during a checkpoint")
        raise ProtocolError("ABORTED", f"session {sid} ended in the checkpoint: {e}") from None
    if not isinstance(answer, Checkpointed):
        mgr.give_back(session, SessionState.CHECKPOINTING, before)
        if isinstance(answer, Refused) and answer.late:
            raise ProtocolError(
                "DEADLINE_EXCEEDED", f"{answer.error}; the session is left as it was"
            )
        raise ProtocolError("FAILED_PRECONDITION", f"checkpoint of {sid} failed: {reason(answer)}")
    if not release:
        mgr.give_back(session, SessionState.CHECKPOINTING, before)
        return answer, before, full
    with mgr.table.lock:
        session.move(SessionState.PARKED)
        session.parked_at = str(full)
        session.parked_since = time.monotonic()
        session.peer = ""
    mgr.release(session)
    ttl = mgr.expiry.parked_ttl_s
    log.info(
        "session %s parked to %s; its device memory is released; its entry waits %s for a restore",
        sid,
        full,
        f"{ttl:g} s" if ttl else "without limit",
    )
    return answer, SessionState.PARKED, full


def _confined(mgr: SessionManager, name: str, write: bool) -> tuple[PurePosixPath, Path]:
    """``name`` relative to the checkpoint directory and as a full path; PERMISSION_DENIED by
    name for anything outside it, decided before the file system is asked anything about it
    (so the refusal says nothing about whether such a file exists)."""
    where = mgr.checkpoints
    try:
        rel = where.relative(name)
        if write:
            where.check_writable(name)  # inside: a link or a directory there is refused too
    except PathRefused as e:
        log.warning("refused a checkpoint path: %s", e)
        raise ProtocolError("PERMISSION_DENIED", str(e)) from None
    except OSError as e:  # inside the directory: a missing sub-directory, say
        raise ProtocolError("NOT_FOUND", f"{where.root / name}: {e.strerror or e}") from None
    return rel, where.root / rel


def restore(
    mgr: SessionManager, path: str, device_index: int, accept_lower: bool = False
) -> tuple[DaemonSession, int]:
    """Recreate a checkpointed session here; refuses precisely, leaves nothing behind. Returns
    the session and the sequence number its guest's calls ran to. ``accept_lower``: the device
    may offer less than the guest was told (never less than the session uses)."""
    rel, full = _confined(mgr, path, write=False)
    path = str(full)
    device = mgr.device(device_index)
    dest = device.destination()
    name = os.path.basename(path)
    code_refusals: list[str] = []

    def on_image(digest: bytes, image: bytes) -> None:
        for msg in check_code(digest, image, dest.cc, dest.where):
            kind = "NO_BINARY_FOR_GPU" if "no usable code" in msg else "INVALID_IMAGE"
            code_refusals.append(f"{msg} (CUDA_ERROR_{kind})")

    try:
        with mgr.checkpoints.open_read(str(rel)) as f:
            head = read_head(f, name, on_image)
        record, note = SessionRecord.from_meta(head.meta, head.version, name)
        needed = _mem_needed(head)
        use = Use.from_json(head.meta.get("use"))  # None: a file from before use was recorded
    except PathRefused as e:  # a link, a directory: inside, but no checkpoint file
        raise ProtocolError("PERMISSION_DENIED", str(e)) from None
    except OSError as e:
        raise ProtocolError("NOT_FOUND", f"cannot read {path}: {e.strerror or e}") from None
    except CheckpointError as e:
        raise ProtocolError("INVALID_ARGUMENT", str(e)) from None
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(
            "INVALID_ARGUMENT", f"{path}: META lacks the session or is malformed: {e}"
        ) from None
    sid = record.id
    bind_session(record)  # the rest of this call is about the restored session
    if note:
        log.warning("restore of %s: %s", sid, note)
    mgr.expire()
    mgr.table.settle_slot(sid, record.slot)
    with mgr.table.lock:
        conflicts = mgr.table.slot_refusals(sid, record.slot)
        if conflicts:  # name every reason, the device's too, not only the first found
            status = conflicts[0][0]
            device_why = code_refusals + refusals(
                dest, told=record.told, mem_needed=needed, use=use, accept_lower=accept_lower
            )
            raise ProtocolError(
                status, f"{path}: " + "; ".join([*(why for _, why in conflicts), *device_why])
            )
        old = mgr.table.entries().get(sid)
        if mgr.table.full(sid):
            raise ProtocolError(
                "RESOURCE_EXHAUSTED", f"daemon is at its limit of {mgr.max_sessions} sessions"
            )
        over = mgr.table.tenant_refusal(record.tenant, sid)
        if over:
            raise ProtocolError("RESOURCE_EXHAUSTED", f"restore of {sid} refused: {over}")
        mgr.table.claim_slot(record.slot, record.tenant)
        if old is not None:
            old.move(SessionState.RESTORING)
    try:
        # the pre-flight, against what the device reports (any backend), before a worker starts
        verdict = assess(dest, told=record.told, mem_needed=needed, use=use)
        why = code_refusals + verdict.refusals(accept_lower, dest.where)
        if why:
            raise ProtocolError(
                "FAILED_PRECONDITION", f"restore of {sid} refused: " + "; ".join(why)
            )
        # after the restore: a worker's start would slow it down
        session = mgr.start(record, device, SessionState.RESTORING, replenish=False)
        try:
            with session.channel_lock:
                answer = request(session, RestoreRequest(str(rel), str(mgr.checkpoints.root)))
        except ChannelClosed as e:
            answer = Refused(f"the worker exited: {e}")
        if not isinstance(answer, Restored):
            mgr.release(session)
            raise ProtocolError(
                "FAILED_PRECONDITION", f"restore of {sid} refused: {reason(answer)}"
            )
        session.adopt(record)
        mgr.admit(session)
    except BaseException:
        if old is not None:
            mgr.give_back(old, SessionState.RESTORING, SessionState.PARKED)
        raise
    finally:
        with mgr.table.lock:
            mgr.table.unclaim_slot(record.slot)
        mgr.pool.replenish()
    log.info(
        "session %s restored from %s on device %d (%s), window %#x",
        sid,
        path,
        device.index,
        device.name,
        session.va_base,
    )
    return session, answer.done_seq


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
