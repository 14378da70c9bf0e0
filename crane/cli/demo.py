"""``crane demo``: the main job on an embedded default.

Starts a craned on the simulated GPU in a temporary directory, then drives it as a guest would:
device identity, memory round trips, streams and events, a CUDA module compiled with nvcc and
loaded (its kernels' parameter layouts come back from the daemon), a kernel launch, and
``crane ps`` while the session is open; then an unmodified nvcc-built CUDA program run
through the interposer (``crane run``) against the same daemon, a Thrust program (CUB's radix
sort and reduce, as nvcc ships them), and a live migration. Everything it prints is computed,
nothing is canned.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from crane.api.results import CudaError
from crane.cli.control_client import ControlClient
from crane.cli.inventory import format_bytes
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession

__all__ = ["cmd_demo", "find_nvcc"]

DEMO_KERNEL = r"""
extern "C" __global__ void saxpy(int n, float a, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def find_nvcc() -> str | None:
    """nvcc on PATH, else the one from the pip package nvidia-cuda-nvcc."""
    found = shutil.which("nvcc")
    if found:
        return found
    try:
        import nvidia.cuda_nvcc as pkg  # type: ignore[import-not-found]
    except ImportError:
        return None
    for base in pkg.__path__:
        cand = Path(base) / "bin" / "nvcc"
        if cand.exists():
            return str(cand)
    return None


def _say(msg: str) -> None:
    print(msg, flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="crane-demo-") as tmp:
        tmpdir = Path(tmp)
        _say(f"starting craned on the simulated GPU ({args.profile}) in {tmpdir}")
        with DaemonProcess(tmpdir / "run", [f"sim:{args.profile}"]) as daemon:
            os.environ["CRANE_DAEMON"] = daemon.address
            try:
                return _run(daemon.address, tmpdir)
            finally:
                _say("\n--- craned log (last lines) ---")
                _say("\n".join(daemon.log_text().splitlines()[-12:]))


def _run(address: str, tmpdir: Path) -> int:
    t0 = time.perf_counter()
    with GuestSession(address, client="crane demo") as s:
        d = s.device
        _say(
            f"session {s.session_id}: {d.name} (sm_{d.cc[0]}{d.cc[1]}), "
            f"{format_bytes(d.total_mem)}, {len(d.attributes)} attributes, "
            f"virtual UUID {d.uuid.hex()}"
        )
        rng = np.random.default_rng()
        n = 1 << 20
        x = rng.standard_normal(n, dtype=np.float32)
        y = rng.standard_normal(n, dtype=np.float32)
        dx, dy = s.mem_alloc(x.nbytes), s.mem_alloc(y.nbytes)
        s.memcpy_htod(dx, x)
        s.memcpy_htod(dy, y)
        back = np.empty_like(x)
        s.memcpy_dtoh(dx, out=back)
        _say(
            f"round trip of {format_bytes(x.nbytes)}: "
            f"{'identical' if np.array_equal(back, x) else 'MISMATCH'}"
        )
        free, total = s.mem_get_info()
        _say(f"cuMemGetInfo: {format_bytes(free)} free of {format_bytes(total)}")

        stream = s.stream_create()
        start, end = s.event_create(), s.event_create()
        s.event_record(start, stream)
        for _ in range(1000):
            s.memset_d32(dx, 0x3F800000, n, stream)  # 1.0f
        s.event_record(end, stream)
        s.event_synchronize(end)
        _say(
            f"1000 memsets of {format_bytes(x.nbytes)} on a stream: "
            f"{s.event_elapsed(start, end):.1f} ms between events"
        )

        with ControlClient(address) as ctl:
            for info in ctl.sessions().sessions:
                _say(
                    f"crane ps: {info.id} {info.state} {format_bytes(info.mem_used)} "
                    f"{info.calls} calls, client {info.client!r}"
                )

        code = _demo_kernel(s, tmpdir, n, dx, dy, y)
    code = code or _demo_interposer(address, tmpdir)
    code = code or _demo_thrust(address, tmpdir)
    nvcc = find_nvcc()
    if code == 0 and nvcc is not None:
        from crane.cli.demo_migrate import demo_migration

        code = demo_migration(address, tmpdir, nvcc, _say)
    _say(f"demo finished in {time.perf_counter() - t0:.2f} s")
    return code


def _demo_kernel(s: GuestSession, tmpdir: Path, n: int, dx: int, dy: int, y: np.ndarray) -> int:
    nvcc = find_nvcc()
    if nvcc is None:
        _say("nvcc not found: skipping the module part (pip install nvidia-cuda-nvcc)")
        return 0
    src = tmpdir / "saxpy.cu"
    src.write_text(DEMO_KERNEL)
    fatbin = tmpdir / "saxpy.fatbin"
    subprocess.run(
        [
            nvcc,
            "-fatbin",
            "-arch=sm_90",
            "-gencode",
            "arch=compute_90,code=compute_90",
            "-o",
            str(fatbin),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    mod = s.module_load(fatbin.read_bytes())
    _say(f"module: {mod.description}")
    for k in mod.kernels.values():
        _say(
            f"  kernel {k.name}: parameters (offset, size) {list(k.params)}, {k.param_bytes} bytes"
        )
    fn = s.module_get_function(mod, "saxpy")
    try:
        s.launch(fn, ((n + 255) // 256,), (256,), [n, 2.0, dx, dy])
        s.synchronize()
    except CudaError as e:
        _say(f"launch: {e.code.name}: {e.message}")
        return 0
    out = np.empty_like(y)
    s.memcpy_dtoh(dy, out=out)
    want = np.float32(2.0) * np.ones_like(y) + y
    ok = np.array_equal(out, want)
    _say(f"saxpy on the simulated GPU: {'matches NumPy' if ok else 'MISMATCH'}")
    return 0 if ok else 1


GUEST_PROGRAM = r"""
#include <cstdio>
#include <cuda_runtime.h>
__global__ void square(const int *in, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * in[i];
}
int main() {
    const int n = 4096;
    static int h[n], r[n];
    for (int i = 0; i < n; i++) h[i] = i;
    int *din, *dout;
    cudaMalloc(&din, sizeof h); cudaMalloc(&dout, sizeof r);
    cudaMemcpy(din, h, sizeof h, cudaMemcpyHostToDevice);
    square<<<(n + 255) / 256, 256>>>(din, dout, n);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(r, dout, sizeof r, cudaMemcpyDeviceToHost);
    long long sum = 0; for (int i = 0; i < n; i++) sum += r[i];
    cudaDeviceProp p; cudaGetDeviceProperties(&p, 0);
    printf("  [guest] %s, sm_%d%d: sum of squares 0..%d = %lld (%s)\n", p.name, p.major,
           p.minor, n - 1, sum, cudaGetErrorString(e));
    cudaFree(din); cudaFree(dout);
    return e != cudaSuccess;
}
"""


def _crane_run(address: str, exe: Path) -> subprocess.CompletedProcess[str]:
    """``crane run --daemon ADDRESS -- EXE``, its output captured."""
    cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", address, "--", str(exe)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _demo_interposer(address: str, tmpdir: Path) -> int:
    """An unmodified program built by nvcc (default flags: static cudart) run with
    ``crane run``: its CUDA calls go through the guest libcuda.so.1 to the daemon."""
    from crane.interposer import library_path

    nvcc = find_nvcc()
    if nvcc is None or not library_path().exists():
        _say("interposer part skipped: needs nvcc and the built guest library (scripts/setup.sh)")
        return 0
    src = tmpdir / "square.cu"
    src.write_text(GUEST_PROGRAM)
    exe = tmpdir / "square"
    subprocess.run([nvcc, "-o", str(exe), str(src)], check=True, capture_output=True)
    _say(f"running an nvcc-built CUDA program through the interposer: crane run -- {exe.name}")
    p = _crane_run(address, exe)
    _say(p.stdout.rstrip())
    want = sum(i * i for i in range(4096))
    ok = p.returncode == 0 and f"= {want} " in p.stdout
    _say(f"guest program: {'correct' if ok else 'WRONG: ' + p.stderr[-500:]}")
    return 0 if ok else 1


THRUST_PROGRAM = r"""
#include <cstdio>
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>
#include <thrust/reduce.h>
#include <thrust/sort.h>
int main() {
    const int n = 100000;
    thrust::host_vector<unsigned> h(n);
    unsigned s = 7;
    for (int i = 0; i < n; i++) { s = s * 1664525u + 1013904223u; h[i] = s >> 8; }
    thrust::device_vector<unsigned> d = h;
    thrust::sort(d.begin(), d.end());
    unsigned long long sum = thrust::reduce(d.begin(), d.end(), 0ull);
    thrust::host_vector<unsigned> g = d;
    bool sorted = true;
    for (int i = 1; i < n; i++) sorted = sorted && g[i - 1] <= g[i];
    unsigned long long want = 0;
    for (int i = 0; i < n; i++) want += h[i];
    printf("thrust::sort of %d keys: %s; thrust::reduce %s\n", n,
           sorted ? "sorted" : "NOT SORTED", sum == want ? "matches the host" : "WRONG");
    return sorted && sum == want ? 0 : 1;
}
"""


def _demo_thrust(address: str, tmpdir: Path) -> int:
    """Thrust as nvcc ships it (CUB's radix sort and reduce) in an unmodified program."""
    nvcc = find_nvcc()
    if nvcc is None:
        return 0
    src, exe = tmpdir / "thrust_sort.cu", tmpdir / "thrust_sort"
    src.write_text(THRUST_PROGRAM)
    subprocess.run([nvcc, "-o", str(exe), str(src)], check=True, capture_output=True)
    _say(f"running a Thrust program through the interposer: crane run -- {exe.name}")
    p = _crane_run(address, exe)
    _say(p.stdout.rstrip() or p.stderr[-500:])
    return p.returncode


if __name__ == "__main__":
    sys.exit(cmd_demo(argparse.Namespace(profile="h100-80gb")))
