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

__all__ = ["SessionStats"]

_LAYOUT = struct.Struct("<QQQ")  # calls executed, device bytes committed, last done seq


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
        _LAYOUT.pack_into(self._map, 0, calls, mem_used, done_seq)

    def read(self) -> tuple[int, int, int]:
        return _LAYOUT.unpack_from(self._map, 0)

    def close(self) -> None:
        self._map.close()
