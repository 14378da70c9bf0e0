"""Kernels executed by the simulated GPU through a real daemon: results, device printf reaching
the guest's stdout, faults that are sticky for the session while other sessions carry on."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession

KERNELS = r"""
#include <cstdio>
extern "C" __global__ void axpy(int n, float a, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void block_sum(const int *in, int *out, int n)
{
    __shared__ int part[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    part[threadIdx.x] = i < n ? in[i] : 0;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}
extern "C" __global__ void hello(int tag)
{
    if (threadIdx.x < 2) printf("hello %d from thread %d\n", tag, threadIdx.x);
}
extern "C" __global__ void wild_write(int *p)
{
    p[threadIdx.x + (1 << 24)] = 1;
}
"""


@pytest.fixture
def module(session: GuestSession, cuda_build):  # type: ignore[no-untyped-def]
    return session.module_load(
        cuda_build(
            KERNELS,
            "-fatbin",
            "-arch=sm_90",
            "-gencode",
            "arch=compute_90,code=compute_90",
            suffix=".fatbin",
        ).read_bytes()
    )


@pytest.mark.parametrize("n", [1, 1000, 65_537])
def test_axpy_matches_numpy(session: GuestSession, module, n: int) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    dx, dy = session.mem_alloc(x.nbytes), session.mem_alloc(y.nbytes)
    session.memcpy_htod(dx, x)
    session.memcpy_htod(dy, y)
    fn = session.module_get_function(module, "axpy")
    session.launch(fn, ((n + 127) // 128,), (128,), [n, 1.5, dx, dy])
    out = np.frombuffer(session.memcpy_dtoh(dy, y.nbytes), np.float32)
    # nvcc contracts a*x+y into one fma (rounded once): compare with the exact result rounded to
    # float32 (the float64 product of two floats is exact; 1 ulp allows for double rounding)
    ref = (1.5 * x.astype(np.float64) + y.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_max_ulp(out, ref, maxulp=1)


def test_shared_memory_barriers_and_atomics(session: GuestSession, module) -> None:  # type: ignore[no-untyped-def]
    n = 10_000
    data = np.random.default_rng(1).integers(-1000, 1000, n, dtype=np.int32)
    d_in, d_out = session.mem_alloc(data.nbytes), session.mem_alloc(4)
    session.memcpy_htod(d_in, data)
    session.memset_d32(d_out, 0, 1)
    fn = session.module_get_function(module, "block_sum")
    session.launch(fn, ((n + 255) // 256,), (256,), [d_in, d_out, n])
    assert int(np.frombuffer(session.memcpy_dtoh(d_out, 4), np.int32)[0]) == int(data.sum())


def test_device_printf_reaches_the_guest_stdout(daemon: DaemonProcess, cuda_build) -> None:  # type: ignore[no-untyped-def]
    fatbin = cuda_build(
        KERNELS,
        "-fatbin",
        "-arch=sm_90",
        "-gencode",
        "arch=compute_90,code=compute_90",
        suffix=".fatbin",
    )
    guest = textwrap.dedent(f"""
        from crane.guest.session import GuestSession
        with GuestSession({daemon.address!r}) as s:
            mod = s.module_load(open({str(fatbin)!r}, "rb").read())
            s.launch(s.module_get_function(mod, "hello"), (1,), (32,), [7])
            s.synchronize()
            print("after sync", flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", guest], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "hello 7 from thread 0",
        "hello 7 from thread 1",
        "after sync",
    ]


def test_fault_is_sticky_and_isolated(daemon: DaemonProcess, session: GuestSession, module) -> None:  # type: ignore[no-untyped-def]
    p = session.mem_alloc(4096)
    session.launch(session.module_get_function(module, "wild_write"), (1,), (32,), [p])
    with pytest.raises(CudaError) as e:
        session.synchronize()
    assert e.value.code == CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    for _ in range(2):  # sticky: every later call reports it
        with pytest.raises(CudaError) as e:
            session.memcpy_dtoh(p, 4)
        assert e.value.code == CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    assert "ILLEGAL_ADDRESS" in daemon.log_text()
    with GuestSession(daemon.address) as other:  # the daemon and other sessions carry on
        q = other.mem_alloc(4)
        other.memcpy_htod(q, b"fine")
        assert other.memcpy_dtoh(q, 4) == b"fine"
    # destroying the context (cudaDeviceReset) clears the fault
    session.ctx_destroy(session.primary_context)
    session.primary_context = session.ctx_create()
    p2 = session.mem_alloc(4)
    session.memcpy_htod(p2, b"back")
    assert session.memcpy_dtoh(p2, 4) == b"back"
