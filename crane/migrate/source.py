"""The source worker's side of a live migration: pre-flight, pre-copy rounds, stop-and-copy.

Why in the worker: it owns the device memory, so rounds read memory where it lives and stream
it straight to the destination daemon (one gRPC stream), never through the source daemon. The
worker keeps executing the guest's batches during pre-copy: a round takes the batch lock to mark
the dirty set and snapshot the allocation table, and again for each chunk it reads (a copy of
at most :data:`~crane.migrate.stream.READ_CHUNK` bytes, so a chunk is never torn by a batch and
the guest waits at most one chunk). Anything the guest writes after a chunk was read is in the
next dirty set (its call marks it after our mark), so it is re-sent.

Explicit phases (:mod:`crane.migrate.phases`): ``preflight → precopy (rounds) → stopping →
done | failed``. The guest is quiesced only in ``stopping`` (the batch lock is held from the
last mark until the destination acknowledges). Until that acknowledgement the source stays
authoritative (invariant 6): any failure releases the lock and the guest carries on here, with
nothing lost. No wait on the destination is unbounded: the pre-flight has a deadline, and the
transfer's waits (room in the outbox, an acknowledgement) a deadline on the destination's
progress (:mod:`crane.migrate.deadline`), ``req.peer_timeout_s`` (``crane migrate --timeout``).

Memory moves on the data plane (:mod:`crane.migrate.dataplane`: parallel sockets straight to
the destination worker, opened with a token the destination hands over this stream) whenever
the destination offers one; otherwise, or with ``$CRANE_MIGRATE_STREAMS`` = 0, inside the stream
as checkpoint sections. A round then is its stream part (graph, replies: everything but memory,
ended by the checkpoint's END section), its memory chunks on the sockets, and a last stream
message counting them. To a destination on this host (:mod:`crane.migrate.handover`: same
kernel boot id, and its hand-over socket answers with the token) memory is not copied at all:
pre-copy carries the graph only, and the stopped round passes the backend's memory descriptor
(``Backend.memory_handle``) for the destination to map; ``$CRANE_MIGRATE_HANDOVER`` = 0 forces
the data plane. Once the destination acknowledged, this worker releases none of that memory.

Rounds: ``max_rounds`` counts them all, the stopped one included, so 1 is a true stop-and-copy
(nothing moves while the guest runs; the stopped round carries the whole session). Otherwise
round 0 copies everything while the guest runs, and rounds 1.. copy what changed until the dirty
set is small (``stop_bytes``), stops shrinking (a write set the guest rewrites every step: more
rounds only resend it), or the rounds run out; then the guest stops for the final round.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import select
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from crane.engine.model import SessionDevice
from crane.host.messages import MigrateRequest
from crane.migrate import handover as ho
from crane.migrate.dataplane import CHUNK, STREAMS, DataPlaneError, Sender, TlsPaths
from crane.migrate.deadline import Stall
from crane.migrate.phases import Phase, advance
from crane.migrate.stream import READ_CHUNK, Outbox, StreamClosed, WireSink
from crane.state.checkpoint import CheckpointWriter, Kind
from crane.state.park import pack_replies
from crane.state.preflight import Use, check_code
from crane.state.record import save_graph
from crane.state.session_record import SessionRecord
from crane.state.usage import use_of
from crane.v1 import peer_pb2, peer_pb2_grpc
from crane.wire.channel import TlsFiles, open_channel
from crane.wire.fingerprint import fingerprint
from crane.worker.attach import TooLate, WorkerSession, WorkerState

__all__ = [
    "ABORT",
    "COMMIT",
    "STOP",
    "Decisions",
    "MigrationFailed",
    "Phase",
    "migrate_out",
    "preflight",
    "start",
    "structure",
]

log = logging.getLogger("crane.worker")

#: A final round with at most this much memory sends it in the stream, not the data plane.
FINAL_IN_STREAM = 8 << 20
#: Environment: parallel data-plane sockets (0: memory travels in the Transfer stream).
STREAMS_ENV = "CRANE_MIGRATE_STREAMS"
#: Rounds in all (the stopped one included) when the request names none.
DEFAULT_ROUNDS = 8
#: Pre-copy stops once a round's dirty set is no more than this fraction of the previous one's
#: less: the guest rewrites it as fast as it is sent, so another round would only resend it.
CONVERGENCE = 0.8
#: A final round stores memory raw without sampling it when the last pre-copy round came out
#: at least this large relative to its memory (the guest's write set does not compress).
INCOMPRESSIBLE = 0.9
#: Fixed cost of a switchover beyond copying (graph, acknowledgement), for the estimate.
SWITCH_OVERHEAD_S = 0.02
#: Longest wait for the destination's answer to an abort before it is retried on a thread.
ABORT_WAIT_S = 1.0
#: How long, and how often, an unanswered abort is retried.
ABORT_RETRY_S = 600.0
ABORT_RETRY_EVERY_S = 1.0
#: How long a held migration waits for its Stop / Commit when the request names no limit.
HOLD_TIMEOUT_S = 120.0
Progress = Callable[[dict[str, Any]], None]


class MigrationFailed(Exception):
    """The migration cannot go on; the message says why (the session keeps running here)."""


def structure(graph: dict[str, Any]) -> dict[str, Any]:
    """The parts of a graph a final round cannot patch incrementally (everything but memory
    layout and counters): if these changed during pre-copy the final round is a full one."""
    skip = {"chunks", "allocations", "sticky", "done_seq", "calls"}
    return {k: v for k, v in graph.items() if k not in skip}


def preflight(
    stub: peer_pb2_grpc.PeerStub,
    to: str,
    ident: SessionRecord,
    digests: list[str],
    mem_needed: int,
    device: int,
    image_of: Callable[[str], bytes | None],
    timeout_s: float = 30.0,
    use: Use | None = None,
    accept_lower: bool = False,
) -> set[str]:
    """Ask the destination whether it can take the session (its own rules: window, memory,
    the limits the guest was told, code in the images it holds), and check the images it
    lacks here against its architecture. Raises :class:`MigrationFailed` with every reason;
    returns the digests (hex) of the images the destination holds already."""
    try:
        pf = stub.Preflight(
            peer_pb2.PreflightRequest(
                session_id=ident.id,
                slot=ident.slot,
                mem_needed=mem_needed,
                told=ident.told,
                module_digests=[bytes.fromhex(d) for d in digests],
                device=device,
                fingerprint=fingerprint(),
                use_json=json.dumps(use.to_json()) if use is not None else "",
                accept_lower_limits=accept_lower,
            ),
            timeout=timeout_s,
        )
    except grpc.RpcError as e:
        if e.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            raise MigrationFailed(f"destination {to} refused this daemon: {e.details()}") from None
        if e.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
            raise MigrationFailed(
                f"destination {to} unresponsive: no answer to the pre-flight within {timeout_s:g} s"
            ) from None
        raise MigrationFailed(f"destination {to} unreachable: {e.details()}") from None
    refusals = list(pf.refusals)
    missing = {bytes(d).hex() for d in pf.missing_digests}
    where = f"{to} ({pf.profile})"
    for d in digests:
        if d in missing:
            image = image_of(d)
            if image is None:
                raise MigrationFailed(f"module image {d[:16]} vanished from the cache")
            refusals += check_code(bytes.fromhex(d), image, (pf.cc_major, pf.cc_minor), where)
    if refusals:
        raise MigrationFailed(f"{where} refused: " + "; ".join(refusals))
    return set(digests) - missing


def _chunks(addr: int, size: int, step: int = READ_CHUNK) -> Iterator[tuple[int, int]]:
    for off in range(0, size, step):
        yield addr + off, min(step, size - off)


def _streams() -> int:
    try:
        return max(int(os.environ.get(STREAMS_ENV, STREAMS)), 0)
    except ValueError:
        return STREAMS


def handover_refusal(dev: SessionDevice, streams: int) -> str:
    """Why this migration will not even try to hand the memory over ("" when it will)."""
    if not streams:
        return f"memory goes in the stream ({STREAMS_ENV}=0)"
    if os.environ.get(ho.ENV, "1") == "0":
        return f"{ho.ENV}=0 forces the data plane"
    if dev.memory_handle() is None:
        return "this backend's memory cannot be handed over"
    return ""


def data_host(to: str) -> str:
    """Where the destination's data plane listens: the host of a tcp:// address, loopback for
    a unix one (a daemon on this host)."""
    if not to.startswith("tcp://"):
        return "127.0.0.1"
    hostport = to[len("tcp://") :]
    host = hostport.rsplit(":", 1)[0] if ":" in hostport else hostport
    return host.strip("[]")


def migrate_out(ws: WorkerSession, req: MigrateRequest, progress: Progress) -> None:
    """Run one migration to ``req.to``; raises :class:`MigrationFailed` (source intact)."""
    dev, calls = ws.engine.device, ws.engine.log
    t0 = time.monotonic()
    _ABORTS.begin()  # an earlier attempt's abort retries stop here
    st: dict[str, Any] = {
        "phase": Phase.PREFLIGHT.value,
        "round": 0,
        "bytes_sent": 0,
        "memory_bytes": 0,
        "session_bytes": 0,
        "dirty_bytes": 0,
        "rate": 0.0,
        "est_downtime": 0.0,
    }
    progress(st)
    decisions = Decisions(req.decide)
    ident = req.identity
    phase = Phase.PREFLIGHT

    def enter(to: Phase) -> None:
        nonlocal phase
        phase = advance(phase, to)
        st["phase"] = phase.value

    # a tcp:// destination: mutual TLS with the source daemon's own certificate; a unix one (a
    # daemon on this host): this worker's credential from its ident socket
    tls = TlsFiles(req.tls_cert, req.tls_key, req.tls_ca) if req.tls_cert else None
    channel = open_channel(req.to, tls)
    stub = peer_pb2_grpc.PeerStub(channel)
    stall = Stall(req.to, req.peer_timeout_s)
    outbox = Outbox(stall=stall)
    responses = None
    held = False
    streams = _streams()
    plane: Sender | None = None
    link: ho.Link | None = None  # the destination worker's hand-over socket, authenticated
    no_handover = handover_refusal(dev, streams)
    if no_handover and streams:
        log.info("memory will not be handed over to %s: %s", req.to, no_handover)
    try:
        with ws.boundary(req.boundary_wait_s, "migration"):
            if ws.parked:
                raise MigrationFailed(f"session {ws.session_id} is parked")
            graph0: dict[str, Any] | None = save_graph(dev, calls)
            digests = list(dict.fromkeys(m["digest"] for m in graph0["modules"]))
            st["session_bytes"] = sum(n for _, n in dev.memory_regions())
            mem_needed = dev.mem_used()
            use = use_of(dev)
        # ---- pre-flight: the destination's own rules, plus code checks for images it lacks
        has_image = preflight(
            stub,
            req.to,
            ident,
            digests,
            mem_needed,
            req.device,
            lambda d: dev.image(bytes.fromhex(d)),
            stall.limit_s,
            use,
            req.accept_lower_limits,
        )
        # ---- the transfer stream: messages framed by the sink, sent as they are
        first = {
            "session_id": ident.id,
            "token": ident.token,
            "identity_json": json.dumps(ident.to_json()),
            "device": req.device,
            "accept_lower_limits": req.accept_lower_limits,
            "hold": req.hold,
            "hold_timeout_s": req.hold_timeout_s,
            "data_streams": streams,
            "handover": not no_handover,
        }
        sink = WireSink(outbox, first)
        transfer = channel.stream_stream(
            "/crane.v1.Peer/Transfer",
            request_serializer=None,
            response_deserializer=peer_pb2.TransferAck.FromString,
        )
        responses = transfer(iter(outbox))
        responses.add_done_callback(lambda _call: outbox.closed.set())

        def cancel() -> None:
            responses.cancel()
            if plane is not None:
                plane.close()  # wakes senders blocked on a destination that reads nothing

        stall.cancel = cancel

        def connect_handover(offer: peer_pb2.TransferAck) -> ho.Link | None:
            """The destination worker's hand-over socket, if it is on this host and answers
            with the token; None (the reason logged) otherwise: memory is copied."""
            why = offer.handover_refusal or ho.refusal(
                offer.handover_path, offer.boot_id, ho.boot_id()
            )
            if not why:
                try:
                    got = ho.Link(
                        offer.handover_path, offer.data_token, min(stall.limit_s, ho.HANDSHAKE_S)
                    )
                except (OSError, ho.HandoverError) as e:
                    why = f"its hand-over socket {offer.handover_path} cannot be used: {e}"
                else:
                    log.info(
                        "memory will be handed over to %s (same host, %s): pre-copy carries "
                        "none of it",
                        req.to,
                        offer.handover_path,
                    )
                    return got
            log.warning("memory cannot be handed over to %s: %s; it is copied", req.to, why)
            return None

        def take_offer(round_: int) -> None:
            """A fresh round started a new worker there: connect to its hand-over socket or,
            failing that, its data plane (or go on without either, said in the log)."""
            nonlocal plane, link
            if not streams:
                return
            if plane is not None:
                plane.close()
                plane = None
            if link is not None:
                link.close()
                link = None
            stall.step = f"waiting for the data-plane offer of round {round_}"
            offer = ack(round_)
            if not offer.offer:
                raise MigrationFailed(f"destination answered round {round_} without its offer")
            if not no_handover:
                link = connect_handover(offer)
                if link is not None:
                    return
            if not offer.data_port:
                log.warning(
                    "no data plane to %s: %s; memory goes in the stream",
                    req.to,
                    offer.data_refusal or "not offered",
                )
                return
            tls_paths = TlsPaths(req.tls_cert, req.tls_key, req.tls_ca) if offer.data_tls else None
            host = data_host(req.to)
            try:
                plane = Sender(host, offer.data_port, offer.data_token, streams, tls_paths)
            except (OSError, DataPlaneError, ssl.SSLError) as e:
                log.warning(
                    "data plane to %s:%d unusable (%s); memory goes in the stream",
                    host,
                    offer.data_port,
                    e,
                )
                return
            plane.on_sent = stall.touch
            log.info(
                "data plane to %s:%d: %d streams%s",
                host,
                offer.data_port,
                streams,
                ", TLS" if tls_paths else "",
            )

        def hand_over(w: CheckpointWriter) -> None:
            """End the stopped round with the memory handed over: its descriptor on the
            hand-over socket (received there before the round ends on the stream)."""
            assert link is not None
            fd = dev.memory_handle()
            if fd is None:
                raise MigrationFailed("the backend no longer has a memory descriptor")
            in_use = sum(n for _, n in dev.memory_regions())
            stall.step = f"handing the memory over in the final round {sink.round}"
            w.finish()
            sink.push()  # the graph goes first: the destination applies it meanwhile
            with stall.waiting():
                link.send(sink.round, fd, in_use, stall.limit_s)
            sink.end(handed_over=True)
            st["handed_over_bytes"] = in_use
            log.info(
                "round %d: memory handed over to %s (%d bytes in use, none on the wire)",
                sink.round,
                req.to,
                in_use,
            )

        def end_round(
            w: CheckpointWriter, memory: Callable[[], None], via_plane: bool = True
        ) -> None:
            """Send a round's memory and end it: on the data plane after the stream's part
            (the destination applies memory once the graph is), else in the stream."""
            moved["round_raw"] = 0
            if plane is None or not via_plane:
                memory()
                w.finish()
                sink.end()
                return
            w.finish()
            sink.push(data_follows=True)
            raw0, wire0 = plane.stats.raw, plane.stats.wire
            timing0 = dataclasses.replace(plane.stats.timing)
            stall.step = f"sending round {sink.round}'s memory on the data plane"
            t = time.monotonic()
            try:
                with stall.waiting():  # each chunk sent is progress (Sender.on_sent)
                    memory()
                    n = plane.flush()
            except DataPlaneError:
                # a connection failed: most likely the destination dropped it over a bad chunk.
                # Close them all and end the round with a count it cannot meet, so its refusal
                # (which names the cause) is what the failure reports.
                plane.close()
                sink.end(plane.round_chunks + 1)
                ack(sink.round)
                raise
            moved["round_raw"] = plane.stats.raw - raw0
            moved["wire"] += plane.stats.wire - wire0
            sink.end(n)
            spent = dataclasses.replace(plane.stats.timing)
            for k in ("read", "encode", "send"):
                setattr(spent, k, getattr(spent, k) - getattr(timing0, k))
            log.info(
                "data plane: %d chunks, %d bytes of memory as %d on the wire in %.1f ms; "
                "threads: %s",
                n,
                moved["round_raw"],
                plane.stats.wire - wire0,
                (time.monotonic() - t) * 1e3,
                spent.ms(),
            )

        moved = {"wire": 0, "round_raw": 0}  # what the data plane carried

        def account(w: CheckpointWriter, seconds: float) -> None:
            _account(st, sink.sent + moved["wire"], w.memory_bytes + moved["round_raw"], seconds)
            moved["round_raw"] = 0

        def ack(round_: int) -> peer_pb2.TransferAck:
            stall.step = (
                f"waiting for the acknowledgement of the final round {round_} (switchover)"
                if phase in (Phase.STOPPING, Phase.HELD)
                else f"waiting for the acknowledgement of round {round_} (pre-copy)"
            )
            try:
                with stall.waiting():
                    a = next(responses)
                stall.touch()
            except grpc.RpcError as e:
                if stall.reason:
                    raise MigrationFailed(stall.reason) from None
                raise MigrationFailed(
                    f"destination failed in round {round_}: {e.code().name}: {e.details()}"
                ) from None
            except StopIteration:
                if stall.reason:
                    raise MigrationFailed(stall.reason) from None
                raise MigrationFailed(f"destination ended the transfer in round {round_}") from None
            return a

        def base(w: CheckpointWriter, graph: dict[str, Any], replies: list[bytes]) -> None:
            """What a fresh round carries before memory: identity, missing images, graph."""
            meta = {"format": "crane-checkpoint", "session": ident.to_json(), "mode": "base"}
            w.json(Kind.META, meta)
            for d in dict.fromkeys(m["digest"] for m in graph["modules"]):
                if d not in has_image:
                    image = dev.image(bytes.fromhex(d))
                    if image is None:
                        raise MigrationFailed(f"module image {d[:16]} vanished from the cache")
                    w.section(Kind.IMAGE, bytes.fromhex(d) + image)
                    has_image.add(d)  # the destination's worker keeps it in its cache
            w.json(Kind.OBJECTS, graph)
            w.section(Kind.REPLIES, pack_replies(replies))

        def read_running(region: int, a: int, n: int, _round: int) -> bytes | None:
            """A chunk's bytes while the guest runs: a copy taken under the batch lock (the
            checksum must be of the bytes sent); None if freed under us (resent at the end)."""
            with ws.boundary(req.boundary_wait_s, "migration"):
                try:
                    data = bytes(dev.read(a, n))
                except Exception:  # freed under us: the final round settles it
                    resend.add(region)
                    return None
                dev.dirty.contents(a, data)  # tables kernels wrote (crane.engine.dirty)
            return data

        def read_stopped(a: int, n: int, _round: int) -> bytes | memoryview:
            """A chunk's bytes with the guest stopped: the backend's view where it stays valid
            while other threads read (the simulator's mapping), else a copy."""
            with read_lock:
                data = dev.read(a, n)
                return data if dev.stable_views else bytes(data)

        read_lock = threading.Lock()

        def send_running(
            w: CheckpointWriter, regions: list[tuple[int, int]], resend: set[int], round_: int
        ) -> None:
            """Memory while the guest runs: each chunk copied under the batch lock."""
            if plane is not None:
                for addr, size in regions:
                    read = functools.partial(read_running, addr)
                    for a, n in _chunks(addr, size, CHUNK):
                        plane.send(round_, a, n, 1, read)
                return
            for addr, size in regions:
                for a, n in _chunks(addr, size):
                    with ws.boundary(req.boundary_wait_s, "migration"):
                        try:
                            data = bytes(dev.read(a, n))
                        except Exception:  # freed under us: the final round settles it
                            resend.add(addr)
                            break
                        dev.dirty.contents(a, data)  # tables kernels wrote (crane.engine.dirty)
                    w.memory(a, data)

        max_rounds = max(int(req.max_rounds or DEFAULT_ROUNDS), 1)
        stop_bytes = int(req.stop_bytes or (4 << 20))
        pending: set[int] = set()
        resend: set[int] = set()
        base_allocs: dict[int, int] = {}
        round_ = 0
        packed = 0.0  # compressed / raw size of the last pre-copy round (0: none yet)
        if max_rounds == 1:
            graph0 = None  # a true stop-and-copy: nothing moves before the stop
        else:
            # round 0: the whole graph and all memory, guest running
            enter(Phase.PRECOPY)
            progress(st)
            with ws.boundary(req.boundary_wait_s, "migration"):
                graph0 = save_graph(dev, calls)
                replies0 = list(calls.last_replies)
                dev.dirty.mark()
                regions = dev.memory_regions()
                base_allocs = {a["addr"]: a["size"] for a in graph0["allocations"]}
            sink.begin(0, True, False)
            stall.step = "sending round 0 (pre-copy)"
            r0 = time.monotonic()
            w = CheckpointWriter(sink)  # type: ignore[arg-type]
            base(w, graph0, replies0)
            sink.push()
            take_offer(0)
            if link is not None:  # the stopped round hands the memory over: none moves now
                end_round(w, lambda: None, via_plane=False)
                log.info("round 0 to %s: the object graph only (%d bytes)", req.to, sink.sent)
            else:
                end_round(w, functools.partial(send_running, w, regions, resend, 0))
            ack(0)
            packed = _packed(w, packed)
            account(w, time.monotonic() - r0)
            progress(st)
            # rounds 1..: what changed since the last mark, while the guest runs
            round_ = 1
            last_dirty: int | None = None
            if link is not None and decisions.poll(0) == ABORT:
                raise MigrationFailed("aborted by the operator during pre-copy")
            while link is None:  # delta rounds copy what changed; a hand-over needs none
                with ws.boundary(req.boundary_wait_s, "migration"):
                    dirty, _ = dev.dirty.mark()
                    allocs_now = {a: n for a, (_, n) in dev.allocations.items()}
                pending |= dirty
                sendable = sorted(
                    a for a in pending if a in allocs_now and base_allocs.get(a) == allocs_now[a]
                )
                st["dirty_bytes"] = sum(allocs_now[a] for a in sendable)
                st["est_downtime"] = SWITCH_OVERHEAD_S + st["dirty_bytes"] / max(st["rate"], 1.0)
                progress(st)
                if decisions.poll(0) == ABORT:
                    raise MigrationFailed("aborted by the operator during pre-copy")
                if (
                    STOP in decisions.seen
                    or round_ >= max_rounds - 1
                    or st["dirty_bytes"] <= stop_bytes
                    or (last_dirty is not None and st["dirty_bytes"] > CONVERGENCE * last_dirty)
                ):
                    break
                last_dirty = st["dirty_bytes"]
                st["round"] = round_
                sink.begin(round_, False, False)
                stall.step = f"sending round {round_} (pre-copy)"
                r0 = time.monotonic()
                w = CheckpointWriter(sink)  # type: ignore[arg-type]
                w.json(Kind.META, {"format": "crane-checkpoint", "mode": "delta", "round": round_})
                regions = [(a, allocs_now[a]) for a in sendable]
                end_round(w, functools.partial(send_running, w, regions, resend, round_))
                ack(round_)
                packed = _packed(w, packed)
                pending -= set(sendable)
                account(w, time.monotonic() - r0)
                round_ += 1
        if req.gate:  # the caller picks the moment to stop (a VM's own switchover)
            _await(decisions, st, progress, req.hold_timeout_s, STOP, "Stop before the final round")
        # ---- stop-and-copy: quiesce at a batch boundary, held until the destination acks
        enter(Phase.STOPPING)
        st["round"] = round_
        progress(st)
        ws.acquire_by(time.monotonic() + req.boundary_wait_s, "migration")
        held = True
        stop = time.monotonic()
        dev.synchronize()
        dirty, _ = dev.dirty.mark()
        pending |= dirty | resend
        graph1 = save_graph(dev, calls)
        fresh = graph0 is None or structure(graph1) != structure(graph0)
        sink.begin(round_, fresh, True)
        stall.step = f"sending the final round {round_} (switchover; the guest is stopped)"
        waited = outbox.waited
        # what changed did not compress while the guest ran: do not even sample it now
        level = None if packed > INCOMPRESSIBLE else 1
        w = CheckpointWriter(sink, level=level)  # type: ignore[arg-type]
        if fresh:  # nothing pre-copied, or objects other than memory changed: everything
            if graph0 is not None:
                log.info("object graph changed during pre-copy; final round carries everything")
            base(w, graph1, calls.last_replies)
            sink.push()
            take_offer(round_)  # a fresh round: a new worker there, a new data plane
            regions = dev.memory_regions()
        else:
            w.json(Kind.META, {"format": "crane-checkpoint", "mode": "final"})
            w.json(Kind.OBJECTS, graph1)
            w.section(Kind.REPLIES, pack_replies(calls.last_replies))
            sizes = {a["addr"]: a["size"] for a in graph1["allocations"]}
            final = {a for a in pending if a in sizes}
            final |= {a for a, n in sizes.items() if base_allocs.get(a) != n}
            regions = [(a, sizes[a]) for a in sorted(final)]
            regions += [r for r in dev.memory_regions() if r[0] not in sizes]  # module variables
        if link is not None:
            regions = []  # the memory itself changes hands, not a byte of it is copied
        st["dirty_bytes"] = sum(n for _, n in regions)
        # a small final round goes in the stream: the data plane's hand-off (the stream's part
        # applied, then the chunks, then the count) costs more than it saves on a few MiB
        via_plane = plane is not None and (fresh or st["dirty_bytes"] > FINAL_IN_STREAM)

        def send_stopped() -> None:
            for addr, size in regions:
                if via_plane:
                    assert plane is not None
                    for a, n in _chunks(addr, size, CHUNK):
                        plane.send(round_, a, n, level, read_stopped)
                    continue
                for a, n in _chunks(addr, size):
                    w.memory(a, dev.read(a, n))  # stopped: no snapshot

        if link is not None:
            hand_over(w)
        else:
            end_round(w, send_stopped, via_plane)
        sent = time.monotonic()
        a = ack(round_)
        acked = time.monotonic()
        switchover = acked - stop
        account(w, switchover)
        if req.hold:  # two-phase: frozen here, ready there, until Commit or Abort
            enter(Phase.HELD)
            st.update(switchover=switchover, done_seq=a.done_seq)
            _await(decisions, st, progress, req.hold_timeout_s, COMMIT, "Commit or Abort")
            stall.step = "waiting for the destination to acknowledge the commit"
            outbox.put(peer_pb2.TransferChunk(round=round_, commit=True).SerializeToString())
            a = ack(round_)
            acked = time.monotonic()
        # the destination holds the session now: this worker must never run a call again,
        # nor release a page of memory it handed over (the destination's now)
        if link is not None:
            dev.disown_memory()
        ws.move(WorkerState.PARKED)
        st.update(
            phase=advance(phase, Phase.DONE).value,
            # the source daemon extends both to when it can redirect the guest
            downtime=acked - stop,
            switchover=switchover,
            total=acked - t0,
            stopped_at=stop,
            started_at=t0,
            done_seq=a.done_seq,
        )
        progress(st)
        log.info(
            "migrated to %s: %d rounds, %d bytes%s; stopped %.1f ms (final round: %d bytes "
            "captured in %.1f ms, %.1f ms of it waiting for the stream; applied and acknowledged "
            "%.1f ms later), total %.2f s",
            req.to,
            round_ + 1,
            st["bytes_sent"],
            f", memory handed over ({st['handed_over_bytes']} bytes, none copied)"
            if link is not None
            else "",
            switchover * 1e3,
            w.bytes_written,
            (sent - stop) * 1e3,
            (outbox.waited - waited) * 1e3,
            (acked - sent) * 1e3,
            st["total"],
        )
    except MigrationFailed:
        _abort(req.to, tls, ident, responses, stall.limit_s)
        raise
    except TooLate as e:  # the guest's call in progress never returned: it carries on here
        _abort(req.to, tls, ident, responses, stall.limit_s)
        raise MigrationFailed(f"{e}; the session stays here as it was") from None
    except ho.HandoverError as e:  # the descriptor did not reach the destination
        _abort(req.to, tls, ident, responses, stall.limit_s)
        if stall.reason:
            raise MigrationFailed(stall.reason) from None
        raise MigrationFailed(f"hand-over to {req.to} failed in round {st['round']}: {e}") from None
    except DataPlaneError as e:  # a socket failed: the destination dropped it, or refused
        _abort(req.to, tls, ident, responses, stall.limit_s)
        if stall.reason:
            raise MigrationFailed(stall.reason) from None
        raise MigrationFailed(
            f"data plane to {req.to} failed in round {st['round']}: {e}"
        ) from None
    except StreamClosed:  # the call ended under us: say why it did
        _abort(req.to, tls, ident, responses, stall.limit_s)
        if stall.reason:
            raise MigrationFailed(stall.reason) from None
        why = _why(responses)
        raise MigrationFailed(f"destination failed in round {st['round']}: {why}") from None
    except Exception as e:
        _abort(req.to, tls, ident, responses, stall.limit_s)
        log.exception("migration to %s failed", req.to)
        raise MigrationFailed(f"internal error: {e!r}") from None
    finally:
        if plane is not None:
            plane.close()
        if link is not None:
            link.close()
        stall.close()
        decisions.close()
        outbox.end()
        if held:
            ws.lock.release()
        if stall.reason:
            # closing waits until the cancelled call's frames are out, which a destination
            # that reads nothing may never allow: the session carries on meanwhile
            threading.Thread(target=channel.close, name="migrate-close", daemon=True).start()
        else:
            channel.close()


#: What the source daemon writes to a held migration's decision FIFO (crane migrate's Stop,
#: Commit and Abort RPCs), one byte each.
STOP, COMMIT, ABORT = "s", "c", "a"


class Decisions:
    """The read end of the FIFO a held migration's decisions arrive on (see
    :mod:`crane.migrate.daemon_side`); without one (no hold) nothing ever arrives. Why a FIFO:
    the worker's channel belongs to the relay while the guest runs, and a decision is on the
    guest's clock (a poll interval would add to the pause it sees)."""

    def __init__(self, path: str) -> None:
        self.fd = -1
        self.seen: set[str] = set()
        if path:
            try:
                self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as e:
                log.warning("no decision FIFO at %s: %s", path, e)

    def poll(self, timeout: float) -> str | None:
        """Wait up to ``timeout`` for decisions; the most decisive one seen so far (abort
        first), or None."""
        if self.fd >= 0 and select.select([self.fd], [], [], max(timeout, 0.0))[0]:
            try:
                got = os.read(self.fd, 64)
            except BlockingIOError:
                got = b"?"
            if not got:  # the daemon's end closed (it went away): no decision will come
                self.close()
            self.seen |= set(got.decode("ascii", "replace"))
        elif self.fd < 0 and timeout > 0:
            time.sleep(timeout)
        for d in (ABORT, COMMIT, STOP):
            if d in self.seen:
                return d
        return None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _await(
    decisions: Decisions,
    st: dict[str, Any],
    progress: Progress,
    limit_s: float,
    want: str,
    what: str,
) -> None:
    """Report that the migration waits for ``want`` and wait for it (the guest's state is as
    the phase says: running before the final round, frozen after it). Abort, or nothing within
    ``limit_s``, fails the migration, which thaws the session here."""
    st["awaiting"] = True
    progress(st)
    deadline = time.monotonic() + (limit_s or HOLD_TIMEOUT_S)
    while True:
        d = decisions.poll(min(deadline - time.monotonic(), 1.0))
        if d == ABORT:
            raise MigrationFailed("aborted by the operator; the session stays here as it was")
        if d == want or (want == STOP and d == COMMIT):
            break
        if time.monotonic() >= deadline:
            raise MigrationFailed(
                f"no {what} within {limit_s or HOLD_TIMEOUT_S:g} s: aborted; the session stays "
                "here as it was"
            )
    st["awaiting"] = False


def _packed(w: CheckpointWriter, last: float) -> float:
    """The round's compressed / raw size, if it carried enough memory to tell; else ``last``."""
    if w.memory_bytes < (1 << 20):
        return last
    return w.bytes_written / w.memory_bytes


def _account(st: dict[str, Any], sent: int, memory: int, seconds: float) -> None:
    before = st["bytes_sent"]
    st["bytes_sent"] = sent
    st["memory_bytes"] += memory
    if seconds > 0 and sent > before:
        st["rate"] = (sent - before) / seconds


def _why(responses: Any) -> str:
    try:
        return f"{responses.code().name}: {responses.details()}"
    except Exception:
        return "the transfer stream ended"


def _abort(
    to: str, tls: TlsFiles | None, ident: SessionRecord, responses: Any, limit_s: float
) -> None:
    """End the stream and ask the destination to forget what it received. A destination that
    does not answer at once (stopped, partitioned) is asked again on a thread until it answers
    (:data:`ABORT_RETRY_S` at most): woken up, it could otherwise commit a final round this
    source gave up on, and hold a session no guest will ever use."""
    if responses is None:  # nothing was sent: nothing to forget there
        return
    responses.cancel()
    request = peer_pb2.AbortRequest(session_id=ident.id, token=ident.token)
    gen = _ABORTS.begin()  # a later migration of this session stops these retries
    if _ask_abort(to, tls, request, min(ABORT_WAIT_S, limit_s)):
        return
    log.warning("destination %s did not answer the abort; asking again until it does", to)
    threading.Thread(
        target=_abort_later, args=(to, tls, request, gen), name="migrate-abort", daemon=True
    ).start()


class _Generation:
    """Counts migrations out of this worker, so that retries of an old abort stop once a new
    migration of the session starts (the destination would take them for the new one)."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def begin(self) -> int:
        with self.lock:
            self.n += 1
            return self.n


_ABORTS = _Generation()


def _ask_abort(
    to: str, tls: TlsFiles | None, request: peer_pb2.AbortRequest, timeout_s: float
) -> bool:
    """One Abort (over the same kind of channel as the transfer: mutual TLS on tcp); True
    when the destination answered, a refusal included (it then took nothing from us)."""
    with open_channel(to, tls) as ch:
        try:
            peer_pb2_grpc.PeerStub(ch).Abort(request, timeout=timeout_s)
            return True
        except grpc.RpcError as e:
            return e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _abort_later(to: str, tls: TlsFiles | None, request: peer_pb2.AbortRequest, gen: int) -> None:
    deadline = time.monotonic() + ABORT_RETRY_S
    while time.monotonic() < deadline and _ABORTS.n == gen:
        if _ask_abort(to, tls, request, ABORT_WAIT_S):
            log.info("destination %s answered the abort of session %s", to, request.session_id)
            return
        time.sleep(ABORT_RETRY_EVERY_S)


def start(ws: WorkerSession, req: MigrateRequest, write_progress: Progress) -> threading.Thread:
    """Run :func:`migrate_out` on its own thread; the outcome goes to ``write_progress``."""

    def run() -> None:
        try:
            migrate_out(ws, req, write_progress)
        except MigrationFailed as e:
            log.warning("migration to %s failed: %s", req.to, e)
            write_progress({"phase": Phase.FAILED.value, "error": str(e)})

    t = threading.Thread(target=run, name="migrate-out", daemon=True)
    t.start()
    return t
