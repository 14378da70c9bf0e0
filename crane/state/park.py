"""Writing a quiesced session to a checkpoint stream, and replaying one onto a fresh session.

Both run inside the session's worker, which owns the device memory: the daemon only names the
file. The caller holds the session's batch lock, so no call runs meanwhile (a batch boundary is
a call boundary), and the device is synchronized first so memory is final. Both go through the
session device state's public surface (:class:`~crane.engine.model.SessionDevice`) and its call
log (:class:`~crane.engine.codec.CallLog`).
"""

from __future__ import annotations

import io
import struct
import time
from typing import Any, BinaryIO

from crane.api.results import CudaError
from crane.engine.codec import CallLog
from crane.engine.model import SessionDevice
from crane.state.checkpoint import (
    MEMORY_CHUNK,
    CheckpointError,
    CheckpointReader,
    CheckpointWriter,
    Kind,
)
from crane.state.record import restore_graph, save_graph
from crane.state.usage import use_of

__all__ = ["pack_replies", "restore_checkpoint", "unpack_replies", "write_checkpoint"]


def pack_replies(replies: list[bytes]) -> bytes:
    """A REPLIES section: the answers to the guest's last batch that expected one."""
    return struct.pack("<I", len(replies)) + b"".join(
        struct.pack("<I", len(m)) + m for m in replies
    )


def write_checkpoint(
    dev: SessionDevice, log: CallLog, out: BinaryIO, identity: dict[str, Any]
) -> dict[str, int]:
    """Stream the session to ``out``; returns counts (bytes written, memory bytes, sections).

    ``identity`` is the daemon's record of the session (id, token, window, what the guest was
    told: crane.state.told); it goes into META as is."""
    dev.synchronize()
    w = CheckpointWriter(out)
    try:
        snap = dev.backend.snapshot
        w.json(
            Kind.META,
            {
                "format": "crane-checkpoint",
                "session": identity,
                "mem_needed": dev.mem_used(),
                # what the session uses: a restore refuses a device with less, whatever flag
                "use": use_of(dev).to_json(),
                "source": {"profile": snap.profile, "cc": list(snap.cc), "name": snap.name},
                "created": time.time(),
            },
        )
        graph = save_graph(dev, log)
        for digest in dict.fromkeys(m["digest"] for m in graph["modules"]):
            image = dev.image(bytes.fromhex(digest))
            if image is None:
                raise CheckpointError(f"module image {digest[:16]} vanished from the cache")
            w.section(Kind.IMAGE, bytes.fromhex(digest) + image)
        w.json(Kind.OBJECTS, graph)
        w.section(Kind.REPLIES, pack_replies(log.last_replies))
        for addr, size in dev.memory_regions():
            for off in range(0, size, MEMORY_CHUNK):
                n = min(MEMORY_CHUNK, size - off)
                # no copy: the writer consumes (or copies) a view before the next backend call
                w.memory(addr + off, dev.read(addr + off, n))
        w.finish()
    except BaseException:
        w.abort()
        raise
    dev.dirty.mark()
    return {"bytes": w.bytes_written, "memory_bytes": w.memory_bytes, "sections": w.sections}


def restore_checkpoint(
    dev: SessionDevice, log: CallLog, src: BinaryIO, name: str
) -> dict[str, Any]:
    """Replay a checkpoint onto a fresh session (same window); returns its META.

    Raises :class:`CheckpointError` for a damaged file and :class:`CudaError` for state this
    device cannot take (no code for its architecture, ...). Either way the session is left
    half-built: the caller discards the worker, so nothing leaks.
    """
    r = CheckpointReader(src, name)
    meta = r.expect(Kind.META).json()
    graph: dict[str, Any] | None = None
    # a file: read ahead of the checksums and device writes (a migration's stream is fed by
    # the worker's own loop, which must not be raced by a second reader)
    for s in r.sections(prefetch=isinstance(src, io.BufferedReader)):
        if s.kind == Kind.IMAGE:
            if graph is not None or len(s.payload) < 32:
                raise CheckpointError(f"{name}: misplaced or empty IMAGE section {s.index}")
            try:
                dev.store_image(bytes(s.payload[:32]), s.payload[32:])
            except CudaError:
                raise CheckpointError(
                    f"{name}: IMAGE section {s.index} does not match its digest"
                ) from None
        elif s.kind == Kind.OBJECTS:
            graph = s.json()
            try:
                restore_graph(dev, log, graph)
            except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
                # the graph is the file's word, not ours: a missing key or a value of the
                # wrong type is a damaged file, named as such (not an "internal error")
                raise CheckpointError(
                    f"{name}: OBJECTS section {s.index} is malformed: {type(e).__name__}: {e}"
                ) from None
        elif s.kind == Kind.REPLIES:
            log.last_replies = unpack_replies(s.payload, name)
        elif s.kind == Kind.MEMORY:
            if graph is None:
                raise CheckpointError(f"{name}: MEMORY section {s.index} before the object graph")
            addr, data = s.memory()
            try:
                dev.write(addr, data)  # pointer tables in it are learnt again
            except CudaError as e:
                raise CheckpointError(
                    f"{name}: MEMORY section {s.index} at {addr:#x}+{len(data):#x} is outside "
                    f"the recorded allocations: {e.message}"
                ) from None
        elif s.kind == Kind.END and graph is None:
            raise CheckpointError(f"{name}: no OBJECTS section")
        elif s.kind == Kind.META:
            raise CheckpointError(f"{name}: second META section {s.index}")
    dev.synchronize()
    dev.dirty.mark()
    return meta


def unpack_replies(payload: bytes, name: str) -> list[bytes]:
    """The answers a REPLIES section carries; :class:`CheckpointError` when malformed."""
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
