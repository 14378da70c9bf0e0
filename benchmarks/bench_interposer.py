"""Interposer benchmarks: an nvcc-built CUDA program measured through ``crane run``.

    python benchmarks/bench_interposer.py [--json benchmarks/results/interposer.json] [--quick]

One craned on the simulated GPU, one guest program (static cudart, unmodified) timing itself:

* ``enqueue_rate``: empty-kernel ``<<<1,1>>>`` launches per second as the guest sees them (the
  launch calls only). Target: >= 100k/s.
* ``end_to_end_rate``: the same launches including their execution (time until a
  ``cudaDeviceSynchronize`` after the last one returns).
* ``sync_rtt``: median ``cudaStreamSynchronize`` of an idle stream through the whole stack
  (cudart → libcuda.so.1 → Python → gRPC → worker) vs the bare gRPC Echo ping-pong on the
  daemon's Diagnostics service in the same run.
* ``memset_*_rate``: one-byte ``cudaMemsetAsync`` calls into one 1 KiB buffer per second, as
  the guest sees them (enqueue) and until a synchronize after the last one returns (end to
  end); the buffer's final bytes are checked. Target (issue 17's async rate): >= 1M/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_core import Bare  # noqa: E402

from crane.cli.demo import find_nvcc  # noqa: E402
from crane.craned.launcher import DaemonProcess  # noqa: E402

PROGRAM = r"""
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
__global__ void empty() {}
static double now() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}
int main(int argc, char **argv) {
    int n = atoi(argv[1]), m = atoi(argv[2]);
    empty<<<1, 1>>>();
    cudaDeviceSynchronize();                       // init, module load, first launch
    double t0 = now();
    for (int i = 0; i < n; i++) empty<<<1, 1>>>();
    double t1 = now();
    cudaError_t e = cudaDeviceSynchronize();
    double t2 = now();
    cudaStream_t s; cudaStreamCreate(&s);
    std::vector<double> rtt;
    for (int i = 0; i < m; i++) {
        double a = now();
        cudaStreamSynchronize(s);
        rtt.push_back(now() - a);
    }
    std::sort(rtt.begin(), rtt.end());
    // one-byte memsets into one buffer, then what they left there checked
    unsigned char *buf; cudaMalloc(&buf, 1024);
    cudaMemsetAsync(buf, 0, 1024, s);
    cudaStreamSynchronize(s);
    double m0 = now();
    for (int i = 0; i < n; i++) cudaMemsetAsync(buf + (i & 1023), i & 0xff, 1, s);
    double m1 = now();
    cudaError_t me = cudaStreamSynchronize(s);
    double m2 = now();
    unsigned char host[1024];
    cudaMemcpy(host, buf, 1024, cudaMemcpyDeviceToHost);
    int wrong = 0;
    for (int j = 0; j < 1024; j++) {
        int last = -1;  // the last i < n with (i & 1023) == j
        if (j < n) last = j + ((n - 1 - j) / 1024) * 1024;
        if (host[j] != (last < 0 ? 0 : (last & 0xff))) wrong++;
    }
    if (me == cudaSuccess && wrong) me = cudaErrorUnknown;
    printf("{\"launches\": %d, \"enqueue_s\": %.6f, \"total_s\": %.6f, \"sync_median_s\": %.9f, "
           "\"memset_enqueue_s\": %.6f, \"memset_total_s\": %.6f, \"memset_wrong\": %d, "
           "\"error\": \"%s\"}\n", n, t1 - t0, t2 - t0, rtt[m / 2], m1 - m0, m2 - m0, wrong,
           cudaGetErrorName(e != cudaSuccess ? e : me));
    return e != cudaSuccess || me != cudaSuccess;
}
"""


def run(quick: bool) -> dict:
    nvcc = find_nvcc()
    if nvcc is None:
        raise SystemExit("bench_interposer: no nvcc")
    n, m = (5_000, 200) if quick else (50_000, 1000)
    with tempfile.TemporaryDirectory(prefix="crane-bench-interposer-") as tmp:
        src = Path(tmp) / "bench.cu"
        src.write_text(PROGRAM)
        exe = Path(tmp) / "bench"
        subprocess.run([nvcc, "-O2", "-o", str(exe), str(src)], check=True, capture_output=True)
        d = DaemonProcess(Path(tmp) / "run", ["sim:h100-80gb"])
        try:
            env = {k: v for k, v in os.environ.items() if k != "CRANE_TRACE"}
            cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", d.address, "--"]
            p = subprocess.run(
                [*cmd, str(exe), str(n), str(m)], capture_output=True, text=True, env=env
            )
            if p.returncode:
                raise SystemExit(f"benchmark program failed: {p.stdout}{p.stderr}")
            g = json.loads(p.stdout.strip().splitlines()[-1])
            bare = Bare(d.address)
            ping = statistics.median(bare.ping_pong(m))
        finally:
            d.stop()
    sync = g["sync_median_s"]
    return {
        "launches": n,
        "enqueue_rate_per_s": round(n / g["enqueue_s"]),
        "enqueue_target_per_s": 100_000,
        "end_to_end_rate_per_s": round(n / g["total_s"]),
        "sync_rtt_us": round(sync * 1e6, 1),
        "bare_grpc_ping_pong_us": round(ping * 1e6, 1),
        "sync_rtt_ratio": round(sync / ping, 2),
        "memset_enqueue_rate_per_s": round(n / g["memset_enqueue_s"]),
        "memset_end_to_end_rate_per_s": round(n / g["memset_total_s"]),
        "memset_target_per_s": 1_000_000,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--json", type=Path, default=ROOT / "benchmarks" / "results" / "interposer.json"
    )
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    res = run(a.quick)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
