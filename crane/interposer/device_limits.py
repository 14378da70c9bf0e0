"""Send the context's device-runtime limits to the worker when they changed.

Why: cuCtxSetLimit is answered in the guest (h_context), but two limits shape what kernels do
on the device: CU_LIMIT_MALLOC_HEAP_SIZE (the heap of device malloc/free/new) and
CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT (dynamic parallelism). CUDA reads them when a
kernel launches, so a launch sends them first whenever they differ from what this context
last sent: one asynchronous call the first time, nothing afterwards.
"""

from __future__ import annotations

from crane.interposer.h_context import limit_value
from crane.interposer.runtime import RT

__all__ = ["before_launch"]

_HEAP, _PENDING = 2, 4  # CU_LIMIT_MALLOC_HEAP_SIZE, CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT
_DEFAULTS = (8 << 20, 2048)  # what a worker's device starts with
_sent: dict[int, tuple[int, int]] = {}


def before_launch() -> None:
    values = (limit_value(_HEAP), limit_value(_PENDING))
    ctx = RT.ctx()
    if _sent.get(ctx, _DEFAULTS) != values:
        RT.session().device_runtime_limits(ctx, *values)
        _sent[ctx] = values
