"""Device memory of the simulated GPU: one flat buffer over the session's whole VA window.

Why a flat buffer: the guest chooses every device address inside the window the daemon granted
(architecture invariant 2), so a device address maps to a buffer offset by one subtraction. The
buffer is a ``MAP_SHARED | MAP_NORESERVE`` mapping of a memfd as large as the window, so a
terabyte-sized window costs nothing until pages are written, and unmapping a chunk hands its
pages back with ``MADV_REMOVE`` (a hole punched in the file: ``MADV_DONTNEED`` would only drop
this process's view of shared pages, neither freeing nor zeroing them).

Why a memfd rather than anonymous memory: a worker on the same host can be handed the
descriptor (:meth:`SimMemory.handle`, passed with ``SCM_RIGHTS`` by a same-host migration) and
map the very same pages over its own window (:meth:`SimMemory.adopt`), so a session moves
between workers without a byte of its memory copied. The file's size is sealed
(``F_SEAL_SHRINK | F_SEAL_GROW``), so no holder of the descriptor can make a mapping of it fault
with ``SIGBUS``. Only the worker serving the session releases pages (:attr:`SimMemory.owns_pages`):
a source that handed its memory over, or a destination that has not been committed to yet,
only unmaps. Closing never punches holes: the pages go when the last mapping and descriptor do.
One cost of sharing: a read fault on a hole of a shared mapping commits a page (an anonymous
private mapping maps the zero page instead), so readers of large ranges ask
:meth:`SimMemory.untouched` first and read nothing where nothing was ever written.

Two layers of validity, as on a real GPU with the VMM API:

* *chunks* are mapped (committed) ranges; mapping is what consumes device memory, so it is the
  only operation that can run out of memory;
* *allocations* are the ranges the guest sub-allocated inside chunks (``cuMemAlloc``). Every
  copy, memset and kernel access is checked against the allocation table, so a pointer outside
  the session's allocations or a copy that runs past one is caught, never silently served.

Kernel code (the PTX interpreter) uses :meth:`SimMemory.offsets` to turn a vector of per-lane
addresses into validated buffer offsets, then indexes :attr:`SimMemory.buf` directly.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import fcntl
import logging
import mmap
import os
from dataclasses import dataclass

import numpy as np

from crane.device.layout import CHUNK_GRANULARITY
from crane.wire.libc import (
    FALLOC_PUNCH_HOLE,
    MAP_FIXED,
    MAP_NORESERVE,
    MAP_SHARED,
    PROT_RW,
    libc,
)

__all__ = ["Allocation", "MemoryFault", "SimMemory"]

log = logging.getLogger("crane.sim")

#: The seals every window's memfd carries: its size can never change.
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL

_MASK = {1: 0xFF, 2: 0xFFFF, 4: 0xFFFFFFFF}
#: A run's counts at or above this take the one-call path (no uint64 overflow in elem * count).
_RUN_COUNT_MAX = 1 << 56

try:  # the C loop that applies a run of memsets in order (fillcore.c, crane/wire/shm_build.py)
    from crane.backends.sim._fillcore import ffi as _fill_ffi  # type: ignore[import-not-found]
    from crane.backends.sim._fillcore import lib as _fill_lib
except ImportError:  # not built (a source tree without scripts/setup.sh): one fill per call
    _fill_ffi = _fill_lib = None


class MemoryFault(Exception):
    """An access outside the session's allocations.

    ``kind`` tells the caller which CUDA error it maps to: ``"range"`` for a bad argument to an
    API call (CUDA_ERROR_INVALID_VALUE), ``"illegal"`` for a kernel access
    (CUDA_ERROR_ILLEGAL_ADDRESS), ``"misaligned"`` (CUDA_ERROR_MISALIGNED_ADDRESS).
    """

    def __init__(self, message: str, address: int, kind: str = "range") -> None:
        super().__init__(message)
        self.address = address
        self.kind = kind


@dataclass(frozen=True)
class Allocation:
    """One guest allocation: ``[addr, addr + size)``."""

    addr: int
    size: int

    @property
    def end(self) -> int:
        return self.addr + self.size


class _RangeTable:
    """Sorted, non-overlapping ``[start, end)`` ranges with O(log n) containment look-ups."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self._np: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, start: int, end: int) -> None:
        i = bisect.bisect_right(self.starts, start)
        if (i > 0 and self.ends[i - 1] > start) or (i < len(self.starts) and self.starts[i] < end):
            raise ValueError("overlaps an existing range")
        self.starts.insert(i, start)
        self.ends.insert(i, end)
        self._np = None

    def remove(self, start: int) -> int:
        """Remove the range that starts exactly at ``start``; return its end."""
        i = bisect.bisect_left(self.starts, start)
        if i == len(self.starts) or self.starts[i] != start:
            raise KeyError(start)
        end = self.ends.pop(i)
        del self.starts[i]
        self._np = None
        return end

    def containing(self, addr: int) -> tuple[int, int] | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.ends[i]:
            return self.starts[i], self.ends[i]
        return None

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._np is None:
            self._np = (np.array(self.starts, np.uint64), np.array(self.ends, np.uint64))
        return self._np

    def overlapping(self, start: int, end: int) -> list[tuple[int, int]]:
        i = max(bisect.bisect_right(self.starts, start) - 1, 0)
        out = []
        while i < len(self.starts) and self.starts[i] < end:
            if self.ends[i] > start:
                out.append((self.starts[i], self.ends[i]))
            i += 1
        return out


class SimMemory:
    """The simulated device memory of one session."""

    def __init__(self, base: int, size: int) -> None:
        if base % CHUNK_GRANULARITY or size % CHUNK_GRANULARITY or size <= 0:
            raise ValueError("window base and size must be positive multiples of 2 MiB")
        self.base = base
        self.size = size
        self._fd = os.memfd_create(f"crane-sim-{base:#x}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self._fd, size)
            fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, _SEALS)
            flags = MAP_SHARED | MAP_NORESERVE
            self._map = mmap.mmap(self._fd, size, flags=flags)
        except BaseException:
            os.close(self._fd)
            raise
        #: The whole window as bytes; device address ``a`` is ``buf[a - base]``.
        self.buf = np.frombuffer(self._map, dtype=np.uint8)
        #: This worker serves the session, so a chunk it unmaps is released (False: the
        #: memory was handed over, or adopted and not yet committed to, see the module's doc).
        self.owns_pages = True
        self._chunks = _RangeTable()
        self._allocs = _RangeTable()
        self.mapped_bytes = 0
        self.allocated_bytes = 0

    def close(self) -> None:
        """Release the window (the process exiting does the same).

        A thread that is still finishing (a transport's last replies, which carry views of
        device memory rather than copies) may hold a view for a moment: the mapping is then
        unmapped when the last view goes, not refused with an error at the worker's exit."""
        self.buf = np.empty(0, np.uint8)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._map is None:
            return
        try:
            self._map.close()
        except BufferError:
            log.debug("device memory still viewed at close: unmapped when the last view goes")
        self._map = None  # type: ignore[assignment]

    # ---- handing the memory to another worker on this host ---------------------------------
    def handle(self) -> int:
        """The descriptor of the window's memfd (still this object's: the caller passes it
        on, e.g. with ``SCM_RIGHTS``, and never closes it)."""
        if self._fd < 0:
            raise ValueError("device memory is closed")
        return self._fd

    def adopt(self, fd: int) -> None:
        """Map another window's memfd (its :meth:`handle`, received from its worker) over this
        one, at the same address, so every view of :attr:`buf` (kernels', the PTX compiler's
        cached base address) now sees that memory; this window's own pages are released.
        Takes ``fd`` over (closed with this object). Refuses, with ``ValueError`` and ``fd``
        left to the caller, a descriptor that is not a window of this size with its size
        sealed. Afterwards :attr:`owns_pages` is False until :meth:`claim`."""
        st = os.fstat(fd)
        if st.st_size != self.size:
            raise ValueError(f"the memory handed over holds {st.st_size} bytes, not {self.size}")
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as e:
            raise ValueError(f"the memory handed over is not a sealed memfd: {e}") from None
        if seals & (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW) != (
            fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
        ):
            raise ValueError("the memory handed over may change size (its memfd is not sealed)")
        if self._map is None or self._fd < 0:
            raise ValueError("device memory is closed")
        addr = self.buf.ctypes.data
        flags = MAP_SHARED | MAP_FIXED | MAP_NORESERVE
        got = libc.mmap(addr, self.size, PROT_RW, flags, fd, 0)
        if got != addr:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot map the memory handed over: {os.strerror(err)}")
        # our own pages are mapped nowhere now; the mmap object keeps a duplicate of our
        # descriptor until it closes, so free them here rather than at the session's end
        if libc.fallocate(self._fd, FALLOC_PUNCH_HOLE, 0, self.size) != 0:
            log.warning(
                "could not release the window's own pages: %s", os.strerror(ctypes.get_errno())
            )
        os.close(self._fd)
        self._fd = fd
        self.owns_pages = False

    def claim(self) -> None:
        """This worker serves the session now: chunks it unmaps are released again."""
        self.owns_pages = True

    def disown(self) -> None:
        """The memory was handed over and the receiver took the session: never release a page
        of it from here (the receiver's pages); unmapping at exit is all that is left."""
        self.owns_pages = False

    def untouched(self, addr: int, size: int) -> bool:
        """No page of ``[addr, addr+size)`` was ever written (a hole in the memfd, found with
        ``SEEK_DATA``): it reads as zero, and reading it through the mapping would commit
        its pages for nothing."""
        off = addr - self.base
        try:
            return os.lseek(self._fd, off, os.SEEK_DATA) >= off + size
        except OSError as e:  # ENXIO: no data at or after ``off``
            return e.errno == errno.ENXIO

    # ---- chunks (committed memory) -------------------------------------------------------
    def map_chunk(self, addr: int, size: int) -> None:
        """Commit ``[addr, addr+size)``; the caller has already charged the device's capacity."""
        if size <= 0 or addr % CHUNK_GRANULARITY or size % CHUNK_GRANULARITY:
            raise MemoryFault(f"chunk {addr:#x}+{size:#x} is not 2 MiB aligned", addr)
        if addr < self.base or addr + size > self.base + self.size:
            raise MemoryFault(f"chunk {addr:#x}+{size:#x} lies outside the session window", addr)
        try:
            self._chunks.add(addr, addr + size)
        except ValueError:
            raise MemoryFault(f"chunk {addr:#x}+{size:#x} overlaps a mapped chunk", addr) from None
        self.mapped_bytes += size

    def unmap_chunk(self, addr: int) -> int:
        """Release a chunk that holds no allocation; return its size."""
        span = self._chunks.containing(addr)
        if span is None or span[0] != addr:
            raise MemoryFault(f"{addr:#x} is not the start of a mapped chunk", addr)
        if self._allocs.overlapping(*span):
            raise MemoryFault(f"chunk {addr:#x} still holds allocations", addr)
        self._chunks.remove(addr)
        size = span[1] - span[0]
        self._discard(addr, size)
        self.mapped_bytes -= size
        return size

    def chunks(self) -> list[tuple[int, int]]:
        """Mapped chunks as ``(addr, size)``, in address order."""
        return [(s, e - s) for s, e in zip(self._chunks.starts, self._chunks.ends, strict=True)]

    # ---- allocations ------------------------------------------------------------------------
    def alloc(self, addr: int, size: int) -> None:
        """Record a guest allocation; it must lie inside mapped memory: one chunk, or chunks
        mapped back to back (the worker commits a module variable larger than 2 MiB, or one
        that crosses a chunk boundary, as consecutive 2 MiB chunks)."""
        if size <= 0:
            raise MemoryFault(f"allocation of {size} bytes at {addr:#x}", addr)
        chunk = self._chunks.containing(addr)
        while chunk is not None and chunk[1] < addr + size:
            chunk = self._chunks.containing(chunk[1])  # the next one, if it starts right there
        if chunk is None:
            raise MemoryFault(f"allocation {addr:#x}+{size:#x} is not inside a mapped chunk", addr)
        try:
            self._allocs.add(addr, addr + size)
        except ValueError:
            raise MemoryFault(f"allocation {addr:#x}+{size:#x} overlaps another", addr) from None
        self.allocated_bytes += size

    def free(self, addr: int) -> int:
        """Forget the allocation that starts at ``addr`` (its bytes stay, as on a GPU)."""
        try:
            end = self._allocs.remove(addr)
        except KeyError:
            raise MemoryFault(f"{addr:#x} is not the start of an allocation", addr) from None
        size = end - addr
        self.allocated_bytes -= size
        return size

    def allocations(self) -> list[Allocation]:
        """Live allocations in address order (the state record reads this)."""
        return [
            Allocation(s, e - s)
            for s, e in zip(self._allocs.starts, self._allocs.ends, strict=True)
        ]

    def allocation_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Sorted allocation starts and ends as uint64 arrays (cached until the table changes):
        compiled kernels (ptx/jit) search them to check their own accesses."""
        return self._allocs.arrays()

    def find(self, addr: int) -> Allocation:
        """The allocation containing ``addr``."""
        span = self._allocs.containing(addr)
        if span is None:
            raise MemoryFault(f"{addr:#x} is not inside any allocation of this session", addr)
        return Allocation(span[0], span[1] - span[0])

    # ---- byte ranges (API calls) -----------------------------------------------------------
    def check_range(self, addr: int, size: int) -> int:
        """Validate ``[addr, addr+size)`` lies in one allocation; return its buffer offset."""
        span = self._allocs.containing(addr)
        if span is None:
            raise MemoryFault(f"{addr:#x} is not inside any allocation of this session", addr)
        if size < 0 or addr + size > span[1]:
            raise MemoryFault(
                f"range {addr:#x}+{size:#x} runs {addr + size - span[1]} bytes past the allocation "
                f"{span[0]:#x}+{span[1] - span[0]:#x}",
                addr,
            )
        return addr - self.base

    def view(self, addr: int, size: int) -> np.ndarray:
        """A writable uint8 view of a validated range."""
        off = self.check_range(addr, size)
        return self.buf[off : off + size]

    def write(self, addr: int, data: bytes | memoryview | np.ndarray) -> None:
        src = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
        self.view(addr, src.nbytes)[:] = src.reshape(-1).view(np.uint8)

    def read(self, addr: int, size: int) -> bytes:
        return self.view(addr, size).tobytes()

    def copy(self, dst: int, src: int, size: int) -> None:
        """Device-to-device copy; overlapping ranges behave like memmove."""
        s = self.view(src, size)
        d = self.view(dst, size)
        d[:] = s.copy() if abs(dst - src) < size else s

    def fill(self, addr: int, value: int, elem_size: int, count: int) -> None:
        """cuMemsetD8/D16/D32: ``count`` elements of ``elem_size`` bytes set to ``value``."""
        dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[elem_size]
        off = self.check_range(addr, elem_size * count)
        self.buf[off : off + elem_size * count].view(dtype).fill(value & _MASK[elem_size])

    def fill_run(
        self, addrs: np.ndarray, values: np.ndarray, elem_sizes: np.ndarray, counts: np.ndarray
    ) -> int:
        """Memsets in call order (columns of a packed run, one row per call), as :meth:`fill`
        would apply them one by one, up to the first one :meth:`fill` would refuse (a range
        outside one allocation, an element size not 1, 2 or 4): how many were applied. The
        caller runs that one through :meth:`fill`, which raises what it raises; no range is
        written before every range before it was checked."""
        addrs = addrs.astype(np.uint64, copy=False)
        elem = elem_sizes.astype(np.uint64)
        cnt = counts.astype(np.uint64, copy=False)
        ok = ((elem == 1) | (elem == 2) | (elem == 4)) & (cnt < _RUN_COUNT_MAX)
        starts, ends = self._allocs.arrays()
        if len(starts):
            at = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
            end = ends[np.maximum(at, 0)]
            # ``end - addr >= size`` rather than ``addr + size <= end``: no wrap past 2**64
            ok &= (at >= 0) & (addrs < end) & (end - addrs >= elem * cnt)
        else:
            ok[:] = False
        n = len(addrs) if ok.all() else int(np.argmin(ok))
        if n == 0:
            return 0
        off = (addrs[:n] - np.uint64(self.base)).astype(np.uint64)
        if _fill_lib is None:  # the same fills, one NumPy call each
            for a, v, e, c in zip(
                addrs[:n].tolist(),
                values[:n].tolist(),
                elem[:n].tolist(),
                cnt[:n].tolist(),
                strict=True,
            ):
                self.fill(a, v, e, c)
            return n
        val = np.ascontiguousarray(values[:n], dtype=np.uint32)
        el = np.ascontiguousarray(elem[:n], dtype=np.uint32)
        c = np.ascontiguousarray(cnt[:n])
        f = _fill_ffi
        with f.from_buffer(self.buf, require_writable=True) as base:
            _fill_lib.crane_fill_run(
                base,
                f.from_buffer("uint64_t[]", off),
                f.from_buffer("uint32_t[]", val),
                f.from_buffer("uint32_t[]", el),
                f.from_buffer("uint64_t[]", c),
                n,
            )
        return n

    # ---- per-lane accesses (kernels) -------------------------------------------------------
    def offsets(self, addrs: np.ndarray, nbytes: int) -> np.ndarray:
        """Validate per-lane accesses of ``nbytes`` each; return int64 offsets into :attr:`buf`.

        Raises :class:`MemoryFault` (kind ``"illegal"`` or ``"misaligned"``) naming the first
        offending address, as a GPU reports CUDA_ERROR_ILLEGAL_ADDRESS for the launch.
        """
        a = np.asarray(addrs, dtype=np.uint64)
        if a.size == 0:
            return np.empty(0, np.int64)
        if nbytes > 1:
            bad = (a % np.uint64(nbytes)) != 0
            if bad.any():
                first = int(a[np.argmax(bad)])
                raise MemoryFault(
                    f"misaligned {nbytes}-byte access at {first:#x}", first, "misaligned"
                )
        starts, ends = self._allocs.arrays()
        lo, hi = int(a.min()), int(a.max())
        span = self._allocs.containing(lo)
        if span is not None and hi + nbytes <= span[1]:
            return (a - np.uint64(self.base)).astype(np.int64)
        idx = np.searchsorted(starts, a, side="right").astype(np.int64) - 1
        ok = idx >= 0
        safe = np.where(ok, idx, 0)
        if len(starts):
            # ``end - a >= nbytes`` rather than ``a + nbytes <= end``: the sum wraps past 2**64
            # for an address near the top of the space and would pass the check
            end = ends[safe]
            ok &= (a < end) & ((end - a) >= np.uint64(nbytes))
        else:
            ok[:] = False
        if not ok.all():
            first = int(a[np.argmin(ok)])
            raise MemoryFault(
                f"{nbytes}-byte access at {first:#x} is outside every allocation", first, "illegal"
            )
        return (a - np.uint64(self.base)).astype(np.int64)

    def _discard(self, addr: int, size: int) -> None:
        """Give the pages of a released range back to the OS (they read as zero afterwards):
        a hole punched in the memfd. Not while another worker may own them (see
        :attr:`owns_pages`): the chunk is then only forgotten here."""
        if not self.owns_pages:
            return
        off = addr - self.base
        try:
            self._map.madvise(mmap.MADV_REMOVE, off, size)
        except (AttributeError, OSError):
            self.buf[off : off + size] = 0
