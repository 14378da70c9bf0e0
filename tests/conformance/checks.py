"""The backend conformance suite: one set of checks every backend must pass.

``python -m tests.conformance.checks KIND NAME FATBIN`` runs check ``NAME`` against a fresh
backend of ``KIND`` in its own process (test_backends.py runs them all):

* ``sim``: the simulated GPU;
* ``cuda``: the cuda backend over whatever ``libcuda.so.1`` cuda-python loads: the NVIDIA
  driver on a GPU host or, on a machine without one, Crane's own interposer in front of a
  daemon on the simulated H100 (the test sets ``LD_LIBRARY_PATH`` and ``CRANE_DAEMON``), so
  every driver call of the backend goes through cuda-python's real bindings with real argument
  conversion.

A check drives the :class:`~crane.backends.base.Backend` interface only, through a
:class:`Rig` (the backend, its VA window, and where to put the next allocation); a few look at
what one backend alone has (say which in ``ONLY``). Prints ``OK`` on success; any failure is an
exception with a traceback. Each runs in its own process because the cuda backend captures
device printf from fd 1 and holds a CUDA context, and a fresh process is what a session gets.
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
from crane.backends.base import Backend, LoadedModule
from crane.device.layout import CHUNK_GRANULARITY as CHUNK
from crane.device.layout import window_base
from crane.engine.model import ModuleArea
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
extern "C" __global__ void cluster_swap(int *out) {
    __shared__ int s;
    cg::cluster_group cl = cg::this_cluster();
    if (threadIdx.x == 0) s = blockIdx.x * 10 + 1;
    cl.sync();
    int *peer = cl.map_shared_rank(&s, cl.block_rank() ^ 1);
    if (threadIdx.x == 0) out[blockIdx.x] = *peer;
    cl.sync();
}
"""

WINDOW = 128 << 30  # room for the checks' allocations and the module area (top 64 GiB)
SIM_WINDOW = (window_base(7), WINDOW)
SLOT = 0  # the ledger slot the checks' backends charge

KINDS = ("sim", "cuda")


def _cuda_window(drv) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """A free range of this process's device VA space to use as the session window."""
    from crane.backends.cuda import driver

    base = int(driver.unwrap("cuMemAddressReserve", drv.cuMemAddressReserve(WINDOW, CHUNK, 0, 0)))
    driver.unwrap("cuMemAddressFree", drv.cuMemAddressFree(base, WINDOW))
    return base, WINDOW


def make_backend(kind: str, tmp: Path, window: tuple[int, int] | None = None) -> Backend:
    """A fresh backend of ``kind`` for one session; ``window``: a given one (a restore's)."""
    if kind == "sim":
        from crane.backends.catalog import builtin_model
        from crane.backends.sim.backend import SimBackend
        from crane.device.ledger import Ledger

        model = builtin_model("h100-80gb")
        ledger = Ledger(tmp / "ledger", model.total_mem)
        window = window or SIM_WINDOW
        return SimBackend(model, model.snapshot(b"\x01" * 16), window, ledger, SLOT)
    from crane.backends.cuda import driver
    from crane.backends.cuda.backend import CudaBackend
    from crane.backends.cuda.device import device_snapshot
    from crane.device.ledger import Ledger

    drv = driver.load()
    driver.unwrap("cuInit", drv.cuInit(0))
    snap = device_snapshot(drv, 0, b"\x01" * 16)
    ledger = Ledger(tmp / "ledger", snap.total_mem)
    return CudaBackend(drv, 0, snap, window or _cuda_window(drv), ledger, SLOT)


class Rig:
    """A backend under test, its window, and a bump allocator over the window."""

    def __init__(self, kind: str, backend: Backend, tmp: Path) -> None:
        self.kind, self.b, self.tmp = kind, backend, tmp
        cuda_window = getattr(backend, "window", None)  # the cuda backend's reservation
        window = (cuda_window.base, cuda_window.size) if cuda_window is not None else SIM_WINDOW
        self.window = window
        self.closed = False  # the check closed the backend itself
        self.next = window[0]
        self.area = ModuleArea(window)

    def alloc(self, size: int) -> int:
        """A fresh allocation in chunks of its own, with an unmapped chunk before it (so an
        overrun faults rather than landing in a neighbour)."""
        addr = self.next + CHUNK
        span = max(CHUNK, -(-size // CHUNK) * CHUNK)
        self.b.map_chunk(addr, span)
        self.b.mem_alloc(addr, size)
        self.next = addr + span
        return addr

    def module(self, fatbin: Path) -> LoadedModule:
        data = fatbin.read_bytes()
        image = inspect_image(data, self.b.snapshot.cc)
        return self.b.module_load(image, lambda n: self.area.place(self.b, n), data=data)


def _expect_cuda_error(codes: tuple[CUresult, ...], what: str, fn: Callable[[], object]) -> None:
    try:
        fn()
    except CudaError as e:
        assert e.code in codes, e
    else:
        raise AssertionError(what)


def check_identity(r: Rig, fatbin: Path) -> None:
    s = r.b.snapshot
    assert s.name and s.total_mem > 0 and s.cc >= (7, 0), s
    assert len(s.uuid) == 16 and s.profile
    if r.kind == "cuda":
        assert s.profile == f"cuda:{s.name}"
    free, total = r.b.mem_info()
    assert 0 < free <= total


def check_memory(r: Rig, fatbin: Path) -> None:
    b = r.b
    stream = b.stream_create(0, 0)
    n = 11 << 20  # larger than a staging slot of the cuda backend: goes through it in pieces
    a, c = r.alloc(n), r.alloc(n)
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
    used = b.ledger.slot_bytes(SLOT)  # type: ignore[attr-defined]
    b.mem_free(a)
    b.unmap_chunk(a)
    assert b.ledger.slot_bytes(SLOT) < used  # type: ignore[attr-defined]


def check_window_refusals(r: Rig, fatbin: Path) -> None:
    b, base = r.b, r.window[0]
    for addr in (base + 4096, base - CHUNK):  # misaligned; outside the window
        refused = (CUresult.CUDA_ERROR_INVALID_VALUE,)
        _expect_cuda_error(refused, f"mapped {addr:#x}", lambda a=addr: b.map_chunk(a, CHUNK))
    charged = b.ledger.slot_bytes(SLOT)  # type: ignore[attr-defined]
    assert charged == 0, "a refused chunk stayed charged"


def check_streams_events(r: Rig, fatbin: Path) -> None:
    b = r.b
    s1, s2 = b.stream_create(1, -1), b.stream_create(0, 0)
    e1, e2, timing_off = b.event_create(0), b.event_create(0), b.event_create(2)
    b.event_record(e1, s1)
    buf = r.alloc(1 << 20)
    b.memset(buf, 7, 4, 1 << 18, s1)
    b.event_record(e2, s1)
    b.stream_wait_event(s2, e2, 0)
    b.event_synchronize(e2)
    assert b.event_query(e2) and b.stream_query(s1)
    assert b.event_elapsed(e1, e2) >= 0.0
    b.event_record(timing_off, s1)
    b.event_synchronize(timing_off)
    _expect_cuda_error(
        (CUresult.CUDA_ERROR_INVALID_HANDLE,),
        "elapsed time of a DISABLE_TIMING event",
        lambda: b.event_elapsed(e1, timing_off),
    )
    for ev in (e1, e2, timing_off):
        b.event_destroy(ev)
    b.synchronize()
    b.stream_destroy(s1)
    b.stream_destroy(s2)


def check_launch(r: Rig, fatbin: Path) -> None:
    b = r.b
    mod = r.module(fatbin)
    stream = b.stream_create(0, 0)
    n = 1000
    x, y = r.alloc(4 * n), r.alloc(4 * n)
    xs, ys = np.arange(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    b.memcpy_htod(x, xs.tobytes(), stream)
    b.memcpy_htod(y, ys.tobytes(), stream)
    params = struct.pack("<f4xQQi4x", 3.0, x, y, n)
    b.launch(mod, "axpy", (4, 1, 1), (256, 1, 1), 0, stream, params)
    got = np.frombuffer(bytes(b.memcpy_dtoh(y, 4 * n, stream)), np.float32)
    assert np.array_equal(got, 3.0 * xs + ys)
    # dynamic shared memory above the default 48 KiB needs the raised limit
    d = r.alloc(4 * 256)
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
    data, out = r.alloc(4 * 4096), r.alloc(8)
    b.memcpy_htod(data, np.ones(4096, dtype=np.int32).tobytes(), stream)
    b.memset(out, 0, 4, 2, stream)
    params = struct.pack("<QQi4x", data, out, 4096)
    b.launch(mod, "grid_total", (4, 1, 1), (128, 1, 1), 0, stream, params, cooperative=True)
    assert struct.unpack("<ii", bytes(b.memcpy_dtoh(out, 8, stream))) == (4096, 8192)
    # thread-block clusters of 2: each block reads its partner's shared memory
    swapped = r.alloc(16)
    params = struct.pack("<Q", swapped)
    b.launch(mod, "cluster_swap", (4, 1, 1), (32, 1, 1), 0, stream, params, cluster=(2, 1, 1))
    assert struct.unpack("<4i", bytes(b.memcpy_dtoh(swapped, 16, stream))) == (11, 1, 31, 21)
    b.module_unload(mod)


def check_work_timing(r: Rig, fatbin: Path) -> None:
    """The GPU time the session's accounting needs: a backend whose work is asynchronous
    (cuda) times each launch and copy itself (CUDA events) and reports it once completed, each
    exactly once; a backend whose work is done inside the call (sim) reports nothing, the
    worker timing its calls (crane.engine.meter)."""
    b = r.b
    got: list[tuple[str, str, int]] = []
    b.report_work(lambda kind, name, ns, at: got.append((kind, name, ns)))
    mod = r.module(fatbin)
    stream = b.stream_create(0, 0)
    n = 1000
    x, y = r.alloc(4 * n), r.alloc(4 * n)
    b.memcpy_htod(x, np.arange(n, dtype=np.float32).tobytes(), stream)
    b.memcpy_htod(y, np.ones(n, dtype=np.float32).tobytes(), stream)
    params = struct.pack("<f4xQQi4x", 3.0, x, y, n)
    for _ in range(3):
        b.launch(mod, "axpy", (4, 1, 1), (256, 1, 1), 0, stream, params)
    b.memcpy_dtod(x, y, 4 * n, stream)
    b.memset(y, 0, 4, n, stream)
    b.memcpy_dtoh(x, 4 * n, stream)
    b.synchronize()
    b.settle_work()
    b.settle_work()  # nothing is reported twice
    if not b.async_work:
        assert got == [], got
        return
    kinds = [k for k, _, _ in got]
    assert sorted(kinds) == ["d2d", "d2h", "h2d", "h2d", "launch", "launch", "launch", "memset"]
    assert {name for k, name, _ in got if k == "launch"} == {"axpy"}
    assert all(ns >= 0 for _, _, ns in got) and sum(ns for k, _, ns in got if k == "launch") > 0
    b.module_unload(mod)


def check_code_versions(r: Rig, fatbin: Path) -> None:
    """cuFuncGetAttribute's PTX_VERSION / BINARY_VERSION of the code the device runs: the
    fatbin holds sm_90 SASS and compute_90 PTX, so a 9.0 device runs the SASS (90, 90) and a
    later one JIT-compiles the PTX (90, its own)."""
    mod = r.module(fatbin)
    cc = r.b.snapshot.cc
    binary = 90 if cc == (9, 0) else cc[0] * 10 + cc[1]
    assert r.b.code_versions(mod, "axpy") == (90, binary)
    r.b.module_unload(mod)


def check_globals(r: Rig, fatbin: Path) -> None:
    b = r.b
    mod = r.module(fatbin)
    stream = b.stream_create(0, 0)
    g = mod.globals["counter"]
    assert g.size == 16
    assert struct.unpack("<4i", bytes(b.memcpy_dtoh(g.addr, 16, stream))) == (1, 2, 3, 4)
    b.launch(mod, "bump", (1, 1, 1), (4, 1, 1), 0, stream, struct.pack("<i", 10))
    assert struct.unpack("<4i", bytes(b.memcpy_dtoh(g.addr, 16, stream))) == (11, 12, 13, 14)
    b.module_unload(mod)


def check_global_alias(r: Rig, fatbin: Path) -> None:
    """Only a backend whose driver places module variables itself can be told another address
    for one (a restore on another device); the simulator places them where asked."""
    b = r.b
    mod = r.module(fatbin)
    stream = b.stream_create(0, 0)
    g = mod.globals["counter"]
    b.launch(mod, "bump", (1, 1, 1), (4, 1, 1), 0, stream, struct.pack("<i", 10))
    # a restore told the guest another address for the variable: copies follow the alias
    told = 0x7000_0000_0000
    b.alias_global(told, g.addr, g.size)
    b.memcpy_htod(told + 4, struct.pack("<i", 99), stream)
    assert struct.unpack("<4i", bytes(b.memcpy_dtoh(told, 16, stream))) == (11, 99, 13, 14)
    b.module_unload(mod)


def check_printf(r: Rig, fatbin: Path) -> None:
    b = r.b
    mod = r.module(fatbin)
    stream = b.stream_create(0, 0)
    b.launch(mod, "hello", (1, 1, 1), (32, 1, 1), 0, stream, struct.pack("<i", 42))
    b.stream_synchronize(stream)
    out = b.take_stdout()
    assert out == b"hello from the GPU 42\n", out


def check_fault_is_reported(r: Rig, fatbin: Path) -> None:
    """A wild store is reported at the launch or at the next synchronizing call (CUDA allows
    either: the simulator completes launches before it returns, a GPU does not)."""
    b = r.b
    mod = r.module(fatbin)
    stream = b.stream_create(0, 0)
    p = r.alloc(4)

    def run() -> None:
        b.launch(mod, "wild", (1, 1, 1), (1, 1, 1), 0, stream, struct.pack("<Q", p))
        b.stream_synchronize(stream)

    codes = (CUresult.CUDA_ERROR_ILLEGAL_ADDRESS, CUresult.CUDA_ERROR_INVALID_VALUE)
    _expect_cuda_error(codes, "a wild store went unreported", run)


def check_bad_module(r: Rig, fatbin: Path) -> None:
    ptx = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() { bogus; }\n"
    b = r.b
    try:
        image = inspect_image(ptx.encode(), b.snapshot.cc)
        b.module_load(image, lambda n: r.area.place(b, n), data=ptx.encode())
    except CudaError as e:  # the JIT's (or the interpreter's) log names the bad instruction
        assert e.code == CUresult.CUDA_ERROR_INVALID_PTX, e
        assert "bogus" in e.message, e.message
    else:
        raise AssertionError("a module with an unknown instruction loaded")


def check_checkpoint_roundtrip(r: Rig, fatbin: Path) -> None:
    """Through the worker's engine and the checkpoint format: a session written from one
    backend and restored onto a second one (a new worker's) reads back the same memory and
    module variables, at the addresses the guest was told."""
    import hashlib

    from crane.engine.engine import Engine
    from crane.modules.store import ImageStore
    from crane.state.park import restore_checkpoint, write_checkpoint

    cache = r.tmp / "modules"
    cache.mkdir()
    window = r.window
    eng = Engine.create(r.b, "s1", window, ImageStore(cache))
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
    path = r.tmp / "s.ckpt"
    with path.open("wb") as f:
        write_checkpoint(ex, eng.log, f, {"id": "s1"})
    r.b.close()
    r.closed = True
    b2 = make_backend(r.kind, r.tmp, window)
    eng2 = Engine.create(b2, "s1", window, ImageStore(cache))
    ex2 = eng2.device
    with path.open("rb") as f:
        try:
            restore_checkpoint(ex2, eng2.log, f, "s1")
        except CudaError as e:
            # the driver placed the variable elsewhere on the new context (cuda only): refused,
            # naming it, since a pointer to it stored in device memory would be stale
            assert r.kind == "cuda", e
            assert e.code == CUresult.CUDA_ERROR_NOT_SUPPORTED and "counter (told" in e.message
            b2.close()
            return
    assert bytes(ex2.memcpy_dtoh(window[0], 4096, 0)) == payload
    g = ex2.modules.get(0x100).obj.globals["counter"]
    assert g.addr == told.addr, "the guest's address of a module variable changed"
    assert struct.unpack("<4i", bytes(ex2.memcpy_dtoh(g.addr, 16, 0))) == (5, 6, 7, 8)
    b2.close()


CHECKS: dict[str, Callable[[Rig, Path], None]] = {
    name[len("check_") :]: fn for name, fn in globals().items() if name.startswith("check_")
}
#: Checks of what only some backends have (every other check runs against every backend).
ONLY: dict[str, tuple[str, ...]] = {"global_alias": ("cuda",)}


def main(argv: list[str]) -> int:
    kind, name, fatbin = argv[0], argv[1], Path(argv[2])
    with tempfile.TemporaryDirectory() as tmp:
        rig = Rig(kind, make_backend(kind, Path(tmp)), Path(tmp))
        try:
            CHECKS[name](rig, fatbin)
        finally:
            if not rig.closed:
                rig.b.close()
    print("OK", file=sys.stderr)  # fd 1 is the cuda backend's device-printf pipe
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
