"""What a guest is told about memory its host side shares with the device.

A guest reaches its GPU over a wire, so host memory that kernels address (mapped pinned memory,
managed memory) is kept coherent only at synchronization points (:mod:`crane.guest.mirror`).
CUDA describes exactly that model with device attributes, so a session is told them whatever
the physical board could do locally: no concurrent managed access (the host may touch managed
memory only while the device is idle), no host page-table walks, no host pointers usable for
registered memory (kernels take cuMemHostGetDevicePointer's answer), no host-device native
atomics. Programs and libraries read these to choose their code paths (CUDA's own samples
check CONCURRENT_MANAGED_ACCESS before touching managed memory during a launch).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from crane.api.generated.cuda_enums import CUdevice_attribute as A

__all__ = ["SERVED_OVER_A_WIRE", "served_attributes"]

#: Attribute -> the most a session is told, whatever the device reports.
SERVED_OVER_A_WIRE: Mapping[int, int] = MappingProxyType(
    {
        A.CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: 0,
        A.CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: 0,
        A.CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: 0,
        A.CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: 0,
        A.CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: 0,
        A.CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: 0,
    }
)


def served_attributes(attributes: Mapping[int, int]) -> dict[int, int]:
    """``attributes`` with each of :data:`SERVED_OVER_A_WIRE` lowered to what is served."""
    out = dict(attributes)
    for a, cap in SERVED_OVER_A_WIRE.items():
        if a in out:
            out[a] = min(out[a], cap)
    return out
