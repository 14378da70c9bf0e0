"""Conformance checks of the cuda backend, each run in its own process by test_cuda_backend.py.

``python -m tests.backends.cuda_checks NAME FATBIN`` runs one check against whatever
``libcuda.so.1`` cuda-python loads: the NVIDIA driver on a GPU host, or, on a machine without a
GPU, Crane's own interposer in front of a daemon on the simulated GPU (the test sets
``LD_LIBRARY_PATH`` and ``CRANE_DAEMON``). Either way every driver call of the backend goes
through cuda-python's real bindings with real argument conversion, which is what can be checked
without hardware. Prints ``OK`` on success; any failure is an exception with a traceback.
"""

from __future__ import annotations

import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.backends.cuda import driver
from crane.backends.cuda.backend import CudaBackend
from crane.backends.cuda.device import device_snapshot
from crane.device.ledger import Ledger
from crane.modules.image import inspect_image

#: Kernels of the checks (built by the test with nvcc: sm_90 code and PTX).
SOURCE = r"""
#include <cstdio>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

__device__ int counter[4] = {1, 2, 3, 4};

extern "C" __global__ void axpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void bump(int by) { counter[threadIdx.x] += by; }
extern "C" __global__ void hello(int v) {
    if (threadIdx.x == 0) printf("hello from the GPU %d\n", v);
}
extern "C" __global__ void reverse(int *d, int n) {
    extern __shared__ int s[];
    int t = threadIdx.x;
    s[t] = d[t];
    __syncthreads();
    d[t] = s[n - t - 1];
}
extern "C" __global__ void grid_total(const int *in, int *out, int n) {
    cg::grid_group g = cg::this_grid();
    for (int i = g.thread_rank(); i < n; i += g.size()) atomicAdd(&out[0], in[i]);
    g.sync();
    if (g.thread_rank() == 0) out[1] = out[0] * 2;
}
extern "C" __global__ void wild(int *p) { p[1 << 28] = 1; }
"""

CHUNK = 2 << 20
WINDOW = 128 << 30  # the session keeps the top 64 GiB for the simulator's module variables


def _window(drv) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """A free range of this process's device VA space to use as the session window."""
    base = int(driver.check("cuMemAddressReserve", drv.cuMemAddressReserve(WINDOW, CHUNK, 0, 0)))
    driver.check("cuMemAddressFree", drv.cuMemAddressFree(base, WINDOW))
    return base, WINDOW


def make_backend(tmp: Path, window: tuple[int, int] | None = None) -> CudaBackend:
    drv = driver.load()
    driver.check("cuInit", drv.cuInit(0))
    snap = device_snapshot(drv, 0, b"\x01" * 16)
    ledger = Ledger(tmp / "ledger", snap.total_mem)
    return CudaBackend(drv, 0, snap, window or _window(drv), ledger, 0)


def _alloc(b: CudaBackend, size: int) -> int:
    ends = [a + n for a, (n, _) in b.window.chunks.items()]
    addr = max(ends, default=b.window.base) + CHUNK  # a gap between chunks: overruns fault
    b.map_chunk(addr, max(CHUNK, -(-size // CHUNK) * CHUNK))
    b.mem_alloc(addr, size)
    return addr


def _module(b: CudaBackend, fatbin: Path):  # type: ignore[no-untyped-def]
    data = fatbin.read_bytes()
    image = inspect_image(data, b.snapshot.cc)
    return b.module_load(image, lambda n: 0, data=data)


def check_identity(b: CudaBackend, fatbin: Path) -> None:
    s = b.snapshot
    assert s.name and s.total_mem > 0 and s.cc >= (7, 0), s
    assert len(s.uuid) == 16 and s.profile == f"cuda:{s.name}"
    free, total = b.mem_info()
    assert 0 < free <= total


def check_memory(b: CudaBackend, fatbin: Path) -> None:
    stream = b.stream_create(0, 0)
    n = 11 << 20  # larger than a staging slot: goes through the ring in pieces
    a, c = _alloc(b, n), _alloc(b, n)
    data = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8).tobytes()
    b.memcpy_htod(a, data, stream)
    assert bytes(b.memcpy_dtoh(a, n, stream)) == data
    assert bytes(b.memcpy_dtoh(a + 100, 1000, stream)) == data[100:1100]
    b.memcpy_dtod(c, a, n, stream)
    assert bytes(b.memcpy_dtoh(c + n - 4096, 4096, stream)) == data[-4096:]
    b.memset(c, 0xAB, 1, 16, stream)
    b.memset(c + 16, 0xBEEF, 2, 8, stream)
    b.memset(c + 32, 0xDEADBEEF, 4, 4, stream)
    got = bytes(b.memcpy_dtoh(c, 48, stream))
    assert got == b"\xab" * 16 + b"\xef\xbe" * 8 + b"\xef\xbe\xad\xde" * 4, got.hex()
    b.stream_synchronize(stream)
    b.stream_destroy(stream)
    used = b.ledger.slot_bytes(0)
    b.unmap_chunk(a)
    assert b.ledger.slot_bytes(0) < used


def check_window_refusals(b: CudaBackend, fatbin: Path) -> None:
    for addr, size in ((b.window.base + 4096, CHUNK), (b.window.base - CHUNK, CHUNK)):
        try:
            b.map_chunk(addr, size)
        except CudaError as e:
            assert e.code == CUresult.CUDA_ERROR_INVALID_VALUE, e
        else:
            raise AssertionError(f"mapped {addr:#x}")
    assert b.ledger.slot_bytes(0) == 0, "a refused chunk stayed charged"


def check_streams_events(b: CudaBackend, fatbin: Path) -> None:
    s1, s2 = b.stream_create(1, -1), b.stream_create(0, 0)
    e1, e2, timing_off = b.event_create(0), b.event_create(0), b.event_create(2)
    b.event_record(e1, s1)
    buf = _alloc(b, 1 << 20)
    b.memset(buf, 7, 4, 1 << 18, s1)
    b.event_record(e2, s1)
    b.stream_wait_event(s2, e2, 0)
    b.event_synchronize(e2)
    assert b.event_query(e2) and b.stream_query(s1)
    assert b.event_elapsed(e1, e2) >= 0.0
    b.event_record(timing_off, s1)
    b.event_synchronize(timing_off)
    try:
        b.event_elapsed(e1, timing_off)
    except CudaError as e:
        assert e.code == CUresult.CUDA_ERROR_INVALID_HANDLE, e
    else:
        raise AssertionError("elapsed time of a DISABLE_TIMING event")
    for ev in (e1, e2, timing_off):
        b.event_destroy(ev)
    b.synchronize()
    b.stream_destroy(s1)
    b.stream_destroy(s2)


def check_launch(b: CudaBackend, fatbin: Path) -> None:
    mod = _module(b, fatbin)
    stream = b.stream_create(0, 0)
    n = 1000
    x, y = _alloc(b, 4 * n), _alloc(b, 4 * n)
    xs, ys = np.arange(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    b.memcpy_htod(x, xs.tobytes(), stream)
    b.memcpy_htod(y, ys.tobytes(), stream)
    params = struct.pack("<f4xQQi4x", 3.0, x, y, n)
    b.launch(mod, "axpy", (4, 1, 1), (256, 1, 1), 0, stream, params)
    got = np.frombuffer(bytes(b.memcpy_dtoh(y, 4 * n, stream)), np.float32)
    assert np.array_equal(got, 3.0 * xs + ys)
    # dynamic shared memory above the default 48 KiB needs the raised limit
    d = _alloc(b, 4 * 256)
    b.memcpy_htod(d, np.arange(256, dtype=np.int32).tobytes(), stream)
    b.launch(
        mod,
        "reverse",
        (1, 1, 1),
        (256, 1, 1),
        64 << 10,
        stream,
        struct.pack("<Qi4x", d, 256),
        max_dynamic_shared=64 << 10,
    )
    got = np.frombuffer(bytes(b.memcpy_dtoh(d, 4 * 256, stream)), np.int32)
    assert np.array_equal(got, np.arange(255, -1, -1, dtype=np.int32))
    # cooperative launch with a grid-wide barrier
    data, out = _alloc(b, 4 * 4096), _alloc(b, 8)
    b.memcpy_htod(data, np.ones(4096, dtype=np.int32).tobytes(), stream)
    b.memset(out, 0, 4, 2, stream)
    params = struct.pack("<QQi4x", data, out, 4096)
    b.launch(mod, "grid_total", (4, 1, 1), (128, 1, 1), 0, stream, params, cooperative=True)
    assert struct.unpack("<ii", bytes(b.memcpy_dtoh(out, 8, stream))) == (4096, 8192)
    b.module_unload(mod)


def check_globals_and_alias(b: CudaBackend, fatbin: Path) -> None:
    mod = _module(b, fatbin)
    stream = b.stream_create(0, 0)
    g = mod.globals["counter"]
    assert g.size == 16
    assert struct.unpack("<4i", bytes(b.memcpy_dtoh(g.addr, 16, stream))) == (1, 2, 3, 4)
    b.launch(mod, "bump", (1, 1, 1), (4, 1, 1), 0, stream, struct.pack("<i", 10))
    assert struct.unpack("<4i", bytes(b.memcpy_dtoh(g.addr, 16, stream))) == (11, 12, 13, 14)
    # a restore told the guest another address for the variable: copies follow the alias
    told = 0x7000_0000_0000
    b.alias_global(told, g.addr, g.size)
    b.memcpy_htod(told + 4, struct.pack("<i", 99), stream)
    assert struct.unpack("<4i", bytes(b.memcpy_dtoh(told, 16, stream))) == (11, 99, 13, 14)
    b.module_unload(mod)


def check_printf(b: CudaBackend, fatbin: Path) -> None:
    mod = _module(b, fatbin)
    stream = b.stream_create(0, 0)
    b.launch(mod, "hello", (1, 1, 1), (32, 1, 1), 0, stream, struct.pack("<i", 42))
    b.stream_synchronize(stream)
    out = b.take_stdout()
    assert out == b"hello from the GPU 42\n", out


def check_fault_is_reported(b: CudaBackend, fatbin: Path) -> None:
    mod = _module(b, fatbin)
    stream = b.stream_create(0, 0)
    p = _alloc(b, 4)
    b.launch(mod, "wild", (1, 1, 1), (1, 1, 1), 0, stream, struct.pack("<Q", p))
    try:
        b.stream_synchronize(stream)
    except CudaError as e:
        assert e.code in (
            CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,
            CUresult.CUDA_ERROR_INVALID_VALUE,
        ), e
    else:
        raise AssertionError("a wild store went unreported")


def check_bad_module(b: CudaBackend, fatbin: Path) -> None:
    ptx = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() { bogus; }\n"
    try:
        image = inspect_image(ptx.encode(), b.snapshot.cc)
        b.module_load(image, lambda n: 0, data=ptx.encode())
    except CudaError as e:  # the driver's JIT log names the bad instruction
        assert e.code == CUresult.CUDA_ERROR_INVALID_PTX, e
        assert "bogus" in e.message, e.message
    else:
        raise AssertionError("a module with an unknown instruction loaded")


def check_checkpoint_roundtrip(b: CudaBackend, fatbin: Path) -> None:
    """Through the worker's engine and the checkpoint format: a session written from one
    backend and restored onto a second one (a new worker's) reads back the same memory and
    module variables, at the addresses the guest was told."""
    import hashlib

    from crane.engine.engine import Engine
    from crane.modules.store import ImageStore
    from crane.state.park import restore_checkpoint, write_checkpoint

    tmp = Path(tempfile.mkdtemp())
    cache = tmp / "modules"
    cache.mkdir()
    window = (b.window.base, b.window.size)
    eng = Engine.create(b, "s1", window, ImageStore(cache))
    ex = eng.device
    ctx = 1
    ex.ctx_create(ctx, 0)
    data = fatbin.read_bytes()
    digest = hashlib.sha256(data).digest()
    ex.module_load(ctx, 0x100, digest, data)
    ex.mem_map_chunk(window[0], CHUNK)
    ex.mem_alloc(ctx, window[0], 4096)
    payload = bytes(range(256)) * 16
    ex.memcpy_htod(window[0], 0, payload)
    told = ex.modules.get(0x100).obj.globals["counter"]
    ex.memcpy_htod(told.addr, 0, struct.pack("<4i", 5, 6, 7, 8))
    path = tmp / "s.ckpt"
    with path.open("wb") as f:
        write_checkpoint(ex, eng.log, f, {"id": "s1"})
    b.close()
    b2 = make_backend(tmp, window)
    eng2 = Engine.create(b2, "s1", window, ImageStore(cache))
    ex2 = eng2.device
    with path.open("rb") as f:
        restore_checkpoint(ex2, eng2.log, f, "s1")
    assert bytes(ex2.memcpy_dtoh(window[0], 4096, 0)) == payload
    g = ex2.modules.get(0x100).obj.globals["counter"]
    assert g.addr == told.addr, "the guest's address of a module variable changed"
    assert struct.unpack("<4i", bytes(ex2.memcpy_dtoh(g.addr, 16, 0))) == (5, 6, 7, 8)
    b2.close()


CHECKS: dict[str, Callable[[CudaBackend, Path], None]] = {
    name[len("check_") :]: fn for name, fn in globals().items() if name.startswith("check_")
}


def main(argv: list[str]) -> int:
    name, fatbin = argv[0], Path(argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        backend = make_backend(Path(tmp))
        try:
            CHECKS[name](backend, fatbin)
        finally:
            if backend.staging.slots:  # not closed by the check itself
                backend.close()
    print("OK", file=sys.stderr)  # fd 1 is the backend's device-printf pipe
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
