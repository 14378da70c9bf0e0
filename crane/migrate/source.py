"""The source worker's side of a live migration: pre-flight, pre-copy rounds, stop-and-copy.

Why in the worker: it owns the device memory, so rounds read memory where it lives and stream
it straight to the destination daemon (one gRPC stream), never through the source daemon. The
worker keeps executing the guest's batches during pre-copy: a round takes the batch lock only to
mark the dirty set and snapshot the allocation table, then reads memory without it. Anything the
guest writes meanwhile is in the next dirty set (its call marks it after our mark), so a torn
read is always re-sent.

Explicit phases: ``preflight → precopy (rounds) → stopping → done | failed``. The guest is
quiesced only in ``stopping`` (the batch lock is held from the last mark until the destination
acknowledges). Until that acknowledgement the source stays authoritative (invariant 6): any
failure releases the lock and the guest carries on here, with nothing lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from crane.migrate.preflight import check_code
from crane.state.checkpoint import MEMORY_CHUNK, CheckpointWriter, Kind
from crane.state.park import write_checkpoint
from crane.state.record import memory_regions, save_graph
from crane.v1 import peer_pb2, peer_pb2_grpc
from crane.wire.address import CHANNEL_OPTIONS, to_grpc_target
from crane.worker.session_state import WorkerSession

__all__ = ["MigrationFailed", "migrate_out", "structure"]

log = logging.getLogger("crane.worker")

#: Wire chunk of the transfer stream: large enough to amortize gRPC's per-message cost.
WIRE_CHUNK = 1 << 20
#: Fixed cost of a switchover beyond copying (graph, acknowledgement), for the estimate.
SWITCH_OVERHEAD_S = 0.02
Progress = Callable[[dict[str, Any]], None]


class MigrationFailed(Exception):
    """The migration cannot go on; the message says why (the session keeps running here)."""


def structure(graph: dict[str, Any]) -> dict[str, Any]:
    """The parts of a graph a final round cannot patch incrementally (everything but memory
    layout and counters): if these changed during pre-copy the final round is a full one."""
    skip = {"chunks", "allocations", "sticky", "done_seq", "calls"}
    return {k: v for k, v in graph.items() if k not in skip}


class _Sink:
    """A binary stream that cuts what the checkpoint writer writes into TransferChunks."""

    def __init__(self, out: queue.SimpleQueue, first: dict[str, Any]) -> None:
        self.out = out
        self.first = first  # fields of the stream's first chunk (identity), sent once
        self.buf = bytearray()
        self.round = 0
        self.fresh = False
        self.final = False
        self.sent = 0

    def begin(self, round_: int, fresh: bool, final: bool) -> None:
        self.round, self.fresh, self.final = round_, fresh, final

    def write(self, data: bytes | memoryview) -> int:
        self.buf += data
        if len(self.buf) >= WIRE_CHUNK:
            self._push(False)
        return len(data)

    def flush(self) -> None:
        pass

    def end(self) -> None:
        self._push(True)

    def _push(self, end: bool) -> None:
        chunk = peer_pb2.TransferChunk(
            round=self.round,
            fresh=self.fresh,
            final=self.final,
            end_of_round=end,
            data=bytes(self.buf),
            **self.first,
        )
        self.first = {}
        self.sent += len(self.buf)
        self.buf.clear()
        self.out.put(chunk)


def _read(ex: Any, addr: int, size: int) -> Iterator[tuple[int, bytes]]:
    for off in range(0, size, MEMORY_CHUNK):
        n = min(MEMORY_CHUNK, size - off)
        yield addr + off, bytes(ex.backend.memcpy_dtoh(addr + off, n, ex._default_stream))


def migrate_out(ws: WorkerSession, req: dict[str, Any], progress: Progress) -> None:
    """Run one migration to ``req["to"]``; raises :class:`MigrationFailed` (source intact)."""
    ex = ws.executor
    t0 = time.monotonic()
    st: dict[str, Any] = {
        "phase": "preflight",
        "round": 0,
        "bytes_sent": 0,
        "memory_bytes": 0,
        "session_bytes": 0,
        "dirty_bytes": 0,
        "rate": 0.0,
        "est_downtime": 0.0,
    }
    progress(st)
    ident = req["identity"]
    channel = grpc.insecure_channel(to_grpc_target(req["to"]), options=CHANNEL_OPTIONS)
    stub = peer_pb2_grpc.PeerStub(channel)
    requests: queue.SimpleQueue = queue.SimpleQueue()
    responses = None
    held = False
    try:
        with ws.lock:
            if ws.parked:
                raise MigrationFailed("the session is parked")
            graph0 = save_graph(ex)
            digests = list(dict.fromkeys(m["digest"] for m in graph0["modules"]))
            st["session_bytes"] = sum(n for _, n in memory_regions(ex))
            mem_needed = ex.mem_used()
        # ---- pre-flight: the destination's own rules, plus code checks for images it lacks
        try:
            pf = stub.Preflight(
                peer_pb2.PreflightRequest(
                    session_id=ident["id"],
                    slot=ident["slot"],
                    mem_needed=mem_needed,
                    told={int(k): int(v) for k, v in ident["told"].items()},
                    module_digests=[bytes.fromhex(d) for d in digests],
                    device=req.get("device", -1),
                ),
                timeout=30,
            )
        except grpc.RpcError as e:
            raise MigrationFailed(f"destination {req['to']} unreachable: {e.details()}") from None
        refusals = list(pf.refusals)
        missing = {bytes(d).hex() for d in pf.missing_digests}
        where = f"{req['to']} ({pf.profile})"
        for d in digests:
            if d in missing:
                refusals += check_code(
                    bytes.fromhex(d),
                    ex._image_bytes(bytes.fromhex(d), b""),
                    (pf.cc_major, pf.cc_minor),
                    where,
                )
        if refusals:
            raise MigrationFailed(f"{where} refused: " + "; ".join(refusals))
        # ---- the transfer stream
        first = {
            "session_id": ident["id"],
            "token": bytes.fromhex(ident["token"]),
            "identity_json": json.dumps(ident),
            "device": req.get("device", -1),
        }
        sink = _Sink(requests, first)
        responses = stub.Transfer(iter(requests.get, None))

        def ack(round_: int) -> peer_pb2.TransferAck:
            try:
                a = next(responses)
            except grpc.RpcError as e:
                raise MigrationFailed(
                    f"destination failed in round {round_}: {e.code().name}: {e.details()}"
                ) from None
            except StopIteration:
                raise MigrationFailed(f"destination ended the transfer in round {round_}") from None
            return a

        # round 0: the whole graph and all memory, guest running
        st["phase"] = "precopy"
        progress(st)
        with ws.lock:
            graph0 = save_graph(ex)
            replies0 = list(ex.last_replies)
            ex.dirty.mark()
            regions = memory_regions(ex)
            base_allocs = {a["addr"]: a["size"] for a in graph0["allocations"]}
        sink.begin(0, True, False)
        resend: set[int] = set()
        r0 = time.monotonic()
        w = CheckpointWriter(sink)
        w.json(Kind.META, {"format": "crane-checkpoint", "session": ident, "mode": "base"})
        for d in digests:
            if d in missing:
                w.section(Kind.IMAGE, bytes.fromhex(d) + ex._image_bytes(bytes.fromhex(d), b""))
        w.json(Kind.OBJECTS, graph0)
        w.section(
            Kind.REPLIES,
            struct.pack("<I", len(replies0))
            + b"".join(struct.pack("<I", len(m)) + m for m in replies0),
        )
        for addr, size in regions:
            try:
                for a, data in _read(ex, addr, size):
                    w.memory(a, data)
            except Exception:  # freed under us: the final round settles it
                resend.add(addr)
        w.finish()
        sink.end()
        ack(0)
        _account(st, sink, w.memory_bytes, time.monotonic() - r0)
        progress(st)
        # rounds 1..: what changed since the last mark, while the guest runs
        pending: set[int] = set()
        max_rounds = max(int(req.get("max_rounds") or 8), 1)
        stop_bytes = int(req.get("stop_bytes") or (4 << 20))
        round_ = 1
        while True:
            with ws.lock:
                dirty, _ = ex.dirty.mark()
                allocs_now = {a: n for a, (_, n) in ex.allocations.items()}
            pending |= dirty
            sendable = sorted(
                a for a in pending if a in allocs_now and base_allocs.get(a) == allocs_now[a]
            )
            st["dirty_bytes"] = sum(allocs_now[a] for a in sendable)
            st["est_downtime"] = SWITCH_OVERHEAD_S + st["dirty_bytes"] / max(st["rate"], 1.0)
            progress(st)
            if round_ >= max_rounds or st["dirty_bytes"] <= stop_bytes:
                break
            st["round"] = round_
            sink.begin(round_, False, False)
            r0 = time.monotonic()
            w = CheckpointWriter(sink)
            w.json(Kind.META, {"format": "crane-checkpoint", "mode": "delta", "round": round_})
            for addr in sendable:
                try:
                    for a, data in _read(ex, addr, allocs_now[addr]):
                        w.memory(a, data)
                except Exception:
                    resend.add(addr)
            w.finish()
            sink.end()
            ack(round_)
            pending -= set(sendable)
            _account(st, sink, w.memory_bytes, time.monotonic() - r0)
            round_ += 1
        # ---- stop-and-copy: quiesce at a batch boundary, held until the destination acks
        st["phase"] = "stopping"
        st["round"] = round_
        progress(st)
        ws.lock.acquire()
        held = True
        stop = time.monotonic()
        ex.backend.synchronize()
        dirty, _ = ex.dirty.mark()
        pending |= dirty | resend
        graph1 = save_graph(ex)
        fresh = structure(graph1) != structure(graph0)
        sink.begin(round_, fresh, True)
        if fresh:  # objects other than memory changed during pre-copy: rebuild, all memory
            log.info("object graph changed during pre-copy; final round carries everything")
            final_memory = write_checkpoint(ex, sink, ident)["memory_bytes"]  # type: ignore[arg-type]
        else:
            w = CheckpointWriter(sink)
            w.json(Kind.META, {"format": "crane-checkpoint", "mode": "final"})
            w.json(Kind.OBJECTS, graph1)
            w.section(
                Kind.REPLIES,
                struct.pack("<I", len(ex.last_replies))
                + b"".join(struct.pack("<I", len(m)) + m for m in ex.last_replies),
            )
            sizes = {a["addr"]: a["size"] for a in graph1["allocations"]}
            final = {a for a in pending if a in sizes}
            final |= {a for a, n in sizes.items() if base_allocs.get(a) != n}
            regions = [(a, sizes[a]) for a in sorted(final)]
            globals_ = [r for r in memory_regions(ex) if r[0] not in sizes]
            for addr, size in regions + globals_:
                for a, data in _read(ex, addr, size):
                    w.memory(a, data)
            w.finish()
            final_memory = w.memory_bytes
        sink.end()
        a = ack(round_)
        # the destination holds the session now: this worker must never run a call again
        ws.parked = True
        downtime = time.monotonic() - stop
        _account(st, sink, final_memory, downtime)
        st.update(phase="done", downtime=downtime, total=time.monotonic() - t0, done_seq=a.done_seq)
        progress(st)
        log.info(
            "migrated to %s: %d rounds, %d bytes, downtime %.1f ms, total %.2f s",
            req["to"],
            round_ + 1,
            st["bytes_sent"],
            downtime * 1e3,
            st["total"],
        )
    except MigrationFailed:
        _abort(stub, ident, responses)
        raise
    except Exception as e:
        _abort(stub, ident, responses)
        log.exception("migration to %s failed", req["to"])
        raise MigrationFailed(f"internal error: {e!r}") from None
    finally:
        requests.put(None)
        if held:
            ws.lock.release()
        channel.close()


def _account(st: dict[str, Any], sink: _Sink, memory: int, seconds: float) -> None:
    before = st["bytes_sent"]
    st["bytes_sent"] = sink.sent
    st["memory_bytes"] += memory
    if seconds > 0 and sink.sent > before:
        st["rate"] = (sink.sent - before) / seconds


def _abort(stub: peer_pb2_grpc.PeerStub, ident: dict[str, Any], responses: Any) -> None:
    """Best effort: end the stream and ask the destination to forget what it received."""
    if responses is not None:
        responses.cancel()
    with contextlib.suppress(grpc.RpcError):
        stub.Abort(
            peer_pb2.AbortRequest(session_id=ident["id"], token=bytes.fromhex(ident["token"])),
            timeout=5,
        )


def start(ws: WorkerSession, req: dict[str, Any], write_progress: Progress) -> threading.Thread:
    """Run :func:`migrate_out` on its own thread; the outcome goes to ``write_progress``."""

    def run() -> None:
        try:
            migrate_out(ws, req, write_progress)
        except MigrationFailed as e:
            log.warning("migration to %s failed: %s", req["to"], e)
            write_progress({"phase": "failed", "error": str(e)})

    t = threading.Thread(target=run, name="migrate-out", daemon=True)
    t.start()
    return t
