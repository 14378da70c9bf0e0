"""Host memory that kernels address: mapped pinned memory and managed memory.

A kernel on the daemon's GPU cannot reach this process's memory, so such memory lives twice:
here (what the host reads and writes) and in device memory at the address kernels use (its
*mirror*). The two are made coherent at the points where CUDA's model without concurrent managed
access (``CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 0``, what a session is told, see
:mod:`crane.device.served`) lets a program look:

* **push**: before device work that may read the memory (a launch, a copy out of device
  memory), the bytes the host changed since the device last saw them go to the mirror, in the
  work's stream, ahead of it;
* **pull**: after a synchronization (context, stream, event, a query that reports idle, a copy
  to the host), if device work was issued since, the mirror is read back and the bytes the
  device changed are merged in: a host write to other bytes of the same page is kept.

A shadow copy of what the device last saw tells who changed what (compared page by page with
NumPy, so an untouched mirror costs a memory compare, not a transfer). Like a GPU without
concurrent access, the host must not touch the memory while a kernel that uses it runs; unlike
zero-copy memory on a local GPU, a kernel and the host cannot signal each other through it while
the kernel runs (a documented limit).

Two kinds of blocks: *shared-address* blocks (managed memory, cuMemHostAlloc with DEVICEMAP)
are mapped in this process at their device address, inside the device window the interposer
reserved, so one pointer works on both sides as with unified addressing; *registered* blocks
(cuMemHostRegister with DEVICEMAP) keep the application's pages and get a mirror elsewhere,
whose address cuMemHostGetDevicePointer reports.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from crane.wire.libc import (
    MAP_ANONYMOUS,
    MAP_FAILED,
    MAP_FIXED,
    MAP_FIXED_NOREPLACE,
    MAP_NORESERVE,
    MAP_PRIVATE,
    PROT_NONE,
    PROT_RW,
    libc,
)

__all__ = ["PAGE", "HostMirrors", "Mirror", "MirrorError", "map_fixed", "unmap_fixed"]

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class MirrorError(Exception):
    """Host memory could not be placed at a device address."""


def map_fixed(addr: int, size: int, *, replace: bool) -> None:
    """Map ``size`` bytes of zeroed read-write memory at exactly ``addr``. ``replace``: the
    range is this process's own reservation of the device window (PROT_NONE), which MAP_FIXED
    may replace; otherwise the range must be unmapped."""
    flags = MAP_PRIVATE | MAP_ANONYMOUS | (MAP_FIXED if replace else MAP_FIXED_NOREPLACE)
    got = libc.mmap(addr, size, PROT_RW, flags, -1, 0)
    if got in (None, MAP_FAILED) or got != addr:
        err = ctypes.get_errno()
        if got not in (None, MAP_FAILED):
            libc.munmap(got, size)
        raise MirrorError(
            f"cannot map host memory at {addr:#x}+{size:#x}: {os.strerror(err or errno.EEXIST)}"
        )


def unmap_fixed(addr: int, size: int, *, reserved: bool) -> None:
    """Undo :func:`map_fixed`: back to the window's PROT_NONE reservation, or unmapped."""
    if reserved:
        flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE
        libc.mmap(addr, size, PROT_NONE, flags, -1, 0)
    else:
        libc.munmap(addr, size)


@dataclass
class Mirror:
    """One block: ``size`` bytes at ``host`` here, mirrored at ``dev`` on the device."""

    host: int
    dev: int
    size: int
    kind: str  # "managed", "mapped" (cuMemHostAlloc DEVICEMAP) or "registered"
    flags: int = 0
    shadow: np.ndarray = field(repr=False, default_factory=lambda: np.empty(0, np.uint8))
    #: cuMemAdvise / cuMemPrefetchAsync bookkeeping for cuMemRangeGetAttribute
    advice: dict[int, int] = field(default_factory=dict)
    last_prefetch: int = -2  # CU_DEVICE_INVALID: never prefetched

    def view(self) -> np.ndarray:
        """This process's bytes of the block, as a writable array over them."""
        return np.ctypeslib.as_array((ctypes.c_uint8 * self.size).from_address(self.host))


Write = Callable[[int, memoryview, int], None]  # (device address, bytes, stream)
Read = Callable[[int, int], bytes | bytearray]  # (device address, size) -> bytes, in order


class HostMirrors:
    """The session's mirrored blocks and the push/pull protocol above.

    ``write`` and ``read`` move bytes to and from device memory without coming back here (the
    session's raw copies). Callers hold the session's lock."""

    def __init__(self, write: Write, read: Read) -> None:
        self._write, self._read = write, read
        #: The blocks by device address; empty while nothing is mirrored (the hottest paths
        #: test it: a dict's truth costs no call, :meth:`__bool__` one).
        self.mirrored: dict[int, Mirror] = {}
        self._dev_starts: list[int] = []
        self._by_host: dict[int, Mirror] = {}
        self._host_starts: list[int] = []
        #: streams with device work issued since they were last synchronized
        self.pending: set[int] = set()
        #: Called when a block starts being mirrored: a call on any stream may then owe the
        #: mirrors a push, which only the session's own path does (the interposer's C fast
        #: lane drops what it learnt).
        self.on_add: Callable[[], None] = lambda: None

    def __bool__(self) -> bool:
        return bool(self.mirrored)

    # ---- the blocks -----------------------------------------------------------------------
    def add(self, m: Mirror, stream: int = 0) -> None:
        """Start mirroring ``m``: the device gets the host's current bytes."""
        m.shadow = m.view().copy()
        self._write(m.dev, memoryview(m.shadow), stream)
        self.mirrored[m.dev] = m
        self.on_add()
        bisect.insort(self._dev_starts, m.dev)
        self._by_host[m.host] = m
        bisect.insort(self._host_starts, m.host)

    def remove(self, m: Mirror) -> None:
        del self.mirrored[m.dev]
        self._dev_starts.remove(m.dev)
        del self._by_host[m.host]
        self._host_starts.remove(m.host)

    @staticmethod
    def _find(starts: list[int], table: dict[int, Mirror], addr: int) -> Mirror | None:
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0:
            return None
        m = table[starts[i]]
        return m if addr < starts[i] + m.size else None

    def by_dev(self, addr: int) -> Mirror | None:
        """The block whose mirror holds device address ``addr``."""
        return self._find(self._dev_starts, self.mirrored, addr)

    def by_host(self, addr: int) -> Mirror | None:
        """The block whose host bytes hold ``addr``."""
        return self._find(self._host_starts, self._by_host, addr)

    def blocks(self) -> list[Mirror]:
        return list(self.mirrored.values())

    # ---- coherence ------------------------------------------------------------------------
    def push(self, stream: int, blocks: list[Mirror] | None = None) -> None:
        """Send the pages the host changed since the device last saw them (before device work
        on ``stream`` that may read them)."""
        for m in self.blocks() if blocks is None else blocks:
            host = m.view()
            pages = _changed_pages(host, m.shadow)
            for start, end in pages:
                m.shadow[start:end] = host[start:end]
                self._write(m.dev + start, memoryview(m.shadow[start:end]), stream)

    def issued(self, stream: int) -> None:
        """Device work that may write mirrors was issued on ``stream``."""
        self.pending.add(stream)

    def pull(self, settled: int | None) -> None:
        """After a synchronization: merge what the device wrote into the host's bytes.
        ``settled`` is the stream now known idle (None: the whole device)."""
        if not self.pending:
            return
        for m in self.blocks():
            dev = np.frombuffer(self._read(m.dev, m.size), np.uint8)
            changed = dev != m.shadow
            if changed.any():
                host = m.view()
                host[changed] = dev[changed]
                m.shadow[changed] = dev[changed]
        if settled is None:
            self.pending.clear()
        else:
            self.pending.discard(settled)


def _changed_pages(host: np.ndarray, shadow: np.ndarray) -> list[tuple[int, int]]:
    """Byte ranges ``[start, end)`` of whole pages (the last one may be short) where ``host``
    differs from ``shadow``, adjacent pages merged."""
    n = host.size
    if n == 0:
        return []
    full = n // PAGE * PAGE
    diff = []
    if full:
        d = (host[:full] != shadow[:full]).reshape(-1, PAGE).any(axis=1)
        diff = list(np.flatnonzero(d))
    ranges: list[tuple[int, int]] = []
    for p in diff:
        start, end = int(p) * PAGE, int(p) * PAGE + PAGE
        if ranges and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((start, end))
    if full < n and (host[full:] != shadow[full:]).any():
        if ranges and ranges[-1][1] == full:
            ranges[-1] = (ranges[-1][0], n)
        else:
            ranges.append((full, n))
    return ranges
