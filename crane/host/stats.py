"""Per-session counters the worker publishes and the daemon reads without asking.

A tiny file-backed mmap in the daemon's run directory: ``crane ps`` must answer instantly even
while the worker is busy inside a long kernel, so the daemon never sends the worker a request for
them. Fields are u64, written by the worker only.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

__all__ = ["MODE_DIRECT", "MODE_RELAY", "SessionStats"]

#: How the guest's call stream reaches the worker (0: not attached yet).
MODE_RELAY = 1
MODE_DIRECT = 2

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
