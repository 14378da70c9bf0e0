"""Host memory per idle session: the daemon's resident memory and each session worker's.

    python benchmarks/bench_memory.py [--json benchmarks/results/memory.json] [--quick]

One craned (sim:h100-80gb, one pre-spawned worker) on a unix socket. The baselines, measured in
the same run: the daemon with no session open, and the idle pre-spawned worker (a fresh
interpreter that has imported the worker but serves nothing yet). Then 0, 8 and 16 idle
sessions are held open (half on the direct path, half through the relay; each guest created its
primary context, loaded a small module and allocated 1 MiB, then stopped calling), and for each
count the daemon's RSS and PSS and every session worker's are read from ``/proc`` after a pause.
Reported: the daemon's growth per idle session (vs its baseline), and a session worker's RSS/PSS
(vs the idle worker). Finally every session is closed and the daemon's RSS read again.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.host.lifeline import alive

SETTLE_S = 2.0
#: A module the idle sessions keep loaded (PTX the simulator JIT-runs; no nvcc needed).
PTX = b""".version 7.8
.target sm_80
.address_size 64
.visible .global .align 4 .b32 counter;
.visible .entry bump()
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    mov.u64 %rd1, counter;
    atom.global.add.u32 %r1, [%rd1], 1;
    ret;
}
"""


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of ``pid`` in KiB: PSS shares pages mapped by several processes out among
    them, so it is what a process adds to the host's memory."""
    rss = pss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            pss = int(line.split()[1])
    return rss, pss


def session_workers(d: DaemonProcess) -> dict[str, int]:
    """Session id -> worker pid, from the daemon's "session S opened ... worker pid N" lines."""
    found = re.findall(r"session (\w+) opened .* worker pid (\d+)", d.log_text())
    return {sid: int(pid) for sid, pid in found}


def idle_worker(d: DaemonProcess, serving: set[int]) -> int | None:
    for p in (d.run_dir / "workers").iterdir():
        if p.name.isdigit() and int(p.name) not in serving and alive(int(p.name)):
            return int(p.name)
    return None


def run(counts: list[int]) -> dict:
    results: dict = {"device": "sim:h100-80gb", "counts": {}}
    with tempfile.TemporaryDirectory(prefix="crane-bench-mem-") as tmp:
        d = DaemonProcess(Path(tmp) / "run", ["sim:h100-80gb"])
        sessions: list[GuestSession] = []
        try:
            # warm-up: one session on each path, closed (gRPC's and the relay's buffers exist)
            for direct in (True, False):
                with GuestSession(d.address, client="warm-up", direct=direct) as s:
                    s.module_load(PTX)
                    s.mem_alloc(1 << 20)
            time.sleep(SETTLE_S * 2)
            base_rss, base_pss = memory_kib(d.proc.pid)
            idle = idle_worker(d, set())
            idle_rss, idle_pss = memory_kib(idle) if idle else (0, 0)
            results["baseline"] = {
                "daemon_rss_kib": base_rss,
                "daemon_pss_kib": base_pss,
                "idle_worker_rss_kib": idle_rss,
                "idle_worker_pss_kib": idle_pss,
            }
            for n in counts:
                while len(sessions) < n:
                    s = GuestSession(d.address, client="idle", direct=len(sessions) % 2 == 0)
                    s.module_load(PTX)
                    s.mem_alloc(1 << 20)
                    s.synchronize()
                    sessions.append(s)
                time.sleep(SETTLE_S)
                rss, pss = memory_kib(d.proc.pid)
                pids = session_workers(d)
                ours = [pids[s.session_id] for s in sessions]
                w = [memory_kib(p) for p in ours]
                per = (rss - base_rss) / n if n else 0.0
                results["counts"][n] = {
                    "daemon_rss_kib": rss,
                    "daemon_pss_kib": pss,
                    "daemon_rss_per_session_kib": round(per, 1),
                    "daemon_growth_per_session_vs_baseline": round(per / base_rss, 4),
                    "worker_rss_kib_median": statistics.median(r for r, _ in w) if w else 0,
                    "worker_pss_kib_median": statistics.median(p for _, p in w) if w else 0,
                    "worker_rss_vs_idle_worker": (
                        round(statistics.median(r for r, _ in w) / idle_rss, 3)
                        if w and idle_rss
                        else None
                    ),
                }
            for s in sessions:
                s.close()
            sessions.clear()
            time.sleep(SETTLE_S * 2)
            results["after_close"] = {"daemon_rss_kib": memory_kib(d.proc.pid)[0]}
        finally:
            for s in sessions:
                s.close()
            d.stop()
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="benchmarks/results/memory.json")
    ap.add_argument("--quick", action="store_true", help="0 and 2 sessions only (smoke test)")
    args = ap.parse_args()
    results = run([0, 2] if args.quick else [0, 8, 16])
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
