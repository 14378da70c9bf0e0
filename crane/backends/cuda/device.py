"""What the guest is told about a physical GPU: a :class:`DeviceSnapshot` read from the driver.

Every attribute cuda.h defines is read once when the session starts (the guest answers device
queries locally from it, invariant 3). The UUID is virtual, derived from the session's seed
like the simulator's, so the guest keeps one device identity wherever the session moves; the
physical UUID is the daemon's business (``crane devices``).
"""

from __future__ import annotations

from typing import Any

from crane.api.generated.cuda_enums import CUdevice_attribute
from crane.backends.cuda.driver import unwrap
from crane.device.identity import DeviceSnapshot, virtual_uuid
from crane.device.served import served_attributes

__all__ = ["device_attributes", "device_name", "device_snapshot", "pci_bus_id", "profile_key"]

_CC_MAJOR = CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
_CC_MINOR = CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR


def profile_key(name: str) -> str:
    """The profile text of a real GPU, e.g. ``cuda:NVIDIA H100 80GB HBM3``."""
    return f"cuda:{name}"


def _c_string(raw: Any) -> str:
    """A driver string: cuda-python hands back the whole NUL-padded buffer."""
    if isinstance(raw, str):
        return raw.split("\0", 1)[0].strip()
    return bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace").strip()


def device_name(drv: Any, dev: Any) -> str:
    return _c_string(unwrap("cuDeviceGetName", drv.cuDeviceGetName(256, dev)))


def pci_bus_id(drv: Any, dev: Any) -> str:
    """``domain:bus:device.function`` in lower case, as the simulator's profiles give it."""
    return _c_string(unwrap("cuDeviceGetPCIBusId", drv.cuDeviceGetPCIBusId(64, dev))).lower()


def device_attributes(drv: Any, dev: Any) -> dict[int, int]:
    """Every attribute cuda.h defines that this driver answers for ``dev``."""
    attrs: dict[int, int] = {}
    for a in CUdevice_attribute:
        if a.name == "CU_DEVICE_ATTRIBUTE_MAX":
            continue
        try:
            native = drv.CUdevice_attribute(int(a))
        except ValueError:  # an attribute this cuda-python does not know
            continue
        err, value = drv.cuDeviceGetAttribute(native, dev)
        if int(err) == 0:  # attributes newer than the driver answer INVALID_VALUE: left out
            attrs[int(a)] = int(value)
    return attrs


def device_snapshot(drv: Any, ordinal: int, seed: bytes) -> DeviceSnapshot:
    dev = unwrap("cuDeviceGet", drv.cuDeviceGet(ordinal))
    name = device_name(drv, dev)
    total = int(unwrap("cuDeviceTotalMem", drv.cuDeviceTotalMem(dev)))
    attrs = device_attributes(drv, dev)
    key = profile_key(name)
    return DeviceSnapshot(
        name=name,
        uuid=virtual_uuid(key, seed),
        total_mem=total,
        cc=(attrs[int(_CC_MAJOR)], attrs[int(_CC_MINOR)]),
        attributes=served_attributes(attrs),
        profile=key,
        pci_bus_id=pci_bus_id(drv, dev),
    )
