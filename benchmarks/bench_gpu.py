"""Crane on a real GPU: each workload natively and through Crane in the same run, as ratios.

    python benchmarks/bench_gpu.py [--json benchmarks/results/gpu.json] [--md FILE]
                                   [--backend cuda:0] [--quick] [--migrate-gib 4]
                                   [--sections compute,launch,memcpy,migrate,torch] [--logs DIR]

One nvcc-built program (static cudart, built for the device's architecture) times itself, run
natively and under ``crane run`` against a craned on the same GPU (``--backend cuda:0``), twice
each, interleaved; the best of the two is kept per metric:

* ``compute``: a loop of heavy FMA kernels that fill the GPU (about 1 s natively): the cost of
  remoting when kernels dominate. Target: Crane <= 1.03x native.
* ``launch``: 20k tiny kernels (one block of 32 threads), then a synchronize: per-launch cost.
* ``memcpy``: cudaMemcpy of 256 MiB host-to-device and device-to-host, from pinned
  (cudaMallocHost) and pageable (malloc) memory: GB/s, best of 3 copies.

``torch``: tests/gpu/scripts/torch_workload.py times training steps of a small MLP
(launch-bound) and a large one (compute-bound), natively and through ``crane run``.

``migrate``: a 4 GiB session (float32 noise) moved live between two craned on the one GPU while
its guest keeps stepping (benchmarks/bench_migrate.py's measurement: downtime as the source
reports it, the guest's stall, total time against a bare gRPC copy of the same bytes), with and
without pre-copy.

Writes JSON and a markdown table (device named from nvidia-smi, else pynvml, else the probe).
On a host without a GPU it says so and exits 0 without measuring; ``--backend sim:h100-80gb``
exercises the plumbing on the simulator with tiny sizes (no native side, no ratios).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from crane.cli.demo import find_nvcc  # noqa: E402
from crane.craned.launcher import DaemonProcess  # noqa: E402
from tests.gpu.harness import (  # noqa: E402
    Run,
    Target,
    arch_flags,
    find_target,
    parse_gpu_archs,
    run_crane,
    run_native,
)

MiB = 1 << 20
GiB = 1 << 30
COMPUTE_TARGET = 1.03
TORCH_SCRIPT = ROOT / "tests" / "gpu" / "scripts" / "torch_workload.py"

PROGRAM = r"""
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <cuda_runtime.h>
__global__ void heavy(float *out, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float a = 1.0f + i * 1e-7f, b = 0.5f, c = 0.25f, d = 0.125f;
    for (int k = 0; k < iters; k++) {
        a = fmaf(a, 0.999f, 0.001f); b = fmaf(b, 0.999f, 0.002f);
        c = fmaf(c, 0.999f, 0.003f); d = fmaf(d, 0.999f, 0.004f);
    }
    out[i] = a + b + c + d;
}
__global__ void tiny(int *p) { if (threadIdx.x == 0) p[blockIdx.x] += 1; }
static double now() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}
static double best_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, int reps) {
    cudaMemcpy(dst, src, n, kind);  // warm-up: first touch, pinning of pageable staging
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now();
        cudaMemcpy(dst, src, n, kind);
        best = std::min(best, now() - t);
    }
    return n / best / 1e9;
}
int main(int argc, char **argv) {
    // argv: iters launches_heavy n_tiny copy_mib sections(c,l,m letters)
    int iters = atoi(argv[1]), heavy_n = atoi(argv[2]), tiny_n = atoi(argv[3]);
    size_t copy = (size_t)atoi(argv[4]) << 20;
    std::string what = argc > 5 ? argv[5] : "clm";
    int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    int blocks = sms * 8, threads = 256;
    float *out; int *cnt;
    cudaMalloc(&out, (size_t)blocks * threads * sizeof(float));
    cudaMalloc(&cnt, 1024 * sizeof(int)); cudaMemset(cnt, 0, 1024 * sizeof(int));
    heavy<<<blocks, threads>>>(out, 16); tiny<<<1, 32>>>(cnt);  // module load, first launches
    cudaDeviceSynchronize();
    printf("{\"sms\": %d", sms);
    if (what.find('c') != std::string::npos) {
        double t = now();
        for (int k = 0; k < heavy_n; k++) heavy<<<blocks, threads>>>(out, iters);
        cudaDeviceSynchronize();
        printf(", \"compute_s\": %.6f, \"compute_iters\": %d, \"compute_launches\": %d",
               now() - t, iters, heavy_n);
    }
    if (what.find('l') != std::string::npos) {
        double t = now();
        for (int k = 0; k < tiny_n; k++) tiny<<<1, 32>>>(cnt);
        double enq = now() - t;
        cudaDeviceSynchronize();
        printf(", \"launch_total_s\": %.6f, \"launch_enqueue_s\": %.6f, \"launches\": %d",
               now() - t, enq, tiny_n);
    }
    if (what.find('m') != std::string::npos && copy) {
        void *dev, *pinned, *pageable = malloc(copy);
        memset(pageable, 1, copy);
        cudaMalloc(&dev, copy); cudaMallocHost(&pinned, copy); memset(pinned, 2, copy);
        const cudaMemcpyKind h2d = cudaMemcpyHostToDevice, d2h = cudaMemcpyDeviceToHost;
        printf(", \"copy_bytes\": %zu", copy);
        printf(", \"h2d_pinned_gbs\": %.4f", best_copy(dev, pinned, copy, h2d, 3));
        printf(", \"d2h_pinned_gbs\": %.4f", best_copy(pinned, dev, copy, d2h, 3));
        printf(", \"h2d_pageable_gbs\": %.4f", best_copy(dev, pageable, copy, h2d, 3));
        printf(", \"d2h_pageable_gbs\": %.4f", best_copy(pageable, dev, copy, d2h, 3));
        cudaFree(dev); cudaFreeHost(pinned); free(pageable);
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf(", \"error\": \"%s\"}\n", cudaGetErrorName(e));
    return e != cudaSuccess;
}
"""

#: (key in the program's JSON, label, unit, higher is better)
PROGRAM_METRICS = [
    ("compute_s", "compute-bound kernel loop", "s", False),
    ("launch_us", "launch-bound: tiny kernels, per launch", "µs", False),
    ("h2d_pinned_gbs", "cudaMemcpy H2D, pinned", "GB/s", True),
    ("d2h_pinned_gbs", "cudaMemcpy D2H, pinned", "GB/s", True),
    ("h2d_pageable_gbs", "cudaMemcpy H2D, pageable", "GB/s", True),
    ("d2h_pageable_gbs", "cudaMemcpy D2H, pageable", "GB/s", True),
]


# --- pure helpers (unit-tested on the CPU) ----------------------------------------------------


def parse_program_output(stdout: str) -> dict[str, Any]:
    """The program's one JSON line, with the per-launch time derived."""
    line = next(ln for ln in reversed(stdout.splitlines()) if ln.startswith("{"))
    data = json.loads(line)
    if "launch_total_s" in data and data.get("launches"):
        data["launch_us"] = data["launch_total_s"] / data["launches"] * 1e6
    return data


def best_of(runs: list[dict[str, Any]], key: str, higher_is_better: bool) -> float | None:
    values = [r[key] for r in runs if isinstance(r.get(key), int | float)]
    if not values:
        return None
    return max(values) if higher_is_better else min(values)


def ratio(crane: float | None, native: float | None) -> float | None:
    """Crane / native; for times > 1 means slower, for bandwidths < 1 means slower."""
    if crane is None or native is None or native == 0:
        return None
    return crane / native


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}".strip()


def fmt_size(n: int) -> str:
    return f"{n / GiB:g} GiB" if n >= GiB else f"{n / MiB:g} MiB"


def fmt_ratio(r: float | None, higher_is_better: bool) -> str:
    if r is None:
        return "-"
    slow = (1 / r) if higher_is_better else r
    return f"**{r:.3f}x** ({(slow - 1) * 100:+.1f}% time)"


def markdown(results: dict[str, Any]) -> str:
    """The report: device header, one table of native-vs-Crane rows, the migration table."""
    dev = results.get("device", {})
    lines = [
        f"### {dev.get('name', '?')} (driver {dev.get('driver', '?')}, "
        f"sm_{dev.get('cc', '?')}, {fmt(dev.get('memory_mib'), 'MiB')}), "
        f"backend `{results.get('backend', '?')}`, {results.get('date', '?')}",
        "",
        "| metric | native | Crane | Crane / native | target |",
        "|---|---|---|---|---|",
    ]
    for row in results.get("rows", []):
        target = row.get("target")
        ok = ""
        if target is not None and row.get("ratio") is not None:
            ok = " ✓" if row["ratio"] <= target else " ✗"
        lines.append(
            f"| {row['label']} | {fmt(row.get('native'), row['unit'])} "
            f"| {fmt(row.get('crane'), row['unit'])} "
            f"| {fmt_ratio(row.get('ratio'), row.get('higher_is_better', False))} "
            f"| {'' if target is None else f'<= {target}x'}{ok} |"
        )
    mig = results.get("migrate") or []
    if mig:
        lines += [
            "",
            "| session | write/step | mode | rounds | downtime | guest stall | total | raw copy "
            "| total / raw |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for m in mig:
            stall = m.get("guest_stall_ms")
            lines.append(
                f"| {fmt_size(m['session_bytes'])} | {fmt_size(m['write_set_bytes'])} "
                f"| {m['mode']} | {m['rounds']} | {m['downtime_ms']} ms "
                f"| {'-' if stall is None else f'{stall} ms'} | {m['total_s']} s "
                f"| {m['raw_copy_s']} s | {m['total_vs_raw']}x |"
            )
    for note in results.get("notes", []):
        lines += ["", f"* {note}"]
    return "\n".join(lines) + "\n"


# --- the device -------------------------------------------------------------------------------


def device_info(target: Target) -> dict[str, Any]:
    info: dict[str, Any] = {
        "name": target.name,
        "cc": f"{target.cc[0]}{target.cc[1]}",
        "memory_mib": target.total_mem // MiB,
        "driver": target.driver or "-",
    }
    if target.simulated:
        info["name"] += " (simulated)"
        return info
    smi = shutil.which("nvidia-smi")
    if smi:
        q = subprocess.run(
            [
                smi,
                f"--id={target.ordinal}",
                "--query-gpu=name,driver_version,memory.total,uuid",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        parts = [p.strip() for p in q.stdout.strip().split(",")]
        if q.returncode == 0 and len(parts) == 4:
            info.update(name=parts[0], driver=parts[1], memory_mib=int(float(parts[2])))
            info["uuid"] = parts[3]
            return info
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(target.ordinal)
        name = pynvml.nvmlDeviceGetName(h)
        info["name"] = name.decode() if isinstance(name, bytes) else name
        drv = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = drv.decode() if isinstance(drv, bytes) else drv
    except Exception:
        pass
    return info


# --- sections ---------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, target: Target, work: Path, logs: Path) -> None:
        self.args, self.target, self.work, self.logs = args, target, work, logs
        self.sim = target.simulated
        self.results: dict[str, Any] = {
            "benchmark": "gpu",
            "backend": target.backend,
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "device": device_info(target),
            "cpus": os.cpu_count(),
            "rows": [],
            "migrate": [],
            "raw": {},
            "notes": [],
        }
        self._daemons: dict[str, DaemonProcess] = {}

    def daemon(self, name: str) -> DaemonProcess:
        if name not in self._daemons:
            self._daemons[name] = DaemonProcess(
                self.work / f"run-{name}",
                [self.target.backend],
                log_path=self.logs / f"craned-{name}.log",
            )
        return self._daemons[name]

    def close(self) -> None:
        for d in self._daemons.values():
            d.stop()

    def save(self) -> None:
        """Written after every section, so a run cut short still leaves what it measured."""
        a = self.args
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(self.results, indent=2) + "\n")
        if a.md:
            Path(a.md).write_text(markdown(self.results))

    def row(self, label: str, unit: str, native: Any, crane: Any, hib: bool, **kw: Any) -> None:
        r = ratio(crane, native)
        self.results["rows"].append(
            {
                "label": label,
                "unit": unit,
                "native": native,
                "crane": crane,
                "ratio": None if r is None else round(r, 4),
                "higher_is_better": hib,
                **kw,
            }
        )

    def _pair(self, argv: list[str], timeout: float, reps: int) -> tuple[list[Run], list[Run]]:
        nat, cr = [], []
        for _ in range(reps):
            if not self.sim:
                nat.append(run_native(argv, timeout=timeout))
            cr.append(run_crane(self.daemon("a").address, argv, timeout=timeout))
        for r in [*nat, *cr]:
            if r.returncode != 0:
                raise RuntimeError("a benchmark run failed:\n" + r.describe(3000))
        return nat, cr

    def programs(self, sections: set[str]) -> None:
        nvcc = find_nvcc()
        if nvcc is None:
            raise RuntimeError("no nvcc")
        archs = parse_gpu_archs(
            subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True).stdout
        )
        src = self.work / "bench_gpu.cu"
        src.write_text(PROGRAM)
        exe = self.work / "bench_gpu"
        subprocess.run(
            [nvcc, "-O3", *arch_flags(self.target.cc, archs), "-o", str(exe), str(src)],
            check=True,
            capture_output=True,
        )
        letters = "".join(x[0] for x in ("compute", "launch", "memcpy") if x in sections)
        if self.sim:
            iters, heavy_n, tiny_n, copy_mib = 8, 2, 50, 4
        else:
            iters, heavy_n, tiny_n, copy_mib = self._calibrate(exe), 50, 20_000, 256
        argv = [str(exe), str(iters), str(heavy_n), str(tiny_n), str(copy_mib), letters]
        reps = 1 if self.args.quick or self.sim else 2
        nat, cr = self._pair(argv, timeout=300, reps=reps)
        n = [parse_program_output(r.stdout) for r in nat]
        c = [parse_program_output(r.stdout) for r in cr]
        self.results["raw"]["program"] = {"argv": argv[1:], "native": n, "crane": c}
        for key, label, unit, hib in PROGRAM_METRICS:
            if any(key in x for x in n + c):
                extra = {"target": COMPUTE_TARGET} if key == "compute_s" else {}
                self.row(label, unit, best_of(n, key, hib), best_of(c, key, hib), hib, **extra)
        if "compute_s" in (c[0] if c else {}):
            self.results["notes"].append(
                f"compute loop: {heavy_n} launches of {iters} FMA iterations x4 on "
                f"{c[0]['sms'] * 8} blocks of 256 threads; launch-bound: {tiny_n} launches of "
                f"<<<1,32>>>, then one synchronize; memcpy: {copy_mib} MiB, best of 3"
            )

    def _calibrate(self, exe: Path) -> int:
        """FMA iterations that make one heavy launch take ~20 ms natively."""
        probe = 20_000
        r = run_native([str(exe), str(probe), "5", "0", "0", "c"], timeout=120)
        if r.returncode != 0:
            raise RuntimeError("calibration failed:\n" + r.describe())
        per_launch = parse_program_output(r.stdout)["compute_s"] / 5
        return max(1000, int(probe * 0.020 / max(per_launch, 1e-6)))

    def torch(self) -> None:
        if self.sim:
            self.results["notes"].append("torch: skipped on the simulator")
            return
        try:
            import importlib.util

            if importlib.util.find_spec("torch") is None:
                raise ImportError
        except ImportError:
            self.results["notes"].append(f"torch: not importable by {sys.executable}; skipped")
            return
        steps = 10 if self.args.quick else 30
        out: dict[str, dict[str, Any]] = {}
        for side in ("native", "crane"):
            argv = [
                sys.executable,
                str(TORCH_SCRIPT),
                "--out",
                str(self.work / f"torch-{side}"),
                "--skip-check",
                "--bench-steps",
                str(steps),
            ]
            if side == "native":
                r = run_native(argv, timeout=300)
            else:
                r = run_crane(self.daemon("a").address, argv, timeout=480)
            if r.returncode != 0:
                raise RuntimeError(f"torch ({side}) failed:\n" + r.describe(3000))
            out[side] = json.loads((self.work / f"torch-{side}" / "results.json").read_text())
        self.results["raw"]["torch"] = out
        for cfg, label in (("small", "launch-bound"), ("large", "compute-bound")):
            nb, cb = out["native"]["bench"][cfg], out["crane"]["bench"][cfg]
            self.row(
                f"PyTorch MLP training step, {label} ({nb['inp']}-{nb['hidden']}-"
                f"{nb['hidden']}-10, batch {nb['batch']}), median",
                "ms",
                nb["median_ms"],
                cb["median_ms"],
                False,
            )
        self.row(
            "PyTorch start-up to first CUDA use",
            "s",
            out["native"]["init_s"],
            out["crane"]["init_s"],
            False,
        )

    def migrate(self) -> None:
        import numpy as np
        from bench_migrate import measure

        size = 64 * MiB if self.sim else int(self.args.migrate_gib * GiB)
        write = 1 * MiB if self.sim else 8 * MiB
        block = np.random.default_rng(1).standard_normal(4 * MiB // 4).astype(np.float32)
        a, b = self.daemon("a"), self.daemon("b")
        for mode in ("precopy", "no-precopy"):
            m = measure(a, b, size, write, mode, block.tobytes(), self.work)
            print(json.dumps(m), flush=True)
            self.results["migrate"].append(m)
            self.save()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "gpu.json"))
    p.add_argument("--md", help="also write the markdown table here")
    p.add_argument("--backend", default=None, help="cuda:N (default cuda:0) or sim:PROFILE")
    p.add_argument("--sections", default="compute,launch,memcpy,migrate,torch")
    p.add_argument("--quick", action="store_true", help="one run per side, fewer torch steps")
    p.add_argument("--migrate-gib", type=float, default=4.0)
    p.add_argument("--logs", help="keep the daemons' logs in this directory")
    args = p.parse_args(argv)
    target = find_target(args.backend)
    if isinstance(target, str):
        print(f"bench_gpu: nothing measured: {target}")
        return 0
    sections = set(args.sections.split(","))
    with tempfile.TemporaryDirectory(prefix="crane-bench-gpu-") as tmp:
        work = Path(tmp)
        logs = Path(args.logs) if args.logs else work
        logs.mkdir(parents=True, exist_ok=True)
        bench = Bench(args, target, work, logs)
        steps: list[tuple[str, Callable[[], None]]] = []
        if sections & {"compute", "launch", "memcpy"}:
            steps.append(("programs", lambda: bench.programs(sections)))
        if "migrate" in sections:
            steps.append(("migrate", bench.migrate))
        if "torch" in sections:
            steps.append(("torch", bench.torch))
        failed = 0
        try:
            for name, fn in steps:
                t = time.perf_counter()
                try:
                    fn()
                except Exception as e:  # the other sections still run
                    failed += 1
                    bench.results["notes"].append(f"{name}: FAILED: {str(e)[:2000]}")
                    print(f"bench_gpu: {name} failed: {e}", file=sys.stderr, flush=True)
                print(f"bench_gpu: {name} took {time.perf_counter() - t:.1f} s", flush=True)
                bench.save()
        finally:
            bench.close()
            bench.save()
    print(markdown(bench.results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
