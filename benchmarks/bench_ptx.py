"""Benchmarks of the PTX interpreter (the simulated GPU's kernel executor).

Measures, in the backend (``PtxProgram.launch`` on a SimMemory, no RPC):

* thread-instructions per second on a vectorizable kernel (a long arithmetic loop, all lanes
  converged) — the interpreter's peak throughput;
* wall time of a 1M-element saxpy (target <= 0.2 s), a 512x512 float32 tiled matmul with
  shared memory (target <= 5 s), and a sum reduction of 16M floats (target <= 2 s);
* wall time of a 512x512 linear-filtered, normalized-coordinate 2D texture read (``tex.2d``
  through a texture object over a float array), checked against a NumPy bilinear reference;
* load (parse + decode) time of the benchmark module;
* the PTX compiler (``crane/backends/sim/ptx/jit``) against the interpreter and NumPy, runs
  interleaved (compiled, interpreted, NumPy, again): 1M-element saxpy, a softmax's elementwise
  ``expf`` step over 1M floats, a 16M-float sum (a
  shared-memory tree with ``__syncthreads``, one partial per block, the partials summed by
  NumPy inside the timing), the same sum as one cooperative launch (264 blocks, the
  partials summed by block 0 after ``grid.sync()``), the 512x512 tiled matmul, and the
  compile time of each kernel.
  The interpreter metrics above run with ``CRANE_PTX_JIT=0``;
* wall time of a Thrust sort of 1M unsigned keys (CUB's radix sort, as nvcc ships it) in an
  nvcc-built program run through ``crane run`` on a ``sim:h100-80gb`` daemon (the whole product
  path: interposer, wire, worker, interpreter), timed by the program around ``thrust::sort``
  and checked sorted; NumPy's sort of the same keys is the baseline.

Kernels are compiled from CUDA C with nvcc (-O3, compute_80) at start. Prints a table and
writes a JSON of metrics (``--json``, default benchmarks/results/ptx.json) so two revisions can
be compared.

    python benchmarks/bench_ptx.py [--json PATH] [--repeat N] [--quick] [--no-thrust]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from crane.api.texdesc import (  # noqa: E402
    MAGIC_TEX,
    RES_ARRAY,
    TRSF_NORMALIZED_COORDINATES,
    Level,
    TexDesc,
)
from crane.backends.sim.memory import SimMemory  # noqa: E402
from crane.backends.sim.profiles import get_profile  # noqa: E402
from crane.backends.sim.ptx import load_ptx  # noqa: E402
from crane.backends.sim.ptx.program import GRID_SYNC_BYTES  # noqa: E402

SOURCE = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

extern "C" __global__ void saxpy(int n, float a, const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

// A softmax's elementwise step: expf (libdevice's ex2.approx.ftz, cvt.sat) per element.
extern "C" __global__ void softmax_exp(const float* x, float* y, float m, float inv, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = expf(x[i] - m) * inv;
}

#define TILE 16
extern "C" __global__ void matmul(const float* A, const float* B, float* C, int n) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < n; t += TILE) {
        As[ty][tx] = A[row * n + t + tx];
        Bs[ty][tx] = B[(t + ty) * n + col];
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    C[row * n + col] = acc;
}

// Grid-stride sum, shared-memory tree, warp shuffles, one atomicAdd per block.
extern "C" __global__ void reduce(const float* in, float* out, int n) {
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
        if (lane == 0) atomicAdd(out, v);
    }
}

// Grid-stride sum, then a shared-memory tree with __syncthreads (no shuffles, no atomics):
// one partial sum per block.
extern "C" __global__ void reduce_tree(const float* in, float* partial, int n) {
    __shared__ float s[256];
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        v += in[i];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

// A cooperative reduction (cuLaunchCooperativeKernel): grid-stride sums, a block tree, one
// partial per block, grid.sync(), then block 0 sums the partials.
extern "C" __global__ void reduce_coop(const float* in, float* partial, float* out, int n) {
    __shared__ float s[256];
    cg::grid_group g = cg::this_grid();
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        v += in[i];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
    g.sync();
    if (blockIdx.x == 0) {
        v = 0.0f;
        for (int i = threadIdx.x; i < gridDim.x; i += blockDim.x) v += partial[i];
        s[threadIdx.x] = v;
        __syncthreads();
        for (int k = blockDim.x / 2; k > 0; k >>= 1) {
            if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
            __syncthreads();
        }
        if (threadIdx.x == 0) out[0] = s[0];
    }
}

// One linear-filtered, normalized-coordinate tex2D per thread (texture object).
extern "C" __global__ void texsample(cudaTextureObject_t t, float* out, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float>(t, (x + 0.25f) / w, (y + 0.75f) / h);
}

// Vectorizable: every lane runs the same long arithmetic loop.
extern "C" __global__ void spin(float* out, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float x = (float)i * 1e-3f, y = 1.0f;
    unsigned h = i;
    for (int k = 0; k < iters; ++k) {
        x = fmaf(x, 0.999f, y);
        y = y * 0.5f + 0.25f;
        h = h * 1664525u + 1013904223u;
    }
    out[i] = x + y + (float)(h & 1023);
}
"""

TARGETS = {"saxpy_1m_s": 0.2, "matmul_512_s": 5.0, "reduce_16m_s": 2.0, "tex2d_512_s": 1.0}


def find_nvcc() -> str | None:
    from crane.cli.demo import find_nvcc as find

    return find()


def compile_ptx(nvcc: str) -> str:
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "bench.cu"
        src.write_text(SOURCE)
        out = Path(d) / "bench.ptx"
        subprocess.run(
            [nvcc, "-ptx", "-O3", "-arch=compute_80", str(src), "-o", str(out)], check=True
        )
        return out.read_text()


class Bench:
    def __init__(self, prog) -> None:
        self.prog = prog
        self.mem = SimMemory(0x2000_0000_0000, 1 << 40)
        self.mem.map_chunk(0x2000_0000_0000, 512 << 20)
        self.next = 0x2000_0000_0000
        self.profile = get_profile("h100-80gb")

    def upload(self, arr: np.ndarray) -> int:
        a = self.next
        self.mem.alloc(a, arr.nbytes)
        self.mem.write(a, np.ascontiguousarray(arr).view(np.uint8).reshape(-1))
        self.next += (arr.nbytes + 255) // 256 * 256
        return a

    def read(self, addr: int, n: int, dtype) -> np.ndarray:
        return np.frombuffer(self.mem.read(addr, n * np.dtype(dtype).itemsize), dtype)

    def run(self, name: str, grid, block, *args, **launch) -> float:
        k = self.prog.kernels[name]
        buf = bytearray(k.param_bytes)
        for (off, size), a in zip(k.params, args, strict=True):
            raw = int(a).to_bytes(8, "little") if isinstance(a, int) else np.asarray(a).tobytes()
            buf[off : off + size] = raw[:size]
        t = time.perf_counter()
        self.prog.launch(
            name,
            grid=grid,
            block=block,
            params=bytes(buf),
            memory=self.mem,
            symbols={},
            profile=self.profile,
            **launch,
        )
        return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "ptx.json"))
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs per measurement")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    ap.add_argument("--no-thrust", action="store_true", help="skip the Thrust sort (a daemon)")
    ap.add_argument("--jit-only", action="store_true", help="only the compiler comparison")
    args = ap.parse_args()
    os.environ["CRANE_PTX_JIT"] = "0"  # the interpreter's own metrics; the compiler's below
    nvcc = find_nvcc()
    if nvcc is None:
        print("nvcc not found: install the CUDA toolkit or `pip install nvidia-cuda-nvcc`")
        return 2
    ptx = compile_ptx(nvcc)
    t = time.perf_counter()
    prog = load_ptx(ptx)
    load_s = time.perf_counter() - t
    b = Bench(prog)
    rng = np.random.default_rng(1)
    metrics: dict[str, float] = {"load_s": load_s}

    def best(fn) -> float:
        return min(fn() for _ in range(args.repeat))

    if not args.jit_only:
        _bench_interpreter(b, ptx, rng, metrics, best, args, nvcc)
    _bench_jit(b, rng, metrics, args.repeat, args.quick)

    where = f"{platform.machine()}, {os.cpu_count()} cores, numpy {np.__version__}"
    print(f"PTX interpreter benchmarks ({where})")
    print(f"{'metric':32} {'value':>14} {'target':>10}")
    for key, val in metrics.items():
        tgt = TARGETS.get(key)
        mark = "" if tgt is None else ("  ok" if val <= tgt else "  MISSED")
        tv = f"<= {tgt}" if tgt is not None else ""
        sci = "per_s" in key or "err" in key or "numpy_s" in key
        fmt = f"{val:14.3e}" if sci else f"{val:14.4f}"
        print(f"{key:32} {fmt} {tv:>10}{mark}")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "benchmark": "ptx",
                "quick": args.quick,
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "numpy": np.__version__,
                "python": platform.python_version(),
                "metrics": metrics,
                "targets": TARGETS,
            },
            indent=2,
        )
    )
    print(f"wrote {path}")
    return 0


def _bench_texture(b: Bench, rng, metrics: dict[str, float], best, n: int) -> None:
    """tex2D over an n x n float array: a texture object (a descriptor in device memory, as
    cuTexObjectCreate makes it) with linear filtering, normalized coordinates, clamp."""
    img = rng.random((n, n), dtype=np.float32)
    base = b.upload(img)
    desc = TexDesc(
        magic=MAGIC_TEX,
        res_type=RES_ARRAY,
        format=0x20,  # CU_AD_FORMAT_FLOAT
        channels=1,
        flags=0,
        levels=(Level(base, n * 4, n * n * 4, n, n, 1),),
        address=(1, 1, 1),  # clamp
        filter=1,  # linear
        tex_flags=TRSF_NORMALIZED_COORDINATES,
    )
    tex = b.upload(np.frombuffer(desc.pack(), np.uint8))
    out = b.upload(np.zeros((n, n), np.float32))
    grid = (n // 16, n // 16, 1)
    metrics["tex2d_512_s"] = best(
        lambda: b.run("texsample", grid, (16, 16, 1), tex, out, np.int32(n), np.int32(n))
    )
    # reference: the sample points sit at +0.25/-0.25 texel from centres; weights 0.75/0.25
    # on x and 0.25/0.75 on y are exact in the texture unit's 9-bit fixed point
    xb = np.arange(n) + 0.25 - 0.5
    yb = np.arange(n) + 0.75 - 0.5
    x0, y0 = np.floor(xb).astype(int), np.floor(yb).astype(int)
    ax, ay = xb - x0, yb - y0
    xi = [np.clip(x0, 0, n - 1), np.clip(x0 + 1, 0, n - 1)]
    yi = [np.clip(y0, 0, n - 1), np.clip(y0 + 1, 0, n - 1)]
    ref = (
        np.outer(1 - ay, 1 - ax) * img[np.ix_(yi[0], xi[0])]
        + np.outer(1 - ay, ax) * img[np.ix_(yi[0], xi[1])]
        + np.outer(ay, 1 - ax) * img[np.ix_(yi[1], xi[0])]
        + np.outer(ay, ax) * img[np.ix_(yi[1], xi[1])]
    )
    got = b.read(out, n * n, np.float32).reshape(n, n)
    metrics["tex2d_max_abs_err"] = float(np.max(np.abs(got - ref)))


THRUST_SORT = r"""
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>
#include <thrust/sort.h>
int main(int argc, char **argv) {
    int n = atoi(argv[1]), reps = atoi(argv[2]);
    thrust::host_vector<unsigned> h(n);
    unsigned s = 1;
    for (int i = 0; i < n; i++) { s = s * 1664525u + 1013904223u; h[i] = s; }
    thrust::device_vector<unsigned> warm(h.begin(), h.begin() + (n < 1024 ? n : 1024));
    thrust::sort(warm.begin(), warm.end());  // module load and JIT out of the timing
    double best = 1e30;
    bool ok = true;
    for (int r = 0; r < reps; r++) {
        thrust::device_vector<unsigned> d = h;
        cudaDeviceSynchronize();
        auto t0 = std::chrono::steady_clock::now();
        thrust::sort(d.begin(), d.end());
        cudaDeviceSynchronize();
        double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = t < best ? t : best;
        thrust::host_vector<unsigned> g = d;
        for (int i = 1; i < n; i++) ok = ok && g[i - 1] <= g[i];
    }
    printf("sort_seconds %.6f sorted %d\n", best, (int)ok);
    return ok ? 0 : 1;
}
"""


def _bench_thrust_sort(nvcc: str, metrics: dict[str, float], n: int, repeat: int) -> None:
    from crane.craned.launcher import DaemonProcess

    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "sort.cu", Path(d) / "sort"
        src.write_text(THRUST_SORT)
        cmd = [nvcc, "-O2", "-gencode", "arch=compute_80,code=compute_80", "-o", str(exe)]
        subprocess.run([*cmd, str(src)], check=True, capture_output=True)
        daemon = DaemonProcess(Path(d) / "run", ["sim:h100-80gb"])
        try:
            run = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", daemon.address]
            p = subprocess.run(
                [*run, "--", str(exe), str(n), str(repeat)],
                capture_output=True,
                text=True,
                timeout=1800,
            )
        finally:
            daemon.stop()
    fields = p.stdout.split()
    if p.returncode != 0 or "sort_seconds" not in fields or fields[-1] != "1":
        raise RuntimeError(f"thrust sort failed ({p.returncode}): {p.stdout}{p.stderr[-2000:]}")
    keys = np.random.default_rng(2).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    metrics["thrust_sort_1m_s"] = float(fields[fields.index("sort_seconds") + 1])
    metrics["sort_numpy_s"] = min(_timed(lambda: np.sort(keys)) for _ in range(repeat))
    metrics["thrust_sort_vs_numpy"] = metrics["thrust_sort_1m_s"] / metrics["sort_numpy_s"]


def _bench_interpreter(
    b: Bench, ptx: str, rng, metrics: dict[str, float], best, args, nvcc
) -> None:
    """The interpreter's own metrics (CRANE_PTX_JIT=0 for the whole process until here)."""
    # throughput: instructions executed per thread counted from the loop structure
    threads = 1 << 16 if not args.quick else 1 << 12
    iters = 200
    out = b.upload(np.zeros(threads, np.float32))
    spin_s = best(lambda: b.run("spin", (threads // 256, 1, 1), (256, 1, 1), out, np.int32(iters)))
    body = _loop_body_instructions(ptx, "spin")
    metrics["spin_threads"] = threads
    metrics["spin_s"] = spin_s
    metrics["thread_instructions_per_s"] = threads * iters * body / spin_s

    n = 1 << 20 if not args.quick else 1 << 16
    x = b.upload(rng.standard_normal(n).astype(np.float32))
    y = b.upload(rng.standard_normal(n).astype(np.float32))
    metrics["saxpy_1m_s"] = best(
        lambda: b.run(
            "saxpy", ((n + 255) // 256, 1, 1), (256, 1, 1), np.int32(n), np.float32(2.0), x, y
        )
    )

    # baselines measured in the same run: the same computation done directly by NumPy
    hx, hy = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    metrics["saxpy_numpy_s"] = best(lambda: _timed(lambda: np.float32(2.0) * hx + hy))
    metrics["saxpy_vs_numpy"] = metrics["saxpy_1m_s"] / metrics["saxpy_numpy_s"]

    m = 512 if not args.quick else 64
    A = rng.standard_normal((m, m)).astype(np.float32)
    B = rng.standard_normal((m, m)).astype(np.float32)
    pa, pb, pc = b.upload(A), b.upload(B), b.upload(np.zeros((m, m), np.float32))
    metrics["matmul_512_s"] = best(
        lambda: b.run("matmul", (m // 16, m // 16, 1), (16, 16, 1), pa, pb, pc, np.int32(m))
    )
    got = b.read(pc, m * m, np.float32).reshape(m, m)
    metrics["matmul_numpy_s"] = best(lambda: _timed(lambda: A @ B))
    metrics["matmul_vs_numpy"] = metrics["matmul_512_s"] / metrics["matmul_numpy_s"]
    metrics["matmul_max_rel_err"] = float(
        np.max(np.abs(got - A.astype(np.float64) @ B)) / np.max(np.abs(A.astype(np.float64) @ B))
    )

    r = 1 << 24 if not args.quick else 1 << 18
    data = rng.random(r, dtype=np.float32)
    pin = b.upload(data)
    pout = b.upload(np.zeros(1, np.float32))

    def red() -> float:
        b.mem.write(pout, np.zeros(1, np.float32).view(np.uint8))
        return b.run("reduce", (1024, 1, 1), (256, 1, 1), pin, pout, np.int32(r))

    metrics["reduce_16m_s"] = best(red)
    metrics["reduce_numpy_s"] = best(lambda: _timed(lambda: data.sum()))
    metrics["reduce_vs_numpy"] = metrics["reduce_16m_s"] / metrics["reduce_numpy_s"]
    total = float(b.read(pout, 1, np.float32)[0])
    metrics["reduce_rel_err"] = abs(total - float(data.astype(np.float64).sum())) / float(
        data.astype(np.float64).sum()
    )

    _bench_texture(b, rng, metrics, best, 512 if not args.quick else 64)
    if not args.no_thrust:
        _bench_thrust_sort(nvcc, metrics, (1 << 20) if not args.quick else (1 << 14), args.repeat)


def _bench_jit(b: Bench, rng, metrics: dict[str, float], repeat: int, quick: bool) -> None:
    """Compiled vs interpreted vs NumPy on the same data, in ``repeat`` rounds that interleave
    the three (so load on the machine hits all alike); in a round the compiled kernel and
    NumPy run twice and the second run is timed (warm caches: the interpreter's run before
    evicts them), the interpreter once. Each path's best round. The compiled and the
    interpreted kernel must leave the same bytes (checked in every round)."""
    from crane.backends.sim.ptx import jit

    jit.COMPILE_MIN_LANES = 1  # compiled from the first launch, whatever the size (--quick)
    os.environ["CRANE_PTX_JIT_CACHE"] = "0"  # compile times measured, not disk-cache loads
    n = 1 << 20 if not quick else 1 << 16
    hx = rng.standard_normal(n).astype(np.float32)
    hy = rng.standard_normal(n).astype(np.float32)
    x, y = b.upload(hx), b.upload(hy)

    def saxpy() -> float:
        b.mem.write(y, hy.view(np.uint8))
        g = ((n + 255) // 256, 1, 1)
        return b.run("saxpy", g, (256, 1, 1), np.int32(n), np.float32(2.0), x, y)

    ex = b.upload(np.zeros(n, np.float32))

    def softmax_exp() -> float:
        g = ((n + 255) // 256, 1, 1)
        args = (x, ex, np.float32(0.5), np.float32(0.25), np.int32(n))
        return b.run("softmax_exp", g, (256, 1, 1), *args)

    r = 1 << 24 if not quick else 1 << 18
    data = rng.random(r, dtype=np.float32)
    pin, part = b.upload(data), b.upload(np.zeros(1024, np.float32))

    def reduce_tree() -> float:
        t = b.run("reduce_tree", (1024, 1, 1), (256, 1, 1), pin, part, np.int32(r))
        t0 = time.perf_counter()
        b.read(part, 1024, np.float32).sum(dtype=np.float32)
        return t + time.perf_counter() - t0

    coop_blocks = 264  # 2 blocks of 256 threads on each of the h100 profile's 132 SMs
    cpart, cout = b.upload(np.zeros(coop_blocks, np.float32)), b.upload(np.zeros(1, np.float32))
    ws = b.upload(np.zeros(GRID_SYNC_BYTES, np.uint8))

    def reduce_coop() -> float:
        args = (pin, cpart, cout, np.int32(r))
        coop = {"cooperative": True, "grid_workspace": ws}
        return b.run("reduce_coop", (coop_blocks, 1, 1), (256, 1, 1), *args, **coop)

    m = 512 if not quick else 64
    A = rng.standard_normal((m, m)).astype(np.float32)
    B = rng.standard_normal((m, m)).astype(np.float32)
    pa, pb, pc = b.upload(A), b.upload(B), b.upload(np.zeros((m, m), np.float32))

    def matmul() -> float:
        return b.run("matmul", (m // 16, m // 16, 1), (16, 16, 1), pa, pb, pc, np.int32(m))

    cases = (
        ("saxpy_1m", saxpy, lambda: np.float32(2.0) * hx + hy, (y, n * 4)),
        (
            "softmax_exp_1m",
            softmax_exp,
            lambda: np.exp(hx - np.float32(0.5)) * np.float32(0.25),
            (ex, n * 4),
        ),
        ("reduce_16m", reduce_tree, lambda: data.sum(), (part, 1024 * 4)),
        ("reduce_coop_16m", reduce_coop, lambda: data.sum(), (cout, 4)),
        ("matmul_512", matmul, lambda: A @ B, (pc, m * m * 4)),
    )
    for name, run, ref, (out, size) in cases:
        times: dict[str, list[float]] = {"jit": [], "interp": [], "numpy": []}
        for _ in range(repeat):  # rounds interleave the paths; each path timed warm
            os.environ["CRANE_PTX_JIT"] = "1"
            run()
            times["jit"].append(run())
            got = b.mem.read(out, size)
            os.environ["CRANE_PTX_JIT"] = "0"
            times["interp"].append(run())
            if b.mem.read(out, size) != got:
                raise SystemExit(f"{name}: compiled and interpreted results differ")
            _timed(ref)
            times["numpy"].append(_timed(ref))
        jit_s, int_s, np_s = (min(times[k]) for k in ("jit", "interp", "numpy"))
        metrics[f"jit_{name}_s"] = jit_s
        metrics[f"jit_{name}_interp_s"] = int_s
        metrics[f"jit_{name}_numpy_s"] = np_s
        metrics[f"jit_{name}_vs_numpy"] = jit_s / np_s
        metrics[f"jit_{name}_speedup_vs_interp"] = int_s / jit_s
    os.environ["CRANE_PTX_JIT"] = "1"
    compiled = dict(jit.stats()["compiled"])
    for k in ("saxpy", "softmax_exp", "reduce_tree", "reduce_coop", "matmul"):
        if k not in compiled:
            raise SystemExit(f"the PTX compiler did not take {k}: {jit.stats()['refused']}")
        metrics[f"jit_compile_{k}_ms"] = compiled[k]


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _loop_body_instructions(ptx: str, kernel: str) -> int:
    """Instructions in the kernel's innermost loop (between its label and the back branch)."""
    body = ptx.split(f".entry {kernel}(", 1)[1].split("\n}", 1)[0]
    lines = [ln.strip() for ln in body.splitlines()]
    labels = {ln[:-1]: i for i, ln in enumerate(lines) if ln.endswith(":")}
    for i, ln in enumerate(lines):
        if " bra" in f" {ln}" and ln.split()[-1].rstrip(";") in labels:
            start = labels[ln.split()[-1].rstrip(";")]
            if start < i:
                return sum(
                    1
                    for x in lines[start + 1 : i + 1]
                    if x and not x.endswith(":") and not x.startswith(("//", "."))
                )
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
