"""The session's object graph as plain values: one save and one restore per object type.

Why per type (Firecracker's ``Persist``): each object knows what it needs to be recreated, and a
restore is a replay of the same creations with the same guest-chosen handles and addresses
(invariant 2) on a fresh executor, in dependency order. Saves return JSON-ready dicts; restores
take the executor to recreate into plus that dict, and go through the executor's own creation
paths so the same validation applies to a restored object as to a new one.

Replay order: contexts, guest chunks, the module area, modules (their variables placed at their
recorded addresses), allocations, streams, events, functions (with raised shared-memory limits),
then the sticky error and the sequence number. Memory contents travel separately
(:mod:`crane.state.park`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.backends.base import GlobalVar, LoadedModule
from crane.device.layout import CHUNK_GRANULARITY
from crane.worker.executor import MODULE_AREA, Executor
from crane.worker.objects import Owned

__all__ = ["RECORD_VERSION", "memory_regions", "restore_graph", "save_graph"]

RECORD_VERSION = 1
State = dict[str, Any]


# ---- one save/restore pair per object type --------------------------------------------------
def save_context(handle: int, o: Owned[None]) -> State:
    return {"handle": handle, "flags": o.meta or 0}


def restore_context(ex: Executor, s: State) -> None:
    ex.ctx_create(s["handle"], s["flags"])


def save_chunk(addr: int, size: int) -> State:
    return {"addr": addr, "size": size}


def restore_chunk(ex: Executor, s: State) -> None:
    ex.mem_map_chunk(s["addr"], s["size"])


def save_module(handle: int, o: Owned[LoadedModule]) -> State:
    return {
        "handle": handle,
        "ctx": o.ctx,
        "digest": o.meta.hex(),
        "globals": [[g.name, g.addr, g.size] for g in o.obj.globals.values()],
    }


def restore_module(ex: Executor, s: State) -> None:
    """Reload the image for *this* device (re-JIT is implicit) with variables where they were."""
    digest = bytes.fromhex(s["digest"])
    data = ex._image_bytes(digest, b"")
    if data is None:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_IMAGE, f"module image {s['digest'][:16]} is missing"
        )
    addrs: Iterator[list[Any]] = iter(s["globals"])

    def place(size: int) -> int:
        name, addr, recorded = next(addrs)
        if recorded != size:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_IMAGE,
                f"module variable {name}: {size} bytes now, {recorded} when checkpointed",
            )
        ex.backend.mem_alloc(addr, max(size, 1))
        return addr

    _, loaded = ex.load_module(s["ctx"], s["handle"], digest, data, place)
    for name, addr, size in s["globals"]:
        placed = loaded.globals.get(name)
        if placed is not None and placed.addr != addr:
            # the driver chose (cuda backend): the guest keeps the address it was told
            ex.backend.alias_global(addr, placed.addr, size)
            loaded.globals[name] = GlobalVar(name, addr, size)


def save_allocation(addr: int, ctx: int, size: int) -> State:
    return {"addr": addr, "ctx": ctx, "size": size}


def restore_allocation(ex: Executor, s: State) -> None:
    ex.mem_alloc(s["ctx"], s["addr"], s["size"])


def save_stream(handle: int, o: Owned[Any]) -> State:
    flags, priority = o.meta
    return {"handle": handle, "ctx": o.ctx, "flags": flags, "priority": priority}


def restore_stream(ex: Executor, s: State) -> None:
    ex.stream_create(s["ctx"], s["handle"], s["flags"], s["priority"])


def save_event(handle: int, o: Owned[Any]) -> State:
    return {"handle": handle, "ctx": o.ctx, "flags": o.meta}


def restore_event(ex: Executor, s: State) -> None:
    ex.event_create(s["ctx"], s["handle"], s["flags"])


def save_function(handle: int, o: Owned[str], max_dynamic_shared: int | None) -> State:
    return {"handle": handle, "module": o.meta, "kernel": o.obj, "max_dyn": max_dynamic_shared}


def restore_function(ex: Executor, s: State) -> None:
    ex.function_bind(s["handle"], s["module"], s["kernel"].encode())
    if s["max_dyn"] is not None:
        ex.function_set_max_dynamic_shared(s["handle"], s["max_dyn"])


def save_sticky(e: CudaError | None) -> State | None:
    return None if e is None else {"code": int(e.code), "message": e.message}


def restore_sticky(ex: Executor, s: State | None) -> None:
    ex.sticky = None if s is None else CudaError(CUresult(s["code"]), s["message"])


def save_module_area(ex: Executor) -> State:
    return {"next": ex._module_next, "chunk_end": ex._module_chunk_end}


def restore_module_area(ex: Executor, s: State) -> None:
    base = ex.window[0] + ex.window[1] - MODULE_AREA
    if not base <= s["next"] <= s["chunk_end"] <= ex.window[0] + ex.window[1]:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "module area outside the window")
    for addr in range(base, s["chunk_end"], CHUNK_GRANULARITY):
        ex.backend.map_chunk(addr, CHUNK_GRANULARITY)
    ex._module_next = s["next"]
    ex._module_chunk_end = s["chunk_end"]


# ---- the whole graph ------------------------------------------------------------------------
def save_graph(ex: Executor) -> State:
    """The executor's object graph; call with the session quiesced (no batch running)."""
    return {
        "version": RECORD_VERSION,
        "window": list(ex.window),
        "contexts": [save_context(h, ex.contexts.get(h)) for h in ex.contexts],
        "chunks": [save_chunk(a, n) for a, n in ex.chunks.items()],
        "module_area": save_module_area(ex),
        "modules": [save_module(h, ex.modules.get(h)) for h in ex.modules],
        "allocations": [save_allocation(a, c, n) for a, (c, n) in ex.allocations.items()],
        "streams": [save_stream(h, ex.streams.get(h)) for h in ex.streams],
        "events": [save_event(h, ex.events.get(h)) for h in ex.events],
        "functions": [
            save_function(h, ex.functions.get(h), ex.max_dynamic_shared.get(h))
            for h in ex.functions
        ],
        "sticky": save_sticky(ex.sticky),
        "done_seq": ex.done_seq,
        "calls": ex.calls,
    }


def restore_graph(ex: Executor, g: State) -> None:
    """Replay a saved graph on a fresh executor of the same window.

    Raises :class:`CudaError` naming the object that could not be recreated (for example a
    module with no code for this device's architecture).
    """
    if g.get("version") != RECORD_VERSION:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE, f"state record version {g.get('version')}"
        )
    if tuple(g["window"]) != ex.window:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE,
            f"record is for window {g['window'][0]:#x}, this worker has {ex.window[0]:#x}",
        )
    for s in g["contexts"]:
        restore_context(ex, s)
    for s in g["chunks"]:
        restore_chunk(ex, s)
    restore_module_area(ex, g["module_area"])
    for s in g["modules"]:
        try:
            restore_module(ex, s)
        except CudaError as e:
            raise CudaError(e.code, f"module {s['handle']:#x}: {e.message}") from None
    for s in g["allocations"]:
        restore_allocation(ex, s)
    for s in g["streams"]:
        restore_stream(ex, s)
    for s in g["events"]:
        restore_event(ex, s)
    for s in g["functions"]:
        restore_function(ex, s)
    restore_sticky(ex, g["sticky"])
    ex.done_seq = g["done_seq"]
    ex.calls = g["calls"]


def memory_regions(ex: Executor) -> list[tuple[int, int]]:
    """(address, size) of every range whose contents a checkpoint carries: the guest's
    allocations and the live modules' variables."""
    regions = [(a, n) for a, (_, n) in ex.allocations.items()]
    for h in ex.modules:
        regions += [(v.addr, v.size) for v in ex.modules.get(h).obj.globals.values() if v.size]
    return sorted(regions)
