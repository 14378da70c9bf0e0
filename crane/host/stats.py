"""Per-session counters the worker publishes and the daemon reads without asking.

A tiny file-backed mmap in the daemon's run directory: ``crane ps`` must answer instantly even
while the worker is busy inside a long kernel, so the daemon never sends the worker a request for
them. Fields are u64, written by the worker only.

Beside it, :class:`SnapshotFile`: the session's accounting (crane.engine.meter), a JSON document
the worker replaces atomically about once a second (its size varies with the kernels seen, so
it is no fixed layout); the daemon's exporter and ``crane profile``/``crane top`` read it, again
without asking the worker.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import time
from pathlib import Path
from typing import Any

__all__ = [
    "MODE_DIRECT",
    "MODE_RELAY",
    "MODE_RING",
    "TRANSPORTS",
    "WORKER_MODES",
    "SessionStats",
    "SnapshotFile",
    "snapshot_path",
]

#: How the guest's call stream reaches the worker (0: not attached yet).
MODE_RELAY = 1
MODE_DIRECT = 2
MODE_RING = 3  # the worker's shared-memory call ring (crane.worker.ring)
#: Modes in which the guest's calls reach the worker without passing the daemon.
WORKER_MODES = frozenset({MODE_DIRECT, MODE_RING})
#: What ``crane ps`` calls each mode's transport.
TRANSPORTS = {MODE_RELAY: "relay", MODE_DIRECT: "direct", MODE_RING: "ring"}

# calls executed, device bytes committed, last done seq, attach mode, peer (NUL-padded)
_LAYOUT = struct.Struct("<QQQQ96s")


class SessionStats:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < _LAYOUT.size:
                os.ftruncate(fd, _LAYOUT.size)
            self._map = mmap.mmap(fd, _LAYOUT.size)
        finally:
            os.close(fd)

    def write(self, calls: int, mem_used: int, done_seq: int) -> None:
        struct.pack_into("<QQQ", self._map, 0, calls, mem_used, done_seq)

    def set_attached(self, mode: int, peer: str) -> None:
        struct.pack_into("<Q96s", self._map, 24, mode, peer.encode()[:96])

    def read(self) -> tuple[int, int, int, int, str]:
        """(calls, mem_used, done_seq, mode, peer)."""
        calls, mem, done, mode, peer = _LAYOUT.unpack_from(self._map, 0)
        return calls, mem, done, mode, peer.rstrip(b"\0").decode(errors="replace")

    def close(self) -> None:
        self._map.close()


def snapshot_path(stats_path: Path | str) -> Path:
    """Where the session whose stats page is ``stats_path`` publishes its accounting."""
    return Path(stats_path).with_suffix(".metrics")


class SnapshotFile:
    """A JSON document replaced whole (write to a temporary name, rename): a reader sees the
    previous snapshot or the next one, never half of one."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(self.path.name + ".tmp")

    def write(self, doc: dict[str, Any]) -> None:
        doc = {**doc, "published": time.monotonic()}
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(self._tmp, self.path)

    def read(self) -> dict[str, Any] | None:
        """The last snapshot, or None (accounting off, nothing published yet, gone)."""
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        for p in (self.path, self._tmp):
            p.unlink(missing_ok=True)
