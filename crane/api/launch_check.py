"""Launch-configuration checks, shared by the guest (to fail at the call, invariant 3) and by
the worker (which never trusts the guest). The rules and error codes are the driver's:

* a block dimension or the thread count above the device's limits, a zero dimension, or a grid
  dimension above the limits: CUDA_ERROR_INVALID_VALUE;
* more shared memory (static + dynamic) than the kernel may use: CUDA_ERROR_INVALID_VALUE, the
  limit being 48 KiB unless ``cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)`` raised it, and
  never above the device's opt-in maximum;
* more threads than the kernel was compiled for (``.maxntid``/``__launch_bounds__``):
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES.
"""

from __future__ import annotations

from collections.abc import Mapping

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError

__all__ = ["DEFAULT_SHARED_LIMIT", "check_launch"]

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
