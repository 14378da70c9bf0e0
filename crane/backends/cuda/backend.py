"""The cuda backend: a session's calls executed on a real NVIDIA GPU through cuda-python.

Same interface as the simulated GPU (:class:`crane.backends.base.Backend`); the worker above it
is unchanged. What a real device adds:

* **Addresses.** Memory lives at the guest's addresses
  (:mod:`crane.backends.cuda.va_window`). Module variables are the exception: the driver places
  them, so the guest is told the driver's addresses. A restore or migration loads the module
  again and the driver may pick new addresses: a pointer *to* a module variable the program
  stored in device memory would then be stale, so the restore compares each variable's address
  with the recorded one and refuses if any moved (crane.state.placement; the migration fails
  before switchover). :meth:`CudaBackend.alias_global` (copies and memsets at the told address
  reach the new one) stays for the conformance check of the backend itself.
* **Asynchrony.** Launches, copies from the host and memsets are enqueued and return; a fault
  in a kernel surfaces at the next synchronizing call with the driver's own code, which the
  worker treats as sticky exactly as the simulator's faults.
* **Copies** go through pinned staging buffers (:mod:`crane.backends.cuda.staging`).
* **Device printf** is written by the driver to the process's stdout at synchronization points;
  the worker's fd 1 is a pipe drained by a thread, and :meth:`take_stdout` hands what arrived to
  the guest, as the simulator does.
* **Memory accounting**: each chunk, and each module's variables, is also charged to the
  daemon's per-device ledger and to the session's tenant (:mod:`crane.device.quota`), so
  ``crane devices`` and ``crane ps`` show what each session holds and a tenant's limit covers
  them; the driver has the last word on out-of-memory.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.backends.base import Backend, GlobalVar, LoadedModule
from crane.backends.cuda.driver import unwrap
from crane.backends.cuda.staging import StagingRing
from crane.backends.cuda.timing import WorkTimer
from crane.backends.cuda.va_window import VaWindow
from crane.device.identity import DeviceSnapshot
from crane.device.ledger import Ledger
from crane.device.quota import MemoryAccount, TenantLedger
from crane.modules.image import ModuleImage

__all__ = ["CudaBackend", "CudaModule"]

log = logging.getLogger("crane.cuda")

#: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_FUNC_MAX_DYNAMIC_SHARED = 8
_FUNC_NON_PORTABLE_CLUSTER = 14  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
#: Size of the JIT log buffers asked for when loading PTX (the error log names the bad line).
_JIT_LOG = 16 << 10


@dataclass
class CudaModule:
    """A loaded module and the functions looked up in it so far."""

    handle: Any
    functions: dict[str, Any] = field(default_factory=dict)
    dynamic_shared: dict[str, int] = field(default_factory=dict)  # limit set on each function
    charged: int = 0  # bytes of its variables charged to the session's memory account


class CudaBackend(Backend):
    """One session's view of one physical GPU (one primary context per worker process)."""

    async_work = True

    def __init__(
        self,
        drv: Any,
        ordinal: int,
        snapshot: DeviceSnapshot,
        window: tuple[int, int],
        ledger: Ledger,
        slot: int,
        *,
        tenants: TenantLedger | None = None,
        tenant: str = "",
    ) -> None:
        self.drv = drv
        self.snapshot = snapshot
        self.ledger = ledger
        self.slot = slot
        self.account = MemoryAccount(ledger, slot, tenants, tenant)
        self.device = unwrap("cuDeviceGet", drv.cuDeviceGet(ordinal))
        self.context = unwrap("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(self.device))
        self._tls = threading.local()
        self._bind()
        self.window = VaWindow(drv, ordinal, *window)
        self.staging = StagingRing(drv)
        # Pre-copy rounds of a live migration read memory on their own thread while the guest's
        # batches run: the staging ring is the one shared piece, so it is taken under a lock.
        self._staging_lock = threading.Lock()
        self.aliases: dict[int, tuple[int, int]] = {}  # told address -> (size, real address)
        self._stdout = _StdoutPipe()
        #: Times launches and copies once the session's accounting asks (report_work).
        self.timer: WorkTimer | None = None

    # ---- accounting: launches' and copies' GPU time from events (crane.backends.cuda.timing) -
    def report_work(self, sink: Callable[[str, str, int, int], None]) -> None:
        self.timer = WorkTimer(self.drv, sink)

    def settle_work(self) -> None:
        if self.timer is not None:
            self._bind()
            self.timer.settle()

    @contextmanager
    def _timing(self, kind: str, name: str, stream: Any) -> Iterator[None]:
        """What is enqueued in ``stream`` inside, bracketed by timing events (accounting on)."""
        timer = self.timer
        if timer is None:
            yield
            return
        start = timer.begin(stream)
        try:
            yield
        except BaseException:
            timer.cancel(start)
            raise
        timer.end(kind, name, start, stream)

    # ---- the context is current per thread: gRPC calls the worker on several threads --------
    def _bind(self) -> None:
        if getattr(self._tls, "bound", False):
            return
        unwrap("cuCtxSetCurrent", self.drv.cuCtxSetCurrent(self.context))
        self._tls.bound = True

    def _addr(self, addr: int, size: int) -> int:
        """The real address of a guest range (only module variables moved by a restore differ)."""
        if self.aliases:
            for told, (n, real) in self.aliases.items():
                if told <= addr and addr + size <= told + n:
                    return real + (addr - told)
        return addr

    # ---- memory -------------------------------------------------------------------------------
    def map_chunk(self, addr: int, size: int) -> None:
        self._bind()
        self.account.charge(size)
        try:
            self.window.map(addr, size)
        except CudaError:
            self.account.release(size)
            raise

    def unmap_chunk(self, addr: int) -> None:
        self._bind()
        self.account.release(self.window.unmap(addr))

    def mem_alloc(self, addr: int, size: int) -> None:
        """Nothing to do on the device: the chunk is mapped, and allocation bookkeeping
        (overlaps, double frees) is the worker's."""

    def mem_free(self, addr: int) -> None:
        """As :meth:`mem_alloc`: the memory stays mapped with its chunk."""

    def mem_info(self) -> tuple[int, int]:
        self._bind()
        free, total = unwrap("cuMemGetInfo", self.drv.cuMemGetInfo())
        return self.account.view(int(free), int(total))

    def memcpy_htod(self, dst: int, data: bytes, stream: Any) -> None:
        self._bind()
        with self._staging_lock, self._timing("h2d", "", stream):
            self.staging.upload(self._addr(dst, len(data)), data, stream)

    def memcpy_dtoh(self, src: int, size: int, stream: Any) -> bytes | bytearray:
        self._bind()
        with self._staging_lock, self._timing("d2h", "", stream):
            return self.staging.download(self._addr(src, size), size, stream)

    def memcpy_dtod(self, dst: int, src: int, size: int, stream: Any) -> None:
        self._bind()
        to, frm = self._addr(dst, size), self._addr(src, size)
        with self._timing("d2d", "", stream):
            unwrap("cuMemcpyDtoDAsync", self.drv.cuMemcpyDtoDAsync(to, frm, size, stream))

    def memset(self, dst: int, value: int, elem_size: int, count: int, stream: Any) -> None:
        self._bind()
        d, addr = self.drv, self._addr(dst, elem_size * count)
        with self._timing("memset", "", stream):
            if elem_size == 1:
                unwrap("cuMemsetD8Async", d.cuMemsetD8Async(addr, value & 0xFF, count, stream))
            elif elem_size == 2:
                unwrap("cuMemsetD16Async", d.cuMemsetD16Async(addr, value & 0xFFFF, count, stream))
            else:
                unwrap(
                    "cuMemsetD32Async", d.cuMemsetD32Async(addr, value & 0xFFFFFFFF, count, stream)
                )

    # ---- streams and events -----------------------------------------------------------------
    def stream_create(self, flags: int, priority: int) -> Any:
        self._bind()
        return unwrap(
            "cuStreamCreateWithPriority", self.drv.cuStreamCreateWithPriority(flags, priority)
        )

    def stream_destroy(self, stream: Any) -> None:
        self._bind()
        unwrap("cuStreamDestroy", self.drv.cuStreamDestroy(stream))

    def stream_synchronize(self, stream: Any) -> None:
        self._bind()
        unwrap("cuStreamSynchronize", self.drv.cuStreamSynchronize(stream))

    def _done(self, what: str, ret: Any) -> bool:
        """A query: NOT_READY is an answer (False), any other failure an error."""
        if int(ret[0]) == CUresult.CUDA_ERROR_NOT_READY:
            return False
        unwrap(what, ret)
        return True

    def stream_query(self, stream: Any) -> bool:
        self._bind()
        return self._done("cuStreamQuery", self.drv.cuStreamQuery(stream))

    def stream_wait_event(self, stream: Any, event: Any, flags: int) -> None:
        self._bind()
        unwrap("cuStreamWaitEvent", self.drv.cuStreamWaitEvent(stream, event, flags))

    def event_create(self, flags: int) -> Any:
        self._bind()
        return unwrap("cuEventCreate", self.drv.cuEventCreate(flags))

    def event_destroy(self, event: Any) -> None:
        self._bind()
        unwrap("cuEventDestroy", self.drv.cuEventDestroy(event))

    def event_record(self, event: Any, stream: Any) -> None:
        self._bind()
        unwrap("cuEventRecord", self.drv.cuEventRecord(event, stream))

    def event_synchronize(self, event: Any) -> None:
        self._bind()
        unwrap("cuEventSynchronize", self.drv.cuEventSynchronize(event))

    def event_query(self, event: Any) -> bool:
        self._bind()
        return self._done("cuEventQuery", self.drv.cuEventQuery(event))

    def event_elapsed(self, start: Any, end: Any) -> float:
        self._bind()
        return float(unwrap("cuEventElapsedTime", self.drv.cuEventElapsedTime(start, end)))

    def synchronize(self) -> None:
        self._bind()
        unwrap("cuCtxSynchronize", self.drv.cuCtxSynchronize())
        with self._staging_lock:
            self.staging.wait_idle()

    # ---- modules and launches ---------------------------------------------------------------
    def module_load(
        self, image: ModuleImage, place_global: Callable[[int], int], *, data: bytes = b""
    ) -> LoadedModule:
        """Load the module as the guest sent it: the driver picks the machine code for this
        GPU or JIT-compiles PTX, by the same rules as for the program run natively.

        ``place_global`` is not used: the driver places module variables (see the module
        docstring); a restore that needs the old addresses calls :meth:`alias_global`."""
        self._bind()
        if image.relocatable:
            handle = self._load_linked(image)
        elif data:
            text = _is_text(data)
            handle = self._load_jit(data.rstrip(b"\0") + b"\0" if text else data, image)
        elif image.kind == "ptx":
            handle = self._load_jit(str(image.code).encode() + b"\0", image)
        else:
            handle = self._load_jit(bytes(image.code), image)
        globals_: dict[str, GlobalVar] = {}
        for name, g in image.globals.items():
            dptr, size = unwrap(
                f"cuModuleGetGlobal({name})",
                self.drv.cuModuleGetGlobal(handle, name.encode()),
            )
            globals_[name] = GlobalVar(name, int(dptr), int(size) or g.size)
        # the driver placed the module's variables: charged like any device memory (a tenant's
        # limit covers them), and released with the module
        charged = sum(g.size for g in globals_.values())
        try:
            self.account.charge(charged)
        except CudaError:
            self.drv.cuModuleUnload(handle)
            raise
        return LoadedModule(
            image=image, native=CudaModule(handle, charged=charged), globals=globals_
        )

    def _load_jit(self, code: bytes, image: ModuleImage) -> Any:
        """cuModuleLoadDataEx with an error log, so a failed PTX JIT says which line."""
        d = self.drv
        err_log = bytearray(_JIT_LOG)  # cuda-python passes its buffer as the char*
        opts = [
            d.CUjit_option.CU_JIT_ERROR_LOG_BUFFER,
            d.CUjit_option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ]
        ret = d.cuModuleLoadDataEx(code, len(opts), opts, [err_log, _JIT_LOG])
        if int(ret[0]) != 0:
            detail = bytes(err_log).split(b"\0", 1)[0].decode("utf-8", "replace").strip()
            raise CudaError(
                int(ret[0]),
                f"loading {image.description} on {self.snapshot.name} failed: "
                f"{detail or getattr(ret[0], 'name', ret[0])}",
            )
        return ret[1]

    def _load_linked(self, image: ModuleImage) -> Any:
        """A relocatable (-rdc) cubin must be linked before the driver loads it."""
        d = self.drv
        state = unwrap("cuLinkCreate", d.cuLinkCreate(0, [], []))
        try:
            code = bytes(image.code) if not isinstance(image.code, str) else image.code.encode()
            kind = (
                d.CUjitInputType.CU_JIT_INPUT_PTX
                if image.kind == "ptx"
                else d.CUjitInputType.CU_JIT_INPUT_CUBIN
            )
            unwrap(
                "cuLinkAddData",
                d.cuLinkAddData(state, kind, code, len(code), image.arch.encode(), 0, [], []),
            )
            cubin, size = unwrap("cuLinkComplete", d.cuLinkComplete(state))
            linked = ctypes.string_at(int(cubin), int(size))
            return unwrap("cuModuleLoadData", d.cuModuleLoadData(linked))
        finally:
            d.cuLinkDestroy(state)

    def module_unload(self, module: LoadedModule) -> None:
        self._bind()
        told = {g.addr for g in module.globals.values()}
        for addr in told & self.aliases.keys():
            del self.aliases[addr]
        unwrap("cuModuleUnload", self.drv.cuModuleUnload(module.native.handle))
        self.account.release(module.native.charged)
        module.native.charged = 0

    def alias_global(self, told: int, real: int, size: int) -> None:
        """After a restore: the guest keeps using ``told`` for a module variable that the driver
        placed at ``real`` on this device."""
        if told != real:
            self.aliases[told] = (size, real)

    def set_device_runtime_limits(self, heap_bytes: int, pending_launches: int) -> None:
        self._bind()
        d = self.drv
        unwrap(
            "cuCtxSetLimit",
            d.cuCtxSetLimit(d.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE, heap_bytes),
        )
        unwrap(
            "cuCtxSetLimit",
            d.cuCtxSetLimit(d.CUlimit.CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, pending_launches),
        )

    def code_versions(self, module: LoadedModule, kernel: str) -> tuple[int, int]:
        """What the driver says of the code it chose (a cubin, or PTX it JIT-compiled)."""
        self._bind()
        fn = self._function(module.native, kernel)
        attr = self.drv.CUfunction_attribute
        return (
            int(
                unwrap(
                    "cuFuncGetAttribute",
                    self.drv.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_PTX_VERSION, fn),
                )
            ),
            int(
                unwrap(
                    "cuFuncGetAttribute",
                    self.drv.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_BINARY_VERSION, fn),
                )
            ),
        )

    def _function(self, mod: CudaModule, kernel: str) -> Any:
        fn = mod.functions.get(kernel)
        if fn is None:
            fn = unwrap(
                f"cuModuleGetFunction({kernel})",
                self.drv.cuModuleGetFunction(mod.handle, kernel.encode()),
            )
            mod.functions[kernel] = fn
        return fn

    def launch(
        self,
        module: LoadedModule,
        kernel: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: int,
        stream: Any,
        params: bytes,
        *,
        max_dynamic_shared: int | None = None,
        cooperative: bool = False,
        cluster: tuple[int, int, int] | None = None,
        non_portable_cluster: bool = False,
    ) -> None:
        self._bind()
        with self._timing("launch", kernel, stream):
            d, mod = self.drv, module.native
            fn = self._function(mod, kernel)
            if (
                max_dynamic_shared is not None
                and mod.dynamic_shared.get(kernel) != max_dynamic_shared
            ):
                unwrap(
                    "cuFuncSetAttribute",
                    d.cuFuncSetAttribute(
                        fn, d.CUfunction_attribute(_FUNC_MAX_DYNAMIC_SHARED), max_dynamic_shared
                    ),
                )
                mod.dynamic_shared[kernel] = max_dynamic_shared
            # The driver copies the arguments before the launch call returns, so the buffer and
            # the pointer array only have to live until then.
            layout = module.image.kernels[kernel].params
            buf = ctypes.create_string_buffer(bytes(params), max(len(params), 1))
            base = ctypes.addressof(buf)
            ptrs = (ctypes.c_void_p * max(len(layout), 1))(*[base + off for off, _ in layout])
            args = ctypes.addressof(ptrs) if layout else 0
            if cluster is not None:
                if non_portable_cluster:
                    attrib = d.CUfunction_attribute(_FUNC_NON_PORTABLE_CLUSTER)
                    unwrap("cuFuncSetAttribute", d.cuFuncSetAttribute(fn, attrib, 1))
                self._launch_cluster(fn, grid, block, shared, stream, args, cluster, cooperative)
                return
            if cooperative:
                ret = d.cuLaunchCooperativeKernel(fn, *grid, *block, shared, stream, args)
                unwrap("cuLaunchCooperativeKernel", ret)
            else:
                unwrap(
                    "cuLaunchKernel", d.cuLaunchKernel(fn, *grid, *block, shared, stream, args, 0)
                )

    def _launch_cluster(
        self, fn, grid, block, shared: int, stream, args, cluster, cooperative: bool
    ) -> None:
        """cuLaunchKernelEx with the cluster-dimension attribute (and the cooperative one)."""
        d = self.drv
        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes = shared
        cfg.hStream = stream
        attr = d.CUlaunchAttribute()
        attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        attrs = [attr]
        if cooperative:
            coop = d.CUlaunchAttribute()
            coop.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            coop.value.cooperative = 1
            attrs.append(coop)
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        unwrap("cuLaunchKernelEx", d.cuLaunchKernelEx(cfg, fn, args, 0))

    def take_stdout(self) -> bytes:
        return self._stdout.take()

    def close(self) -> None:
        try:
            self._bind()
            self.drv.cuCtxSynchronize()
            if self.timer is not None:
                self.timer.close()
            self.staging.close()
            self.window.close()
        finally:
            self.account.clear()
            self.account.close()
            self.drv.cuDevicePrimaryCtxRelease(self.device)


def _is_text(data: bytes) -> bool:
    """PTX source (the driver wants it NUL-terminated) rather than a binary image."""
    head = data[:64].lstrip()
    return head.startswith((b"//", b".version", b".target")) or (
        bool(head) and all(32 <= c < 127 or c in (9, 10, 13) for c in head)
    )


class _StdoutPipe:
    """fd 1 of the worker, redirected into a pipe that a thread drains.

    The driver flushes device printf output with stdio on fd 1. Nothing else in the worker
    writes there (its logs go to stderr), so everything read is the guest's kernel output."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._libc = ctypes.CDLL(None)
        r, w = os.pipe()
        os.dup2(w, 1)
        os.close(w)
        os.set_blocking(r, False)
        self._r = r
        threading.Thread(target=self._drain, name="device-printf", daemon=True).start()

    def _read_available(self) -> bool:
        """Move what is in the pipe to the buffer (caller holds the lock: order is kept);
        False once the pipe is closed."""
        while True:
            try:
                data = os.read(self._r, 1 << 16)
            except BlockingIOError:
                return True
            if not data:
                return False
            self._chunks.append(data)

    def _drain(self) -> None:
        """Keep the pipe from filling while the driver writes a large printf buffer (the
        writer would block inside a synchronizing call, on the thread that would read it)."""
        open_ = True
        while open_:
            select.select([self._r], [], [])
            with self._lock:
                open_ = self._read_available()

    def take(self) -> bytes:
        self._libc.fflush(None)  # the driver writes through stdio
        with self._lock:
            self._read_available()
            if not self._chunks:
                return b""
            out = b"".join(self._chunks)
            self._chunks.clear()
        return out
