"""The session's device state: what the guest has created on its device, and the operations.

One public method per op of the call table (:data:`crane.api.ops.OPS`, named ``op.handler``,
parameters named as the op's arguments), each validating what the driver would validate (never
trusting the guest) before it asks the backend. The state lives here, the backend only
executes: handles the guest chose (invariant 2) map to backend objects in :class:`HandleTable`
objects that know which context owns what; allocations and mapped chunks are kept by address;
the module area at the top of the window holds module variables, placed here; the sticky fault
of the context is kept until the context is destroyed; the dirty tracker learns what may have
changed since a mark (invariant 5).

The state record (:mod:`crane.state.record`), checkpoints and live migration read and rebuild
the state through this class's public surface only: the tables, :attr:`module_area`,
:meth:`load_module`, :meth:`read` / :meth:`write`, :meth:`memory_regions`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from crane.api.generated.cuda_enums import CUdevice_attribute, CUresult
from crane.api.launch_check import check_cluster, check_cooperative, check_launch
from crane.api.ops import LaunchConfig
from crane.api.results import CudaError
from crane.backends.base import Backend, LoadedModule
from crane.device.layout import CHUNK_GRANULARITY, MODULE_AREA, module_area_base
from crane.engine.dirty import SCAN_LIMIT, DirtyTracker
from crane.engine.objects import HandleTable
from crane.engine.staged import StagedIn, StagedOut, staged_size
from crane.modules.errors import ImageError, NoCompatibleCode
from crane.modules.image import ModuleImage, inspect_image
from crane.modules.store import DigestMismatch, ImageStore
from crane.wire.ring_bulk import D2H, H2D
from crane.wire.status import CRANE_NEED_IMAGE, MAX_CHUNK

__all__ = ["DEFAULT_STREAMS", "ModuleArea", "SessionDevice"]

#: Stream handles that name the context's default stream: NULL, CU_STREAM_LEGACY,
#: CU_STREAM_PER_THREAD.
DEFAULT_STREAMS = (0, 1, 2)


class ModuleArea:
    """Where module variables go: bump-allocated from the bottom of the window's top
    :data:`~crane.device.layout.MODULE_AREA`, committing chunks as it grows."""

    def __init__(self, window: tuple[int, int]) -> None:
        self.base = module_area_base(window)
        self.limit = window[0] + window[1]
        self.next = self.base  # first free byte
        self.chunk_end = self.base  # end of the committed chunks
        self.placed: list[int] = []  # addresses of the variables placed, in order

    @property
    def committed(self) -> int:
        return self.chunk_end - self.base

    def place(self, backend: Backend, size: int) -> int:
        """Address for a new module variable of ``size`` bytes (256-byte aligned).

        One that cannot fit in the area is refused before anything is committed (a driver
        answers out-of-memory at load); the caller rolls back what earlier variables of the
        same load committed (:meth:`mark` / :meth:`rollback`)."""
        addr = (self.next + 255) & ~255
        end = addr + max(size, 1)
        if end > self.limit:
            raise CudaError(
                CUresult.CUDA_ERROR_OUT_OF_MEMORY,
                f"module variable of {size} bytes does not fit in the "
                f"{self.limit - addr} bytes left of the module area",
            )
        while end > self.chunk_end:
            backend.map_chunk(self.chunk_end, CHUNK_GRANULARITY)
            self.chunk_end += CHUNK_GRANULARITY
        backend.mem_alloc(addr, max(size, 1))
        self.placed.append(addr)
        self.next = end
        return addr

    def mark(self) -> tuple[int, int, int]:
        """Where the area stands, for :meth:`rollback` if the load that follows fails."""
        return self.next, self.chunk_end, len(self.placed)

    def rollback(self, backend: Backend, mark: tuple[int, int, int], stream: Any) -> None:
        """Free what was placed and unmap what was committed since ``mark``: a module that
        failed to load must leave no memory charged to the device (other sessions would see
        out-of-memory for the rest of this session's life). The part of a kept chunk that the
        failed load wrote is zeroed again: the next module's variables without initializers
        start there and must read zero."""
        next_free, chunk_end, count = mark
        for addr in self.placed[count:]:
            backend.mem_free(addr)
        del self.placed[count:]
        for addr in range(chunk_end, self.chunk_end, CHUNK_GRANULARITY):
            backend.unmap_chunk(addr)
        written = min(self.next, chunk_end) - next_free
        if written > 0:
            backend.mem_alloc(next_free, written)
            backend.memset(next_free, 0, 1, written, stream)
            backend.mem_free(next_free)
        self.next, self.chunk_end = next_free, chunk_end

    def restore(self, backend: Backend, next_free: int, chunk_end: int) -> None:
        """Commit the chunks a recorded area had and continue from where it stood."""
        if not self.base <= next_free <= chunk_end <= self.limit:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "module area outside the window")
        for addr in range(self.base, chunk_end, CHUNK_GRANULARITY):
            backend.map_chunk(addr, CHUNK_GRANULARITY)
        self.next = next_free
        self.chunk_end = chunk_end


#: launch configurations a session keeps as checked (beyond it, new ones are checked each time)
_LAUNCHES_OK = 4096


class SessionDevice:
    """One session's device state over its backend."""

    def __init__(self, backend: Backend, window: tuple[int, int], images: ImageStore) -> None:
        self.backend = backend
        self.window = window
        self.images = images
        self.contexts: HandleTable[None] = HandleTable(
            "context", CUresult.CUDA_ERROR_INVALID_CONTEXT
        )
        self.streams: HandleTable[Any] = HandleTable("stream")
        self.events: HandleTable[Any] = HandleTable("event")
        self.modules: HandleTable[LoadedModule] = HandleTable("module")
        self.functions: HandleTable[str] = HandleTable("function")
        self.max_dynamic_shared: dict[int, int] = {}  # function -> raised dynamic smem limit
        #: function -> [dynamic shared bytes, threads per block, CTAs per cluster, cooperative]:
        #: the largest each launch asked for, what a pre-flight weighs as the session's need
        self.launch_peaks: dict[int, list[int]] = {}
        #: launch configurations checked (and folded into the peaks) once, and the kernel they
        #: were checked for: launching one again skips the driver's checks
        self._launches_ok: dict[tuple, object] = {}
        self.allocations: dict[int, tuple[int, int]] = {}  # addr -> (ctx, size)
        self.chunks: dict[int, int] = {}  # addr -> size, guest-mapped
        self._chunk_bytes = 0
        self.module_area = ModuleArea(window)
        self.default_stream = backend.stream_create(0, 0)
        #: The context's sticky fault: every later call fails with it (crane.engine.dispatch).
        self.sticky: CudaError | None = None
        #: The guest closed the session.
        self.closed = False
        self.dirty = DirtyTracker()

    # ---- what the state record and migration use ---------------------------------------------
    def mem_used(self) -> int:
        """Device bytes the session has committed (guest chunks + module variables)."""
        return self._chunk_bytes + self.module_area.committed

    def memory_regions(self) -> list[tuple[int, int]]:
        """(address, size) of every range whose contents a checkpoint carries: the guest's
        allocations and the live modules' variables."""
        regions = [(a, n) for a, (_, n) in self.allocations.items()]
        for h in self.modules:
            variables = self.modules.get(h).obj.globals.values()
            regions += [(v.addr, v.size) for v in variables if v.size]
        return sorted(regions)

    @property
    def stable_views(self) -> bool:
        """:meth:`read`'s views outlive later calls (see ``Backend.stable_views``)."""
        return self.backend.stable_views

    def read(self, addr: int, size: int) -> bytes | memoryview:
        """Device bytes in the default stream's order (a view valid until the next call)."""
        return self.backend.memcpy_dtoh(addr, size, self.default_stream)

    def write(self, addr: int, data: bytes | memoryview) -> None:
        """Restore device bytes (a checkpoint's or a migration round's): learnt by the dirty
        tracker like an upload, so pointer tables in them are known again."""
        self.backend.memcpy_htod(addr, data, self.default_stream)
        self.dirty.contents(addr, data)

    def write_shared(self, addr: int, data: bytes | memoryview, lock: threading.Lock) -> None:
        """:meth:`write` from several threads at once (a migration's data plane, each thread
        its own ranges): the copies run side by side (they release the GIL and take their own
        page faults), the dirty tracker learns under ``lock``."""
        self.backend.memcpy_htod(addr, data, self.default_stream)
        with lock:
            self.dirty.contents(addr, data)

    def synchronize(self) -> None:
        self.backend.synchronize()

    def memory_handle(self) -> int | None:
        """What a same-host migration can hand over instead of copying (``Backend``'s)."""
        return self.backend.memory_handle()

    def adopt_memory(self, fd: int) -> None:
        """Take over another worker's memory (``Backend.adopt_memory``), then learn the pointer
        tables in it: no byte passed through here, so the dirty tracker rescans the small
        allocations and module variables as a round's writes would have taught it."""
        self.backend.adopt_memory(fd)
        for addr, size in self.memory_regions():
            if size <= SCAN_LIMIT:
                self.dirty.contents(addr, self.read(addr, size))

    def claim_memory(self) -> None:
        self.backend.claim_memory()

    def disown_memory(self) -> None:
        self.backend.disown_memory()

    def image(self, digest: bytes) -> bytes | None:
        """A module image this session loaded (or may load), from the daemon's store."""
        return self.images.get(digest)

    def store_image(self, digest: bytes, image: bytes) -> None:
        """Keep an image a checkpoint or migration carried (checked against its digest),
        pinned in the store: this session's next checkpoint or migration reads it back."""
        self.images.pin(digest)
        try:
            self.images.put(digest, image)
        except DigestMismatch as e:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, str(e)) from None

    def load_module(
        self,
        ctx: int,
        module: int,
        digest: bytes,
        data: bytes,
        place: Callable[[int], int],
    ) -> tuple[ModuleImage, LoadedModule]:
        """Load an image for this device and record it; a restore passes its own ``place``
        (the recorded addresses of the module variables) so that they land where they were.
        The image stays pinned in the store while a module of it is loaded."""
        self.images.pin(digest)
        try:
            try:
                info: ModuleImage = inspect_image(data, self.backend.snapshot.cc)
            except NoCompatibleCode as e:
                raise CudaError(CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU, str(e)) from None
            except ImageError as e:
                raise CudaError(CUresult.CUDA_ERROR_INVALID_IMAGE, str(e)) from None
            loaded = self.backend.module_load(info, place, data=data)
            self.modules.add(module, ctx, loaded, digest)
        except BaseException:
            self._unpin_unused(digest)
            raise
        return info, loaded

    def _unpin_unused(self, digest: bytes) -> None:
        """Unpin ``digest`` when no loaded module was made from it."""
        if all(self.modules.get(h).meta != digest for h in self.modules):
            self.images.unpin(digest)

    # ---- helpers -------------------------------------------------------------------------------
    def _ctx(self, ctx: int) -> None:
        self.contexts.get(ctx)

    def _stream(self, handle: int) -> Any:
        if handle in DEFAULT_STREAMS:
            return self.default_stream
        return self.streams.get(handle).obj

    def _check_in_window(self, addr: int, size: int) -> None:
        base, span = self.window
        if addr < base or addr + size > base + span - MODULE_AREA:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"range {addr:#x}+{size:#x} is outside the session's VA window",
            )

    # ---- session and contexts -----------------------------------------------------------------
    def session_close(self) -> None:
        for ctx in list(self.contexts):
            self.ctx_destroy(ctx)
        self.closed = True

    def ctx_create(self, ctx: int, flags: int) -> None:
        self.contexts.add(ctx, ctx, None, flags)

    def ctx_destroy(self, ctx: int) -> None:
        self.contexts.get(ctx)
        self.backend.synchronize()
        for h in self.streams.owned_by(ctx):
            self.backend.stream_destroy(self.streams.pop(h).obj)
        for h in self.events.owned_by(ctx):
            self.backend.event_destroy(self.events.pop(h).obj)
        for h in self.functions.owned_by(ctx):
            self.functions.pop(h)
        for h in self.modules.owned_by(ctx):
            owned = self.modules.pop(h)
            self.backend.module_unload(owned.obj)
            self._unpin_unused(owned.meta)
        for addr in [a for a, (c, _) in self.allocations.items() if c == ctx]:
            self.mem_free(addr)
        self.contexts.pop(ctx)
        self.sticky = None  # destroying (resetting) the context clears a sticky fault

    def ctx_synchronize(self, ctx: int) -> None:
        self._ctx(ctx)
        self.backend.synchronize()

    # ---- memory -------------------------------------------------------------------------------
    def mem_map_chunk(self, addr: int, size: int) -> None:
        self._check_in_window(addr, size)
        self.backend.map_chunk(addr, size)
        self.chunks[addr] = size
        self._chunk_bytes += size

    def mem_unmap_chunk(self, addr: int) -> None:
        if addr not in self.chunks:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"{addr:#x} is not a mapped chunk")
        self.backend.unmap_chunk(addr)
        self._chunk_bytes -= self.chunks.pop(addr)

    def mem_alloc(self, ctx: int, addr: int, size: int) -> None:
        self._ctx(ctx)
        self._check_in_window(addr, size)
        self.backend.mem_alloc(addr, size)
        self.allocations[addr] = (ctx, size)
        self.dirty.add(addr, size, whole_chunk=self.chunks.get(addr) == size)

    def mem_free(self, addr: int) -> None:
        if addr not in self.allocations:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE, f"{addr:#x} is not an allocation of this session"
            )
        self.backend.mem_free(addr)
        del self.allocations[addr]
        self.dirty.remove(addr)

    def mem_get_info(self) -> tuple[int, int]:
        return self.backend.mem_info()

    def memcpy_htod(self, dst: int, stream: int, src: bytes) -> None:
        self.backend.memcpy_htod(dst, src, self._stream(stream))
        if len(src) <= SCAN_LIMIT:
            self.dirty.scan(dst, src)  # a table of device pointers (see crane.engine.dirty)

    def memcpy_dtoh(self, src: int, size: int, stream: int) -> bytes | memoryview:
        if size > MAX_CHUNK:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"read of {size} bytes exceeds the per-call limit of {MAX_CHUNK}",
            )
        return self.backend.memcpy_dtoh(src, size, self._stream(stream))

    def memcpy_htod_staged(self, dst: int, size: int, stream: int, src: StagedIn) -> None:
        """MEMCPY_HTOD with the bytes read from the call ring's bulk area as they come."""
        staged_size(H2D, size)
        native = self._stream(stream)
        self.backend.memcpy_htod_staged(dst, src, native)
        if size <= SCAN_LIMIT:  # as an upload's bytes (crane.engine.dirty), read back
            self.dirty.scan(dst, self.backend.memcpy_dtoh(dst, size, native))

    def memcpy_dtoh_staged(self, src: int, size: int, stream: int, dst: StagedOut) -> None:
        """MEMCPY_DTOH with the bytes written to the call ring's bulk area."""
        staged_size(D2H, size)
        dst.write(self.backend.memcpy_dtoh(src, size, self._stream(stream)))

    def memcpy_dtod(self, dst: int, src: int, size: int, stream: int) -> None:
        self.backend.memcpy_dtod(dst, src, size, self._stream(stream))
        self.dirty.copied(dst, src)

    def memset(self, dst: int, value: int, elem_size: int, count: int, stream: int) -> None:
        if elem_size not in (1, 2, 4):
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"memset element size {elem_size}")
        self.backend.memset(dst, value, elem_size, count, self._stream(stream))

    def memset_run(
        self,
        dst: np.ndarray,
        value: np.ndarray,
        elem_size: np.ndarray,
        count: np.ndarray,
        stream: np.ndarray,
    ) -> int:
        """:meth:`memset` over a run of calls (a batch's packed memsets: columns, one row per
        call, in call order): how many ran, from the first. It stops before the first call
        :meth:`memset` might refuse (an element size, an unknown stream, a range the backend
        refuses) and before the first on another stream than the first's (a backend run is on
        one stream); the dispatcher runs that one through :meth:`memset`."""
        s0 = int(stream[0])
        if s0 not in DEFAULT_STREAMS and s0 not in self.streams:
            return 0
        ok = (stream == stream[0]) & ((elem_size == 1) | (elem_size == 2) | (elem_size == 4))
        n = len(dst) if ok.all() else int(np.argmin(ok))
        if n == 0:
            return 0
        return self.backend.memset_run(
            dst[:n], value[:n], elem_size[:n], count[:n], self._stream(s0)
        )

    def run_handlers(self) -> dict[str, Callable[..., int]]:
        """The ops this device runs a run of calls of at once (by handler name; each
        ``<handler>_run`` takes the op's arguments as columns and says how many ran), as far
        as the backend serves them (crane.engine.dispatch binds them)."""
        return {"memset": self.memset_run} if self.backend.memset_runs else {}

    # ---- streams and events -------------------------------------------------------------------
    def stream_create(self, ctx: int, stream: int, flags: int, priority: int) -> None:
        self._ctx(ctx)
        if stream in DEFAULT_STREAMS:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"stream handle {stream} reserved")
        native = self.backend.stream_create(flags, priority)
        self.streams.add(stream, ctx, native, (flags, priority))

    def stream_destroy(self, stream: int) -> None:
        self.backend.stream_destroy(self.streams.pop(stream).obj)

    def stream_synchronize(self, stream: int) -> None:
        self.backend.stream_synchronize(self._stream(stream))

    def stream_query(self, stream: int) -> int:
        done = self.backend.stream_query(self._stream(stream))
        return 0 if done else int(CUresult.CUDA_ERROR_NOT_READY)

    def stream_wait_event(self, stream: int, event: int, flags: int) -> None:
        self.backend.stream_wait_event(self._stream(stream), self.events.get(event).obj, flags)

    def event_create(self, ctx: int, event: int, flags: int) -> None:
        self._ctx(ctx)
        self.events.add(event, ctx, self.backend.event_create(flags), flags)

    def event_destroy(self, event: int) -> None:
        self.backend.event_destroy(self.events.pop(event).obj)

    def event_record(self, event: int, stream: int) -> None:
        self.backend.event_record(self.events.get(event).obj, self._stream(stream))

    def event_synchronize(self, event: int) -> None:
        self.backend.event_synchronize(self.events.get(event).obj)

    def event_query(self, event: int) -> int:
        done = self.backend.event_query(self.events.get(event).obj)
        return 0 if done else int(CUresult.CUDA_ERROR_NOT_READY)

    def event_elapsed(self, start: int, end: int) -> tuple[float]:
        return (self.backend.event_elapsed(self.events.get(start).obj, self.events.get(end).obj),)

    # ---- modules and launches -----------------------------------------------------------------
    def module_load(self, ctx: int, module: int, digest: bytes, image: bytes) -> bytes | int:
        self._ctx(ctx)
        if module in self.modules:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"module handle {module:#x} in use")
        if image:
            if hashlib.sha256(image).digest() != digest:
                raise CudaError(
                    CUresult.CUDA_ERROR_INVALID_VALUE, "module image does not match its digest"
                )
            data: bytes | None = image
        else:
            self.images.pin(digest)  # before the read: an eviction may not take it from under us
            data = self.image(digest)
        if data is None:
            self._unpin_unused(digest)
            return CRANE_NEED_IMAGE
        mark = self.module_area.mark()
        try:
            info, loaded = self.load_module(
                ctx, module, digest, data, lambda size: self.module_area.place(self.backend, size)
            )
        except BaseException:
            self.module_area.rollback(self.backend, mark, self.default_stream)
            raise
        if image:  # cached only once it loaded: a refused image must not fill the store
            self.store_image(digest, image)
        desc = {
            "kind": info.kind,
            "description": info.description,
            "kernels": {
                name: {
                    "params": [list(p) for p in k.params],
                    "param_bytes": k.param_bytes,
                    "static_shared": k.static_shared_bytes or 0,
                    "max_threads": k.max_threads_per_block,
                    "versions": list(self.backend.code_versions(loaded, name)),
                    "cluster": k.cluster_dims,
                }
                for name, k in info.kernels.items()
            },
            "globals": {n: [g.addr, g.size] for n, g in loaded.globals.items()},
        }
        return json.dumps(desc).encode()

    def module_unload(self, module: int) -> None:
        owned = self.modules.pop(module)
        self._launches_ok.clear()  # (its functions' peaks go: a reload must fold them again)
        for h in [h for h in self.functions if self.functions.get(h).meta == module]:
            self.functions.pop(h)
            self.launch_peaks.pop(h, None)
        self.backend.module_unload(owned.obj)
        self._unpin_unused(owned.meta)

    def function_bind(self, function: int, module: int, name: bytes) -> None:
        owned = self.modules.get(module)
        kernel = name.decode("utf-8", "replace")
        if kernel not in owned.obj.image.kernels:
            raise CudaError(CUresult.CUDA_ERROR_NOT_FOUND, f"module has no kernel {kernel!r}")
        self.functions.add(function, owned.ctx, kernel, module)

    def function_set_max_dynamic_shared(self, function: int, size: int) -> None:
        self.functions.get(function)
        optin = self.backend.snapshot.attributes[
            CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        ]
        if size > optin:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE, f"{size} bytes exceeds the opt-in limit {optin}"
            )
        self.max_dynamic_shared[function] = size

    def device_runtime_limits(self, ctx: int, heap: int, pending: int) -> None:
        """cuCtxSetLimit's device-heap size and pending-launch count, for later launches."""
        self.contexts.get(ctx)
        self.backend.set_device_runtime_limits(heap, pending)

    def launch(self, function: int, config: LaunchConfig, stream: int, params: bytes) -> None:
        self._launch(function, config, stream, params, cooperative=False)

    def launch_cooperative(
        self, function: int, config: LaunchConfig, stream: int, params: bytes
    ) -> None:
        """The checks of a launch plus the device's co-residency limit (the guest checked it
        too, but the worker never trusts the guest), then a cooperative launch."""
        self._launch(function, config, stream, params, cooperative=True)

    def launch_cluster(
        self,
        function: int,
        config: LaunchConfig,
        stream: int,
        cluster_x: int,
        cluster_y: int,
        cluster_z: int,
        flags: int,
        params: bytes,
    ) -> None:
        """A cluster launch: the checks of a launch (cooperative ones with flag 1) plus the
        driver's cluster rules, then the backend runs the grid as clusters."""
        if flags & ~3:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown launch flags {flags:#x}")
        cluster = (cluster_x, cluster_y, cluster_z)
        self._launch(function, config, stream, params, bool(flags & 1), cluster, bool(flags & 2))

    def param_layout(self, function: int) -> tuple[tuple[int, int], ...]:
        """The (offset, size) of each parameter of a bound kernel: where its parameter buffer
        can hold pointers (the dirty tracker reads only those words)."""
        fn = self.functions.get(function)
        return self.modules.get(fn.meta).obj.image.kernels[fn.obj].params

    def _peak(self, function: int, launch: tuple[int, int, int, int]) -> None:
        """Fold one validated launch into the function's peaks (elementwise maximum)."""
        old = self.launch_peaks.get(function)
        self.launch_peaks[function] = (
            list(launch) if old is None else [max(a, b) for a, b in zip(old, launch, strict=True)]
        )

    def _launch(
        self,
        function: int,
        config: LaunchConfig,
        stream: int,
        params: bytes,
        cooperative: bool,
        cluster: tuple[int, int, int] | None = None,
        non_portable_cluster: bool = False,
    ) -> None:
        """Validate a launch like the driver does (never trusting the guest), then run it."""
        fn = self.functions.get(function)
        loaded = self.modules.get(fn.meta).obj
        kernel = loaded.image.kernels[fn.obj]
        if len(params) != kernel.param_bytes:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"{fn.obj}: parameter buffer is {len(params)} bytes, kernel takes "
                f"{kernel.param_bytes}",
            )
        max_dyn = self.max_dynamic_shared.get(function)
        grid, block, shared = config
        key = (function, grid, block, shared, max_dyn, cooperative, cluster, non_portable_cluster)
        if self._launches_ok.get(key) is not kernel:  # (a configuration checked once is fine)
            limits = {
                "static_shared": kernel.static_shared_bytes or 0,
                "max_threads": kernel.max_threads_per_block,
            }
            attrs = self.backend.snapshot.attributes
            check_launch(attrs, grid, block, shared, max_dynamic_shared=max_dyn, **limits)
            if cooperative:
                check_cooperative(attrs, grid, block, shared, **limits)
            if cluster is not None:
                check_cluster(attrs, grid, cluster, non_portable=non_portable_cluster)
            ctas = cluster[0] * cluster[1] * cluster[2] if cluster is not None else 0
            self._peak(function, (shared, block[0] * block[1] * block[2], ctas, int(cooperative)))
            if len(self._launches_ok) < _LAUNCHES_OK:
                self._launches_ok[key] = kernel
        extra = {}
        if cluster is not None:
            extra = {"cluster": cluster, "non_portable_cluster": non_portable_cluster}
        self.backend.launch(
            loaded,
            fn.obj,
            grid,
            block,
            shared,
            self._stream(stream),
            params,
            max_dynamic_shared=max_dyn,
            cooperative=cooperative,
            **extra,
        )
