"""``python -m crane.backends.cuda.probe``: the GPUs the CUDA driver sees, as JSON on stdout.

The daemon's inventory comes from NVML. Where NVML is not available (a container given the CUDA
driver but not libnvidia-ml) the daemon asks CUDA instead, in this short-lived process, so that
the daemon itself never initializes CUDA: a driver context in the daemon would cost memory and
is never used there (sessions run in their own worker processes). The answer carries every
device attribute too: a migration's or restore's pre-flight compares them with the limits a
guest was told, and only CUDA knows them (NVML does not).
"""

from __future__ import annotations

import json
import sys
import uuid

from crane.backends.cuda import driver
from crane.backends.cuda.device import device_attributes, device_name, pci_bus_id
from crane.backends.cuda.driver import unwrap


def probe() -> dict:
    drv = driver.load()
    unwrap("cuInit", drv.cuInit(0))
    version = int(unwrap("cuDriverGetVersion", drv.cuDriverGetVersion()))
    gpus = []
    for i in range(int(unwrap("cuDeviceGetCount", drv.cuDeviceGetCount()))):
        dev = unwrap("cuDeviceGet", drv.cuDeviceGet(i))
        raw_uuid = unwrap("cuDeviceGetUuid", drv.cuDeviceGetUuid(dev))
        attr = drv.CUdevice_attribute
        major = unwrap(
            "cuDeviceGetAttribute",
            drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
        )
        minor = unwrap(
            "cuDeviceGetAttribute",
            drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
        )
        gpus.append(
            {
                "index": i,
                "name": device_name(drv, dev),
                "uuid": "GPU-" + str(uuid.UUID(bytes=bytes(raw_uuid.bytes)[:16])),
                "total_mem": int(unwrap("cuDeviceTotalMem", drv.cuDeviceTotalMem(dev))),
                "cc": [int(major), int(minor)],
                "pci_bus_id": pci_bus_id(drv, dev),
                "driver_version": f"CUDA {version // 1000}.{version % 1000 // 10}",
                "attributes": {str(k): v for k, v in device_attributes(drv, dev).items()},
            }
        )
    return {"gpus": gpus}


def main() -> int:
    try:
        out = probe()
    except Exception as e:  # reported to the daemon, which logs why there is no GPU
        out = {"error": f"{type(e).__name__}: {e}"}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
