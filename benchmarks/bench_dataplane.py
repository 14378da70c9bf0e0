"""Migration data plane and same-host hand-over: total time and downtime against a raw
single-stream gRPC copy, one run.

    python benchmarks/bench_dataplane.py [--json benchmarks/results/dataplane.json]
                                         [--sizes-mib 256,1024,2048] [--rounds 3]
                                         [--contents noise,zeros] [--no-stream]
                                         [--modes handover,dataplane,stream]

Daemons on this host (sim:h100-80gb), all migrating to ``b``: ``h`` hands the memory over
(the default between daemons of one host: the source's memfd passed to the destination
worker, :mod:`crane.migrate.handover`), ``a`` copies it on the data plane
(``CRANE_MIGRATE_HANDOVER=0``: :data:`crane.migrate.dataplane.STREAMS` sockets), ``s`` inside
the one Transfer stream (``CRANE_MIGRATE_STREAMS=0``: what every migration did before).
For each session size and content (float32 noise, which zstd cannot shrink; zeros, written by
``cuMemsetD8`` so the source holds them as ordinary memory) a guest keeps stepping (a 1 MiB
device-to-device copy of noise per step, synchronize, 5 ms pause) while its session moves with
default pre-copy; the reference is a bare gRPC Drain of the same number of bytes in 2 MiB
messages on the destination's Diagnostics service (one stream, no capture, no checksums),
measured in the same round. Rounds interleave every (size, content, mode) so drift touches all
alike; the table shows medians and the ratios of medians. Correctness is checked every time:
the memory read back on the destination equals what was written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_migrate import Stepper, leftovers, migrate, raw_drain

from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.migrate.dataplane import CHUNK, STREAMS
from crane.migrate.handover import ENV as HANDOVER_ENV
from crane.migrate.source import STREAMS_ENV

MiB = 1 << 20
WRITE = 1 * MiB  # the guest's write set per step


def one(
    src: DaemonProcess, dst: DaemonProcess, size: int, content: str, block: bytes
) -> dict[str, float]:
    """Move a session of ``size`` bytes of ``content`` from ``src`` to ``dst`` while it steps."""
    bulk_size = size - WRITE
    with GuestSession(src.address, client="bench-dataplane") as s:
        bulk = s.mem_alloc(bulk_size)
        if content == "zeros":
            s.memset_d8(bulk, 0, bulk_size)
            noise = s.mem_alloc(4 * MiB)  # what the steps copy from
            s.memcpy_htod(noise, block)
        else:
            for off in range(0, bulk_size, len(block)):
                s.memcpy_htod(bulk + off, block[: min(len(block), bulk_size - off)])
            noise = bulk
        wbuf = s.mem_alloc(WRITE)
        s.synchronize()
        g = Stepper(s, noise, 4 * MiB, wbuf, WRITE)
        g.wait_steps(10)
        last = migrate(src.address, s.session_id, dst.address, 0)
        assert last.phase == "done", last.error
        g.wait_steps(len(g.steps) + 10)
        g.finish()
        assert s._t.address == dst.address, "the guest did not follow the session"
        n = len(block)
        for off in (0, bulk_size // 2 // n * n, (bulk_size // n - 1) * n):
            got = s.memcpy_dtoh(bulk + off, len(block))
            want = bytes(len(block)) if content == "zeros" else block
            assert got == want, f"memory at +{off:#x} differs after the move"
        assert s.memcpy_dtoh(wbuf, WRITE) == s.memcpy_dtoh(g.last_src, WRITE)
    assert leftovers(src) == 0 and leftovers(dst) == 0, "a session leaked"
    return {
        "total_s": last.total,
        "downtime_ms": last.downtime * 1e3,
        "rounds": last.round + 1,
        "bytes_sent": last.bytes_sent,
        "handed_over": last.handed_over_bytes,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "dataplane.json"))
    p.add_argument("--sizes-mib", default="256,1024,2048")
    p.add_argument("--contents", default="noise,zeros")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-stream", action="store_true", help="skip the in-stream (old) path")
    p.add_argument("--modes", default="handover,dataplane,stream", help="paths to compare")
    p.add_argument("--logs", help="keep the daemons' logs in this directory")
    args = p.parse_args()
    sizes = [int(x) * MiB for x in args.sizes_mib.split(",")]
    contents = args.contents.split(",")
    modes = [m for m in args.modes.split(",") if not (args.no_stream and m == "stream")]
    block = np.random.default_rng(1).standard_normal(4 * MiB // 4).astype(np.float32).tobytes()
    samples: dict[tuple[int, str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="crane-bench-dp-", dir=os.environ.get("TMPDIR")) as d:
        work = Path(d)
        logs = Path(args.logs) if args.logs else work
        logs.mkdir(parents=True, exist_ok=True)
        sim = ["sim:h100-80gb"]
        envs = {
            "handover": None,
            "dataplane": {**os.environ, HANDOVER_ENV: "0"},
            "stream": {**os.environ, STREAMS_ENV: "0"},
        }
        names = {"handover": "h", "dataplane": "a", "stream": "s"}
        sources = {
            m: DaemonProcess(
                work / names[m], sim, env=envs[m], log_path=logs / f"craned-{names[m]}.log"
            )
            for m in modes
        }
        b = DaemonProcess(work / "b", sim, log_path=logs / "craned-b.log")
        try:
            for r in range(args.rounds):
                for size in sizes:
                    for content in contents:
                        for mode in [*modes, "raw"]:
                            if mode == "raw":
                                m = {"total_s": raw_drain(b.address, block, size)}
                            else:
                                m = one(sources[mode], b, size, content, block)
                                # the path under test is the one taken (a fallback is logged)
                                assert bool(m["handed_over"]) == (mode == "handover"), m
                            samples.setdefault((size, content, mode), []).append(m)
                            print(
                                json.dumps(
                                    {
                                        "round": r,
                                        "size_mib": size // MiB,
                                        "content": content,
                                        "mode": mode,
                                        **m,
                                    }
                                ),
                                flush=True,
                            )
        finally:
            for dmn in (*sources.values(), b):
                dmn.stop()
    results: list[dict[str, Any]] = []
    for size in sizes:
        for content in contents:
            raw = statistics.median(m["total_s"] for m in samples[(size, content, "raw")])
            for mode in modes:
                ms = samples[(size, content, mode)]
                total = statistics.median(m["total_s"] for m in ms)
                results.append(
                    {
                        "size_mib": size // MiB,
                        "content": content,
                        "mode": mode,
                        "total_s": round(total, 3),
                        "raw_copy_s": round(raw, 3),
                        "total_vs_raw": round(total / raw, 2),
                        "downtime_ms": round(statistics.median(m["downtime_ms"] for m in ms), 1),
                        "downtimes_ms": [round(m["downtime_ms"], 1) for m in ms],
                        "totals_s": [round(m["total_s"], 3) for m in ms],
                        "rounds": [int(m["rounds"]) for m in ms],
                        "bytes_sent_mib": round(
                            statistics.median(m["bytes_sent"] for m in ms) / MiB, 1
                        ),
                        "handed_over_mib": round(
                            statistics.median(m["handed_over"] for m in ms) / MiB
                        ),
                    }
                )
    rows = [
        "| session | content | path | total | raw gRPC copy | total/raw | downtime | sent "
        "| handed over |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in results:
        rows.append(
            f"| {x['size_mib']} MiB | {x['content']} | {x['mode']} | {x['total_s']} s "
            f"| {x['raw_copy_s']} s | {x['total_vs_raw']}x | {x['downtime_ms']} ms "
            f"| {x['bytes_sent_mib']} MiB | {x['handed_over_mib']} MiB |"
        )
    print("\n".join(rows))
    out = {
        "benchmark": "dataplane",
        "streams": STREAMS,
        "chunk_bytes": CHUNK,
        "rounds": args.rounds,
        "baseline": "bare gRPC Drain of the session's bytes on the destination, 2 MiB messages, "
        "one stream, same round",
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "results": results,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
