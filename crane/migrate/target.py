"""The destination worker's side of a live migration: apply each round as it streams in.

Rounds arrive over the worker channel as the checkpoint format (one stream per round). A fresh
round (round 0, or a final round after the object graph changed during pre-copy) is an ordinary
checkpoint, replayed with :func:`crane.state.park.restore_checkpoint` on this fresh worker. A
delta round carries memory only. The final round carries the final object graph, which differs
from the applied one only in memory layout (allocations and chunks created or freed while the
guest ran) and counters, so it is patched in place rather than replayed: that keeps the
switchover proportional to what changed, not to the session's size.

With a data plane (:mod:`crane.migrate.dataplane`) a round's memory arrives on its sockets
instead of in the stream: its chunks are applied once the stream's part of the round (its
object graph) is, and the round is answered only when all the chunks the source counted are.

From a source on this host (:mod:`crane.migrate.handover`) no memory arrives at all: pre-copy
rounds carry the graph only (built on this worker's own window), and the stopped round's
memory is a descriptor of the source's, mapped over the window once that round's graph is
applied, so nothing here writes a byte of the source's memory before the switchover.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from crane.api.results import CudaError
from crane.engine.codec import CallLog
from crane.engine.model import SessionDevice
from crane.migrate.dataplane import DataPlaneError, Incoming, Receiver, TlsPaths, is_zero
from crane.migrate.handover import HandoverError, Listener
from crane.migrate.stream import FrameReader
from crane.state.checkpoint import CheckpointError, CheckpointReader, Kind
from crane.state.park import restore_checkpoint, unpack_replies
from crane.state.record import restore_progress, restore_sticky, save_graph

__all__ = ["RoundApplier", "patch_graph"]

log = logging.getLogger("crane.worker")

#: Reads of at least this many bytes that lie in one wire message are applied from it in place.
_VIEW_MIN = 64 << 10


def patch_graph(dev: SessionDevice, log: CallLog, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Bring the memory layout from ``old`` to ``new``: frees, unmaps, maps, allocations."""
    old_a = {(a["addr"], a["size"]) for a in old["allocations"]}
    new_a = {(a["addr"], a["size"]): a for a in new["allocations"]}
    old_c = {(c["addr"], c["size"]) for c in old["chunks"]}
    new_c = {(c["addr"], c["size"]) for c in new["chunks"]}
    for addr, _ in sorted(old_a - set(new_a)):
        dev.mem_free(addr)
    for addr, _ in sorted(old_c - new_c):
        dev.mem_unmap_chunk(addr)
    for addr, size in sorted(new_c - old_c):
        dev.mem_map_chunk(addr, size)
    for key in sorted(set(new_a) - old_a):
        dev.mem_alloc(new_a[key]["ctx"], key[0], key[1])
    restore_sticky(dev, new["sticky"])
    restore_progress(log, new)


class RoundApplier:
    """Applies rounds on a thread while the worker's loop feeds it bytes from the channel."""

    def __init__(self, dev: SessionDevice, log: CallLog) -> None:
        self.dev = dev
        self.log = log
        self.graph: dict[str, Any] | None = None
        self.reader: FrameReader | None = None
        self._thread: threading.Thread | None = None
        self._result: dict[str, Any] = {}
        self._round = 0
        self.plane: Receiver | None = None
        self.handover: Listener | None = None
        self._write_lock = threading.Lock()  # data-plane chunks arrive on several threads

    def open_plane(self, token: bytes, bind: str, tls: TlsPaths | None) -> int:
        """Listen for the source's data connections (a fresh worker: once); the port."""
        if self.plane is None:
            self.plane = Receiver(self._write, token, bind, tls, into=self._write_from)
        return self.plane.port

    def open_handover(self, token: bytes, path: str) -> str:
        """Listen at ``path`` for a same-host source's memory descriptor (a fresh worker:
        once); the path."""
        if self.handover is None:
            self.handover = Listener(path, token)
        return self.handover.path

    def _write_from(self, addr: int, src: Incoming) -> None:
        """A raw data-plane chunk from its socket straight into device memory (the backend
        validates the range first; the simulator receives into its mapping, others stage it),
        checksummed where it landed; the dirty tracker then learns it like any round's bytes."""
        dev = self.dev
        dev.backend.memcpy_htod_staged(addr, src, dev.default_stream)
        assert src.filled is not None  # read_into raised otherwise
        with self._write_lock:
            dev.dirty.contents(addr, src.filled)

    def _write(self, addr: int, data: bytes | memoryview | None, n: int) -> None:
        """A data-plane chunk into device memory (None: zeros, written only where the range
        is not zero already, so a fresh worker's untouched memory stays uncommitted)."""
        if data is None:
            with self._write_lock:  # a read: the cuda backend's views are its staging buffers
                if is_zero(self.dev.read(addr, n)):
                    return
            data = bytes(n)
        self.dev.write_shared(addr, data, self._write_lock)

    def close(self) -> None:
        if self.plane is not None:
            self.plane.close()
            self.plane = None
        if self.handover is not None:
            self.handover.close()
            self.handover = None

    def begin(self, fresh: bool, round_: int) -> None:
        # a fresh round is replayed by the checkpoint restore, which keeps what it reads
        self.reader = FrameReader(None if fresh else _VIEW_MIN)
        self._result = {}
        self._round = round_
        self._thread = threading.Thread(
            target=self._run, args=(fresh, round_), name="migrate-in", daemon=True
        )
        self._thread.start()

    def feed(self, data: bytes) -> None:
        """Bytes of the round's stream; empty: its stream part ended (the data plane carries
        the rest), so the reader sees the end of its input now, not at the round's end."""
        if self.reader is not None:
            self.reader.q.put(data if data else None)

    def end(self, chunks: int = 0, handed_over: bool = False) -> dict[str, Any]:
        """Wait for the round to be applied (and its ``chunks`` data-plane chunks, or, when
        its memory was ``handed_over``, map that memory); its answer for the daemon (or an
        error)."""
        if self.reader is None or self._thread is None:
            return {"error": "no round in progress"}
        self.reader.q.put(None)
        self._thread.join()
        self.reader = None
        if chunks and "error" not in self._result:
            if self.plane is None:
                return {"error": f"round {self._round}: {chunks} chunks but no data plane"}
            try:
                self.plane.wait(self._round, chunks)
            except DataPlaneError as e:
                return {"error": f"round {self._round}: {e}"}
            self.dev.synchronize()
            self.dev.dirty.mark()  # as after a round from the stream
        if handed_over and "error" not in self._result:
            try:
                self._adopt()
            except HandoverError as e:
                return {"error": f"round {self._round}: {e}"}
            except CudaError as e:  # not a window of ours (size, seals), or not mappable
                return {"error": f"round {self._round}: memory handed over refused: {e.message}"}
        return self._result

    def _adopt(self) -> None:
        """Map the source's memory over the window, now that the round's graph is applied
        on this worker's own (its allocations, module variables' initial values)."""
        if self.handover is None:
            raise HandoverError("the memory was handed over but no hand-over socket is open")
        fd, in_use = self.handover.take(self._round)
        t = time.perf_counter()
        self.dev.adopt_memory(fd)  # the descriptor is the backend's now, refused or not
        self.dev.synchronize()
        self.dev.dirty.mark()
        log.info(
            "round %d: mapped the memory the source handed over (%d bytes in use, none "
            "copied) in %.1f ms",
            self._round,
            in_use,
            (time.perf_counter() - t) * 1e3,
        )

    def _run(self, fresh: bool, round_: int) -> None:
        name = f"migration round {round_}"
        try:
            if fresh:
                restore_checkpoint(self.dev, self.log, self.reader, name)  # type: ignore[arg-type]
                self.graph = save_graph(self.dev, self.log)
            else:
                self._apply(name)
            if self.plane is not None:
                self.plane.open_round(round_)  # its memory may land now
            self._result = {"done_seq": self.log.done_seq}
        except CheckpointError as e:
            self._result = {"error": str(e)}
        except Exception as e:  # CudaError and bugs alike: the round is refused, not fatal
            msg = getattr(e, "message", None) or repr(e)
            code = getattr(getattr(e, "code", None), "name", "")
            self._result = {"error": f"{code + ': ' if code else ''}{msg}"}
        finally:
            if self.reader is not None:
                self.reader.drain()  # so the feeder never blocks on us

    def _apply(self, name: str) -> None:
        if self.graph is None:
            raise CheckpointError(f"{name}: no base round was applied")
        dev = self.dev
        r = CheckpointReader(self.reader, name)  # type: ignore[arg-type]
        r.expect(Kind.META)
        for s in r.sections():
            if s.kind == Kind.MEMORY:
                addr, data = s.memory()  # a stored chunk: a view of its wire message
                dev.write(addr, data)  # pointer tables in it are learnt again
            elif s.kind == Kind.OBJECTS:
                try:
                    graph = json.loads(bytes(s.payload))
                except ValueError as e:
                    msg = f"{name}: OBJECTS section is not valid JSON: {e}"
                    raise CheckpointError(msg) from None
                patch_graph(dev, self.log, self.graph, graph)
                self.graph = graph
            elif s.kind == Kind.REPLIES:
                self.log.last_replies = unpack_replies(bytes(s.payload), name)
        dev.synchronize()
        dev.dirty.mark()
