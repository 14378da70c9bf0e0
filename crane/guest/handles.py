"""Guest-chosen handle ids (architecture invariant 2).

The guest names every object it creates, so creation is an asynchronous call and a restored
session recreates the same names. The object kind sits in the top byte, so a stream handle
passed where an event is expected is caught locally (CUDA_ERROR_INVALID_HANDLE) without asking
the daemon, and no handle is ever 0, 1 or 2 (the NULL, legacy and per-thread default streams).
"""

from __future__ import annotations

import itertools
import threading
from enum import IntEnum

__all__ = ["HandleAllocator", "HandleKind", "kind_of"]


class HandleKind(IntEnum):
    CONTEXT = 0xC1
    MODULE = 0xC2
    FUNCTION = 0xC3
    STREAM = 0xC4
    EVENT = 0xC5


def kind_of(handle: int) -> int:
    return (handle >> 56) & 0xFF


class HandleAllocator:
    """Thread-safe monotonically increasing ids per kind (never reused within a session)."""

    def __init__(self) -> None:
        self._counters = {k: itertools.count(1) for k in HandleKind}
        self._lock = threading.Lock()

    def new(self, kind: HandleKind) -> int:
        with self._lock:
            return (int(kind) << 56) | next(self._counters[kind])
