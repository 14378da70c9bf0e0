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
  CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE.
"""

from __future__ import annotations

from collections.abc import Mapping

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError

__all__ = [
    "DEFAULT_SHARED_LIMIT",
    "check_cooperative",
    "check_launch",
    "max_active_blocks_per_sm",
]

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
            f"the kernel's limit of {min(dyn_limit, optin - static_shared)} "
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
    it: the simulated device has no register file limit (function attribute NUM_REGS is 0).
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
