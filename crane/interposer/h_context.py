"""Created contexts, synchronization and per-context settings.

The current-context stack and primary-context reference counts are C (interposer/src/context.c);
this side creates and destroys remote contexts and answers settings that only matter locally
(limits and cache preferences are hints the simulated and remote devices do not need)."""

from __future__ import annotations

from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.interposer import graphs
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

# cuCtxGetLimit defaults (CUlimit order): stack, printf FIFO, malloc heap, sync depth,
# pending launches, L2 fetch granularity, persisting L2.
_LIMITS: dict[int, int] = {0: 1024, 1: 1 << 20, 2: 8 << 20, 3: 2, 4: 2048, 5: 64, 6: 0}
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


def limit_value(limit: int) -> int:
    """The value cuCtxSetLimit set for ``limit`` (CUlimit), or its default: what the
    device-side heap and launch limits are sent from (crane.interposer.device_limits)."""
    return _LIMITS[limit]


@handles("cuCtxGetLimit@3010")
def ctx_get_limit(out: Any, limit: int) -> None:
    if limit not in _LIMITS:
        raise CudaError(CUresult.CUDA_ERROR_UNSUPPORTED_LIMIT, f"unknown limit {limit}")
    RT.out(out, _LIMITS[limit])


@handles("cuCtxSetLimit@3010")
def ctx_set_limit(limit: int, value: int) -> None:
    if limit not in _LIMITS:
        raise CudaError(CUresult.CUDA_ERROR_UNSUPPORTED_LIMIT, f"unknown limit {limit}")
    _LIMITS[limit] = value


@handles("cuCtxGetCacheConfig@3020")
def ctx_get_cache_config(out: Any) -> None:
    RT.out(out, _cache_config)


@handles("cuCtxSetCacheConfig@3020")
def ctx_set_cache_config(config: int) -> None:
    global _cache_config
    if not 0 <= config <= 3:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad cache config {config}")
    _cache_config = config
