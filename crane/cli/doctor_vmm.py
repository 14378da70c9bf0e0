"""``python -m crane.cli.doctor_vmm ORDINAL``: can this host's CUDA driver reserve the device-VA
windows craned's workers use (``crane/device/layout.py``) at their exact addresses?

Each session's worker reserves its 1 TiB window with ``cuMemAddressReserve`` at a fixed base and
fails its start when the driver places it elsewhere (``crane/backends/cuda/va_window.py``).
``crane doctor --host`` runs this in a child process, as a worker would be (a fresh interpreter
with its own CUDA context), and reads one JSON line: the windows that reserved where asked, and
the first failure with the driver's words.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from crane.device.layout import WINDOW_SIZE, WINDOW_SLOTS, window_base

__all__ = ["main", "probe"]


def _ok(name: str, answer: Any) -> Any:
    err, *rest = answer if isinstance(answer, tuple) else (answer,)
    if int(err) != 0:
        raise RuntimeError(f"{name} failed: {err!r}")
    return rest[0] if len(rest) == 1 else rest


def probe(ordinal: int, slots: list[int]) -> dict[str, Any]:
    from cuda.bindings import driver as drv  # cuda-python, as the cuda backend uses it

    _ok("cuInit", drv.cuInit(0))
    dev = _ok("cuDeviceGet", drv.cuDeviceGet(ordinal))
    ctx = _ok("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(dev))
    _ok("cuCtxSetCurrent", drv.cuCtxSetCurrent(ctx))
    prop = drv.CUmemAllocationProp()
    prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    flag = drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    granularity = int(
        _ok("cuMemGetAllocationGranularity", drv.cuMemGetAllocationGranularity(prop, flag))
    )
    reserved = []
    try:
        for slot in slots:
            base = window_base(slot)
            got = int(
                _ok(
                    "cuMemAddressReserve",
                    drv.cuMemAddressReserve(WINDOW_SIZE, granularity, base, 0),
                )
            )
            _ok("cuMemAddressFree", drv.cuMemAddressFree(got, WINDOW_SIZE))
            if got != base:
                return {
                    "ok": False,
                    "granularity": granularity,
                    "error": f"window {slot}: the driver placed {WINDOW_SIZE:#x} bytes at {got:#x} "
                    f"instead of {base:#x}",
                    "reserved": reserved,
                }
            reserved.append(slot)
    finally:
        drv.cuDevicePrimaryCtxRelease(dev)
    return {"ok": True, "granularity": granularity, "reserved": reserved}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    ordinal = int(args[0]) if args else 0
    slots = [0, WINDOW_SLOTS // 2, WINDOW_SLOTS - 1]
    try:
        out = probe(ordinal, slots)
    except Exception as e:  # report, never a trace: the parent prints the finding
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
