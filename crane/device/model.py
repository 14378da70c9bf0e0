"""The model of a GPU product: its name, compute capability, memory and every attribute.

Why a model and not just a snapshot: CUDA 13's runtime asks the driver for the device name,
total memory, UUID and 111 attributes during its first call and fails the whole program if any
query fails (see shared/reference/cuda-driver-shim-facts.md section 2); libraries then size grids,
shared memory and occupancy from those answers. A model is one product as a real driver
describes it, checked for exactly that completeness, from which each session's identity (a
:class:`~crane.device.identity.DeviceSnapshot` with a virtual UUID) is made. The simulator's
built-in profiles (``crane.backends.sim.profiles``) are models; a real GPU is read from its
driver instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.device.identity import DeviceSnapshot, virtual_uuid
from crane.device.served import served_attributes

__all__ = [
    "CUDART13_QUERIED_ATTRIBUTES",
    "DEVICE_ATTRIBUTES",
    "NVIDIA_PCI_VENDOR_ID",
    "DeviceModel",
]

#: The 111 attributes cudart 13.0 queries for every device at start-up; each must succeed.
CUDART13_QUERIED_ATTRIBUTES: frozenset[int] = frozenset(range(1, 144)) - {
    13, 15, 17, 20, 36, 44, 69, 87, 92, 93, 94, 96, 98, 102, 103, 104, 105, 107, 110,
    122, 123, 124, 126, 127, 128, 132, 135, 136, 137, 138, 141, 142,
}  # fmt: skip

#: Every attribute value cuda.h of CUDA 13.0 defines (aliases collapse; the MAX sentinel is out).
DEVICE_ATTRIBUTES: frozenset[int] = frozenset(
    int(a) for a in A if a is not A.CU_DEVICE_ATTRIBUTE_MAX
)

NVIDIA_PCI_VENDOR_ID = 0x10DE


@dataclass(frozen=True)
class DeviceModel:
    """One GPU product as the CUDA driver describes it: what a guest is told about its device.

    ``name`` is cuDeviceGetName's string, ``total_mem`` cuDeviceTotalMem's bytes, and
    ``attributes`` maps every ``CUdevice_attribute`` value the device answers to the value
    cuDeviceGetAttribute returns.  ``provenance`` says where the numbers come from.
    """

    key: str
    name: str
    compute_capability: tuple[int, int]
    total_mem: int
    attributes: Mapping[int, int] = field(hash=False, repr=False)
    provenance: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        frozen = MappingProxyType({int(k): int(v) for k, v in sorted(self.attributes.items())})
        object.__setattr__(self, "attributes", frozen)
        problems: list[str] = []
        missing = CUDART13_QUERIED_ATTRIBUTES - frozen.keys()
        if missing:
            problems.append(f"missing attributes required by cudart 13: {sorted(missing)}")
        unknown = frozen.keys() - DEVICE_ATTRIBUTES
        if unknown:
            problems.append(f"attributes not defined by cuda.h: {sorted(unknown)}")
        major_minor = (
            frozen.get(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            frozen.get(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        )
        if major_minor != tuple(self.compute_capability):
            problems.append(f"compute_capability {self.compute_capability} != attributes 75/76")
        if not self.name or len(self.name.encode()) >= 256:
            problems.append("name must be 1..255 bytes (cuDeviceGetName buffers are 256)")
        if self.total_mem <= 0:
            problems.append("total_mem must be positive")
        if problems:
            raise ValueError(f"device model {self.key!r}: " + "; ".join(problems))

    def attribute(self, attribute: int) -> int:
        """cuDeviceGetAttribute's answer; ``KeyError`` if the device does not answer it."""
        try:
            return self.attributes[int(attribute)]
        except KeyError:
            raise KeyError(f"{self.key} answers no device attribute {int(attribute)}") from None

    def uuid_for(self, session_seed: bytes) -> bytes:
        """A stable 16-byte virtual device UUID for this model within one session.

        Name-based (RFC 4122 version 5: SHA-1 over namespace, model key and seed), so a
        session that carries its seed to another host keeps the same device identity, while
        different seeds or models give different devices.
        """
        return virtual_uuid(self.key, session_seed)

    def snapshot(self, session_seed: bytes) -> DeviceSnapshot:
        """The identity a session on this model is told (its virtual UUID from the seed)."""
        return DeviceSnapshot(
            name=self.name,
            uuid=self.uuid_for(session_seed),
            total_mem=self.total_mem,
            cc=self.compute_capability,
            attributes=served_attributes(self.attributes),
            profile=self.key,
            pci_bus_id=self.pci_bus_id_string,
        )

    # -- convenience views of the attributes ---------------------------------------------------
    @property
    def cc(self) -> tuple[int, int]:
        """Short name for ``compute_capability`` (major, minor)."""
        return self.compute_capability

    @property
    def sm_arch(self) -> int:
        """Compute capability as the ``sm_XY`` number (e.g. 90)."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def max_threads_per_block(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK]

    @property
    def max_block(self) -> tuple[int, int, int]:
        """Maximum block dimensions (x, y, z)."""
        return (
            self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X],
            self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y],
            self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z],
        )

    @property
    def max_grid(self) -> tuple[int, int, int]:
        """Maximum grid dimensions (x, y, z)."""
        return (
            self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X],
            self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y],
            self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z],
        )

    @property
    def max_shared_per_block(self) -> int:
        """Shared memory a block gets without opting in (bytes)."""
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK]

    @property
    def max_shared_per_block_optin(self) -> int:
        """Shared memory a block may opt in to via CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_..."""
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN]

    @property
    def max_shared_per_sm(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR]

    @property
    def reserved_shared_per_block(self) -> int:
        """Shared memory the driver reserves per block (counts against the SM's capacity)."""
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK]

    @property
    def total_const_mem(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY]

    @property
    def warp_size(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_WARP_SIZE]

    @property
    def sm_count(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT]

    @property
    def max_threads_per_sm(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR]

    @property
    def max_blocks_per_sm(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR]

    @property
    def regs_per_block(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK]

    @property
    def regs_per_sm(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR]

    @property
    def l2_size(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE]

    @property
    def clock_khz(self) -> int:
        """Peak SM clock in kHz."""
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_CLOCK_RATE]

    @property
    def mem_clock_khz(self) -> int:
        """Peak memory clock in kHz."""
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE]

    @property
    def bus_width(self) -> int:
        """Global memory bus width in bits."""
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH]

    @property
    def async_engine_count(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT]

    @property
    def pci_domain_id(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID]

    @property
    def pci_bus_id(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID]

    @property
    def pci_device_id(self) -> int:
        return self.attributes[A.CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID]

    @property
    def pci_bus_id_string(self) -> str:
        """``domain:bus:device.function`` as cuDeviceGetPCIBusId formats it."""
        return f"{self.pci_domain_id:04x}:{self.pci_bus_id:02x}:{self.pci_device_id:02x}.0"
