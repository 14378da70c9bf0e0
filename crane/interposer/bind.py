"""Wire the registered Python handlers to the library's embedding-API symbols.

Runs once, from the library's init code, in the embedded (or host) interpreter. Every Python
entry of :data:`crane.api.driver_spec.SPEC` must have a handler: a missing one is an error at
start-up, not a silent stub. Each handler is wrapped so that a :class:`CudaError` becomes its
CUresult and any other exception is logged once with its traceback and becomes
CUDA_ERROR_UNKNOWN (a bug in Crane must never crash the guest).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import Any

from crane.api.driver_spec import SPEC, How, spec_key
from crane.api.results import CudaError
from crane.interposer import (  # noqa: F401 - imported for their registrations
    h_array,
    h_cluster,
    h_context,
    h_copy,
    h_device,
    h_graph,
    h_hostmap,
    h_launch,
    h_link,
    h_memory,
    h_misc,
    h_module,
    h_pools,
    h_stream,
    h_texture,
    h_vmm,
)
from crane.interposer.fastlane import FAST
from crane.interposer.registry import HANDLERS
from crane.interposer.runtime import RT

__all__ = ["install", "wrap"]

_UNKNOWN = 999


def wrap(name: str, fn: Callable[..., object], local: bool = False) -> Callable[..., int]:
    """The entry for one handler. ``local`` handlers answer even after a sticky fault (device
    queries, error strings); every other call then fails with the fault, as on a GPU."""

    def entry(*args: Any) -> int:
        if RT.sticky is not None and not local:
            return int(RT.sticky.code)
        try:
            r = fn(*args)
            return 0 if r is None else int(r)  # type: ignore[call-overload]
        except CudaError as e:
            RT.note_error(name, e)
            return int(e.code)
        except Exception:
            print(f"crane: internal error in {name}:", file=sys.stderr)
            traceback.print_exc()
            return _UNKNOWN

    entry.__name__ = name
    return entry


def install(ffi: Any, lib: Any) -> None:
    missing = [spec_key(e.name, e.version) for e in SPEC if e.how is How.PY]
    missing = [k for k in missing if k not in HANDLERS]
    if missing:
        raise RuntimeError(f"crane.interposer: no handler for {missing}")
    RT.attach(ffi, lib)
    for e in SPEC:
        if e.how is How.PY:
            c_name = f"crane_py_{e.name}_{e.version}"
            handler = HANDLERS[spec_key(e.name, e.version)]
            # teardown entries (crane.api.driver_spec) still run after a sticky fault
            ffi.def_extern(name=c_name)(wrap(e.name, handler, e.local or e.teardown))
    ffi.def_extern(name="crane_py_primary_reset")(
        wrap("primary_reset", h_context.primary_reset, local=True)
    )
    # interposer/src/fastlane.c: a record it queued filled the queue or began a batch
    ffi.def_extern(name="crane_py_fast_queued")(
        wrap("fast_queued", lambda n: RT.session().queued(n))
    )
    FAST.attach(lib)
