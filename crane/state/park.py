"""Writing a quiesced executor to a checkpoint stream, and replaying one onto a fresh executor.

Both run inside the session's worker, which owns the device memory: the daemon only names the
file. The caller holds the session's batch lock, so no call runs meanwhile (a batch boundary is
a call boundary), and the backend is synchronized first so memory is final.
"""

from __future__ import annotations

import io
import struct
import time
from typing import Any, BinaryIO

from crane.api.results import CudaError
from crane.state.checkpoint import (
    MEMORY_CHUNK,
    CheckpointError,
    CheckpointReader,
    CheckpointWriter,
    Kind,
)
from crane.state.record import memory_regions, restore_graph, save_graph
from crane.worker.executor import Executor

__all__ = ["restore_checkpoint", "write_checkpoint"]


def write_checkpoint(ex: Executor, out: BinaryIO, identity: dict[str, Any]) -> dict[str, int]:
    """Stream the session to ``out``; returns counts (bytes written, memory bytes, sections).

    ``identity`` is the daemon's record of the session (id, token, window, what the guest was
    told: crane.state.told); it goes into META as is."""
    ex.backend.synchronize()
    w = CheckpointWriter(out)
    try:
        snap = ex.backend.snapshot
        w.json(
            Kind.META,
            {
                "format": "crane-checkpoint",
                "session": identity,
                "mem_needed": ex.mem_used(),
                "source": {"profile": snap.profile, "cc": list(snap.cc), "name": snap.name},
                "created": time.time(),
            },
        )
        graph = save_graph(ex)
        for digest in dict.fromkeys(m["digest"] for m in graph["modules"]):
            image = ex._image_bytes(bytes.fromhex(digest), b"")
            if image is None:
                raise CheckpointError(f"module image {digest[:16]} vanished from the cache")
            w.section(Kind.IMAGE, bytes.fromhex(digest) + image)
        w.json(Kind.OBJECTS, graph)
        w.section(
            Kind.REPLIES,
            struct.pack("<I", len(ex.last_replies))
            + b"".join(struct.pack("<I", len(m)) + m for m in ex.last_replies),
        )
        stream = ex._default_stream
        for addr, size in memory_regions(ex):
            for off in range(0, size, MEMORY_CHUNK):
                n = min(MEMORY_CHUNK, size - off)
                # no copy: the writer consumes (or copies) a view before the next backend call
                w.memory(addr + off, ex.backend.memcpy_dtoh(addr + off, n, stream))
        w.finish()
    except BaseException:
        w.abort()
        raise
    ex.dirty.mark()
    return {"bytes": w.bytes_written, "memory_bytes": w.memory_bytes, "sections": w.sections}


def restore_checkpoint(ex: Executor, src: BinaryIO, name: str) -> dict[str, Any]:
    """Replay a checkpoint onto a fresh executor (same window); returns its META.

    Raises :class:`CheckpointError` for a damaged file and :class:`CudaError` for state this
    device cannot take (no code for its architecture, ...). Either way the executor is left
    half-built: the caller discards the worker, so nothing leaks.
    """
    r = CheckpointReader(src, name)
    meta = r.expect(Kind.META).json()
    graph: dict[str, Any] | None = None
    stream = ex._default_stream
    # a file: read ahead of the checksums and device writes (a migration's stream is fed by
    # the worker's own loop, which must not be raced by a second reader)
    for s in r.sections(prefetch=isinstance(src, io.BufferedReader)):
        if s.kind == Kind.IMAGE:
            if graph is not None or len(s.payload) < 32:
                raise CheckpointError(f"{name}: misplaced or empty IMAGE section {s.index}")
            try:
                ex._image_bytes(s.payload[:32], s.payload[32:])
            except CudaError:
                raise CheckpointError(
                    f"{name}: IMAGE section {s.index} does not match its digest"
                ) from None
        elif s.kind == Kind.OBJECTS:
            graph = s.json()
            restore_graph(ex, graph)
        elif s.kind == Kind.REPLIES:
            ex.last_replies = _replies(s.payload, name)
        elif s.kind == Kind.MEMORY:
            if graph is None:
                raise CheckpointError(f"{name}: MEMORY section {s.index} before the object graph")
            addr, data = s.memory()
            try:
                ex.backend.memcpy_htod(addr, data, stream)
                ex.dirty.contents(addr, data)  # pointer tables (crane.state.dirty)
            except CudaError as e:
                raise CheckpointError(
                    f"{name}: MEMORY section {s.index} at {addr:#x}+{len(data):#x} is outside "
                    f"the recorded allocations: {e.message}"
                ) from None
        elif s.kind == Kind.END and graph is None:
            raise CheckpointError(f"{name}: no OBJECTS section")
        elif s.kind == Kind.META:
            raise CheckpointError(f"{name}: second META section {s.index}")
    ex.backend.synchronize()
    ex.dirty.mark()
    return meta


def _replies(payload: bytes, name: str) -> list[bytes]:
    try:
        (count,) = struct.unpack_from("<I", payload)
        out, pos = [], 4
        for _ in range(count):
            (n,) = struct.unpack_from("<I", payload, pos)
            pos += 4
            if pos + n > len(payload):
                raise struct.error("runs past the section")
            out.append(payload[pos : pos + n])
            pos += n
    except struct.error as e:
        raise CheckpointError(f"{name}: REPLIES section is malformed: {e}") from None
    return out
