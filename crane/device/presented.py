"""Device models a device presents to its guests, as libvirt presents CPU models.

A device may tell its guests a model other than its own (``--backend SPEC@MODEL``), so that
guests started on different GPUs are told the same limits and can move between them. The
rule is the one a CPU model follows: the model may promise *no more* than the device has.
Every attribute falls in one of four kinds, decided by what a program does with its value:

* **limit** (the default; larger promises more): sizes a program plans with (threads, block
  and grid dimensions, shared memory, registers, SM count and per-SM limits, which bound
  cooperative grids and occupancy, constant memory, texture and surface extents, L2
  persistence windows) and feature flags (1 promises the feature). The model's value must be
  <= the device's. Unclassified attributes are limits, so no new attribute can be promised
  by accident.
* **requirement** (larger demands more of the program): alignments the program must honour
  and shared memory the driver reserves per block. The model's value must be >= the device's.
* **mask** (a set of supported kinds as bits): the model's bits must all be the device's.
* **informational** (describes the board, bounds nothing a launch asks for): clock rates,
  bus width, L2 size, copy engines, PCI and NUMA ids, ECC, TCC, compute mode, MPS, the
  watchdog, multi-GPU board ids, the FP32:FP64 ratio. Told as the model says. The warp size
  is exact: code is compiled for it, so it must equal the device's.

Total memory is not refused but clipped: a device presents min(model, its own), and the
ledger bounds allocations by that (boards of one product differ by the driver's reservation,
so a baseline of "the same" GPUs would otherwise be refused).

Compute capability: the model's may be lower than the device's. PTX compiled for compute_XY
is JIT-compiled for any device of a higher capability (forward compatible); a cubin for sm_XY
runs only on devices of the same major with a minor >= Y (and an arch-specific sm_XYa only on
XY). The guest chooses nothing itself: Crane loads the image it sent (the whole fatbin) on the
device, so the driver picks the device's own cubin or JITs the PTX, and code the device cannot
run is refused at load with CUDA_ERROR_NO_BINARY_FOR_GPU, as it would be natively. A model of a
*higher* capability than a real GPU is refused (code built for it would not run there). On the
simulated GPU any capability is accepted: the PTX interpreter runs PTX of every target it
decodes and refuses what it cannot at load, naming the instruction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.device.model import DeviceModel
from crane.device.model_file import attribute_name
from crane.device.served import served_attributes

__all__ = [
    "INFORMATIONAL",
    "MASKS",
    "REQUIREMENTS",
    "attribute_kind",
    "baseline",
    "present",
    "promises_more",
]

#: Attributes that describe the board and bound nothing a program asks for.
INFORMATIONAL: frozenset[int] = frozenset(
    int(a)
    for a in (
        A.CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
        A.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
        A.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
        A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
        A.CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT,
        A.CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT,
        A.CU_DEVICE_ATTRIBUTE_INTEGRATED,
        A.CU_DEVICE_ATTRIBUTE_COMPUTE_MODE,
        A.CU_DEVICE_ATTRIBUTE_ECC_ENABLED,
        A.CU_DEVICE_ATTRIBUTE_TCC_DRIVER,
        A.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
        A.CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
        A.CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
        A.CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID,
        A.CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID,
        A.CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD,
        A.CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID,
        A.CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO,
        A.CU_DEVICE_ATTRIBUTE_NUMA_CONFIG,
        A.CU_DEVICE_ATTRIBUTE_NUMA_ID,
        A.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID,
        A.CU_DEVICE_ATTRIBUTE_MPS_ENABLED,
        # follow compute_capability, checked on their own
        A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    )
)

#: Attributes whose larger value demands more of the program (alignments, reservations).
REQUIREMENTS: frozenset[int] = frozenset(
    int(a)
    for a in (
        A.CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT,
        A.CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT,
        A.CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT,
        A.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
    )
)

#: Attributes that are sets of supported kinds, as bits.
MASKS: frozenset[int] = frozenset(
    int(a)
    for a in (
        A.CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
        A.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
        A.CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK,
    )
)

_EXACT: frozenset[int] = frozenset({int(A.CU_DEVICE_ATTRIBUTE_WARP_SIZE)})


def attribute_kind(attribute: int) -> str:
    """``limit``, ``requirement``, ``mask``, ``exact`` or ``informational``."""
    a = int(attribute)
    if a in INFORMATIONAL:
        return "informational"
    if a in REQUIREMENTS:
        return "requirement"
    if a in MASKS:
        return "mask"
    if a in _EXACT:
        return "exact"
    return "limit"


def _exceeds(kind: str, model: int, device: int) -> bool:
    """Whether the model's value promises more than the device's."""
    if kind == "limit":
        return model > device
    if kind == "requirement":
        return model < device
    if kind == "mask":
        return bool(model & ~device)
    if kind == "exact":
        return model != device
    return False


def promises_more(
    model: DeviceModel,
    device_attributes: Mapping[int, int],
    device_cc: tuple[int, int],
    *,
    simulated: bool,
) -> list[str]:
    """Each way ``model`` promises more than a device reporting ``device_attributes`` (an
    attribute the device does not report counts as 0: a feature it lacks), naming the
    attribute and both values. ``simulated``: the device is the PTX interpreter (any compute
    capability runs). Attributes every session is told lowered (host memory coherence, see
    :mod:`crane.device.served`) are compared as told."""
    out: list[str] = []
    if not simulated and tuple(model.compute_capability) > tuple(device_cc):
        out.append(
            "compute capability: model {}.{} > device {}.{} (code built for the model's "
            "architecture cannot run on the device)".format(*model.compute_capability, *device_cc)
        )
    # what a session is told over a wire whatever the device (crane.device.served) is not a
    # promise of the model's: compare what the guest will actually hear
    for attr, value in sorted(served_attributes(model.attributes).items()):
        kind = attribute_kind(attr)
        have = int(device_attributes.get(attr, 0))
        if _exceeds(kind, int(value), have):
            rel = {"limit": ">", "requirement": "<", "mask": "has bits beyond", "exact": "!="}
            out.append(f"{attribute_name(attr)}: model {value} {rel[kind]} device {have}")
    return out


def present(model: DeviceModel, device_total_mem: int) -> DeviceModel:
    """What a device of ``device_total_mem`` bytes tells its guests under ``model``."""
    total = min(int(model.total_mem), int(device_total_mem))
    return dataclasses.replace(model, total_mem=total)


def baseline(models: Sequence[DeviceModel], key: str, name: str = "") -> DeviceModel:
    """The greatest model every one of ``models`` (devices as they report themselves) can
    honour: each limit's minimum, each requirement's maximum, each mask's common bits, the
    least memory and compute capability; informational values are the minimum too (the
    slowest clock is the honest description of the pool). An attribute some device does not
    report is left out (a model answers only what every device answers). ``name``: the
    device name told (default: the devices' one name, or a list of them)."""
    if not models:
        raise ValueError("a baseline needs at least one device")
    common = set(models[0].attributes)
    for m in models[1:]:
        common &= set(m.attributes)
    attrs: dict[int, int] = {}
    for a in sorted(common):
        values = [int(m.attributes[a]) for m in models]
        kind = attribute_kind(a)
        if kind == "exact" and len(set(values)) > 1:
            raise ValueError(f"no common model: the devices differ in {attribute_name(a)} {values}")
        if kind == "requirement":
            attrs[a] = max(values)
        elif kind == "mask":
            v = values[0]
            for x in values[1:]:
                v &= x
            attrs[a] = v
        else:
            attrs[a] = min(values)
    cc = min(tuple(m.compute_capability) for m in models)
    attrs[int(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)] = cc[0]
    attrs[int(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)] = cc[1]
    names = list(dict.fromkeys(m.name for m in models))
    if not name:
        name = names[0] if len(names) == 1 else "Crane baseline (" + ", ".join(names) + ")"
    name = name.encode()[:255].decode(errors="ignore")
    return DeviceModel(
        key=key,
        name=name,
        compute_capability=(cc[0], cc[1]),
        total_mem=min(int(m.total_mem) for m in models),
        attributes=attrs,
        provenance="crane baseline of " + ", ".join(f"{m.key} ({m.name})" for m in models),
    )
