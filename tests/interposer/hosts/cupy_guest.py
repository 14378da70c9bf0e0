"""CuPy (the PyPI wheel, unmodified) as a guest on a simulated GPU, each result checked against
NumPy. Run under ``crane run`` on ``sim:ptx-next``: crane run sets CUPY_COMPILE_WITH_PTX=1 and
an empty CUPY_ACCELERATORS, so NVRTC hands the device PTX and reductions use CuPy's own
kernels; cuBLAS, cuFFT, cuSOLVER and the prebuilt Thrust module take their PTX paths on that
device."""

from __future__ import annotations

import os
import time

from guest_checks import check, close, finish

t0 = time.perf_counter()
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

print(f"import {time.perf_counter() - t0:.3f}", flush=True)
rng = np.random.default_rng(12)
x = rng.standard_normal(5000).astype(np.float32)


@check("environment")
def _() -> None:
    got = (os.environ.get("CUPY_COMPILE_WITH_PTX"), os.environ.get("CUPY_ACCELERATORS"))
    assert got == ("1", ""), got
    assert cp.cuda.runtime.getDeviceCount() == 1
    cc = cp.cuda.Device(0).compute_capability
    assert cc == "130", cc


@check("arange")
def _() -> None:
    close(
        cp.arange(3, 1000, 7, dtype=cp.float32).get(), np.arange(3, 1000, 7, dtype=np.float32), 0, 0
    )
    close(cp.arange(1000, dtype=cp.int64).get(), np.arange(1000, dtype=np.int64), 0, 0)


@check("elementwise")
def _() -> None:
    a = cp.asarray(x)
    close((a * 2.5 + 1).get(), x * np.float32(2.5) + 1, 1e-6, 1e-6)
    close(cp.sqrt(cp.abs(a)).get(), np.sqrt(np.abs(x)), 1e-6, 1e-6)
    close(cp.where(a > 0, a, -a).get(), np.abs(x), 0, 0)


@check("reductions")
def _() -> None:
    a = cp.asarray(x)
    close(float(a.sum()), float(x.astype(np.float64).sum()), 1e-4, 1e-3)
    close(float(a.max()), float(x.max()), 0, 0)
    close(float(a.mean()), float(x.astype(np.float64).mean()), 1e-4, 1e-6)
    m = cp.asarray(x[:4000].reshape(40, 100))
    close(m.sum(axis=1).get(), x[:4000].reshape(40, 100).sum(axis=1), 1e-5, 1e-4)


@check("elementwise_kernel")
def _() -> None:
    k = cp.ElementwiseKernel("float32 a, float32 b", "float32 z", "z = a * b + 1.0f", "crane_fma")
    a = cp.asarray(x)
    close(k(a, a).get(), x * x + 1, 1e-6, 1e-6)


@check("raw_kernel")
def _() -> None:
    src = r"""
    extern "C" __global__ void crane_rev(const float* a, float* b, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) b[n - 1 - i] = a[i] * 3.0f;
    }"""
    k = cp.RawKernel(src, "crane_rev")
    a = cp.asarray(x)
    b = cp.empty_like(a)
    k(((x.size + 255) // 256,), (256,), (a, b, cp.int32(x.size)))
    close(b.get(), x[::-1] * 3, 1e-6, 0)


@check("dot_cublas")
def _() -> None:
    m = rng.standard_normal((64, 48)).astype(np.float32)
    n = rng.standard_normal((48, 32)).astype(np.float32)
    close(cp.dot(cp.asarray(m), cp.asarray(n)).get(), m @ n, 1e-4, 1e-4)
    v = rng.standard_normal(48).astype(np.float32)
    close((cp.asarray(m) @ cp.asarray(v)).get(), m @ v, 1e-4, 1e-4)


@check("fft_cufft")
def _() -> None:
    s = x[:256] + 1j * x[256:512]
    close(cp.fft.fft(cp.asarray(s.astype(np.complex64))).get(), np.fft.fft(s), 1e-3, 1e-3)
    close(cp.fft.rfft(cp.asarray(x[:128])).get(), np.fft.rfft(x[:128]), 1e-3, 1e-3)


@check("linalg_cusolver")
def _() -> None:
    """cuSOLVER's LU (getrf/getrs): double-precision warp MMA, blocks waiting on each other."""
    m = rng.standard_normal((16, 16))
    rhs = rng.standard_normal((16, 3))
    close(
        cp.linalg.solve(cp.asarray(m), cp.asarray(rhs)).get(), np.linalg.solve(m, rhs), 1e-9, 1e-9
    )
    close(cp.linalg.inv(cp.asarray(m)).get(), np.linalg.inv(m), 1e-9, 1e-9)


@check("sort_thrust")
def _() -> None:
    close(cp.sort(cp.asarray(x)).get(), np.sort(x), 0, 0)
    ints = rng.integers(-(2**31), 2**31, 3000, dtype=np.int64).astype(np.int32)
    close(cp.sort(cp.asarray(ints)).get(), np.sort(ints), 0, 0)


finish()
