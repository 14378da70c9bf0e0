"""Applies batches of guest calls to a backend: the worker's data path.

One method per op in :data:`crane.api.ops.OPS`, named ``op.handler``; the dispatch table is
built from the call table at start and a missing handler is a start-up error, so the table and
the worker cannot drift. The executor owns the session's object tables and the error rules:

* asynchronous calls that fail get a reply with their sequence number (the guest surfaces it at
  its next synchronizing call); synchronous calls always get a reply;
* a kernel fault (illegal address, trap, assert, ...) is *sticky*: every later call fails with it
  until the context is destroyed, as on real hardware;
* malformed input (undecodable batch, unknown op, bad argument bytes) is answered with
  CUDA_ERROR_INVALID_VALUE / CUDA_ERROR_NOT_SUPPORTED and a log line, never a crash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from crane.api.generated.cuda_enums import CUdevice_attribute, CUresult
from crane.api.launch_check import check_cooperative, check_launch
from crane.api.ops import OPS, Op
from crane.api.results import STICKY, CudaError
from crane.backends.base import Backend, LoadedModule
from crane.device.layout import CHUNK_GRANULARITY
from crane.modules.errors import ImageError, NoCompatibleCode
from crane.modules.image import ModuleImage, inspect_image
from crane.state.dirty import SCAN_LIMIT, DirtyTracker
from crane.v1 import guest_pb2
from crane.wire.batch_flags import EXPECTS_REPLY, peek_flags
from crane.wire.replies import encode_data_reply
from crane.wire.status import CRANE_NEED_IMAGE, MAX_CHUNK
from crane.worker.objects import HandleTable

__all__ = ["MODULE_AREA", "Executor"]

log = logging.getLogger("crane.worker")

#: Top of the session window reserved for module variables (placed by the worker, not the guest).
MODULE_AREA = 64 << 30


#: Ops that still run after a sticky error (tearing down is always allowed).
_TEARDOWN = frozenset({"SESSION_CLOSE", "CTX_DESTROY", "MEM_FREE", "MEM_UNMAP_CHUNK"})

_DEFAULT_STREAMS = (0, 1, 2)  # NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD

#: Reads at least this large are sent as their own hand-encoded reply (one copy, not three).
_BULK = 64 << 10


class Executor:
    """The per-session interpreter of call batches."""

    def __init__(
        self,
        backend: Backend,
        session_id: str,
        window: tuple[int, int],
        module_cache: Path,
    ) -> None:
        self.backend = backend
        self.session_id = session_id
        self.window = window
        self.module_cache = module_cache
        self.contexts: HandleTable[None] = HandleTable(
            "context", CUresult.CUDA_ERROR_INVALID_CONTEXT
        )
        self.streams: HandleTable[Any] = HandleTable("stream")
        self.events: HandleTable[Any] = HandleTable("event")
        self.modules: HandleTable[LoadedModule] = HandleTable("module")
        self.functions: HandleTable[str] = HandleTable("function")
        self.max_dynamic_shared: dict[int, int] = {}  # function -> raised dynamic smem limit
        self.allocations: dict[int, tuple[int, int]] = {}  # addr -> (ctx, size)
        self.chunks: dict[int, int] = {}  # addr -> size, guest-mapped
        self._chunk_bytes = 0
        self._default_stream = backend.stream_create(0, 0)
        self._module_next = window[0] + window[1] - MODULE_AREA
        self._module_chunk_end = self._module_next
        self.sticky: CudaError | None = None
        self.closed = False
        self.calls = 0
        self.done_seq = 0
        #: The messages answering the last batch that expected a reply: a guest that reconnects
        #: after a park resends that batch if the answer never reached it (see run_batch).
        self.last_replies: list[bytes] = []
        self.dirty = DirtyTracker()
        self._handlers: dict[int, tuple[Op, Callable[..., Any]]] = {}
        self._writes: dict[int, tuple[int, ...]] = {}
        for o in OPS:
            if o.retired:
                continue
            fn = getattr(self, o.handler, None)
            if fn is None:
                raise RuntimeError(f"worker has no handler for op {o.name}")
            self._handlers[o.id] = (o, fn)
            names = [p.name for p in o.args]
            self._writes[o.id] = tuple(names.index(w) for w in o.writes)
        self._launch_op = next(o.id for o in OPS if o.name == "LAUNCH")

    # ---- batches ------------------------------------------------------------------------------
    def run_batch(self, raw: bytes) -> list[bytes]:
        """Execute one serialized CallBatch; return the serialized ReplyBatch messages to send.

        A batch flagged EXPECTS_REPLY always gets at least one message (the daemon waits for
        it); others get one only if a call failed or a kernel printed.
        """
        out: list[bytes] = []
        replies = guest_pb2.ReplyBatch()
        pending = 0
        try:
            batch = guest_pb2.CallBatch.FromString(raw)
        except DecodeError as e:
            log.warning(
                "session %s: malformed call batch (%d bytes): %s", self.session_id, len(raw), e
            )
            replies.replies.add(
                seq=0, result=CUresult.CUDA_ERROR_INVALID_VALUE, detail=f"malformed call batch: {e}"
            )
            replies.done_seq = self.done_seq
            return [replies.SerializeToString()]
        expects = bool(peek_flags(raw) & EXPECTS_REPLY)
        fresh = [c for c in batch.calls if c.seq > self.done_seq]
        if not fresh and len(batch.calls) and expects:
            # a resent batch (the guest reconnected): everything in it ran before, its answer
            # may never have arrived; answer again (the guest drops what it already has)
            replies.done_seq = self.done_seq
            return [*self.last_replies, replies.SerializeToString()]
        for call in fresh:
            reply = self._run_call(call)
            self.calls += 1
            self.done_seq = call.seq
            if isinstance(reply, bytes):  # a bulk read, already a serialized ReplyBatch
                if len(replies.replies):
                    out.append(self._finish(replies))
                    replies = guest_pb2.ReplyBatch()
                    pending = 0
                out.append(reply)
            elif reply is not None:
                replies.replies.append(reply)
                pending += len(reply.data) + 64
                if pending >= MAX_CHUNK:
                    out.append(self._finish(replies))
                    replies = guest_pb2.ReplyBatch()
                    pending = 0
            if self.closed:
                break
        if len(replies.replies) or (not out and expects):
            out.append(self._finish(replies))
        else:
            text = self.backend.take_stdout()
            if text:
                out.append(
                    guest_pb2.ReplyBatch(done_seq=self.done_seq, stdout=text).SerializeToString()
                )
        if expects:
            self.last_replies = out
        return out

    def _finish(self, replies: guest_pb2.ReplyBatch) -> bytes:
        replies.done_seq = self.done_seq
        text = self.backend.take_stdout()
        if text:
            replies.stdout = text
        return replies.SerializeToString()

    def _run_call(self, call: guest_pb2.Call) -> guest_pb2.Reply | bytes | None:
        entry = self._handlers.get(call.op)
        if entry is None:
            return self._error(
                call, None, CudaError(CUresult.CUDA_ERROR_NOT_SUPPORTED, f"unknown op {call.op}")
            )
        o, fn = entry
        try:
            args = o.unpack(call.args)
        except struct.error as e:
            return self._error(
                call, o, CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"malformed arguments: {e}")
            )
        if self.sticky is not None and o.name not in _TEARDOWN:
            return self._error(call, o, self.sticky, quiet=True)
        try:
            result = fn(*args, call.data) if o.data_in else fn(*args)
        except CudaError as e:
            if e.code in STICKY:
                self.sticky = e
            return self._error(call, o, e)
        except Exception as e:  # a bug in a backend: report, log, keep serving
            log.exception("session %s: %s failed unexpectedly", self.session_id, o.name)
            return self._error(call, o, CudaError(CUresult.CUDA_ERROR_UNKNOWN, repr(e)))
        for i in self._writes[o.id]:
            self.dirty.write(args[i])
        if o.id == self._launch_op:
            self.dirty.launch(call.data)
        if not (o.sync or o.data_out):
            return None
        if isinstance(result, memoryview) and result.nbytes >= _BULK:
            return encode_data_reply(call.seq, result, call.seq)
        reply = guest_pb2.Reply(seq=call.seq, result=0)
        if isinstance(result, tuple):
            reply.out = o.pack_results(*result)
        elif isinstance(result, bytes | bytearray | memoryview):
            reply.data = bytes(result)
        elif isinstance(result, int) and result:
            reply.result = result
        return reply

    def _error(
        self, call: guest_pb2.Call, o: Op | None, e: CudaError, quiet: bool = False
    ) -> guest_pb2.Reply:
        code = int(e.code)
        if not quiet:
            log.warning(
                "session %s: seq %d %s -> %s: %s",
                self.session_id,
                call.seq,
                o.name if o else f"op#{call.op}",
                e.code.name if isinstance(e.code, CUresult) else code,
                e.message,
            )
        return guest_pb2.Reply(seq=call.seq, result=code, detail=e.message)

    # ---- helpers ------------------------------------------------------------------------------
    def _ctx(self, ctx: int) -> None:
        self.contexts.get(ctx)

    def _stream(self, handle: int) -> Any:
        if handle in _DEFAULT_STREAMS:
            return self._default_stream
        return self.streams.get(handle).obj

    def mem_used(self) -> int:
        """Device bytes the session has committed (guest chunks + module variables)."""
        return self._chunk_bytes + (
            self._module_chunk_end - (self.window[0] + self.window[1] - MODULE_AREA)
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
            self.backend.module_unload(self.modules.pop(h).obj)
        for addr in [a for a, (c, _) in self.allocations.items() if c == ctx]:
            self.mem_free(addr)
        self.contexts.pop(ctx)
        self.sticky = None  # destroying (resetting) the context clears a sticky fault

    def ctx_synchronize(self, ctx: int) -> None:
        self._ctx(ctx)
        self.backend.synchronize()

    # ---- memory -------------------------------------------------------------------------------
    def _check_in_window(self, addr: int, size: int) -> None:
        base, span = self.window
        if addr < base or addr + size > base + span - MODULE_AREA:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"range {addr:#x}+{size:#x} is outside the session's VA window",
            )

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

    def memcpy_htod(self, dst: int, stream: int, data: bytes) -> None:
        self.backend.memcpy_htod(dst, data, self._stream(stream))
        if len(data) <= SCAN_LIMIT:
            self.dirty.scan(dst, data)  # a table of device pointers (see crane.state.dirty)

    def memcpy_dtoh(self, src: int, size: int, stream: int) -> bytes | memoryview:
        if size > MAX_CHUNK:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"read of {size} bytes exceeds the per-call limit of {MAX_CHUNK}",
            )
        return self.backend.memcpy_dtoh(src, size, self._stream(stream))

    def memcpy_dtod(self, dst: int, src: int, size: int, stream: int) -> None:
        self.backend.memcpy_dtod(dst, src, size, self._stream(stream))
        self.dirty.copied(dst, src)

    def memset(self, dst: int, value: int, elem_size: int, count: int, stream: int) -> None:
        if elem_size not in (1, 2, 4):
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"memset element size {elem_size}")
        self.backend.memset(dst, value, elem_size, count, self._stream(stream))

    # ---- streams and events -------------------------------------------------------------------
    def stream_create(self, ctx: int, stream: int, flags: int, priority: int) -> None:
        self._ctx(ctx)
        if stream in _DEFAULT_STREAMS:
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
    def _image_bytes(self, digest: bytes, image: bytes) -> bytes | None:
        path = self.module_cache / digest.hex()
        if not image:
            try:
                return path.read_bytes()
            except FileNotFoundError:
                return None
        if hashlib.sha256(image).digest() != digest:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE, "module image does not match its digest"
            )
        if not path.exists():
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(image)
            tmp.replace(path)
        return image

    def _place_global(self, size: int) -> int:
        """Bump-allocate a module variable in the module area, committing chunks as needed."""
        addr = (self._module_next + 255) & ~255
        end = addr + max(size, 1)
        while end > self._module_chunk_end:
            self.backend.map_chunk(self._module_chunk_end, CHUNK_GRANULARITY)
            self._module_chunk_end += CHUNK_GRANULARITY
        self.backend.mem_alloc(addr, max(size, 1))
        self._module_next = end
        return addr

    def module_load(self, ctx: int, module: int, digest: bytes, image: bytes) -> bytes | int:
        self._ctx(ctx)
        if module in self.modules:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"module handle {module:#x} in use")
        data = self._image_bytes(digest, image)
        if data is None:
            return CRANE_NEED_IMAGE
        info, loaded = self.load_module(ctx, module, digest, data, self._place_global)
        desc = {
            "kind": info.kind,
            "description": info.description,
            "kernels": {
                name: {
                    "params": [list(p) for p in k.params],
                    "param_bytes": k.param_bytes,
                    "static_shared": k.static_shared_bytes or 0,
                    "max_threads": k.max_threads_per_block,
                }
                for name, k in info.kernels.items()
            },
            "globals": {n: [g.addr, g.size] for n, g in loaded.globals.items()},
        }
        return json.dumps(desc).encode()

    def load_module(
        self,
        ctx: int,
        module: int,
        digest: bytes,
        data: bytes,
        place: Callable[[int], int],
    ) -> tuple[ModuleImage, LoadedModule]:
        """Load an image for this device and record it; a restore passes its own ``place``
        (the recorded addresses of the module variables) so that they land where they were."""
        try:
            info: ModuleImage = inspect_image(data, self.backend.snapshot.cc)
        except NoCompatibleCode as e:
            raise CudaError(CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU, str(e)) from None
        except ImageError as e:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_IMAGE, str(e)) from None
        loaded = self.backend.module_load(info, place, data=data)
        self.modules.add(module, ctx, loaded, digest)
        return info, loaded

    def module_unload(self, module: int) -> None:
        owned = self.modules.pop(module)
        for h in [h for h in self.functions if self.functions.get(h).meta == module]:
            self.functions.pop(h)
        self.backend.module_unload(owned.obj)

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

    def launch(
        self,
        function: int,
        gx: int,
        gy: int,
        gz: int,
        bx: int,
        by: int,
        bz: int,
        shared: int,
        stream: int,
        params: bytes,
    ) -> None:
        self._launch(function, (gx, gy, gz), (bx, by, bz), shared, stream, params)

    def launch_cooperative(
        self,
        function: int,
        gx: int,
        gy: int,
        gz: int,
        bx: int,
        by: int,
        bz: int,
        shared: int,
        stream: int,
        params: bytes,
    ) -> None:
        """LAUNCH_COOPERATIVE: the checks of LAUNCH plus the device's co-residency limit (the
        guest checked it too, but the worker never trusts the guest), then a cooperative launch.
        Marks what the kernel may write itself: the generic dirty marking is LAUNCH's."""
        self._launch(function, (gx, gy, gz), (bx, by, bz), shared, stream, params, cooperative=True)
        self.dirty.launch(params)

    def _launch(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: int,
        stream: int,
        params: bytes,
        cooperative: bool = False,
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
        limits = {
            "static_shared": kernel.static_shared_bytes or 0,
            "max_threads": kernel.max_threads_per_block,
        }
        attrs = self.backend.snapshot.attributes
        max_dyn = self.max_dynamic_shared.get(function)
        check_launch(attrs, grid, block, shared, max_dynamic_shared=max_dyn, **limits)
        if cooperative:
            check_cooperative(attrs, grid, block, shared, **limits)
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
        )
