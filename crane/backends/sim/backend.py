"""The simulated GPU backend: a device profile, memory on the CPU, and PTX execution.

Execution model: the worker applies calls in the order the guest issued them, and this backend
completes each one before returning. That is one of the schedules CUDA permits (every stream's
order is kept; independent streams may run in any interleaving), so stream queries always report
idle and events carry the host time at which the work before them finished. Kernel execution is
delegated to the PTX interpreter (``crane.backends.sim.ptx``); a module with no PTX loads (its
parameter layouts come from the cubin) but its launches fail with a message naming the nvcc flag
that embeds PTX.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.backends.base import Backend, GlobalVar, LoadedModule, StagedSource
from crane.backends.sim.memory import MemoryFault, SimMemory
from crane.device.identity import DeviceSnapshot
from crane.device.layout import CHUNK_GRANULARITY
from crane.device.ledger import Ledger
from crane.device.model import DeviceModel
from crane.device.quota import MemoryAccount, TenantLedger
from crane.modules.image import ModuleImage

__all__ = ["SimBackend", "SimEvent", "SimStream"]

log = logging.getLogger("crane.sim")

CU_EVENT_DISABLE_TIMING = 0x2
#: cuCtxGetStreamPriorityRange on sm_70 and later: least 0, greatest -5.
GREATEST_STREAM_PRIORITY = -5

_FAULT_CODES = {
    "range": CUresult.CUDA_ERROR_INVALID_VALUE,
    "illegal": CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,
    "misaligned": CUresult.CUDA_ERROR_MISALIGNED_ADDRESS,
}


@dataclass
class SimStream:
    flags: int
    priority: int


@dataclass
class SimEvent:
    flags: int
    recorded_at: float | None = None


@dataclass
class _SimModule:
    program: Any = None  # crane.backends.sim.ptx.PtxProgram, or None without PTX
    symbols: dict[str, int] = field(default_factory=dict)
    why_no_ptx: str = ""


def _fault(e: MemoryFault) -> CudaError:
    return CudaError(_FAULT_CODES.get(e.kind, CUresult.CUDA_ERROR_INVALID_VALUE), str(e))


class SimBackend(Backend):
    """A simulated device for one session."""

    stable_views = True  # views of the one mapping backing the window

    def __init__(
        self,
        profile: DeviceModel,
        snapshot: DeviceSnapshot,
        window: tuple[int, int],
        ledger: Ledger,
        slot: int,
        *,
        tenants: TenantLedger | None = None,
        tenant: str = "",
        kernel_time_limit_s: float | None = None,
    ) -> None:
        self.profile = profile
        self.snapshot = snapshot
        self.memory = SimMemory(*window)
        self.ledger = ledger
        self.slot = slot
        self.account = MemoryAccount(ledger, slot, tenants, tenant)
        #: A launch running longer fails with CUDA_ERROR_LAUNCH_TIMEOUT (the tenant's limit).
        self.kernel_time_limit_s = kernel_time_limit_s
        self._stdout: list[bytes] = []
        self._heap: Any = None  # the device heap, on the first launch calling malloc/free
        self._heap_bytes = DEVICE_HEAP_BYTES  # CU_LIMIT_MALLOC_HEAP_SIZE
        self._pending_launches = DEVICE_PENDING_LAUNCHES

    # ---- memory -------------------------------------------------------------------------------
    def map_chunk(self, addr: int, size: int) -> None:
        self.account.charge(size)
        try:
            self.memory.map_chunk(addr, size)
        except MemoryFault as e:
            self.account.release(size)
            raise _fault(e) from None

    def unmap_chunk(self, addr: int) -> None:
        try:
            size = self.memory.unmap_chunk(addr)
        except MemoryFault as e:
            raise _fault(e) from None
        self.account.release(size)

    def mem_alloc(self, addr: int, size: int) -> None:
        try:
            self.memory.alloc(addr, size)
        except MemoryFault as e:
            raise _fault(e) from None

    def mem_free(self, addr: int) -> None:
        try:
            self.memory.free(addr)
        except MemoryFault as e:
            raise _fault(e) from None

    def mem_info(self) -> tuple[int, int]:
        total = self.ledger.capacity
        return self.account.view(max(total - self.ledger.used(), 0), total)

    def memcpy_htod(self, dst: int, data: bytes, stream: Any) -> None:
        try:
            self.memory.write(dst, data)
        except MemoryFault as e:
            raise _fault(e) from None

    def memcpy_htod_staged(self, dst: int, src: StagedSource, stream: Any) -> None:
        """Straight from the bulk area into the device memory's mapping: one copy, made
        while the guest writes the next bytes."""
        try:
            view = self.memory.view(dst, len(src))  # validated before a byte is taken
        except MemoryFault as e:
            raise _fault(e) from None
        src.read_into(view)

    def memcpy_dtoh(self, src: int, size: int, stream: Any) -> memoryview:
        """A view of the device's bytes; zeros for a large range never written, without
        touching it (reading a hole of the shared mapping would commit its pages: a
        checkpoint, a migration or a zero check would fill a sparse session's memory)."""
        try:
            view = memoryview(self.memory.view(src, size))
        except MemoryFault as e:
            raise _fault(e) from None
        if size >= UNTOUCHED_CHECK and self.memory.untouched(src, size):
            return memoryview(_ZEROS)[:size] if size <= len(_ZEROS) else memoryview(bytes(size))
        return view

    def memcpy_dtod(self, dst: int, src: int, size: int, stream: Any) -> None:
        try:
            self.memory.copy(dst, src, size)
        except MemoryFault as e:
            raise _fault(e) from None

    def memset(self, dst: int, value: int, elem_size: int, count: int, stream: Any) -> None:
        try:
            self.memory.fill(dst, value, elem_size, count)
        except MemoryFault as e:
            raise _fault(e) from None

    # ---- handing the memory over (a same-host migration) ---------------------------------------
    def memory_handle(self) -> int | None:
        return self.memory.handle()

    def adopt_memory(self, fd: int) -> None:
        try:
            self.memory.adopt(fd)
        except (ValueError, OSError) as e:
            os.close(fd)  # refused: the descriptor is ours to drop all the same
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, str(e)) from None

    def claim_memory(self) -> None:
        self.memory.claim()

    def disown_memory(self) -> None:
        self.memory.disown()

    # ---- runs of packed memsets (crane/engine/codec.py) ----------------------------------------
    memset_runs = True

    def memset_run(
        self,
        dst: np.ndarray,
        value: np.ndarray,
        elem_size: np.ndarray,
        count: np.ndarray,
        stream: Any,
    ) -> int:
        return self.memory.fill_run(dst, value, elem_size, count)

    # ---- streams and events -----------------------------------------------------------------
    def stream_create(self, flags: int, priority: int) -> SimStream:
        # CUDA clamps out-of-range priorities to the device's range instead of failing.
        return SimStream(flags, min(max(priority, GREATEST_STREAM_PRIORITY), 0))

    def stream_destroy(self, stream: Any) -> None:
        pass

    def stream_synchronize(self, stream: Any) -> None:
        pass

    def stream_query(self, stream: Any) -> bool:
        return True

    def stream_wait_event(self, stream: Any, event: Any, flags: int) -> None:
        pass

    def event_create(self, flags: int) -> SimEvent:
        return SimEvent(flags)

    def event_destroy(self, event: Any) -> None:
        pass

    def event_record(self, event: SimEvent, stream: Any) -> None:
        event.recorded_at = time.perf_counter()

    def event_synchronize(self, event: Any) -> None:
        pass

    def event_query(self, event: Any) -> bool:
        return True

    def event_elapsed(self, start: SimEvent, end: SimEvent) -> float:
        for ev in (start, end):
            if ev.flags & CU_EVENT_DISABLE_TIMING:
                raise CudaError(
                    CUresult.CUDA_ERROR_INVALID_HANDLE, "event was created with DISABLE_TIMING"
                )
            if ev.recorded_at is None:
                raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, "event was never recorded")
        return (end.recorded_at - start.recorded_at) * 1000.0  # type: ignore[operator]

    def synchronize(self) -> None:
        pass

    # ---- modules and launches ---------------------------------------------------------------
    def module_load(
        self, image: ModuleImage, place_global: Callable[[int], int], *, data: bytes = b""
    ) -> LoadedModule:
        if image.ptx is None:
            # as a driver does: a module with no code this device can run is refused at load,
            # not at its first launch (the simulated GPU runs PTX only)
            cc = "{}{}".format(*self.profile.compute_capability)
            raise CudaError(
                CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU,
                f"the module holds no PTX ({image.description}); the simulated GPU executes "
                f"PTX: rebuild with -gencode arch=compute_{cc},code=compute_{cc} (or any "
                "compute_XX <= the device's) to embed it",
            )
        sim = _SimModule()
        globals_: dict[str, GlobalVar] = {}
        for name, g in image.globals.items():
            addr = place_global(g.size)
            if g.init:
                self.memory.write(addr, g.init)
            globals_[name] = GlobalVar(name, addr, g.size)
            sim.symbols[name] = addr
        if image.ptx is not None:
            sim.program = _load_program(image.ptx, image.ptx_info)
            if sim.program is None:
                sim.why_no_ptx = "this build of Crane has no PTX interpreter"
        code = sim.program.function_addresses() if sim.program is not None else {}
        for g in image.globals.values():
            for r in g.relocs:  # address initializers: `__device__ int *p = &table[3];`
                # a function's (vtables, function-pointer tables) or a variable's address
                target = code.get(r.symbol, sim.symbols.get(r.symbol))
                if target is None:
                    log.warning(
                        "module %s: %s+%d refers to %s, which is not a module variable; left zero",
                        image.sha256[:12],
                        g.name,
                        r.offset,
                        r.symbol,
                    )
                    continue
                value = (target + r.addend) & ((1 << (8 * r.size)) - 1)
                self.memory.write(sim.symbols[g.name] + r.offset, value.to_bytes(r.size, "little"))
        return LoadedModule(image=image, native=sim, globals=globals_)

    def module_unload(self, module: LoadedModule) -> None:
        pass

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
        sim: _SimModule = module.native
        if sim.program is None:
            raise CudaError(CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU, sim.why_no_ptx)
        limit = self.kernel_time_limit_s
        deadline = time.monotonic() + limit if limit else None
        try:
            sim.program.launch(
                kernel,
                grid=grid,
                block=block,
                dynamic_shared=shared,
                params=params,
                memory=self.memory,
                symbols=sim.symbols,
                profile=self.profile,
                printf=self._printf,
                max_dynamic_shared=max_dynamic_shared,
                cooperative=cooperative,
                grid_workspace=self._grid_workspace() if cooperative else 0,
                heap=self._device_heap() if sim.program.uses_heap else None,
                max_pending=self._pending_launches,
                cluster=cluster,
                non_portable_cluster=non_portable_cluster,
                deadline=deadline,
            )
        except Exception as e:
            # (imported here, not per launch: an import statement costs a small launch ~1 µs)
            from crane.backends.sim.ptx import KernelFault

            if not isinstance(e, KernelFault):
                raise
            timed_out = deadline is not None and time.monotonic() > deadline
            if timed_out and e.code == CUresult.CUDA_ERROR_LAUNCH_TIMEOUT:
                log.warning(
                    "tenant %s: kernel %s ran past the kernel time limit of %g s; "
                    "the context fails with CUDA_ERROR_LAUNCH_TIMEOUT",
                    self.account.tenant or "?",
                    kernel,
                    limit,
                )
                raise CudaError(
                    CUresult.CUDA_ERROR_LAUNCH_TIMEOUT,
                    f"kernel {kernel} ran past the kernel time limit of {limit:g} s: {e}",
                ) from None
            raise CudaError(CUresult(e.code), str(e)) from None

    def _grid_workspace(self) -> int:
        """The grid-sync workspace of cooperative launches: driver memory, not the guest's.

        It lives in the last 2 MiB chunk of the session window, above the guest's part and the
        worker's module area (which grows upward from 64 GiB below the top and would have to
        fill all of it to get here), mapped on the first cooperative launch and charged to the
        device like any memory; the interpreter zeroes it before each launch. Kept out of the
        worker's tables on purpose: nothing in it outlives a launch, so a checkpoint need not
        carry it and a restored session maps it again on its next cooperative launch."""
        from crane.backends.sim.ptx.program import GRID_SYNC_BYTES

        chunk = self.memory.base + self.memory.size - CHUNK_GRANULARITY
        try:
            self.memory.find(chunk)
        except MemoryFault:
            self.map_chunk(chunk, CHUNK_GRANULARITY)
            self.mem_alloc(chunk, GRID_SYNC_BYTES)
        return chunk

    def set_device_runtime_limits(self, heap_bytes: int, pending_launches: int) -> None:
        """A new heap size takes effect while the heap holds no block (CUDA refuses the change
        once a launch used malloc; the guest answered cuCtxSetLimit already, so a change that
        comes too late is logged and the heap keeps its size)."""
        if pending_launches < 1 or heap_bytes < 0:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "bad device-runtime limits")
        self._pending_launches = pending_launches
        if heap_bytes == self._heap_bytes:
            return
        if self._heap is not None:
            if self._heap.live:
                log.warning(
                    "device heap holds %d blocks: CU_LIMIT_MALLOC_HEAP_SIZE %d ignored, it stays "
                    "%d bytes",
                    len(self._heap.live),
                    heap_bytes,
                    self._heap.size,
                )
                return
            self.mem_free(self._heap.base)
            self.unmap_chunk(self._heap.base)
            self._heap = None
        self._heap_bytes = heap_bytes

    def _device_heap(self) -> Any:
        """The device heap of kernels' malloc/free: CU_LIMIT_MALLOC_HEAP_SIZE bytes (CUDA's
        default 8 MiB) of driver memory just below the grid-sync workspace's chunk, mapped and
        charged to the device on the first launch that calls malloc or free. Its blocks outlive
        launches; the session (the context) frees it all when it ends."""
        if self._heap is None:
            from crane.backends.sim.ptx.heap import DeviceHeap

            size = -(-max(self._heap_bytes, 1) // CHUNK_GRANULARITY) * CHUNK_GRANULARITY
            top = self.memory.base + self.memory.size - CHUNK_GRANULARITY
            base = top - size
            self.map_chunk(base, size)
            self.mem_alloc(base, size)
            self._heap = DeviceHeap(base, self._heap_bytes)
        return self._heap

    def _printf(self, text: str) -> None:
        self._stdout.append(text.encode("utf-8", "replace"))

    def take_stdout(self) -> bytes:
        if not self._stdout:
            return b""
        out = b"".join(self._stdout)
        self._stdout.clear()
        return out

    def close(self) -> None:
        self.account.clear()
        self.account.close()
        self.memory.close()


#: Reads from this size on check first whether the range was ever written (one ``lseek``:
#: small reads, the guest's usual ones, skip it and may commit a few pages).
UNTOUCHED_CHECK = 64 << 10
_ZEROS = bytes(8 << 20)  # what an untouched range reads as (never written: stable views)

#: CUDA's defaults of CU_LIMIT_MALLOC_HEAP_SIZE and CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT.
DEVICE_HEAP_BYTES = 8 << 20
DEVICE_PENDING_LAUNCHES = 2048


def _load_program(ptx: str, info: Any) -> Any:
    """Decode a module's PTX once (unsupported instructions are refused here, at load), or,
    for a large module, check its declarations now and decode each kernel on its first launch
    (``ptx/lazy.py``: CUDA's lazy loading)."""
    try:
        from crane.backends.sim.ptx import PtxError
        from crane.backends.sim.ptx.lazy import load_program
    except ImportError:  # the interpreter is not part of this build
        return None
    try:
        return load_program(ptx, info)
    except PtxError as e:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_PTX, str(e)) from None
