"""The daemon's checkpoint and restore requests, done in the worker that owns the memory.

Each runs under the session's batch lock (so at a call boundary) and answers with a typed
message: :class:`~crane.host.messages.Checkpointed` / :class:`~crane.host.messages.Restored`,
or :class:`~crane.host.messages.Refused` with the reason, never an exception on the channel: a
failed checkpoint leaves the session running as it was, and a failed restore leaves a worker the
daemon discards.
"""

from __future__ import annotations

import logging
from pathlib import Path

from crane.api.results import CudaError
from crane.host.checkpoint_dir import CheckpointDir, PathRefused
from crane.host.messages import (
    Checkpointed,
    CheckpointRequest,
    ControlAnswer,
    Refused,
    Restored,
    RestoreRequest,
)
from crane.state.checkpoint import CheckpointError
from crane.state.park import restore_checkpoint, write_checkpoint
from crane.worker.attach import NotAllowed, TooLate, WorkerSession, WorkerState

__all__ = ["checkpoint", "restore"]

log = logging.getLogger("crane.worker")


def checkpoint(ws: WorkerSession, req: CheckpointRequest) -> ControlAnswer:
    """Write the session to ``req.path`` inside ``req.directory`` (complete or absent, 0600,
    never through a link); park it with ``release``."""
    try:
        where = CheckpointDir(req.directory)
    except ValueError as e:
        return Refused(str(e))
    path = where.root / req.path
    try:
        ws.acquire_by(req.deadline, "checkpoint")
    except TooLate as e:
        return Refused(str(e), late=True)
    try:
        ws.require("checkpoint")
        eng = ws.engine
        with where.open_write(req.path) as f:  # a checkpoint file is complete or absent
            counts = write_checkpoint(eng.device, eng.log, f, req.identity.to_json())
        if req.release:
            ws.move(WorkerState.PARKED)
        log.info("checkpoint written to %s (%d bytes)", path, counts["bytes"])
        return Checkpointed(counts["bytes"], counts["memory_bytes"], counts["sections"])
    except Exception as e:
        return _refused("checkpoint", path, e)
    finally:
        ws.lock.release()


def restore(ws: WorkerSession, req: RestoreRequest) -> ControlAnswer:
    """Replay the checkpoint at ``req.path`` inside ``req.directory`` onto this fresh
    session (never through a link)."""
    try:
        where = CheckpointDir(req.directory)
    except ValueError as e:
        return Refused(str(e))
    path = where.root / req.path
    with ws.lock:
        try:
            ws.require("restore")
            with where.open_read(req.path) as f:
                meta = restore_checkpoint(ws.engine.device, ws.engine.log, f, path.name)
            ws.publish_stats()
            log.info("restored from %s", path)
            return Restored(ws.engine.log.done_seq, meta)
        except Exception as e:
            return _refused("restore", path, e)


def _refused(what: str, path: Path, e: Exception) -> Refused:
    """The reason an operator reads; a bug is logged with its traceback, not hidden."""
    if isinstance(e, CheckpointError | NotAllowed | PathRefused):
        return Refused(str(e))
    if isinstance(e, CudaError):
        return Refused(f"{e.name}: {e.message}")
    if isinstance(e, OSError):
        return Refused(f"{path}: {e.strerror or e}")
    log.exception("%s failed", what)
    return Refused(f"internal error: {e!r}")
