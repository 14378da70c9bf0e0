"""CuPy on a real GPU, unmodified: elementwise, reductions, RawKernel, cuBLAS (``cp.dot``),
cuFFT, sort; every result checked against NumPy in the script itself. Prints one ``name ok``
line per check (``name FAIL why`` otherwise) and exits 1 if any failed; the GPU suite runs it
natively and through ``crane run`` and compares the two outputs."""

from __future__ import annotations

import sys

import cupy as cp
import numpy as np

rng = np.random.default_rng(5)
x = rng.standard_normal(1 << 20).astype(np.float32)
a = rng.standard_normal((256, 192)).astype(np.float32)
b = rng.standard_normal((192, 128)).astype(np.float32)
failed = 0


def check(
    name: str, got: np.ndarray, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-5
) -> None:
    global failed
    ok = got.shape == want.shape and np.allclose(got, want, rtol=rtol, atol=atol)
    print(f"{name} {'ok' if ok else 'FAIL'}", flush=True)
    failed += not ok


dx = cp.asarray(x)
check("elementwise", (dx * 2.5 + cp.sin(dx)).get(), x * np.float32(2.5) + np.sin(x))
check(
    "sum", cp.asarray(dx.sum()).get(), np.asarray(x.sum(dtype=np.float64), np.float32), 1e-4, 1e-2
)
check("max", cp.asarray(dx.max()).get(), np.asarray(x.max()))
add = cp.RawKernel(
    r'extern "C" __global__ void add(const float *a, float *o, int n) {'
    r" int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) o[i] = a[i] + i; }",
    "add",
)
out = cp.empty_like(dx)
add(((x.size + 255) // 256,), (256,), (dx, out, cp.int32(x.size)))
check("rawkernel", out.get(), x + np.arange(x.size, dtype=np.float32))
check("dot", cp.dot(cp.asarray(a), cp.asarray(b)).get(), a @ b, 1e-4, 1e-4)
check("fft", cp.fft.fft(cp.asarray(x[:4096])).get(), np.fft.fft(x[:4096]), 1e-3, 1e-2)
check("sort", cp.sort(dx).get(), np.sort(x), 0, 0)
cp.cuda.Device().synchronize()
sys.exit(1 if failed else 0)
