"""The CUDA virtual memory management (VMM) API on the guest side.

``cuMemAddressReserve`` / ``cuMemCreate`` / ``cuMemMap`` / ``cuMemSetAccess`` and their inverses,
as used by PyTorch's expandable segments, NCCL and code that places memory at an address of its
choice. Everything is guest-chosen (architecture invariant 2), so the API maps onto the wire the
session already speaks:

* a **reservation** is a range of the session's VA window, taken from the guest's allocator
  (:meth:`crane.guest.va.VaAllocator.reserve`): no round trip. The caller's address is honoured
  when that range is free (callers compare, as they must with a real driver);
* a **physical handle** (``cuMemCreate``) is a guest-side record: its memory is committed
  lazily, when it is first mapped. Creation checks the device's free memory (less what other
  unmapped handles will need) so an impossible request still fails at ``cuMemCreate`` with
  CUDA_ERROR_OUT_OF_MEMORY, but a create that passes may still fail at ``cuMemMap`` if memory
  ran out in between (``cuMemMap`` documents that error too);
* a **mapping** commits device memory at exactly the mapped address (``MEM_MAP_CHUNK``) and
  records it as an allocation (``MEM_ALLOC``), so the worker's state record (checkpoints,
  migration), kernel arguments, copies and memsets treat it like any other device memory.
  ``cuMemUnmap`` frees it (``MEM_FREE`` + ``MEM_UNMAP_CHUNK``) once the handle is also released,
  in either order, as CUDA does.

What a handle holds survives an unmap while it is not released (CUDA keeps the physical memory
with the handle): the memory then stays committed at its old address, unseen by the application
(a *parked* handle), so the usual teardown (unmap then release, or release then unmap) costs no
copy. Mapping a parked handle again moves its contents to the new address (a device-to-device
copy; through guest memory if the device has no room for both), and anything that needs its old
range (a new mapping over it, freeing the reservation) first saves its contents to guest memory.

Not supported (CUDA_ERROR_NOT_SUPPORTED, with the reason): mapping part of a handle (``offset`` or
``size`` other than the whole handle), mapping one handle at two addresses at once (the worker
holds memory per address and cannot alias it), host-located allocations, and exporting or
importing shareable handles (IPC). Access flags set by ``cuMemSetAccess`` are recorded and
reported by ``cuMemGetAccess``; the device does not enforce them (mapped memory is accessible).
Memory mapped while a context is current is that context's: destroying the context frees it
(the mapping disappears; the handle and reservation stay valid).
"""

from __future__ import annotations

import itertools
import struct
import threading
from dataclasses import dataclass
from typing import Protocol

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.guest.va import VaAllocator, VaError

__all__ = [
    "ACCESS_FLAGS",
    "PROP",
    "Device",
    "Mapping",
    "PhysHandle",
    "Vmm",
    "check_location",
    "parse_prop",
]

_V = CUresult.CUDA_ERROR_INVALID_VALUE
_NS = CUresult.CUDA_ERROR_NOT_SUPPORTED

#: CUmemAllocationProp (cuda.h, 32 bytes): type, requestedHandleTypes, location {type, id},
#: win32HandleMetaData, allocFlags {compressionType, gpuDirectRDMACapable, usage, reserved[4]}.
PROP = struct.Struct("<iiiiQBBH4x")
_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_LOC_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_LOC_HOST = (2, 3, 4)  # HOST, HOST_NUMA, HOST_NUMA_CURRENT
#: CUmemAccess_flags accepted by cuMemSetAccess: PROT_NONE, PROT_READ, PROT_READWRITE.
ACCESS_FLAGS = (0, 1, 3)
#: Top byte of a physical-allocation handle (the session's own handles use 0xC1..0xC5).
HANDLE_KIND = 0xC6


class Device(Protocol):
    """What the VMM state needs from the session (device memory at guest-chosen addresses)."""

    def commit(self, ctx: int, addr: int, size: int) -> None:
        """Commit device memory at ``addr`` and record it as an allocation of ``ctx``."""

    def decommit(self, addr: int) -> None:
        """Free what :meth:`commit` made at ``addr``."""

    def move(self, dst: int, src: int, size: int) -> None:
        """Device-to-device copy after all earlier work."""

    def save(self, addr: int, size: int) -> bytes:
        """Read committed memory back after all earlier work."""

    def restore(self, addr: int, data: bytes) -> None:
        """Write ``data`` to committed memory."""

    def free_memory(self) -> int:
        """The device's free memory, as cuMemGetInfo reports it."""


def check_location(loc_type: int, loc_id: int, what: str) -> None:
    """A CUmemLocation naming the session's device (ordinal 0)."""
    if loc_type == _LOC_DEVICE:
        if loc_id != 0:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_DEVICE, f"{what}: no device {loc_id}")
        return
    if loc_type in _LOC_HOST:
        raise CudaError(_NS, f"{what}: host-located VMM memory is not supported by Crane")
    raise CudaError(_V, f"{what}: bad memory location type {loc_type}")


def parse_prop(raw: bytes, what: str) -> bytes:
    """Validate a CUmemAllocationProp; returns it normalised (as the driver reports it)."""
    kind, handle_types, loc_type, loc_id, win32, _comp, rdma, usage = PROP.unpack(raw)
    if kind != _PINNED:
        raise CudaError(_V, f"{what}: allocation type {kind} (only PINNED is supported)")
    check_location(loc_type, loc_id, what)
    # compression is a request the driver may decline (callers check the handle's properties)
    return PROP.pack(kind, handle_types, loc_type, loc_id, win32, 0, rdma, usage)


@dataclass(eq=False)
class PhysHandle:
    """A cuMemCreate allocation."""

    handle: int
    size: int
    prop: bytes
    refs: int = 1  # cuMemCreate + cuMemRetainAllocationHandle - cuMemRelease
    mapped_at: int | None = None  # its live mapping
    parked_at: int | None = None  # unmapped, memory still committed there (contents kept)
    saved: bytes | None = None  # contents kept in guest memory
    ctx: int = 0  # the context its committed memory belongs to

    @property
    def committed(self) -> bool:
        return self.mapped_at is not None or self.parked_at is not None


@dataclass(eq=False)
class Mapping:
    addr: int
    size: int
    phys: PhysHandle
    access: int = 0  # CUmemAccess_flags for device 0


class Vmm:
    """Reservations, physical handles and mappings of one session."""

    def __init__(self, va: VaAllocator, device: Device, lock: threading.RLock | None = None):
        self.va = va
        self.dev = device
        self.lock = lock or threading.RLock()
        self.handles: dict[int, PhysHandle] = {}  # unreleased handles
        self.maps: dict[int, Mapping] = {}  # address -> live mapping
        self.parked: dict[int, PhysHandle] = {}  # address -> parked handle
        self._waiting: set[PhysHandle] = set()  # held handles with no device memory yet
        self._ids = itertools.count(1)

    @property
    def granularity(self) -> int:
        return self.va.granularity

    # ---- address reservations ----------------------------------------------------------------
    def reserve(self, size: int, align: int = 0, hint: int = 0) -> int:
        with self.lock:
            try:
                return self.va.reserve(size, align, hint)
            except VaError as e:
                bad = size <= 0 or size % self.granularity or (align & (align - 1))
                raise CudaError(_V if bad else CUresult.CUDA_ERROR_OUT_OF_MEMORY, str(e)) from None

    def address_free(self, addr: int, size: int) -> None:
        with self.lock:
            if self.va.reservations.get(addr) != size:
                raise CudaError(_V, f"{addr:#x}+{size:#x} is not an address reservation")
            if self.va.overlaps_mapping(addr, size):
                raise CudaError(_V, f"reservation {addr:#x}+{size:#x} still has mapped ranges")
            for a in [a for a in self.parked if addr <= a < addr + size]:
                self._evict(self.parked[a])
            self.va.unreserve(addr, size)

    # ---- physical handles --------------------------------------------------------------------
    def create(self, size: int, prop: bytes) -> int:
        """A new physical handle of ``size`` bytes (``prop`` already validated)."""
        g = self.granularity
        if size <= 0 or size % g:
            raise CudaError(_V, f"cuMemCreate: size {size:#x} is not a positive multiple of {g:#x}")
        with self.lock:
            pending = sum(h.size for h in self._waiting)
            free = self.dev.free_memory()
            if size + pending > free:
                raise CudaError(
                    CUresult.CUDA_ERROR_OUT_OF_MEMORY,
                    f"cuMemCreate: {size:#x} bytes requested, {free:#x} free "
                    f"({pending:#x} promised to unmapped handles)",
                )
            h = (HANDLE_KIND << 56) | next(self._ids)
            phys = self.handles[h] = PhysHandle(h, size, prop)
            self._track(phys)
            return h

    def handle(self, h: int) -> PhysHandle:
        phys = self.handles.get(h)
        if phys is None:
            raise CudaError(_V, f"{h:#x} is not a memory handle of this session")
        return phys

    def release(self, h: int) -> None:
        with self.lock:
            phys = self.handle(h)
            phys.refs -= 1
            if phys.refs:
                return
            del self.handles[h]
            a = phys.parked_at
            if a is not None:  # unmapped before: free now
                del self.parked[a]
                phys.parked_at = None
                self.dev.decommit(a)
            phys.saved = None
            self._track(phys)
            # a mapped handle is freed by its cuMemUnmap

    def retain(self, addr: int) -> int:
        with self.lock:
            m = self._mapping_at(addr)
            phys = m.phys
            phys.refs += 1
            self.handles[phys.handle] = phys
            return phys.handle

    # ---- mappings ----------------------------------------------------------------------------
    def map(self, ctx: int, addr: int, size: int, offset: int, h: int) -> None:
        g = self.granularity
        with self.lock:
            phys = self.handle(h)
            if addr % g or size % g or offset % g or size <= 0:
                raise CudaError(
                    _V, f"cuMemMap: {addr:#x}+{size:#x} at offset {offset:#x} is not a multiple of "
                    f"the granularity {g:#x}",
                )  # fmt: skip
            res = self.va.reservation(addr)
            if res is None or addr + size > res[0] + res[1]:
                raise CudaError(
                    _V, f"cuMemMap: {addr:#x}+{size:#x} is not inside one address reservation"
                )
            if self.va.overlaps_mapping(addr, size):
                raise CudaError(_V, f"cuMemMap: {addr:#x}+{size:#x} is already mapped")
            if offset + size > phys.size:
                raise CudaError(
                    _V, f"cuMemMap: offset {offset:#x} + size {size:#x} exceeds the handle's "
                    f"{phys.size:#x} bytes",
                )  # fmt: skip
            if offset or size != phys.size:
                raise CudaError(
                    _NS,
                    f"cuMemMap: mapping part of a handle (offset {offset:#x}, size {size:#x} of "
                    f"{phys.size:#x}) is not supported by Crane; map whole handles",
                )
            if phys.mapped_at is not None:
                raise CudaError(
                    _NS,
                    f"cuMemMap: handle {h:#x} is already mapped at {phys.mapped_at:#x}; mapping "
                    "one allocation at two addresses (aliasing) is not supported by Crane: its "
                    "worker holds device memory per address",
                )
            # parked memory in the way (another handle's, or this one's at another offset)
            for a, p in list(self.parked.items()):
                if a < addr + size and addr < a + p.size and not (p is phys and a == addr):
                    self._evict(p)
            if phys.parked_at == addr:
                del self.parked[addr]
                phys.parked_at = None
            elif phys.parked_at is not None:
                self._relocate(phys, ctx, addr)
            else:
                self.dev.commit(ctx, addr, size)
                phys.ctx = ctx
                if phys.saved is not None:
                    self.dev.restore(addr, phys.saved)
                    phys.saved = None
            self.va.add_mapping(addr, size)
            phys.mapped_at = addr
            self.maps[addr] = Mapping(addr, size, phys)
            self._track(phys)

    def unmap(self, addr: int, size: int) -> None:
        """Unmap whole mappings covering exactly ``[addr, addr+size)``."""
        with self.lock:
            span = self.va.mapped_span(addr, size)
            if span is None or span[0][0] != addr or sum(n for _, n in span) != size:
                raise CudaError(
                    _V,
                    f"cuMemUnmap: {addr:#x}+{size:#x} is not a whole mapped range (mappings are "
                    "unmapped whole)",
                )
            for a, _ in span:
                self._drop_mapping(self.maps[a])

    def set_access(self, addr: int, size: int, flags: int) -> None:
        with self.lock:
            span = self.va.mapped_span(addr, size)
            if span is None:
                raise CudaError(
                    _V, f"cuMemSetAccess: {addr:#x}+{size:#x} is not a fully mapped range"
                )
            for a, _ in span:
                self.maps[a].access = flags

    def get_access(self, addr: int) -> int:
        with self.lock:
            return self._mapping_at(addr).access

    def mapping_of(self, addr: int) -> Mapping | None:
        m = self.va.mapping(addr)
        return self.maps[m[0]] if m is not None else None

    def forget_context(self, ctx: int) -> None:
        """The context is being destroyed: free the VMM memory committed while it was current
        (its mappings disappear; handles and reservations stay)."""
        with self.lock:
            for m in [m for m in self.maps.values() if m.phys.ctx == ctx]:
                self.va.remove_mapping(m.addr)
                del self.maps[m.addr]
                self.dev.decommit(m.addr)
                m.phys.mapped_at = None
                self._track(m.phys)
            for a in [a for a, p in self.parked.items() if p.ctx == ctx]:
                self.dev.decommit(a)
                phys = self.parked.pop(a)
                phys.parked_at = None
                self._track(phys)

    # ---- internals ---------------------------------------------------------------------------
    def _track(self, phys: PhysHandle) -> None:
        """Keep the set of held handles that will need device memory when mapped."""
        if phys.refs > 0 and not phys.committed:
            self._waiting.add(phys)
        else:
            self._waiting.discard(phys)

    def _mapping_at(self, addr: int) -> Mapping:
        m = self.mapping_of(addr)
        if m is None:
            raise CudaError(_V, f"{addr:#x} is not in a mapped VMM range")
        return m

    def _drop_mapping(self, m: Mapping) -> None:
        self.va.remove_mapping(m.addr)
        del self.maps[m.addr]
        phys = m.phys
        phys.mapped_at = None
        if phys.refs:  # still held: keep the contents where they are
            phys.parked_at = m.addr
            self.parked[m.addr] = phys
        else:
            self.dev.decommit(m.addr)

    def _evict(self, phys: PhysHandle) -> None:
        """Move a parked handle's contents to guest memory and free its device memory."""
        a = phys.parked_at
        assert a is not None
        phys.saved = self.dev.save(a, phys.size)
        self.dev.decommit(a)
        del self.parked[a]
        phys.parked_at = None
        self._track(phys)

    def _relocate(self, phys: PhysHandle, ctx: int, addr: int) -> None:
        """Map a parked handle at a new address, keeping its contents."""
        old = phys.parked_at
        assert old is not None
        try:
            self.dev.commit(ctx, addr, phys.size)
        except CudaError as e:
            if e.code != CUresult.CUDA_ERROR_OUT_OF_MEMORY:
                raise
            self._evict(phys)  # no room for both copies: go through guest memory
            self.dev.commit(ctx, addr, phys.size)
            self.dev.restore(addr, phys.saved or b"")
            phys.saved = None
        else:
            self.dev.move(addr, old, phys.size)
            self.dev.decommit(old)
            del self.parked[old]
            phys.parked_at = None
        phys.ctx = ctx
