"""The simulator's built-in device profiles: real GPU products as :class:`DeviceModel` data.

Why this exists: CUDA 13's runtime asks the driver for the device name, total memory, UUID and
111 attributes during its first call and fails the whole program if any query fails (see
shared/reference/cuda-driver-shim-facts.md §2).  Libraries then size grids, shared memory and
occupancy from those answers, so a simulated device must answer *exactly* what the real board
answers, or programs tuned for that board misbehave.  Each profile below is one real product as
seen through a CUDA 12/13 driver on x86-64 Linux, with every attribute that CUDA 13.0's cuda.h
defines (1-147; the sentinel ``CU_DEVICE_ATTRIBUTE_MAX`` excluded).

Provenance: values come from published ``deviceQuery`` runs and ``cudaGetDeviceProperties``
dumps of these boards, a full cuDeviceGetAttribute(1..148) snapshot of a GH200 (same GH100 die
as H100/H200) under driver 13.2, and a full property dump of an Ada GPU under driver 13.0.
Where no published reading of a board exists for an attribute, the comment says how the value
was derived.  Platform-dependent feature flags assume an x86-64 Linux host with a CUDA 13
driver, open kernel modules, no HMM, no IMEX/NVLink fabric and no MPS (see ``_X86_LINUX_DGPU``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.device.model import NVIDIA_PCI_VENDOR_ID, DeviceModel

__all__ = [
    "DEFAULT_PROFILE_KEY",
    "PROFILES",
    "UnknownProfileError",
    "get_profile",
]

DEFAULT_PROFILE_KEY = "h100-80gb"


def _pci_ids(device_id: int, subsystem_id: int) -> dict[A, int]:
    """Attributes 139/140 pack ``id << 16 | vendor`` (checked against the GH200 snapshot:
    591925470 == 0x2348 << 16 | 0x10DE, 416420062 == 0x18D2 << 16 | 0x10DE)."""
    return {
        A.CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID: device_id << 16 | NVIDIA_PCI_VENDOR_ID,
        A.CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID: subsystem_id << 16 | NVIDIA_PCI_VENDOR_ID,
    }


# --- Limits common to every CUDA device of compute capability 7.5 through 9.0 -----------------
# Identical in every dump consulted (sm_75, sm_80, sm_86, sm_89 under driver 13.0, sm_90 GH200).
_COMMON_LIMITS: dict[A, int] = {
    A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 1024,
    A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: 1024,
    A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: 1024,
    A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: 64,
    A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: 2147483647,
    A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: 65535,
    A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: 65535,
    A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: 49152,
    A.CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: 65536,
    A.CU_DEVICE_ATTRIBUTE_WARP_SIZE: 32,
    A.CU_DEVICE_ATTRIBUTE_MAX_PITCH: 2147483647,
    A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: 65536,
    A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: 65536,
    A.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: 1024,
    A.CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: 512,
    A.CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: 32,
    A.CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: 512,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH: 131072,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH: 131072,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT: 65536,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH: 16384,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT: 16384,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH: 16384,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS: 2048,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS: 2048,
    A.CU_DEVICE_ATTRIBUTE_CAN_TEX2D_GATHER: 1,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE: 8192,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE: 8192,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS: 2046,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH: 131072,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT: 65536,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH: 16384,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT: 16384,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH: 16384,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS: 2048,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS: 2048,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS: 2046,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH: 268435456,  # deprecated, still answered
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_WIDTH: 131072,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT: 65000,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_PITCH: 2097120,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT: 32768,
    A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH: 32768,
}

# --- A discrete datacenter GPU on x86-64 Linux under a CUDA 13 driver --------------------------
# Capability flags that depend on the host platform rather than the chip.  Readings: deviceQuery
# of A100/H100/L4 boards, the driver-13.0 Ada dump (x86: no host-native atomics, no pageable
# access, no direct managed access from host) and the GH200 snapshot for flags deviceQuery does
# not print.  Where GH200's coherent NVLink-C2C host link makes it differ from a PCIe/SXM board
# on x86, the x86 behaviour is used and the line says so.
_X86_LINUX_DGPU: dict[A, int] = {
    A.CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: 1,
    A.CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: 0,  # "Run time limit on kernels: No" (no display)
    A.CU_DEVICE_ATTRIBUTE_INTEGRATED: 0,
    A.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: 1,
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: 0,  # CU_COMPUTEMODE_DEFAULT
    A.CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: 1,
    A.CU_DEVICE_ATTRIBUTE_ECC_ENABLED: 1,  # datacenter boards ship with ECC on ("Enabled")
    A.CU_DEVICE_ATTRIBUTE_TCC_DRIVER: 0,  # Windows-only notion
    A.CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: 1,
    A.CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: 1,
    A.CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: 0,
    A.CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: 0,
    A.CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: 0,  # PCIe host link; GH200 (C2C): 1
    # HMM-enabled kernels with the open driver report 1 here; 0 is the classic x86 answer and
    # the only honest one for a remoted GPU, which cannot reach the guest's pageable memory.
    A.CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: 0,
    A.CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: 1,
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: 1,
    A.CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1: 0,  # v1 MemOps API is gone; 13.x answers 0
    A.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1: 0,
    A.CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1: 0,
    A.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: 1,
    A.CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH: 1,  # deviceQuery: "Yes"
    # CU_STREAM_WAIT_VALUE_FLUSH is "restricted to selected platforms"; GH200 answers 1.
    A.CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES: 0,
    A.CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: 0,  # GH200 (ATS): 1
    A.CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: 0,  # GH200: 1
    A.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED: 0,
    A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED: 0,
    A.CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED: 1,  # compute data compression, sm_80+
    A.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: 0,  # as the GH200 snapshot
    A.CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: 1,
    # Bitmask of CUflushGPUDirectRDMAWritesOptions: HOST (1) only; MEMOPS (2) goes with
    # CAN_FLUSH_REMOTE_WRITES above.  GH200 answers 3.
    A.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: 1,
    # CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE on a PCIe host; GH200 answers ALL_DEVICES (200).
    A.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING: 0,
    # CUmemAllocationHandleType bits: POSIX_FD (1).  FABRIC (8) needs an IMEX/NVLink fabric.
    A.CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: 1,
    A.CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: 1,
    A.CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: 1,
    A.CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: 1,  # open kernel modules (the default since R560)
    A.CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: 0,  # needs IMEX; GH200 NVL answers 1
    # Host function pointers callable from device need system-wide addressing (ATS/HMM);
    # GH200 answers 1, a plain x86 host does not offer it.
    A.CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS: 0,
    A.CU_DEVICE_ATTRIBUTE_NUMA_CONFIG: 0,  # CU_DEVICE_NUMA_CONFIG_NONE: GPU memory is no NUMA node
    A.CU_DEVICE_ATTRIBUTE_NUMA_ID: -1,  # documented answer when NUMA_CONFIG is NONE
    A.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: 0,  # needs NVSwitch multicast + fabric manager
    A.CU_DEVICE_ATTRIBUTE_MPS_ENABLED: 0,
    A.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: 0,  # closest host node; depends on the slot's socket
    A.CU_DEVICE_ATTRIBUTE_D3D12_CIG_SUPPORTED: 0,
    A.CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK: 0,  # decompression engine is sm_100+
    A.CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_MAXIMUM_LENGTH: 0,
    A.CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED: 0,
    A.CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED: 0,
    A.CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: 1,
    A.CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED: 0,
    A.CU_DEVICE_ATTRIBUTE_ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED: 0,
    A.CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: 0,
    A.CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: 0,  # device number on its bus (function 0)
    # Maximum CUaccessPolicyWindow::num_bytes: 128 MiB - 4 KiB under driver 13.0 on x86 (Ada
    # dump); the GH200 snapshot under 13.2 shows a flat 128 MiB.
    A.CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: 134213632,
}

# --- Per-architecture limits (CUDA C++ Programming Guide, compute capability tables) -----------
_SM80: dict[A, int] = {  # GA100
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 8,
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
    A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: 2048,
    A.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: 32,
    A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: 167936,  # 164 KiB
    A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 166912,  # 163 KiB
    A.CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: 2,  # 64 FP32 : 32 FP64 per SM
    A.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: 0,  # thread block clusters are sm_90+
    A.CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: 1,  # memory sync domains are sm_90+
    A.CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED: 0,  # TMA is sm_90+
}

_SM89: dict[A, int] = {  # AD10x
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 8,
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 9,
    A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: 1536,
    A.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: 24,
    A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: 102400,  # 100 KiB
    A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 101376,  # 99 KiB
    A.CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: 64,  # 128 FP32 : 2 FP64 per SM
    A.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: 0,
    A.CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: 1,
    A.CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED: 0,
}

_SM90: dict[A, int] = {  # GH100; values as in the GH200 snapshot
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
    A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: 2048,
    A.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: 32,
    A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: 233472,  # 228 KiB
    A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448,  # 227 KiB
    A.CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: 2,
    A.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: 1,
    A.CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: 4,
    A.CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED: 1,
}


def _persisting_l2(l2_bytes: int, numerator: int) -> int:
    """Maximum persisting-L2 set-aside, ``numerator``/16 of the L2.

    No datasheet states this limit; the fraction per architecture is read off real devices:
    sm_86 (RTX 3090: 4718592 of 6291456) -> 12/16, sm_89 (RTX 4090, driver 13.0: 51904512 of
    75497472) -> 11/16, sm_90 (GH200, driver 13.2: 39321600 of 62914560) -> 10/16.
    """
    return l2_bytes * numerator // 16


def _board(
    *,
    sm_count: int,
    clock_khz: int,
    mem_clock_khz: int,
    bus_width: int,
    l2_bytes: int,
    persisting_sixteenths: int,
    async_engines: int,
    pci_bus: int,
) -> dict[A, int]:
    """Attributes that vary between boards of one architecture."""
    return {
        A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: sm_count,
        A.CU_DEVICE_ATTRIBUTE_CLOCK_RATE: clock_khz,
        A.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: mem_clock_khz,
        A.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: bus_width,
        A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: l2_bytes,
        A.CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: _persisting_l2(
            l2_bytes, persisting_sixteenths
        ),
        A.CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: async_engines,
        A.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: pci_bus,
    }


def _merge(*layers: Mapping[A, int]) -> dict[int, int]:
    """Union of attribute layers; each attribute must be defined by exactly one layer."""
    merged: dict[int, int] = {}
    for layer in layers:
        for attribute, value in layer.items():
            if int(attribute) in merged:
                raise ValueError(f"{A(attribute).name} defined twice")
            merged[int(attribute)] = value
    return merged


class UnknownProfileError(KeyError):
    """No device profile has the requested key."""

    def __init__(self, key: str, known: list[str]) -> None:
        super().__init__(key)
        self.key = key
        self.known = known

    def __str__(self) -> str:
        return f"unknown device profile {self.key!r}; known profiles: {', '.join(self.known)}"


def _profile(
    key: str, name: str, total_mem: int, provenance: str, *layers: Mapping[A, int]
) -> DeviceModel:
    attributes = _merge(*layers)
    cc = (
        attributes[A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR],
        attributes[A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR],
    )
    return DeviceModel(key, name, cc, total_mem, attributes, provenance)


_A100_40GB = _profile(
    "a100-40gb",
    "NVIDIA A100-SXM4-40GB",
    42298834944,  # deviceQuery, driver 12.2: 40339 MBytes (42298834944 bytes)
    "deviceQuery (driver 12.2); lspci 10de:20b0 subsystem 10de:134f",
    _COMMON_LIMITS,
    _X86_LINUX_DGPU,
    _SM80,
    _board(
        sm_count=108,
        clock_khz=1410000,
        mem_clock_khz=1215000,  # HBM2
        bus_width=5120,
        l2_bytes=41943040,  # 40 MiB
        persisting_sixteenths=12,  # Ampere: 30 MiB
        async_engines=3,  # "Yes with 3 copy engine(s)"
        pci_bus=0x07,
    ),
    _pci_ids(0x20B0, 0x134F),
)

_A100_80GB = _profile(
    "a100-80gb",
    "NVIDIA A100-SXM4-80GB",
    85100068864,  # deviceQuery, driver 12.5: 81158 MBytes (driver 12.2 reported 84987740160)
    "deviceQuery (drivers 12.2, 12.5); hwloc/lspci 10de:20b2 subsystem 10de:1463",
    _COMMON_LIMITS,
    _X86_LINUX_DGPU,
    _SM80,
    _board(
        sm_count=108,
        clock_khz=1410000,
        mem_clock_khz=1593000,  # HBM2e
        bus_width=5120,
        l2_bytes=41943040,
        persisting_sixteenths=12,
        async_engines=3,
        pci_bus=0x07,
    ),
    _pci_ids(0x20B2, 0x1463),
)

_L4 = _profile(
    "l4",
    "NVIDIA L4",
    23612293120,  # deviceQuery, driver 12.0: 22518 MBytes (23612293120 bytes)
    "deviceQuery (driver 12.0); lspci 10de:27b8 subsystem 10de:16ca",
    _COMMON_LIMITS,
    _X86_LINUX_DGPU,
    _SM89,
    _board(
        sm_count=58,
        clock_khz=2040000,
        mem_clock_khz=6251000,  # GDDR6
        bus_width=192,
        l2_bytes=50331648,  # 48 MiB
        persisting_sixteenths=11,  # Ada; no published L4 reading, derived (33 MiB)
        async_engines=2,  # "Yes with 2 copy engine(s)"
        pci_bus=0x09,
    ),
    _pci_ids(0x27B8, 0x16CA),
)

_H100_80GB = _profile(
    "h100-80gb",
    "NVIDIA H100 80GB HBM3",
    85017755648,  # deviceQuery, driver 13.0: 81079 MBytes (85017755648 bytes)
    "deviceQuery (driver 13.0); GH200 attribute snapshot; lspci 10de:2330 subsystem 10de:16c1",
    _COMMON_LIMITS,
    _X86_LINUX_DGPU,
    _SM90,
    _board(
        sm_count=132,
        clock_khz=1980000,
        mem_clock_khz=2619000,  # HBM3
        bus_width=5120,
        l2_bytes=52428800,  # 50 MiB
        persisting_sixteenths=10,  # Hopper; no published H100 reading, derived (31.25 MiB)
        async_engines=3,  # "Yes with 3 copy engine(s)" under driver 13.0
        pci_bus=0x8A,
    ),
    _pci_ids(0x2330, 0x16C1),
)

_H200 = _profile(
    "h200",
    "NVIDIA H200",
    # PyTorch reports total_memory=143156MB (MiB, rounded down); no byte-exact reading is
    # published, so this is that floor -- within 1 MiB of what cuDeviceTotalMem returns.
    143156 * 1024 * 1024,
    "PyTorch device properties and nvidia-smi clocks on H200 SXM; GH200 attribute snapshot "
    "(same die, L2 and HBM3e width); lspci 10de:2335 subsystem 10de:18bf",
    _COMMON_LIMITS,
    _X86_LINUX_DGPU,
    _SM90,
    _board(
        sm_count=132,
        clock_khz=1980000,  # nvidia-smi max SM clock
        mem_clock_khz=3201000,  # nvidia-smi memory clock, HBM3e
        bus_width=6144,
        l2_bytes=62914560,  # 60 MiB
        persisting_sixteenths=10,  # equals the GH200 reading (39321600)
        async_engines=3,  # as H100 under driver 13.0 (GH200 under 13.2 reports 2)
        pci_bus=0x9A,
    ),
    _pci_ids(0x2335, 0x18BF),
)

#: Not a product: a device of compute capability 13.0, newer than any architecture NVIDIA ships
#: code for today, with an H100's resources. Its purpose is to make libraries that carry SASS for
#: real GPUs and PTX only for their newest target (cuBLAS, cuBLASLt and CUB ship compute_120
#: PTX, cuDNN compute_121) take their PTX paths, which the simulated GPU can run; on the
#: real-model profiles those libraries pick SASS, which the simulator refuses at load.
_SM_NEXT: dict[A, int] = _SM90 | {
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 13,
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
}

_PTX_NEXT = _profile(
    "ptx-next",
    "Crane simulated GPU (compute 13.0, runs PTX only)",
    85017755648,
    "not a product: an H100 80GB's resources at an unreleased compute capability, so that "
    "libraries choose their PTX (see _SM_NEXT)",
    _COMMON_LIMITS,
    _X86_LINUX_DGPU,
    _SM_NEXT,
    _board(
        sm_count=132,
        clock_khz=1980000,
        mem_clock_khz=2619000,
        bus_width=5120,
        l2_bytes=52428800,
        persisting_sixteenths=10,
        async_engines=3,
        pci_bus=0xC0,
    ),
    _pci_ids(0x0000, 0x0000),
)

#: All built-in profiles by key.
PROFILES: Mapping[str, DeviceModel] = MappingProxyType(
    {p.key: p for p in (_A100_40GB, _A100_80GB, _L4, _H100_80GB, _H200, _PTX_NEXT)}
)


def get_profile(key: str) -> DeviceModel:
    """The profile named ``key``; ``UnknownProfileError`` (a ``KeyError``) lists known keys."""
    try:
        return PROFILES[key]
    except KeyError:
        raise UnknownProfileError(key, sorted(PROFILES)) from None
