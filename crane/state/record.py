"""The session's object graph as plain values: one save and one restore per object type.

Why per type (Firecracker's ``Persist``): each object knows what it needs to be recreated, and a
restore is a replay of the same creations with the same guest-chosen handles and addresses
(invariant 2) on a fresh session device state, in dependency order. Saves return JSON-ready
dicts; restores take the :class:`~crane.engine.model.SessionDevice` to recreate into plus that
dict, and go through its own creation operations (its public surface only) so the same
validation applies to a restored object as to a new one. The call log (how far the guest's
calls have run) travels in the graph too.

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
from crane.backends.base import LoadedModule
from crane.engine.codec import CallLog
from crane.engine.model import SessionDevice
from crane.engine.objects import Owned
from crane.state.placement import moved_globals, placement_refusal

__all__ = ["RECORD_VERSION", "restore_graph", "restore_progress", "restore_sticky", "save_graph"]

RECORD_VERSION = 1
State = dict[str, Any]


# ---- one save/restore pair per object type --------------------------------------------------
def save_context(handle: int, o: Owned[None]) -> State:
    return {"handle": handle, "flags": o.meta or 0}


def restore_context(dev: SessionDevice, s: State) -> None:
    dev.ctx_create(s["handle"], s["flags"])


def save_chunk(addr: int, size: int) -> State:
    return {"addr": addr, "size": size}


def restore_chunk(dev: SessionDevice, s: State) -> None:
    dev.mem_map_chunk(s["addr"], s["size"])


def save_module(handle: int, o: Owned[LoadedModule]) -> State:
    return {
        "handle": handle,
        "ctx": o.ctx,
        "digest": o.meta.hex(),
        "globals": [[g.name, g.addr, g.size] for g in o.obj.globals.values()],
    }


def restore_module(dev: SessionDevice, s: State) -> None:
    """Reload the image for *this* device (re-JIT is implicit) with variables where they were."""
    digest = bytes.fromhex(s["digest"])
    data = dev.image(digest)
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
        dev.backend.mem_alloc(addr, max(size, 1))
        return addr

    _, loaded = dev.load_module(s["ctx"], s["handle"], digest, data, place)
    # the driver chose (cuda backend): the guest's stored pointers to them would be stale
    moved = moved_globals(s["globals"], loaded.globals)
    if moved:
        raise CudaError(
            CUresult.CUDA_ERROR_NOT_SUPPORTED, placement_refusal(s["digest"][:16], moved)
        )


def save_allocation(addr: int, ctx: int, size: int) -> State:
    return {"addr": addr, "ctx": ctx, "size": size}


def restore_allocation(dev: SessionDevice, s: State) -> None:
    dev.mem_alloc(s["ctx"], s["addr"], s["size"])


def save_stream(handle: int, o: Owned[Any]) -> State:
    flags, priority = o.meta
    return {"handle": handle, "ctx": o.ctx, "flags": flags, "priority": priority}


def restore_stream(dev: SessionDevice, s: State) -> None:
    dev.stream_create(s["ctx"], s["handle"], s["flags"], s["priority"])


def save_event(handle: int, o: Owned[Any]) -> State:
    return {"handle": handle, "ctx": o.ctx, "flags": o.meta}


def restore_event(dev: SessionDevice, s: State) -> None:
    dev.event_create(s["ctx"], s["handle"], s["flags"])


def save_function(
    handle: int, o: Owned[str], max_dynamic_shared: int | None, peaks: list[int] | None
) -> State:
    return {
        "handle": handle,
        "module": o.meta,
        "kernel": o.obj,
        "max_dyn": max_dynamic_shared,
        "peaks": peaks,
    }


def restore_function(dev: SessionDevice, s: State) -> None:
    dev.function_bind(s["handle"], s["module"], s["kernel"].encode())
    if s["max_dyn"] is not None:
        dev.function_set_max_dynamic_shared(s["handle"], s["max_dyn"])
    if s.get("peaks"):  # a record from before launch peaks were kept has none
        dev.launch_peaks[s["handle"]] = [int(x) for x in s["peaks"]]


def save_sticky(e: CudaError | None) -> State | None:
    return None if e is None else {"code": int(e.code), "message": e.message}


def restore_sticky(dev: SessionDevice, s: State | None) -> None:
    dev.sticky = None if s is None else CudaError(CUresult(s["code"]), s["message"])


def save_module_area(dev: SessionDevice) -> State:
    return {"next": dev.module_area.next, "chunk_end": dev.module_area.chunk_end}


def restore_module_area(dev: SessionDevice, s: State) -> None:
    dev.module_area.restore(dev.backend, s["next"], s["chunk_end"])


# ---- the whole graph ------------------------------------------------------------------------
def save_graph(dev: SessionDevice, log: CallLog) -> State:
    """The session's object graph; call with the session quiesced (no batch running)."""
    return {
        "version": RECORD_VERSION,
        "window": list(dev.window),
        "contexts": [save_context(h, dev.contexts.get(h)) for h in dev.contexts],
        "chunks": [save_chunk(a, n) for a, n in dev.chunks.items()],
        "module_area": save_module_area(dev),
        "modules": [save_module(h, dev.modules.get(h)) for h in dev.modules],
        "allocations": [save_allocation(a, c, n) for a, (c, n) in dev.allocations.items()],
        "streams": [save_stream(h, dev.streams.get(h)) for h in dev.streams],
        "events": [save_event(h, dev.events.get(h)) for h in dev.events],
        "functions": [
            save_function(
                h, dev.functions.get(h), dev.max_dynamic_shared.get(h), dev.launch_peaks.get(h)
            )
            for h in dev.functions
        ],
        "sticky": save_sticky(dev.sticky),
        "done_seq": log.done_seq,
        "calls": log.calls,
    }


def restore_graph(dev: SessionDevice, log: CallLog, g: State) -> None:
    """Replay a saved graph on a fresh session device state of the same window.

    Raises :class:`CudaError` naming the object that could not be recreated (for example a
    module with no code for this device's architecture).
    """
    if g.get("version") != RECORD_VERSION:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE, f"state record version {g.get('version')}"
        )
    if tuple(g["window"]) != dev.window:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE,
            f"record is for window {g['window'][0]:#x}, this worker has {dev.window[0]:#x}",
        )
    for s in g["contexts"]:
        restore_context(dev, s)
    for s in g["chunks"]:
        restore_chunk(dev, s)
    restore_module_area(dev, g["module_area"])
    for s in g["modules"]:
        try:
            restore_module(dev, s)
        except CudaError as e:
            raise CudaError(e.code, f"module {s['handle']:#x}: {e.message}") from None
    for s in g["allocations"]:
        restore_allocation(dev, s)
    for s in g["streams"]:
        restore_stream(dev, s)
    for s in g["events"]:
        restore_event(dev, s)
    for s in g["functions"]:
        restore_function(dev, s)
    restore_sticky(dev, g["sticky"])
    restore_progress(log, g)


def restore_progress(log: CallLog, g: State) -> None:
    """The call log's counters as a graph recorded them (ValueError unless both are counts:
    every later batch is compared with them)."""
    done_seq, calls = g["done_seq"], g["calls"]
    for name, v in (("done_seq", done_seq), ("calls", calls)):
        if type(v) is not int or not 0 <= v < 1 << 64:
            raise ValueError(f"{name} {v!r} is not a 64-bit count")
    log.done_seq = done_seq
    log.calls = calls
