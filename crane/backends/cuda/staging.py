"""Pinned host staging for the cuda backend's copies.

Guest bytes arrive in Python objects (pageable memory). An asynchronous copy from pageable memory
makes the driver synchronize or stage it itself; copying into page-locked memory we own keeps
host-to-device copies asynchronous in stream order, and lets device-to-host copies land at full
DMA speed. A ring of slots, each with an event recorded after the copy that used it: a slot is
reused only once its event completes, so a burst of copies pipelines over all slots and a copy
larger than a slot goes through them in pieces.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from crane.backends.cuda.driver import unwrap

__all__ = ["StagingRing"]

#: CU_EVENT_DISABLE_TIMING: the ring's events only order reuse.
_EVENT_DISABLE_TIMING = 0x2


@dataclass
class _Slot:
    addr: int
    event: Any
    busy: bool = False  # an operation was recorded on the event and not yet waited for


class StagingRing:
    """``count`` page-locked buffers of ``size`` bytes, used round-robin."""

    def __init__(self, drv: Any, size: int = 4 << 20, count: int = 8) -> None:
        self.drv = drv
        self.size = size
        self.slots: list[_Slot] = []
        self._next = 0
        try:
            for _ in range(count):
                addr = int(unwrap("cuMemHostAlloc", drv.cuMemHostAlloc(size, 0)))
                self.slots.append(_Slot(addr, None))
                self.slots[-1].event = unwrap(
                    "cuEventCreate", drv.cuEventCreate(_EVENT_DISABLE_TIMING)
                )
        except BaseException:
            self.close()
            raise

    def _take(self) -> _Slot:
        slot = self.slots[self._next]
        self._next = (self._next + 1) % len(self.slots)
        if slot.busy:
            unwrap("cuEventSynchronize", self.drv.cuEventSynchronize(slot.event))
            slot.busy = False
        return slot

    def _done(self, slot: _Slot, stream: Any) -> None:
        unwrap("cuEventRecord", self.drv.cuEventRecord(slot.event, stream))
        slot.busy = True

    def upload(self, dst: int, data: Any, stream: Any) -> None:
        """Host-to-device in stream order; returns once ``data`` has been consumed."""
        view = memoryview(data).cast("B")
        for off in range(0, len(view), self.size):
            piece = view[off : off + self.size]
            slot = self._take()
            n = len(piece)
            ctypes.memmove(slot.addr, _address_of(piece), n)
            unwrap(
                "cuMemcpyHtoDAsync",
                self.drv.cuMemcpyHtoDAsync(dst + off, slot.addr, n, stream),
            )
            self._done(slot, stream)

    def download(self, src: int, size: int, stream: Any) -> bytes | bytearray:
        """Device-to-host in stream order, waiting for the data.

        Returns a copy, never a view of a slot: a migration's pre-copy thread reads while the
        guest's calls run, and a view would be overwritten under its reader. A read larger
        than a slot is assembled while the next piece is already in flight."""
        if size <= self.size:
            slot = self._take()
            unwrap("cuMemcpyDtoHAsync", self.drv.cuMemcpyDtoHAsync(slot.addr, src, size, stream))
            unwrap("cuStreamSynchronize", self.drv.cuStreamSynchronize(stream))
            return ctypes.string_at(slot.addr, size)
        out = bytearray(size)
        dst = (ctypes.c_char * size).from_buffer(out)
        base = ctypes.addressof(dst)
        pending: list[tuple[_Slot, int, int]] = []
        for off in range(0, size, self.size):
            n = min(self.size, size - off)
            slot = self._take()
            unwrap(
                "cuMemcpyDtoHAsync",
                self.drv.cuMemcpyDtoHAsync(slot.addr, src + off, n, stream),
            )
            self._done(slot, stream)
            pending.append((slot, off, n))
            if len(pending) > 1:
                self._drain(pending.pop(0), base)
        for p in pending:
            self._drain(p, base)
        del dst
        return out

    def _drain(self, item: tuple[_Slot, int, int], base: int) -> None:
        slot, off, n = item
        unwrap("cuEventSynchronize", self.drv.cuEventSynchronize(slot.event))
        slot.busy = False
        ctypes.memmove(base + off, slot.addr, n)

    def wait_idle(self) -> None:
        for slot in self.slots:
            if slot.busy:
                unwrap("cuEventSynchronize", self.drv.cuEventSynchronize(slot.event))
                slot.busy = False

    def close(self) -> None:
        for slot in self.slots:
            if slot.event is not None:
                self.drv.cuEventDestroy(slot.event)
            self.drv.cuMemFreeHost(slot.addr)
        self.slots.clear()


def _address_of(view: memoryview) -> int:
    """The address of a contiguous read-only buffer (bytes from protobuf are read-only, so
    ctypes' from_buffer refuses them; numpy reads the address without copying)."""
    import numpy as np

    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
