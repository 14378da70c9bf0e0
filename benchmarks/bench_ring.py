"""The shared-memory call ring against the worker's gRPC socket, and both against the floor
two processes on this machine can reach.

    python benchmarks/bench_ring.py [--json benchmarks/results/ring.json] [--quick]
                                    [--only sync|async|bulk]

One craned on the simulated GPU; two sessions on it, one attached through the call ring
(``CRANE_RING=require``), one through the worker's gRPC socket (``CRANE_RING=0``). Every
measurement is taken in interleaved rounds (ring, gRPC, baselines, ring, gRPC, ...) so the
machine's noise hits all alike; the result is the median over rounds and the ratios.

* ``sync_rtt_us``: ``cuStreamSynchronize`` of an idle stream (median per round). Baselines in
  the same run: an ``os.eventfd`` ping-pong between two Python processes, and the ring's C core
  alone (a 64-byte message echoed by a second process, no engine). Target: ring <= 10 us.
* ``async_rate``: one-byte ``cuMemsetD8`` calls then one synchronize, calls/s. Target >= 1M/s.
* ``bulk_gib_s``: 64 MiB host-to-device and device-to-host copies, GiB/s; baseline: one plain
  ``memcpy`` of the same bytes into a shared mapping (the least a copy between two processes
  costs), its ratio taken per round. Target: ring >= 0.9x memcpy. The bytes go through
  the ring's bulk area (crane/guest/ring_bulk.py); ``CRANE_RING_BULK_MIN=0`` sends them in the
  calls instead, as before it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.wire.ring import REPLIES, REQUESTS, Ring

BULK = 64 << 20


def _session(address: str, ring: bool) -> GuestSession:
    os.environ["CRANE_RING"] = "require" if ring else "0"
    s = GuestSession(address, client="bench-ring" if ring else "bench-grpc", direct=True)
    assert s._t.path == ("ring" if ring else "direct"), s._t.path
    return s


def _median_rtt(fn: Callable[[], None], n: int) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


# ---- baselines between two plain processes -------------------------------------------------
def _eventfd_echo(a: int, b: int, n: int) -> None:
    for _ in range(n):
        os.eventfd_read(a)
        os.eventfd_write(b, 1)


def eventfd_rtt(n: int) -> float:
    a, b = os.eventfd(0), os.eventfd(0)
    p = multiprocessing.get_context("fork").Process(target=_eventfd_echo, args=(a, b, n))
    p.start()

    def once() -> None:
        os.eventfd_write(a, 1)
        os.eventfd_read(b)

    rtt = _median_rtt(once, n)
    p.join()
    os.close(a)
    os.close(b)
    return rtt


def _ring_echo(fd: int, n: int) -> None:
    r = Ring(fd, REPLIES, lambda: True)
    for _ in range(n):
        r.send(r.recv())


def core_rtt(n: int) -> float:
    fd = Ring.create(1 << 20)
    p = multiprocessing.get_context("fork").Process(target=_ring_echo, args=(fd, n))
    p.start()
    r = Ring(fd, REQUESTS, lambda: True)
    os.close(fd)
    msg = b"x" * 64

    def once() -> None:
        r.send(msg)
        r.recv()

    rtt = _median_rtt(once, n)
    p.join()
    return rtt


def memcpy_gib_s() -> float:
    """One memcpy of BULK bytes into a MAP_SHARED memfd mapping (after a warm-up that faults
    its pages in), GiB/s."""
    src = os.urandom(BULK)
    fd = os.memfd_create("bench")
    os.ftruncate(fd, BULK)
    with mmap.mmap(fd, BULK) as m:
        dst = ctypes.addressof(ctypes.c_char.from_buffer(m))
        ctypes.memmove(dst, src, BULK)
        t0 = time.perf_counter()
        ctypes.memmove(dst, src, BULK)
        took = time.perf_counter() - t0
        del dst
    os.close(fd)
    return BULK / took / (1 << 30)


# ---- crane ---------------------------------------------------------------------------------
def async_rate(s: GuestSession, p: int, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        s.memset_d8(p + (i & 1023), i & 0xFF, 1)
    s.synchronize()
    return n / (time.perf_counter() - t0)


def bulk(s: GuestSession, p: int, data: bytes, out: bytearray) -> tuple[float, float]:
    """One upload of ``data`` (then a synchronize) and one read back into ``out``, a host
    buffer the program already has (as ``cuMemcpyDtoH``'s destination is): a fresh one would
    time the kernel's page faults, which the memcpy baseline does not pay either."""
    t0 = time.perf_counter()
    s.memcpy_htod(p, data)
    s.synchronize()
    h2d = time.perf_counter() - t0
    t0 = time.perf_counter()
    s.memcpy_dtoh(p, len(data), out=out)
    d2h = time.perf_counter() - t0
    if out[:4096] != data[:4096] or out[-4096:] != data[-4096:]:
        raise AssertionError("the bytes read back are not the bytes written")
    return BULK / h2d / (1 << 30), BULK / d2h / (1 << 30)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--only", choices=("sync", "async", "bulk"), help="measure only this part")
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)
    n_sync = 300 if args.quick else 1000
    n_async = 20000 if args.quick else 100000
    rows: dict[str, list[float]] = {}

    def add(key: str, v: float) -> None:
        rows.setdefault(key, []).append(v)

    with (
        tempfile.TemporaryDirectory() as tmp,
        DaemonProcess(Path(tmp) / "run", ["sim:h100-80gb"]) as d,
    ):
        subjects = {"ring": _session(d.address, True), "grpc": _session(d.address, False)}
        data = os.urandom(BULK)
        out = bytearray(BULK)
        mem = {k: s.mem_alloc(BULK) for k, s in subjects.items()}
        for k, s in subjects.items():
            s.synchronize()
            if args.only in (None, "bulk"):  # first touches fault pages in, as memcpy's warm-up
                bulk(s, mem[k], data, out)
        for r in range(rounds):
            # which transport goes first alternates: neither gets the warmer machine always
            order = list(subjects.items())[:: 1 if r % 2 == 0 else -1]
            if args.only in (None, "sync"):
                for k, s in order:
                    add(f"sync_rtt_us.{k}", _median_rtt(s.synchronize, n_sync))
                add("sync_rtt_us.eventfd", eventfd_rtt(n_sync))
                add("sync_rtt_us.ring_core", core_rtt(n_sync))
            if args.only in (None, "async"):
                for k, s in order:
                    add(f"async_rate.{k}", async_rate(s, mem[k], n_async))
            if args.only in (None, "bulk"):
                for k, s in order:
                    h2d, d2h = bulk(s, mem[k], data, out)
                    add(f"bulk_gib_s.h2d.{k}", h2d)
                    add(f"bulk_gib_s.d2h.{k}", d2h)
                add("bulk_gib_s.memcpy", memcpy_gib_s())
            print(f"round {r + 1}/{rounds} done", file=sys.stderr)
        for s in subjects.values():
            s.close()
    med = {k: statistics.median(v) for k, v in rows.items()}
    ratios = {}
    if args.only in (None, "sync"):
        ratios["sync ring / eventfd"] = med["sync_rtt_us.ring"] / med["sync_rtt_us.eventfd"]
        ratios["sync grpc / ring"] = med["sync_rtt_us.grpc"] / med["sync_rtt_us.ring"]
    if args.only in (None, "async"):
        ratios["async ring / grpc"] = med["async_rate.ring"] / med["async_rate.grpc"]
    if args.only in (None, "bulk"):
        # the ratio to memcpy per round (both measured in it), then the median over rounds:
        # a round the machine's other jobs slowed slows its baseline too
        for way in ("h2d", "d2h"):
            per_round = [
                r / m
                for r, m in zip(
                    rows[f"bulk_gib_s.{way}.ring"], rows["bulk_gib_s.memcpy"], strict=True
                )
            ]
            ratios[f"{way} ring / memcpy"] = statistics.median(per_round)
        ratios["h2d ring / grpc"] = med["bulk_gib_s.h2d.ring"] / med["bulk_gib_s.h2d.grpc"]
        ratios["d2h ring / grpc"] = med["bulk_gib_s.d2h.ring"] / med["bulk_gib_s.d2h.grpc"]
    for k in sorted(med):
        print(f"{k:28s} {med[k]:12.2f}   rounds: {', '.join(f'{v:.2f}' for v in rows[k])}")
    for k, v in ratios.items():
        print(f"{k:28s} {v:12.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"rounds": rows, "median": med, "ratios": ratios, "cpus": os.cpu_count()}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
