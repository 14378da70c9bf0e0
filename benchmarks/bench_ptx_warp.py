"""The PTX compiler on warp-level code: a block reduction by warp shuffles, compiled vs
interpreted (crane/backends/sim/ptx/jit/warp.py; before it the compiler refused every kernel
with a ``shfl``, so the interpreted time is also the time before).

The kernel: a grid-stride sum per thread, ``__shfl_down_sync`` within each warp, the warps'
sums through shared memory and ``__syncthreads``, a second shuffle round in warp 0, one partial
per block (no atomics, which the compiler does not take); the partials are summed by NumPy
inside the timing. Rounds interleave the two paths (compiled run twice, the second timed;
interpreted once), the best of each, and the two must leave the same bytes.

    python benchmarks/bench_ptx_warp.py [--repeat N] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_ptx import Bench, find_nvcc  # noqa: E402

from crane.backends.sim.ptx import jit, load_ptx  # noqa: E402

SOURCE = r"""
extern "C" __global__ void reduce_shfl(const float* in, float* partial, int n) {
    __shared__ float warp_sums[32];
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        v += in[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (blockDim.x + 31) / 32 ? warp_sums[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0) partial[blockIdx.x] = v;
    }
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1M floats instead of 16M")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "ptx_warp.json"))
    args = ap.parse_args()
    nvcc = find_nvcc()
    if nvcc is None:
        print("nvcc not found: install the CUDA toolkit or `pip install nvidia-cuda-nvcc`")
        return 2
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "w.cu", Path(d) / "w.ptx"
        src.write_text(SOURCE)
        cmd = [nvcc, "-ptx", "-O3", "-arch=compute_80", str(src), "-o", str(out)]
        subprocess.run(cmd, check=True)
        ptx = out.read_text()
    b = Bench(load_ptx(ptx))
    jit.COMPILE_MIN_LANES = 1
    os.environ["CRANE_PTX_JIT_CACHE"] = "0"
    r = 1 << (20 if args.quick else 24)
    data = np.random.default_rng(1).random(r, dtype=np.float32)
    pin, part = b.upload(data), b.upload(np.zeros(1024, np.float32))

    def run() -> float:
        t = b.run("reduce_shfl", (1024, 1, 1), (256, 1, 1), pin, part, np.int32(r))
        t0 = time.perf_counter()
        b.read(part, 1024, np.float32).sum(dtype=np.float32)
        return t + time.perf_counter() - t0

    times: dict[str, list[float]] = {"jit": [], "interp": []}
    for _ in range(args.repeat):
        os.environ["CRANE_PTX_JIT"] = "1"
        run()
        times["jit"].append(run())
        got = b.mem.read(part, 4096)
        os.environ["CRANE_PTX_JIT"] = "0"
        times["interp"].append(run())
        if b.mem.read(part, 4096) != got:
            raise SystemExit("compiled and interpreted partials differ")
    compiled = dict(jit.stats()["compiled"])
    if "reduce_shfl" not in compiled:
        raise SystemExit(f"the PTX compiler did not take reduce_shfl: {jit.stats()['refused']}")
    total = float(b.read(part, 1024, np.float32).astype(np.float64).sum())
    exact = float(data.astype(np.float64).sum())
    metrics = {
        "floats": r,
        "jit_s": min(times["jit"]),
        "interp_s": min(times["interp"]),
        "speedup": min(times["interp"]) / min(times["jit"]),
        "compile_ms": compiled["reduce_shfl"],
        "rel_err": abs(total - exact) / exact,
    }
    for k, v in metrics.items():
        print(f"{k:12} {v:14.4f}")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "ptx_warp", "metrics": metrics}, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
