"""Device memory at the guest's addresses, with the CUDA virtual memory management API.

Architecture invariant 2: the guest chooses every device address inside the VA window its
session was granted, so that a restore anywhere recreates the same addresses. On a real GPU that
means: reserve the whole window at its base with ``cuMemAddressReserve`` (the address is only a
hint to the driver, so the result is *checked*, and a window the driver would not place where
asked fails the worker's start with the reason), then back each chunk the guest maps with its
own physical allocation (``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess``). Chunks are
multiples of the 2 MiB mapping granularity; the guest sub-allocates inside them.
"""

from __future__ import annotations

import logging
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.backends.cuda.driver import unwrap

__all__ = ["VaWindow"]

log = logging.getLogger("crane.cuda")


class VaWindow:
    """One session's reserved VA window on one device, and the chunks mapped in it."""

    def __init__(self, drv: Any, ordinal: int, base: int, size: int) -> None:
        self.drv = drv
        self.ordinal = ordinal
        self.base = base
        self.size = size
        self.chunks: dict[int, tuple[int, Any]] = {}  # addr -> (size, physical handle)
        self._prop = self._allocation_prop()
        self.granularity = int(
            unwrap(
                "cuMemGetAllocationGranularity",
                drv.cuMemGetAllocationGranularity(
                    self._prop,
                    drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                ),
            )
        )
        if base % self.granularity or size % self.granularity:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"VA window {base:#x}+{size:#x} is not aligned to the device's mapping "
                f"granularity {self.granularity:#x}",
            )
        got = int(
            unwrap(
                "cuMemAddressReserve",
                drv.cuMemAddressReserve(size, self.granularity, base, 0),
            )
        )
        if got != base:
            drv.cuMemAddressFree(got, size)
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"the driver placed the session's VA window at {got:#x} instead of {base:#x} "
                "(something else in the worker occupies that range); change the daemon's "
                "window base",
            )
        self._access = self._access_desc()

    def _allocation_prop(self) -> Any:
        d = self.drv
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.ordinal
        return prop

    def _access_desc(self) -> Any:
        d = self.drv
        desc = d.CUmemAccessDesc()
        desc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.ordinal
        desc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return desc

    def contains(self, addr: int, size: int) -> bool:
        return self.base <= addr and addr + size <= self.base + self.size

    def map(self, addr: int, size: int) -> None:
        """Back ``addr..addr+size`` with new device memory (OUT_OF_MEMORY when there is none)."""
        if not self.contains(addr, size) or addr % self.granularity or size % self.granularity:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"chunk {addr:#x}+{size:#x} is not granularity-aligned inside the window",
            )
        if addr in self.chunks:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"chunk {addr:#x} already mapped")
        d = self.drv
        handle = unwrap("cuMemCreate", d.cuMemCreate(size, self._prop, 0))
        try:
            unwrap("cuMemMap", d.cuMemMap(addr, size, 0, handle, 0))
            try:
                unwrap("cuMemSetAccess", d.cuMemSetAccess(addr, size, [self._access], 1))
            except CudaError:
                d.cuMemUnmap(addr, size)
                raise
        except CudaError:
            d.cuMemRelease(handle)
            raise
        self.chunks[addr] = (size, handle)

    def unmap(self, addr: int) -> int:
        """Unmap and free one chunk; returns its size."""
        if addr not in self.chunks:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"{addr:#x} is not a mapped chunk")
        size, handle = self.chunks.pop(addr)
        unwrap("cuMemUnmap", self.drv.cuMemUnmap(addr, size))
        unwrap("cuMemRelease", self.drv.cuMemRelease(handle))
        return size

    def close(self) -> None:
        """Unmap everything and give the reservation back (errors only logged: teardown)."""
        for addr in list(self.chunks):
            try:
                self.unmap(addr)
            except CudaError as e:
                log.warning("unmapping chunk %#x at teardown: %s", addr, e)
        self.drv.cuMemAddressFree(self.base, self.size)
