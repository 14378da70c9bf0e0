"""Device-side ``malloc``/``free`` (and C++ ``new``/``delete``, which call them).

Why: kernels allocate per-thread buffers and C++ objects on the device heap, whose blocks
persist across launches until freed, and a virtual destructor's deleting variant calls
``free`` even in programs that never delete anything. The heap is a range of device memory the
backend provides (:class:`DeviceHeap`): first-fit over a free list, 16-byte aligned blocks (as
CUDA's malloc guarantees), neighbours coalesced on free, NULL when no block is large enough.
Calls are served lane by lane in lane order, like serialized atomics. ``free`` of NULL does
nothing; of anything that is not a live block it faults as an illegal address.
"""

from __future__ import annotations

import bisect

import numpy as np

from .errors import KernelFault

__all__ = ["ALIGN", "DeviceHeap", "h_free", "h_malloc"]

ALIGN = 16
_ILLEGAL_ADDRESS = 700


class DeviceHeap:
    """Blocks of ``[base, base + size)``; ``alloc`` returns 0 when none fits."""

    def __init__(self, base: int, size: int) -> None:
        self.base, self.size = base, size
        self._free: list[tuple[int, int]] = [(base, size)] if size >= ALIGN else []
        self.live: dict[int, int] = {}

    def alloc(self, n: int) -> int:
        need = max((n + ALIGN - 1) // ALIGN * ALIGN, ALIGN)
        for i, (addr, size) in enumerate(self._free):
            if size >= need:
                if size == need:
                    del self._free[i]
                else:
                    self._free[i] = (addr + need, size - need)
                self.live[addr] = need
                return addr
        return 0

    def free(self, addr: int) -> bool:
        size = self.live.pop(addr, None)
        if size is None:
            return False
        i = bisect.bisect_left(self._free, (addr, 0))
        self._free.insert(i, (addr, size))
        if i + 1 < len(self._free) and addr + size == self._free[i + 1][0]:
            self._free[i] = (addr, size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == addr:
            prev = self._free[i - 1]
            self._free[i - 1] = (prev[0], prev[1] + self._free[i][1])
            del self._free[i]
        return True

    @property
    def used(self) -> int:
        return sum(self.live.values())


def _heap(st, ins) -> DeviceHeap:
    heap = getattr(st, "heap", None)
    if heap is None:
        raise KernelFault(
            _ILLEGAL_ADDRESS, f"device malloc/free without a device heap at `{ins.text}`"
        )
    return heap


def h_malloc(st, ins, idx) -> None:
    size_off, ret_off = ins.x
    lanes = np.arange(st.n) if idx is None else idx
    pm = st.pm[ins.fid]
    sizes = pm[lanes, size_off : size_off + 8].copy().view(np.uint64).reshape(-1)
    heap = _heap(st, ins)
    out = np.array([heap.alloc(int(s)) for s in sizes.tolist()], np.uint64)
    if ret_off is not None:
        pm[lanes, ret_off : ret_off + 8] = out.view(np.uint8).reshape(-1, 8)


def h_free(st, ins, idx) -> None:
    (ptr_off,) = ins.x
    lanes = np.arange(st.n) if idx is None else idx
    ptrs = st.pm[ins.fid][lanes, ptr_off : ptr_off + 8].copy().view(np.uint64).reshape(-1)
    heap = _heap(st, ins)
    for p in ptrs.tolist():
        if p and not heap.free(int(p)):
            raise KernelFault(
                _ILLEGAL_ADDRESS,
                f"free({p:#x}): not a block of the device heap, at `{ins.text}` "
                f"(PTX line {ins.line})",
            )
