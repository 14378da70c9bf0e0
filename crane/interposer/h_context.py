"""Created contexts, synchronization and per-context settings.

The current-context stack and primary-context reference counts are C (interposer/src/context.c);
this side creates and destroys remote contexts and answers settings that only matter locally
(limits and cache preferences are hints the simulated and remote devices do not need)."""

from __future__ import annotations

from typing import Any

from crane.api.generated.cuda_enums import CUdevice_attribute as DA
from crane.api.generated.cuda_enums import CUlimit as L
from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.interposer import graphs
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

# CUlimit, every limit cuda.h defines, with the defaults a driver starts a context with
_LIMITS: dict[int, int] = {
    L.CU_LIMIT_STACK_SIZE: 1024,
    L.CU_LIMIT_PRINTF_FIFO_SIZE: 1 << 20,
    L.CU_LIMIT_MALLOC_HEAP_SIZE: 8 << 20,
    L.CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: 2,
    L.CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: 2048,
    L.CU_LIMIT_MAX_L2_FETCH_GRANULARITY: 64,
    L.CU_LIMIT_PERSISTING_L2_CACHE_SIZE: 0,
    L.CU_LIMIT_SHMEM_SIZE: 0,
    L.CU_LIMIT_CIG_ENABLED: 0,
    L.CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED: 0,
}
#: set by the context's creation, not by cuCtxSetLimit
_READ_ONLY = {L.CU_LIMIT_SHMEM_SIZE, L.CU_LIMIT_CIG_ENABLED}
_MAX_STACK = 512 * 1024  # per thread, what NVIDIA's devices accept


def limit_value(which: int) -> int:
    """The value cuCtxSetLimit set for ``which`` (CUlimit), or its default: what the
    device-side heap and launch limits are sent from (crane.interposer.device_limits)."""
    return _LIMITS[which]


def _check_limit(which: int, value: int) -> int:
    """The value a driver would store for ``which`` (it rounds some), or the reason it refuses."""
    if which not in _LIMITS:
        raise CudaError(CUresult.CUDA_ERROR_UNSUPPORTED_LIMIT, f"unknown limit {which}")
    if which in _READ_ONLY:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"limit {which} cannot be set")
    if which == L.CU_LIMIT_STACK_SIZE and value > _MAX_STACK:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE, f"stack size {value} exceeds {_MAX_STACK}"
        )
    if which == L.CU_LIMIT_MAX_L2_FETCH_GRANULARITY and value not in (0, 32, 64, 128):
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE, f"L2 fetch granularity {value} (0/32/64/128)"
        )
    if which == L.CU_LIMIT_PERSISTING_L2_CACHE_SIZE:
        # the driver clamps the set-aside to what the device can persist
        cap = RT.session().attributes.get(DA.CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, 0)
        return min(value, cap)
    if which == L.CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH and not 1 <= value <= 24:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"sync depth {value} (1..24)")
    if which == L.CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED and value not in (0, 1):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad CIG fallback flag {value}")
    if which == L.CU_LIMIT_STACK_SIZE:
        return (value + 15) // 16 * 16
    return value


_cache_config = 0


@handles("cuCtxCreate@3020")
def ctx_create(out: Any, flags: int, dev: int) -> None:
    s = RT.require_init()
    if dev != 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_DEVICE, f"no device {dev}")
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL context pointer")
    h = s.ctx_create(flags)
    RT.created_contexts.add(h)
    value = RT.ffi.cast("void *", h)
    RT.lib.crane_c_cuCtxPushCurrent_4000(value)
    out[0] = value


@handles("cuCtxCreate@12050")
def ctx_create_v4(out: Any, params: Any, flags: int, dev: int) -> None:
    if params != RT.ffi.NULL:
        affinity, n, cig = RT.ffi.cast("uintptr_t *", params)[0:3]
        if affinity or (n & 0xFFFFFFFF) or cig:
            raise CudaError(
                CUresult.CUDA_ERROR_NOT_SUPPORTED, "execution affinity and CIG contexts"
            )
    ctx_create(out, flags, dev)


@handles("cuCtxDestroy@4000")
def ctx_destroy(ctx: Any) -> None:
    h = RT.ptr(ctx)
    if h not in RT.created_contexts:
        if RT.lib.crane_primary_dev(ctx) >= 0:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_CONTEXT, "cannot destroy a primary context")
        raise CudaError(CUresult.CUDA_ERROR_INVALID_CONTEXT, f"unknown context {h:#x}")
    RT.session().ctx_destroy(h)
    RT.created_contexts.discard(h)
    RT.lib.crane_ctx_forget(ctx)


@handles("cuCtxSynchronize@2000")
def ctx_synchronize() -> None:
    graphs.check_device_sync("cuCtxSynchronize")
    RT.session().ctx_synchronize(RT.ctx())


@handles("cuCtxSynchronize@13000")
def ctx_synchronize_v2(ctx: Any) -> None:
    graphs.check_device_sync("cuCtxSynchronize")
    RT.session().ctx_synchronize(RT.ctx(ctx))


def primary_reset(dev: int) -> None:
    """Called by C after the CLS destructors ran: replace the remote primary context."""
    if not RT.has_session:
        return  # nothing remote was ever made
    RT.session().ctx_reset_primary()
    RT.sticky = None
    for h in list(RT.modules):
        RT.forget_module(h)
    RT.streams.clear()


@handles("cuCtxGetStreamPriorityRange@5050")
def ctx_get_stream_priority_range(least: Any, greatest: Any) -> None:
    if least != RT.ffi.NULL:
        least[0] = 0
    if greatest != RT.ffi.NULL:
        greatest[0] = -5


@handles("cuCtxGetLimit@3010")
def ctx_get_limit(out: Any, which: int) -> None:
    if which not in _LIMITS:
        raise CudaError(CUresult.CUDA_ERROR_UNSUPPORTED_LIMIT, f"unknown limit {which}")
    RT.out(out, _LIMITS[which])


@handles("cuCtxSetLimit@3010")
def ctx_set_limit(which: int, value: int) -> None:
    _LIMITS[which] = _check_limit(which, value)


@handles("cuCtxResetPersistingL2Cache@11000")
def ctx_reset_persisting_l2() -> None:
    """Resets persisting L2 lines to normal: no data changes, so nothing to send (the
    simulated GPU has no cache; the cuda backend's L2 policy is the driver's)."""
    RT.session()


@handles("cuCtxGetCacheConfig@3020")
def ctx_get_cache_config(out: Any) -> None:
    RT.out(out, _cache_config)


@handles("cuCtxSetCacheConfig@3020")
def ctx_set_cache_config(config: int) -> None:
    global _cache_config
    if not 0 <= config <= 3:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad cache config {config}")
    _cache_config = config
