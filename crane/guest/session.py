"""The guest session: the Python API the interposer sits on, one method per driver operation.

What is answered locally (invariant 3): device identity and attributes (cached at open), handle
validity, address-range validity of copies (from the guest's own VA allocator), launch limits,
kernel look-up (kernels and their parameter layouts come back with the module load). What goes
to the daemon: everything that touches the device, batched (see :mod:`crane.guest.transport`).

Errors are raised as :class:`crane.api.results.CudaError` carrying the CUresult the application
should see; errors of asynchronous calls are raised by the next synchronizing call. The
transport below raises :class:`crane.api.errors.TransportError` (the daemon is gone, the stream
broke); this class is where that becomes the CUresult it means for the application
(:meth:`GuestSession._enqueue`, :meth:`GuestSession._wait`), so no transport failure reaches a
caller as anything but a CUDA error.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from crane.api.errors import TransportError
from crane.api.generated.cuda_enums import CUresult
from crane.api.launch_check import check_cluster, check_cooperative, check_launch
from crane.api.ops import OPS_BY_NAME, Op
from crane.api.results import CudaError
from crane.device.identity import DeviceSnapshot, snapshot_from_proto
from crane.guest import ring_bulk
from crane.guest.handles import HandleAllocator, HandleKind
from crane.guest.mirror import PAGE, HostMirrors, Mirror, MirrorError, map_fixed, unmap_fixed
from crane.guest.ring_bulk import BULK_MIN
from crane.guest.transport import MAX_BATCH_CALLS as _BATCH
from crane.guest.transport import CallReply, Transport
from crane.guest.va import VaAllocator, VaError
from crane.guest.vmm import Vmm
from crane.wire.channel import TlsFiles
from crane.wire.packed import SYNC_OPS
from crane.wire.status import CRANE_NEED_IMAGE, MAX_CHUNK

__all__ = ["Function", "GuestSession", "KernelLayout", "Module"]

_O = OPS_BY_NAME
_DEFAULT_STREAMS = (0, 1, 2)
_LAUNCH = _O["LAUNCH"]
_LAUNCH_COOPERATIVE = _O["LAUNCH_COOPERATIVE"]
_LAUNCH_CLUSTER = _O["LAUNCH_CLUSTER"]
_MEMSET = _O["MEMSET"]
_MEMSET_ID = _MEMSET.id


@dataclass(frozen=True)
class KernelLayout:
    """A kernel's parameters as (offset, size) pairs, from the module's code."""

    name: str
    params: tuple[tuple[int, int], ...]
    param_bytes: int
    static_shared: int = 0
    max_threads: int | None = None
    #: cuFuncGetAttribute's PTX_VERSION and BINARY_VERSION of the code the device runs.
    ptx_version: int = 0
    binary_version: int = 0
    #: compiled cluster shape (``__cluster_dims__``), else None
    cluster: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class Module:
    handle: int
    kind: str
    description: str
    kernels: dict[str, KernelLayout]
    globals: dict[str, tuple[int, int]]  # name -> (device address, size)


@dataclass(frozen=True)
class Function:
    handle: int
    module: int
    layout: KernelLayout


@dataclass
class _Objects:
    contexts: set[int] = field(default_factory=set)
    streams: set[int] = field(default_factory=set)
    events: set[int] = field(default_factory=set)
    modules: dict[int, Module] = field(default_factory=dict)
    functions: dict[int, Function] = field(default_factory=dict)


class GuestSession:
    """A connection to craned and the guest-side state of one CUDA session."""

    def __init__(
        self,
        address: str | None = None,
        device: int = -1,
        client: str = "",
        direct: bool | None = None,
        alternates: Sequence[str] = (),
        tls: TlsFiles | None = None,
    ) -> None:
        """``alternates``: other daemons where this session may be restored after a park.
        ``tls``: the certificate for ``tcp://`` daemons (None: ``$CRANE_TLS_*``)."""
        try:
            self._t = Transport(address, device, client, direct, alternates, tls)
        except TransportError as e:
            raise e.as_cuda_error() from e
        o = self._t.opened
        self.session_id: str = o.session_id
        self.device: DeviceSnapshot = snapshot_from_proto(o.device)
        self.attributes = self.device.attributes
        self.driver_version: int = o.driver_version
        self.va_window = (o.va_base, o.va_size)
        self._handles = HandleAllocator()
        self._objs = _Objects()
        # module variables' ranges (start -> end), starts sorted: the worker places them (the
        # driver does, on a real GPU), outside the span the guest allocates in
        self._var_starts: list[int] = []
        self._var_ends: dict[int, int] = {}
        self._lock = threading.RLock()
        self._launch_ok: set[tuple[object, ...]] = set()  # launch configurations checked
        self.va = VaAllocator(
            o.va_base,
            o.va_size,
            self._map_chunk,
            self._unmap_chunk,
            granularity=o.chunk_granularity,
        )
        #: The CUDA VMM API's reservations, handles and mappings (crane.guest.vmm).
        self.vmm = Vmm(self.va, _VmmDevice(self), self._lock)
        self._put = self._t.queue.put
        #: Mapped and managed host memory kept coherent with its device mirror.
        self.mirrors = HostMirrors(self._raw_htod, self._raw_dtoh)
        self._mirrored = self.mirrors.mirrored
        #: Who keeps a copy of what this session's checks accepted (:meth:`on_forget`).
        self._forget_hooks: list[Callable[[], None]] = []
        self.va.on_forget = self.mirrors.on_add = self._forget
        #: Set by the interposer once this process reserved the device window (PROT_NONE), so
        #: shared-address host memory may replace the reservation's pages.
        self.window_reserved = False
        self.primary_context = self.ctx_create()

    @classmethod
    def open(cls, address: str | None = None, device: int = -1, client: str = "") -> GuestSession:
        return cls(address, device, client)

    def __enter__(self) -> GuestSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing -----------------------------------------------------------------------------
    def _enqueue(
        self, op: Op, args: bytes, data: bytes = b"", *, expect: bool, send: bool = True
    ) -> int:
        """:meth:`Transport.enqueue`, a broken transport reported as the CUDA error it means."""
        try:
            return self._t.enqueue(op, args, data, expect=expect, send=send)
        except TransportError as e:
            raise e.as_cuda_error() from e

    def _wait(self, seq: int) -> CallReply:
        """:meth:`Transport.wait`, a broken transport reported as the CUDA error it means."""
        try:
            return self._t.wait(seq)
        except TransportError as e:
            raise e.as_cuda_error() from e

    def _call(self, op: Op, *args: int) -> tuple[int, CallReply]:
        """:meth:`Transport.call` (a synchronizing op that travels as a record): ``(seq,
        reply)``, a broken transport reported as the CUDA error it means."""
        try:
            return self._t.call(op, *args)
        except TransportError as e:
            raise e.as_cuda_error() from e

    def _async(self, op: Op, *args: object, data: bytes = b"") -> None:
        try:  # (inline, not through _enqueue: the hot path of every asynchronous call)
            self._t.enqueue(op, op.pack(*args), data, expect=False)
        except TransportError as e:
            raise e.as_cuda_error() from e

    def _sync(self, op: Op, *args: object, data: bytes = b"") -> CallReply:
        try:
            if data or op.id not in SYNC_OPS:
                seq = self._t.enqueue(op, op.pack(*args), data, expect=True)
                reply = self._t.wait(seq)
            else:  # (the transport's one call: every idle synchronize takes this path)
                seq, reply = self._t.call(op, *args)  # type: ignore[arg-type]
        except TransportError as e:
            raise e.as_cuda_error() from e
        return self._settle(seq, reply)

    def _settle(self, seq: int, reply: CallReply) -> CallReply:
        """Raise a pending asynchronous error first, then this call's own."""
        pending = self._t.take_async_error(seq)
        if pending is not None:
            raise CudaError(CUresult(pending.result), pending.detail)
        if reply.result and reply.result != CRANE_NEED_IMAGE:
            raise CudaError(_as_result(reply.result), reply.detail)
        return reply

    def _ctx(self, ctx: int | None) -> int:
        ctx = self.primary_context if ctx is None else ctx
        if ctx not in self._objs.contexts:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_CONTEXT, f"unknown context {ctx:#x}")
        return ctx

    def check_stream(self, stream: int) -> int:
        """``stream`` if it names a stream of this session (or a default stream), else
        CUDA_ERROR_INVALID_HANDLE: answered locally, without a round trip."""
        if stream not in _DEFAULT_STREAMS and stream not in self._objs.streams:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"unknown stream {stream:#x}")
        return stream

    def check_event(self, event: int) -> int:
        """``event`` if it names an event of this session, else CUDA_ERROR_INVALID_HANDLE."""
        if event not in self._objs.events:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"unknown event {event:#x}")
        return event

    def _in_module_global(self, addr: int, size: int) -> bool:
        return any(
            g <= addr and addr + size <= g + n
            for m in self._objs.modules.values()
            for g, n in m.globals.values()
        )

    def _range(self, addr: int, size: int) -> None:
        """Local check that a device range lies in one allocation or module variable."""
        if not self.va.check(addr, size) and not self._in_module_global(addr, size):
            hit = self.va.find(addr)
            why = (
                "is not inside any allocation"
                if hit is None
                else f"runs past the allocation {hit[0]:#x}+{hit[1]:#x}"
            )
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE, f"device range {addr:#x}+{size:#x} {why}"
            )

    # ---- contexts -----------------------------------------------------------------------------
    def ctx_create(self, flags: int = 0) -> int:
        h = self._handles.new(HandleKind.CONTEXT)
        self._async(_O["CTX_CREATE"], h, flags)
        self._objs.contexts.add(h)
        return h

    def ctx_destroy(self, ctx: int) -> None:
        self._ctx(ctx)
        self.vmm.forget_context(ctx)
        self._forget()  # (its memory and streams go with it on the worker)
        self._async(_O["CTX_DESTROY"], ctx)
        self._objs.contexts.discard(ctx)

    def ctx_synchronize(self, ctx: int | None = None) -> None:
        self._sync(_O["CTX_SYNCHRONIZE"], self._ctx(ctx))
        if self.mirrors.pending:
            self._pull(None)

    synchronize = ctx_synchronize

    def ctx_reset_primary(self) -> None:
        """cuDevicePrimaryCtxReset: destroy the primary context with everything in it (which
        clears a sticky fault) and start a fresh one."""
        self.ctx_destroy(self.primary_context)
        self.primary_context = self.ctx_create()

    # ---- memory -------------------------------------------------------------------------------
    def _map_chunk(self, addr: int, size: int) -> None:
        """Map a chunk; an earlier asynchronous error reported by this call still fails it,
        but the chunk the worker did map is unmapped first, so the allocator (which takes the
        failure as "not mapped" and reuses the range) and the worker keep agreeing."""
        seq, reply = self._call(_O["MEM_MAP_CHUNK"], addr, size)
        pending = self._t.take_async_error(seq)
        if pending is not None:
            if not reply.result:
                self._async(_O["MEM_UNMAP_CHUNK"], addr)
            raise CudaError(CUresult(pending.result), pending.detail)
        self._settle(seq, reply)

    def _unmap_chunk(self, addr: int) -> None:
        self._async(_O["MEM_UNMAP_CHUNK"], addr)

    def mem_alloc(self, size: int, ctx: int | None = None) -> int:
        ctx = self._ctx(ctx)
        with self._lock:
            try:
                addr = self.va.alloc(size)
            except VaError as e:
                raise CudaError(
                    CUresult.CUDA_ERROR_INVALID_VALUE
                    if size <= 0
                    else CUresult.CUDA_ERROR_OUT_OF_MEMORY,
                    str(e),
                ) from None
        self._async(_O["MEM_ALLOC"], ctx, addr, size)
        return addr

    def mem_free(self, addr: int) -> None:
        if addr == 0:
            return  # cuMemFree(0) is a no-op, as cudaFree(NULL)
        with self._lock:
            if self.va.find(addr) is None or self.va.find(addr)[0] != addr:  # type: ignore[index]
                raise CudaError(
                    CUresult.CUDA_ERROR_INVALID_VALUE,
                    f"{addr:#x} is not an allocation of this session",
                )
            m = self.mirrors.by_dev(addr) if self.mirrors else None
            if m is not None and m.dev == addr and m.kind == "managed":
                self.mirror_release(m)  # cuMemFree frees managed memory too
                return
            if m is not None:
                raise CudaError(
                    CUresult.CUDA_ERROR_INVALID_VALUE,
                    f"{addr:#x} is page-locked host memory (free it with cuMemFreeHost)",
                )
            self._async(_O["MEM_FREE"], addr)
            self.va.free(addr)

    # ---- host memory kernels address (crane.guest.mirror) --------------------------------------
    def _pull(self, settled: int | None) -> None:
        with self._lock:
            self.mirrors.pull(settled)

    def push_mirrors(self, stream: int, blocks: list[Mirror] | None = None) -> None:
        """Send the host's changes to mirrored memory ahead of ``stream``'s next work (all
        blocks, or ``blocks``: cuMemPrefetchAsync to the device)."""
        with self._lock:
            self.mirrors.push(stream, blocks)

    def _page_aligned(self, size: int) -> int:
        try:
            return self.va.alloc(size, align=PAGE)
        except VaError as e:
            raise CudaError(CUresult.CUDA_ERROR_OUT_OF_MEMORY, str(e)) from None

    def mirror_shared(self, size: int, kind: str, flags: int = 0) -> int:
        """Managed memory or mapped pinned memory: ``size`` bytes at one address valid both
        here and in kernels (device memory there, host pages mapped at the same address here)."""
        if size <= 0:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"cannot allocate {size} bytes")
        rounded = (size + PAGE - 1) // PAGE * PAGE
        ctx = self._ctx(None)
        with self._lock:
            addr = self._page_aligned(rounded)
            try:
                map_fixed(addr, rounded, replace=self.window_reserved)
            except MirrorError as e:
                self.va.free(addr)
                raise CudaError(CUresult.CUDA_ERROR_OUT_OF_MEMORY, str(e)) from None
            self._async(_O["MEM_ALLOC"], ctx, addr, rounded)
            self.mirrors.add(Mirror(addr, addr, rounded, kind, flags))
        return addr

    def mirror_register(self, host: int, size: int, flags: int = 0) -> int:
        """cuMemHostRegister(DEVICEMAP): a device mirror of the application's own pages;
        returns the mirror's address (what kernels use)."""
        ctx = self._ctx(None)
        with self._lock:
            dev = self._page_aligned(size)
            self._async(_O["MEM_ALLOC"], ctx, dev, size)
            self.mirrors.add(Mirror(host, dev, size, "registered", flags))
        return dev

    def mirror_release(self, m: Mirror) -> None:
        """Stop mirroring ``m`` and free its device memory (and, for shared-address memory,
        its host pages)."""
        with self._lock:
            self.mirrors.remove(m)
            self._async(_O["MEM_FREE"], m.dev)
            self.va.free(m.dev)
            if m.host == m.dev:
                unmap_fixed(m.host, m.size, reserved=self.window_reserved)

    def _spans(self, addr: int, size: int) -> list[tuple[int, int]] | None:
        """The pieces of a device range that runs across back-to-back VMM mappings (one range
        to the application, separate allocations to the worker); None otherwise."""
        if not self.va.mappings or self.va.check(addr, size):
            return None
        return self.va.segments(addr, size)

    def _cuts(self, dst: int, src: int, size: int) -> list[tuple[int, int]] | None:
        """Offsets ``(off, n)`` splitting a device-to-device copy so that each piece lies in
        one allocation or mapping on both sides; None when no split is needed."""
        d, s = self._spans(dst, size), self._spans(src, size)
        if d is None and s is None:
            return None
        cuts = {0, size}
        cuts.update(a - dst for a, _ in d or ())
        cuts.update(a - src for a, _ in s or ())
        edges = sorted(cuts)
        return [(a, b - a) for a, b in itertools.pairwise(edges)]

    def mem_get_info(self) -> tuple[int, int]:
        reply = self._sync(_O["MEM_GET_INFO"])
        return _O["MEM_GET_INFO"].unpack_results(reply.out)

    def memcpy_htod(
        self, dst: int, src: bytes | bytearray | memoryview | np.ndarray, stream: int = 0
    ) -> None:
        """Copy host bytes to the device; the source may be reused as soon as this returns."""
        view = (
            memoryview(src).cast("B")
            if not isinstance(src, np.ndarray)
            else memoryview(np.ascontiguousarray(src)).cast("B")
        )
        spans = self._spans(dst, view.nbytes)
        if spans:
            for a, n in spans:
                self.memcpy_htod(a, view[a - dst : a - dst + n], stream)
            return
        self._range(dst, view.nbytes)
        stream = self.check_stream(stream)
        self._raw_htod(dst, view, stream)
        if self.mirrors:
            self.mirrors.issued(stream)

    def _raw_htod(self, dst: int, view: memoryview, stream: int) -> None:
        bulk = self._t.bulk if view.nbytes >= BULK_MIN > 0 else None
        if bulk is not None:  # through the call ring's bulk area (crane.guest.ring_bulk)
            try:
                return ring_bulk.htod(self._t, bulk, dst, view, stream)
            except TransportError as e:
                raise e.as_cuda_error() from e
        op = _O["MEMCPY_HTOD"]
        for off in range(0, view.nbytes, MAX_CHUNK):
            part = view[off : off + MAX_CHUNK]
            self._async(op, dst + off, stream, data=part.tobytes())

    def _raw_dtoh(self, src: int, size: int) -> bytearray:
        """Read device memory in stream order on the legacy default stream."""
        buf = bytearray(size)
        self._dtoh(src, size, 0, memoryview(buf))
        return buf

    def memcpy_dtoh(
        self,
        src: int,
        size: int | None = None,
        stream: int = 0,
        out: bytearray | memoryview | np.ndarray | None = None,
    ) -> bytes | None:
        """Read device memory; returns bytes, or fills ``out`` (then returns None)."""
        target = None
        if out is not None:
            target = (
                memoryview(out).cast("B")
                if not isinstance(out, np.ndarray)
                else memoryview(out.reshape(-1).view(np.uint8))
            )
            size = target.nbytes if size is None else size
        if size is None:
            raise TypeError("memcpy_dtoh needs size or out")
        spans = self._spans(src, size)
        if spans:
            whole = target if target is not None else memoryview(bytearray(size))
            for a, n in spans:
                self.memcpy_dtoh(a, n, stream, out=whole[a - src : a - src + n])
            return None if target is not None else bytes(whole)
        self._range(src, size)
        stream = self.check_stream(stream)
        buf = target if target is not None else memoryview(bytearray(size))
        if self.mirrors:
            self.push_mirrors(stream)
        self._dtoh(src, size, stream, buf)
        if self.mirrors.pending:
            self._pull(stream)
        return None if target is not None else bytes(buf)

    def _dtoh(self, src: int, size: int, stream: int, buf: memoryview) -> None:
        bulk = self._t.bulk if size >= BULK_MIN > 0 else None
        if bulk is not None:  # through the call ring's bulk area (crane.guest.ring_bulk)
            try:
                got = ring_bulk.dtoh(self._t, bulk, src, size, stream, buf)
            except TransportError as e:
                raise e.as_cuda_error() from e
            for seq, off, n, arrived in got:
                data = self._settle(seq, self._wait(seq)).data
                if not arrived:  # resent as a plain read: its reply has the bytes
                    if len(data) != n:
                        raise CudaError(
                            CUresult.CUDA_ERROR_UNKNOWN, f"a read of {n} bytes returned {len(data)}"
                        )
                    buf[off : off + n] = data
            return
        op = _O["MEMCPY_DTOH"]
        seqs = []
        for off in range(0, size, MAX_CHUNK):  # one batch: the worker streams the pieces back
            n = min(MAX_CHUNK, size - off)
            seqs.append(
                (off, self._enqueue(op, op.pack(src + off, n, stream), expect=True, send=False))
            )
        self._t.flush()
        for off, seq in seqs:
            data = self._settle(seq, self._wait(seq)).data
            buf[off : off + len(data)] = data

    def memcpy_dtod(self, dst: int, src: int, size: int, stream: int = 0) -> None:
        cuts = self._cuts(dst, src, size)
        if cuts:
            for off, n in cuts:
                self.memcpy_dtod(dst + off, src + off, n, stream)
            return
        self._range(src, size)
        self._range(dst, size)
        stream = self.check_stream(stream)
        if self.mirrors:
            self.push_mirrors(stream)
            self.mirrors.issued(stream)
        self._async(_O["MEMCPY_DTOD"], dst, src, size, stream)

    def _memset(self, dst: int, value: int, elem: int, count: int, stream: int) -> None:
        size = elem * count
        lo, hi = self.va.hit  # (the common case first: the buffer the last check found)
        if not (lo <= dst and dst + size <= hi) and not self.va.check(dst, size):
            spans = self._spans(dst, size)
            if spans and all(n % elem == 0 for _, n in spans):
                for a, n in spans:
                    self._memset(a, value, elem, n // elem, stream)
                return
            self._range(dst, size)
        if stream not in _DEFAULT_STREAMS:
            self.check_stream(stream)
        if self._mirrored:
            self.mirrors.issued(stream)
        # a packed record, straight into the transport's queue (crane.guest.callq): the hot
        # path of small asynchronous calls; the transport is asked only when the queue says so
        n = self._put(_MEMSET_ID, dst, value, elem, count, stream)
        if n == 1 or n >= _BATCH or n < 0:
            self._queued(n, _MEMSET, dst, value, elem, count, stream)

    # ---- what callers outside this session may keep of its checks (the interposer's C) ------
    def on_forget(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` whenever something this session's checks accepted may stop holding: a
        range freed or unmapped, a stream or context destroyed, a block mirrored."""
        self._forget_hooks.append(fn)

    def _forget(self) -> None:
        for fn in self._forget_hooks:
            fn()

    def queue_handles(self) -> tuple[int, int, int] | None:
        """The transport's C call queue for callers that append records themselves: (its
        memory, the address of its put function, its capacity), or None (no C queue). Such a
        caller reports every put that answered 1 or the capacity to :meth:`queued`."""
        handles = getattr(self._t.queue, "handles", None)
        return None if handles is None else (*handles(), _BATCH)

    def queued(self, n: int) -> None:
        """A record appended from outside this session made the queue hold ``n``: arm the
        flush timer (1) or send the batch (the capacity)."""
        try:
            self._t.queued(n)
        except TransportError as e:
            raise e.as_cuda_error() from e

    def _queued(self, n: int, op: Op, *args: int) -> None:
        """After ``queue.put`` answered ``n`` for a call of ``op``: what the transport then
        does (arm its timer, send the batch), or, refused, the call the generic way."""
        try:
            if n > 0:
                self._t.queued(n)
            else:  # (an argument too wide, the transport has news: enqueue sorts it out)
                self._t.enqueue(op, op.pack(*args), expect=False)
        except TransportError as e:
            raise e.as_cuda_error() from e

    def memset_d8(self, dst: int, value: int, count: int, stream: int = 0) -> None:
        self._memset(dst, value & 0xFF, 1, count, stream)

    def memset_d16(self, dst: int, value: int, count: int, stream: int = 0) -> None:
        self._memset(dst, value & 0xFFFF, 2, count, stream)

    def memset_d32(self, dst: int, value: int, count: int, stream: int = 0) -> None:
        self._memset(dst, value & 0xFFFFFFFF, 4, count, stream)

    # ---- streams and events -------------------------------------------------------------------
    def stream_create(self, flags: int = 0, priority: int = 0, ctx: int | None = None) -> int:
        h = self._handles.new(HandleKind.STREAM)
        self._async(_O["STREAM_CREATE"], self._ctx(ctx), h, flags, priority)
        self._objs.streams.add(h)
        return h

    def stream_destroy(self, stream: int) -> None:
        if stream not in self._objs.streams:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"unknown stream {stream:#x}")
        self._forget()
        self._async(_O["STREAM_DESTROY"], stream)
        self._objs.streams.discard(stream)

    def stream_synchronize(self, stream: int = 0) -> None:
        self._sync(_O["STREAM_SYNCHRONIZE"], self.check_stream(stream))
        if self.mirrors.pending:
            self._pull(stream)

    def stream_query(self, stream: int = 0) -> bool:
        """True when idle (CUDA_SUCCESS); False for CUDA_ERROR_NOT_READY."""
        seq, reply = self._call(_O["STREAM_QUERY"], self.check_stream(stream))
        if reply.result == CUresult.CUDA_ERROR_NOT_READY:
            reply.result = 0
            self._settle(seq, reply)
            return False
        self._settle(seq, reply)
        if self.mirrors.pending:
            self._pull(stream)
        return True

    def stream_wait_event(self, stream: int, event: int, flags: int = 0) -> None:
        self._async(
            _O["STREAM_WAIT_EVENT"], self.check_stream(stream), self.check_event(event), flags
        )

    def event_create(self, flags: int = 0, ctx: int | None = None) -> int:
        h = self._handles.new(HandleKind.EVENT)
        self._async(_O["EVENT_CREATE"], self._ctx(ctx), h, flags)
        self._objs.events.add(h)
        return h

    def event_destroy(self, event: int) -> None:
        self._forget()
        self._async(_O["EVENT_DESTROY"], self.check_event(event))
        self._objs.events.discard(event)

    def event_record(self, event: int, stream: int = 0) -> None:
        self._async(_O["EVENT_RECORD"], self.check_event(event), self.check_stream(stream))

    def event_synchronize(self, event: int) -> None:
        self._sync(_O["EVENT_SYNCHRONIZE"], self.check_event(event))
        if self.mirrors.pending:
            self._pull(-1)  # which streams the event covered is not known here: keep them

    def event_query(self, event: int) -> bool:
        seq, reply = self._call(_O["EVENT_QUERY"], self.check_event(event))
        ready = reply.result != CUresult.CUDA_ERROR_NOT_READY
        if not ready:
            reply.result = 0
        self._settle(seq, reply)
        if ready and self.mirrors.pending:
            self._pull(-1)
        return ready

    def event_elapsed(self, start: int, end: int) -> float:
        """Milliseconds between two recorded events."""
        reply = self._sync(_O["EVENT_ELAPSED"], self.check_event(start), self.check_event(end))
        return _O["EVENT_ELAPSED"].unpack_results(reply.out)[0]

    # ---- modules and launches -----------------------------------------------------------------
    def module_load(self, image: bytes, ctx: int | None = None) -> Module:
        """Load a fatbin, cubin or PTX image; sends the bytes only if the daemon lacks them."""
        ctx = self._ctx(ctx)
        if not image:  # an empty image is no module (and the wire reads no bytes as "by digest")
            raise CudaError(CUresult.CUDA_ERROR_INVALID_IMAGE, "empty module image")
        digest = hashlib.sha256(image).digest()
        h = self._handles.new(HandleKind.MODULE)
        op = _O["MODULE_LOAD"]
        reply = self._sync(op, ctx, h, digest)
        if reply.result == CRANE_NEED_IMAGE:
            reply = self._sync(op, ctx, h, digest, data=bytes(image))
        if reply.result == CRANE_NEED_IMAGE:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_IMAGE, "the worker did not take the image")
        try:
            desc = json.loads(reply.data)
        except ValueError:
            raise CudaError(
                CUresult.CUDA_ERROR_UNKNOWN, "the worker's module description is unreadable"
            ) from None
        kernels = {
            name: KernelLayout(
                name,
                tuple(tuple(p) for p in k["params"]),
                k["param_bytes"],
                k["static_shared"],
                k["max_threads"],
                *k["versions"],
                tuple(k["cluster"]) if k.get("cluster") else None,
            )
            for name, k in desc["kernels"].items()
        }
        mod = Module(
            h,
            desc["kind"],
            desc["description"],
            kernels,
            {n: (a, s) for n, (a, s) in desc["globals"].items()},
        )
        self._objs.modules[h] = mod
        for addr, size in mod.globals.values():
            bisect.insort(self._var_starts, addr)
            self._var_ends[addr] = addr + max(size, 1)
        return mod

    def is_device_address(self, addr: int) -> bool:
        """Whether ``addr`` is device memory: inside the allocation window, or inside one of
        the loaded modules' variables (``cudaGetSymbolAddress`` gives such addresses to
        unified copies)."""
        base, size = self.va_window
        if base <= addr < base + size:
            return True
        i = bisect.bisect_right(self._var_starts, addr) - 1
        return i >= 0 and addr < self._var_ends[self._var_starts[i]]

    def module_unload(self, module: Module | int) -> None:
        h = module.handle if isinstance(module, Module) else module
        if h not in self._objs.modules:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"unknown module {h:#x}")
        self._async(_O["MODULE_UNLOAD"], h)
        for addr, _ in self._objs.modules.pop(h).globals.values():
            self._var_starts.remove(addr)
            del self._var_ends[addr]
        for f in [f for f, fn in self._objs.functions.items() if fn.module == h]:
            del self._objs.functions[f]

    def module_get_function(self, module: Module | int, name: str) -> Function:
        h = module.handle if isinstance(module, Module) else module
        mod = self._objs.modules.get(h)
        if mod is None:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"unknown module {h:#x}")
        layout = mod.kernels.get(name)
        if layout is None:
            raise CudaError(CUresult.CUDA_ERROR_NOT_FOUND, f"module has no kernel {name!r}")
        fh = self._handles.new(HandleKind.FUNCTION)
        self._async(_O["FUNCTION_BIND"], fh, h, data=name.encode())
        fn = Function(fh, h, layout)
        self._objs.functions[fh] = fn
        return fn

    def module_get_global(self, module: Module | int, name: str) -> tuple[int, int]:
        h = module.handle if isinstance(module, Module) else module
        mod = self._objs.modules.get(h)
        if mod is None:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"unknown module {h:#x}")
        if name not in mod.globals:
            raise CudaError(CUresult.CUDA_ERROR_NOT_FOUND, f"module has no global {name!r}")
        return mod.globals[name]

    def launch(
        self,
        function: Function,
        grid: Sequence[int],
        block: Sequence[int],
        params: bytes | Sequence[object] = b"",
        shared: int = 0,
        stream: int = 0,
        max_dynamic_shared: int | None = None,
    ) -> None:
        """Enqueue a kernel. ``params`` is the packed buffer or one value per parameter.

        ``max_dynamic_shared`` is the limit raised by :meth:`function_set_max_dynamic_shared`."""
        self._launch(_LAUNCH, function, grid, block, params, shared, stream, max_dynamic_shared)

    def launch_cooperative(
        self,
        function: Function,
        grid: Sequence[int],
        block: Sequence[int],
        params: bytes | Sequence[object] = b"",
        shared: int = 0,
        stream: int = 0,
        max_dynamic_shared: int | None = None,
    ) -> None:
        """cuLaunchCooperativeKernel: every block resident at once, so the kernel may sync the
        whole grid (cooperative_groups grid.sync()). The device's limits, co-residency
        included, are checked here so a refused launch fails at the call as with the driver;
        a limit only the device side knows (the simulated GPU's batch memory) is reported,
        like a fault, by the next synchronizing call."""
        self._launch(
            _LAUNCH_COOPERATIVE,
            function,
            grid,
            block,
            params,
            shared,
            stream,
            max_dynamic_shared,
            cooperative=True,
        )

    def launch_cluster(
        self,
        function: Function,
        grid: Sequence[int],
        block: Sequence[int],
        cluster: Sequence[int],
        params: bytes | Sequence[object] = b"",
        shared: int = 0,
        stream: int = 0,
        max_dynamic_shared: int | None = None,
        *,
        cooperative: bool = False,
        non_portable_cluster: bool = False,
    ) -> None:
        """A launch whose grid is made of thread-block clusters of ``cluster`` blocks
        (cuLaunchKernelEx's CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION): the driver's cluster
        rules (:func:`crane.api.launch_check.check_cluster`) are checked here so a refused
        launch fails at the call; ``non_portable_cluster`` is the function's
        NON_PORTABLE_CLUSTER_SIZE_ALLOWED."""
        c = ((*tuple(int(d) for d in cluster), 1, 1))[:3]
        self._launch(
            _LAUNCH_CLUSTER,
            function,
            grid,
            block,
            params,
            shared,
            stream,
            max_dynamic_shared,
            cooperative=cooperative,
            cluster=(*c, (1 if cooperative else 0) | (2 if non_portable_cluster else 0)),
        )

    def _launch(
        self,
        op: Op,
        function: Function,
        grid: Sequence[int],
        block: Sequence[int],
        params: bytes | Sequence[object],
        shared: int,
        stream: int,
        max_dynamic_shared: int | None,
        cooperative: bool = False,
        cluster: tuple[int, int, int, int] | None = None,
    ) -> None:
        if function.handle not in self._objs.functions:  # holds FUNCTION handles only
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, "unknown function")
        g = grid if len(grid) == 3 and type(grid) is tuple else ((*tuple(grid), 1, 1))[:3]
        b = block if len(block) == 3 and type(block) is tuple else ((*tuple(block), 1, 1))[:3]
        lay = function.layout
        key = (function.handle, g, b, shared, max_dynamic_shared, cooperative, cluster)
        if key not in self._launch_ok:  # configurations repeat: check each one once
            limits = {"static_shared": lay.static_shared or 0, "max_threads": lay.max_threads}
            check_launch(
                self.attributes, g, b, shared, max_dynamic_shared=max_dynamic_shared, **limits
            )
            if cooperative:
                check_cooperative(self.attributes, g, b, shared, **limits)
            if cluster is not None:
                check_cluster(self.attributes, g, cluster[:3], non_portable=bool(cluster[3] & 2))
            if len(self._launch_ok) > 4096:
                self._launch_ok.clear()
            self._launch_ok.add(key)
        buf = params if isinstance(params, bytes | bytearray) else pack_param_values(lay, params)
        if len(buf) != lay.param_bytes:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"{lay.name} takes {lay.param_bytes} parameter bytes, got {len(buf)}",
            )
        if stream not in _DEFAULT_STREAMS:
            self.check_stream(stream)
        if self.mirrors:
            self.push_mirrors(stream)
            self.mirrors.issued(stream)
        try:  # (inline, not through _enqueue: launches are the hot path)
            self._t.enqueue(
                op,
                op.pack(function.handle, (g, b, shared), stream)
                if cluster is None
                else op.pack(function.handle, (g, b, shared), stream, *cluster),
                buf if type(buf) is bytes else bytes(buf),
                expect=False,
            )
        except TransportError as e:
            raise e.as_cuda_error() from e

    def function_set_max_dynamic_shared(self, function: Function, size: int) -> None:
        """cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) for later launches."""
        if function.handle not in self._objs.functions:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, "unknown function")
        self._async(_O["FUNCTION_SET_MAX_DYNAMIC_SHARED"], function.handle, size)

    def device_runtime_limits(self, ctx: int | None, heap: int, pending: int) -> None:
        """CU_LIMIT_MALLOC_HEAP_SIZE and CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT for later
        launches in ``ctx`` (device malloc/free, dynamic parallelism)."""
        self._async(_O["DEVICE_RUNTIME_LIMITS"], self._ctx(ctx), heap, pending)

    # ---- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """End the session: the daemon frees everything it held."""
        if self._t.closed:
            return
        try:
            self._sync(_O["SESSION_CLOSE"])
        except CudaError:
            pass
        finally:
            self._t.close()


class _VmmDevice:
    """Device memory for the VMM API (crane.guest.vmm.Device) over the session's wire: a
    mapping is a chunk committed at the mapped address holding one allocation of its size."""

    def __init__(self, s: GuestSession) -> None:
        self.s = s

    def commit(self, ctx: int, addr: int, size: int) -> None:
        seq, reply = self.s._call(_O["MEM_MAP_CHUNK"], addr, size)
        try:
            self.s._settle(seq, reply)  # an earlier asynchronous error is raised first
        except CudaError:
            if reply.result == 0:  # mapped all the same: undo, the caller saw a failure
                self.s._async(_O["MEM_UNMAP_CHUNK"], addr)
            raise
        self.s._async(_O["MEM_ALLOC"], ctx, addr, size)

    def decommit(self, addr: int) -> None:
        self.s._async(_O["MEM_FREE"], addr)
        self.s._async(_O["MEM_UNMAP_CHUNK"], addr)

    def _settle_all(self) -> None:
        self.s._sync(_O["CTX_SYNCHRONIZE"], self.s.primary_context)

    def move(self, dst: int, src: int, size: int) -> None:
        self._settle_all()
        self.s._async(_O["MEMCPY_DTOD"], dst, src, size, 0)

    def save(self, addr: int, size: int) -> bytes:
        self._settle_all()
        out = bytearray(size)
        op = _O["MEMCPY_DTOH"]
        for off in range(0, size, MAX_CHUNK):
            n = min(MAX_CHUNK, size - off)
            data = self.s._sync(op, addr + off, n, 0).data
            out[off : off + len(data)] = data
        return bytes(out)

    def restore(self, addr: int, data: bytes) -> None:
        view = memoryview(data)
        for off in range(0, len(view), MAX_CHUNK):
            self.s._async(_O["MEMCPY_HTOD"], addr + off, 0, data=bytes(view[off : off + MAX_CHUNK]))

    def free_memory(self) -> int:
        return self.s.mem_get_info()[0]


def pack_param_values(layout: KernelLayout, values: Sequence[object]) -> bytes:
    """Pack Python/NumPy values into a kernel's parameter buffer by its layout.

    ints are packed little-endian at the parameter's size (signed if negative), floats as f32
    or f64 by size, bytes-like and NumPy values by their raw bytes (sizes must match).
    """
    if len(values) != len(layout.params):
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE,
            f"{layout.name} takes {len(layout.params)} parameters, got {len(values)}",
        )
    buf = bytearray(layout.param_bytes)
    for i, ((off, size), v) in enumerate(zip(layout.params, values, strict=True)):
        if isinstance(v, bool | int):
            raw = int(v).to_bytes(size, "little", signed=int(v) < 0)
        elif isinstance(v, float):
            raw = struct.pack("<f" if size == 4 else "<d", v)
        elif isinstance(v, np.generic | np.ndarray):
            raw = np.asarray(v).tobytes()
        else:
            raw = bytes(v)  # type: ignore[arg-type]
        if len(raw) != size:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"{layout.name} parameter {i} is {size} bytes, got {len(raw)}",
            )
        buf[off : off + size] = raw
    return bytes(buf)


def _as_result(code: int) -> CUresult:
    try:
        return CUresult(code)
    except ValueError:
        return CUresult.CUDA_ERROR_UNKNOWN
