"""Device-memory accounting shared by every session on one device (simulated or real).

Each session runs in its own worker process (invariant 4), but ``cuMemGetInfo`` and
out-of-memory must reflect the whole device, as on a real GPU. The ledger is a small file in the
daemon's run directory holding one u64 per session slot; a worker updates its own slot under an
``fcntl`` lock, and the daemon zeroes a slot when it reaps a worker, so a crashed session's
memory is returned too.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from pathlib import Path

__all__ = ["LEDGER_SLOTS", "Ledger"]

LEDGER_SLOTS = 1024
_SLOT = struct.Struct("<Q")


class Ledger:
    """Committed bytes per session slot on one device."""

    def __init__(self, path: Path | str, capacity: int) -> None:
        self.path = Path(path)
        self.capacity = capacity
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < LEDGER_SLOTS * _SLOT.size:
                os.ftruncate(fd, LEDGER_SLOTS * _SLOT.size)
            self._map = mmap.mmap(fd, LEDGER_SLOTS * _SLOT.size)
        finally:
            os.close(fd)
        self._lock_fd = os.open(self.path, os.O_RDWR)

    def _total(self) -> int:
        return sum(v for (v,) in _SLOT.iter_unpack(self._map))

    def used(self) -> int:
        """Bytes committed on the device by all sessions."""
        fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
        try:
            return self._total()
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def charge(self, slot: int, nbytes: int) -> bool:
        """Add ``nbytes`` to ``slot`` if the device has room; False (nothing changed) if not."""
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            if self._total() + nbytes > self.capacity:
                return False
            off = slot * _SLOT.size
            (cur,) = _SLOT.unpack_from(self._map, off)
            _SLOT.pack_into(self._map, off, cur + nbytes)
            return True
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def release(self, slot: int, nbytes: int) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            off = slot * _SLOT.size
            (cur,) = _SLOT.unpack_from(self._map, off)
            _SLOT.pack_into(self._map, off, max(cur - nbytes, 0))
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def slot_bytes(self, slot: int) -> int:
        (v,) = _SLOT.unpack_from(self._map, slot * _SLOT.size)
        return v

    def clear(self, slot: int) -> None:
        """Forget a slot entirely (the daemon, after reaping its worker)."""
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            _SLOT.pack_into(self._map, slot * _SLOT.size, 0)
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def reset(self) -> None:
        """Zero every slot (a daemon starting up owns no sessions yet)."""
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            self._map[:] = bytes(len(self._map))
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._map.close()
        os.close(self._lock_fd)
