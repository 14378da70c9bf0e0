"""Launch-configuration checks, shared by the guest (to fail at the call, invariant 3) and by
the worker (which never trusts the guest). The rules and error codes are the driver's:

* a block dimension or the thread count above the device's limits, a zero dimension, or a grid
  dimension above the limits: CUDA_ERROR_INVALID_VALUE;
* more shared memory (static + dynamic) than the kernel may use: CUDA_ERROR_INVALID_VALUE, the
  limit being 48 KiB unless ``cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)`` raised it, and
  never above the device's opt-in maximum;
* more threads than the kernel was compiled for (``.maxntid``/``__launch_bounds__``):
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
* a cooperative launch on a device without CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
  CUDA_ERROR_NOT_SUPPORTED; one with more blocks than the device keeps resident at once (SMs x
  the occupancy of that block size and shared memory, :func:`max_active_blocks_per_sm`, the
  same number cuOccupancyMaxActiveBlocksPerMultiprocessor answers):
  CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
* a cluster launch (:func:`check_cluster`) on a device without CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH
  (compute capability below 9.0): CUDA_ERROR_NOT_SUPPORTED; a grid not a whole number of
  clusters, a cluster of more than 8 CTAs (16 with NON_PORTABLE_CLUSTER_SIZE_ALLOWED), launch
  dimensions differing from the kernel's compiled ones (``__cluster_dims__``,
  ``.reqnctapercluster``), above its ``.maxclusterrank``, or a kernel compiled for clusters
  (``.explicitcluster``) launched without: CUDA_ERROR_INVALID_CLUSTER_SIZE.
"""

from __future__ import annotations

from collections.abc import Mapping

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError

__all__ = [
    "DEFAULT_SHARED_LIMIT",
    "MAX_CLUSTER_SIZE",
    "PORTABLE_CLUSTER_SIZE",
    "check_cluster",
    "check_cooperative",
    "check_launch",
    "max_active_blocks_per_sm",
    "max_active_clusters",
]

#: CTAs per cluster every sm_90 device runs, and the most any runs (non-portable sizes)
PORTABLE_CLUSTER_SIZE, MAX_CLUSTER_SIZE = 8, 16

#: Shared memory a kernel may use per block without opting in.
DEFAULT_SHARED_LIMIT = 48 * 1024


def check_launch(
    attributes: Mapping[int, int],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    dynamic_shared: int,
    *,
    static_shared: int = 0,
    max_threads: int | None = None,
    max_dynamic_shared: int | None = None,
) -> None:
    """Raise :class:`CudaError` if this launch would be refused by the driver."""
    limits = (
        attributes[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X],
        attributes[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y],
        attributes[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z],
    )
    glimits = (
        attributes[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X],
        attributes[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y],
        attributes[A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z],
    )
    invalid = CUresult.CUDA_ERROR_INVALID_VALUE
    for axis, (b, lim) in enumerate(zip(block, limits, strict=True)):
        if not 1 <= b <= lim:
            raise CudaError(invalid, f"block dimension {'xyz'[axis]}={b} outside 1..{lim}")
    for axis, (g, lim) in enumerate(zip(grid, glimits, strict=True)):
        if not 1 <= g <= lim:
            raise CudaError(invalid, f"grid dimension {'xyz'[axis]}={g} outside 1..{lim}")
    threads = block[0] * block[1] * block[2]
    max_tpb = attributes[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK]
    if threads > max_tpb:
        raise CudaError(invalid, f"{threads} threads per block exceeds the device's {max_tpb}")
    if max_threads is not None and threads > max_threads:
        raise CudaError(
            CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            f"{threads} threads per block exceeds the kernel's limit of {max_threads}",
        )
    optin = attributes[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN]
    dyn_limit = (
        max_dynamic_shared
        if max_dynamic_shared is not None
        else max(DEFAULT_SHARED_LIMIT - static_shared, 0)
    )
    if dynamic_shared < 0 or dynamic_shared > dyn_limit or static_shared + dynamic_shared > optin:
        raise CudaError(
            invalid,
            f"{dynamic_shared} bytes of dynamic shared memory (+{static_shared} static) exceeds "
            f"the kernel's limit of {max(min(dyn_limit, optin - static_shared), 0)} "
            "(raise it with cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES))",
        )


def max_active_blocks_per_sm(
    attributes: Mapping[int, int],
    block_threads: int,
    shared_bytes: int,
    *,
    max_threads: int | None = None,
) -> int:
    """Blocks of ``block_threads`` threads using ``shared_bytes`` of shared memory (static +
    dynamic) that one SM holds at once: the occupancy calculator's answer, limited by blocks,
    warps (threads rounded up to whole warps) and shared memory per SM. Registers do not limit
    it: the simulated device has no register file limit (function attribute NUM_REGS is the
    share of the register file that never limits occupancy).
    One function for cuOccupancyMaxActiveBlocksPerMultiprocessor and the cooperative-launch
    check, so the two can never disagree."""
    if block_threads <= 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "block size must be positive")
    if block_threads > (max_threads or attributes[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK]):
        return 0
    warp = attributes[A.CU_DEVICE_ATTRIBUTE_WARP_SIZE]
    threads = (block_threads + warp - 1) // warp * warp
    limit = min(
        attributes[A.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR],
        attributes[A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR] // threads,
    )
    if shared_bytes:
        per_block = shared_bytes + attributes.get(
            A.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 0
        )
        per_sm = attributes[A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR]
        limit = min(limit, per_sm // per_block)
    return max(limit, 0)


def check_cooperative(
    attributes: Mapping[int, int],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    dynamic_shared: int,
    *,
    static_shared: int = 0,
    max_threads: int | None = None,
) -> None:
    """Raise :class:`CudaError` if the driver would refuse this launch *as cooperative*: every
    block must be resident at once (blocks wait for each other at a grid-wide sync). Call it
    after :func:`check_launch`."""
    if not attributes.get(A.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 0):
        raise CudaError(
            CUresult.CUDA_ERROR_NOT_SUPPORTED, "the device does not support cooperative launches"
        )
    per_sm = max_active_blocks_per_sm(
        attributes,
        block[0] * block[1] * block[2],
        static_shared + dynamic_shared,
        max_threads=max_threads,
    )
    sms = attributes[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT]
    blocks = grid[0] * grid[1] * grid[2]
    if blocks > per_sm * sms:
        raise CudaError(
            CUresult.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
            f"cooperative launch of {blocks} blocks: the device keeps at most {per_sm * sms} "
            f"resident ({sms} SMs x {per_sm} blocks of {block[0] * block[1] * block[2]} threads "
            f"and {static_shared + dynamic_shared} bytes of shared memory)",
        )


def check_cluster(
    attributes: Mapping[int, int],
    grid: tuple[int, int, int],
    cluster: tuple[int, int, int] | None,
    *,
    required: tuple[int, int, int] | None = None,
    explicit: bool = False,
    max_rank: int | None = None,
    non_portable: bool = False,
) -> tuple[int, int, int] | None:
    """The cluster dimensions a launch runs with (None: no cluster launch), or
    :class:`CudaError` as the driver refuses it. ``cluster`` is the launch's
    (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, or the REQUIRED_CLUSTER_* function attributes;
    all zero counts as none), ``required``/``explicit``/``max_rank`` the kernel's compiled
    ``.reqnctapercluster``/``.explicitcluster``/``.maxclusterrank``."""
    bad = CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE
    given = ((*cluster, 1, 1))[:3] if cluster is not None and any(cluster) else None
    if given is not None and not all(d >= 1 for d in given):
        raise CudaError(bad, f"cluster dimensions {given} must all be positive")
    req = ((*required, 1, 1))[:3] if required and any(d > 0 for d in required) else None
    if req is not None and given is not None and given != req:
        raise CudaError(bad, f"cluster dimensions {given} differ from the kernel's {req}")
    dims = req or given
    if dims is None:
        if explicit:
            raise CudaError(bad, "the kernel is compiled for clusters but launched without")
        return None
    if not attributes.get(A.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 0):
        raise CudaError(
            CUresult.CUDA_ERROR_NOT_SUPPORTED,
            "the device has no thread-block clusters (compute capability 9.0 and above)",
        )
    size = dims[0] * dims[1] * dims[2]
    for axis, (g, c) in enumerate(zip(grid, dims, strict=True)):
        if g % c:
            raise CudaError(
                bad, f"grid dimension {'xyz'[axis]}={g} is not a multiple of the cluster's {c}"
            )
    most = MAX_CLUSTER_SIZE if non_portable else PORTABLE_CLUSTER_SIZE
    if size > most:
        why = "" if non_portable else " (more needs NON_PORTABLE_CLUSTER_SIZE_ALLOWED)"
        raise CudaError(bad, f"a cluster of {size} CTAs is above the limit of {most}{why}")
    if max_rank and size > max_rank:
        raise CudaError(bad, f"a cluster of {size} CTAs is above the kernel's .maxclusterrank")
    return dims  # type: ignore[return-value]


def max_active_clusters(
    attributes: Mapping[int, int],
    cluster_size: int,
    block_threads: int,
    shared_bytes: int,
    *,
    max_threads: int | None = None,
) -> int:
    """cuOccupancyMaxActiveClusters: clusters of ``cluster_size`` CTAs that the device keeps
    resident at once. A cluster's CTAs run on the SMs of one GPC (graphics processing
    cluster), so clusters are counted per GPC: the device's SMs grouped in GPCs of
    :data:`SMS_PER_GPC` (the last one smaller), each SM holding
    :func:`max_active_blocks_per_sm` CTAs, and a GPC as many whole clusters as its CTAs make."""
    per_sm = max_active_blocks_per_sm(
        attributes, block_threads, shared_bytes, max_threads=max_threads
    )
    if cluster_size <= 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "cluster size must be positive")
    if per_sm == 0:
        return 0
    sms = attributes[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT]
    gpcs, rest = divmod(sms, SMS_PER_GPC)
    per_gpc = (per_sm * SMS_PER_GPC) // cluster_size
    return gpcs * per_gpc + (per_sm * rest) // cluster_size


#: SMs per graphics processing cluster (a cluster's CTAs share one GPC) on sm_90 parts
SMS_PER_GPC = 18
