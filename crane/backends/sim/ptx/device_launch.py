"""Dynamic parallelism (CDP2): kernels launching kernels.

Why: ``kernel<<<g, b, s, stream>>>`` in device code compiles to calls into libcudadevrt:
``cudaGetParameterBufferV2(func, grid, block, shmem)`` hands out a buffer the parent fills
with the child's parameters, ``cudaLaunchDeviceV2(buffer, stream)`` launches it, and
``cudaGetLastError``/``cudaPeekAtLastError`` report per thread. libcudadevrt ships no PTX a
pre-Blackwell device can JIT, so the simulated GPU serves these entry points itself
(``__cudaCDP2*``, the names the PTX calls).

Semantics (CUDA programming guide, CDP2): a child grid may start any time after its launch and
completes before its parent grid is considered complete; a parent cannot wait for it
(no device-side cudaDeviceSynchronize in CDP2). Running every child after the parent grid's
last block is therefore a legal schedule: fire-and-forget (``cudaStreamFireAndForget``) and
NULL-stream launches run first, in launch order, each with its own children after it; then
the tail launches (``cudaStreamTailLaunch``), which CUDA starts only after the parent grid and
all its fire-and-forget work complete. Streams a kernel creates
(``cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)``, the only flag device code may give)
are handles of the grid that created them; their launches run among the fire-and-forget ones,
in launch order, which keeps each stream's order and is one legal interleaving of different
streams. Device events (``cudaEventCreateWithFlags`` with ``cudaEventDisableTiming``,
``cudaEventRecord``, ``cudaStreamWaitEvent``, ``cudaEventDestroy``) are accepted and order
nothing further: under that schedule every dependency they can express already holds.
Limits: 24 nested levels (cudaErrorLaunchMaxDepthExceeded)
and 2048 pending launches per grid (CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT's default,
cudaErrorLaunchPendingCountExceeded; the context's limit when it set one). Parameter buffers
come from the device heap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .calls import fid_of_address
from .heap import DeviceHeap
from .memspace import resolve

__all__ = [
    "BUILTINS",
    "MAX_DEPTH",
    "MAX_PENDING",
    "DeviceLaunches",
    "PendingLaunch",
]

MAX_DEPTH = 24
MAX_PENDING = 2048
STREAM_NULL, STREAM_TAIL, STREAM_FIRE_AND_FORGET = 0, 3, 4
# cudaError_t values (driver_types.h)
_SUCCESS = 0
_INVALID_VALUE = 1
_MEMORY_ALLOCATION = 2
_INVALID_CONFIGURATION = 9
_INVALID_DEVICE_FUNCTION = 98
_MAX_DEPTH_EXCEEDED = 65
_PENDING_COUNT_EXCEEDED = 69
_INVALID_RESOURCE_HANDLE = 400
#: cudaStreamNonBlocking, cudaEventDisableTiming: what device code must pass
_STREAM_NON_BLOCKING, _EVENT_DISABLE_TIMING = 1, 2
#: the first handle of a device-created stream or event (never 0, the tail or F&F stream)
_FIRST_HANDLE = 0x1000


@dataclass
class PendingLaunch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    params: bytes
    tail: bool


@dataclass
class DeviceLaunches:
    """What one grid's threads launched; ``kernels`` maps a function id to its kernel's name
    and parameter bytes."""

    kernels: dict[int, tuple[str, int]]
    heap: DeviceHeap | None
    depth: int = 0
    #: CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT
    max_pending: int = MAX_PENDING
    pending: list[PendingLaunch] = field(default_factory=list)
    buffers: dict[int, tuple[str, tuple, tuple, int, int]] = field(default_factory=dict)
    #: (first block of the lane's batch, lane) -> the thread's last error
    errors: dict[tuple[int, int], int] = field(default_factory=dict)
    #: live handles of the streams and events this grid's threads created
    streams: set[int] = field(default_factory=set)
    events: set[int] = field(default_factory=set)
    next_handle: int = _FIRST_HANDLE

    def ordered(self) -> list[PendingLaunch]:
        return [p for p in self.pending if not p.tail] + [p for p in self.pending if p.tail]


def _launches(st) -> DeviceLaunches | None:
    return getattr(st, "device_launches", None)


def _pm(st, ins):
    return st.pm[ins.fid]


def _u64(st, ins, lanes, off) -> np.ndarray:
    return _pm(st, ins)[lanes, off : off + 8].copy().view(np.uint64).reshape(-1)


def _u32(st, ins, lanes, off) -> np.ndarray:
    return _pm(st, ins)[lanes, off : off + 4].copy().view(np.uint32).reshape(-1)


def _set_error(st, dl: DeviceLaunches | None, lane: int, code: int) -> None:
    if dl is not None and code != _SUCCESS:
        dl.errors[(st.first_block, lane)] = code


def _put32(st, ins, idx_lanes, off, values) -> None:
    if off is not None:
        _pm(st, ins)[idx_lanes, off : off + 4] = (
            np.asarray(values, np.int32).view(np.uint8).reshape(-1, 4)
        )


def h_get_parameter_buffer(st, ins, idx) -> None:
    func_off, grid_off, block_off, shmem_off, ret_off = ins.x
    lanes = np.arange(st.n) if idx is None else idx
    pm = _pm(st, ins)
    funcs = _u64(st, ins, lanes, func_off)
    grids = pm[lanes, grid_off : grid_off + 12].copy().view(np.uint32).reshape(-1, 3)
    blocks = pm[lanes, block_off : block_off + 12].copy().view(np.uint32).reshape(-1, 3)
    shmem = _u32(st, ins, lanes, shmem_off)
    dl = _launches(st)
    out = np.zeros(lanes.size, np.uint64)
    for j, lane in enumerate(lanes.tolist()):
        fid = fid_of_address(int(funcs[j]))
        kernel = dl.kernels.get(fid) if dl is not None and fid is not None else None
        if kernel is None:
            _set_error(st, dl, lane, _INVALID_DEVICE_FUNCTION)
            continue
        assert dl is not None
        addr = dl.heap.alloc(max(kernel[1], 8)) if dl.heap is not None else 0
        if not addr:
            _set_error(st, dl, lane, _MEMORY_ALLOCATION)
            continue
        dl.buffers[addr] = (
            kernel[0],
            tuple(int(x) for x in grids[j]),
            tuple(int(x) for x in blocks[j]),
            int(shmem[j]),
            kernel[1],
        )
        out[j] = addr
    if ret_off is not None:
        pm[lanes, ret_off : ret_off + 8] = out.view(np.uint8).reshape(-1, 8)


def h_launch_device(st, ins, idx) -> None:
    buf_off, stream_off, ret_off = ins.x
    lanes = np.arange(st.n) if idx is None else idx
    bufs = _u64(st, ins, lanes, buf_off)
    streams = _u64(st, ins, lanes, stream_off)
    dl = _launches(st)
    codes = np.zeros(lanes.size, np.int32)
    for j, lane in enumerate(lanes.tolist()):
        code = _launch_one(st, dl, int(bufs[j]), int(streams[j]))
        codes[j] = code
        _set_error(st, dl, lane, code)
    _put32(st, ins, lanes, ret_off, codes)


def _launch_one(st, dl: DeviceLaunches | None, buf: int, stream: int) -> int:
    if dl is None or buf not in dl.buffers:
        return _INVALID_VALUE
    kernel, grid, block, shared, nbytes = dl.buffers.pop(buf)
    params = bytes(st.mem.read(buf, nbytes)) if nbytes else b""
    if dl.heap is not None:
        dl.heap.free(buf)
    if stream not in (STREAM_NULL, STREAM_TAIL, STREAM_FIRE_AND_FORGET, *dl.streams):
        return _INVALID_RESOURCE_HANDLE  # not a stream of this grid (or destroyed)
    if min(grid) < 1 or min(block) < 1 or block[0] * block[1] * block[2] > 1024:
        return _INVALID_CONFIGURATION
    if dl.depth + 1 >= MAX_DEPTH:
        return _MAX_DEPTH_EXCEEDED
    if len(dl.pending) >= dl.max_pending:
        return _PENDING_COUNT_EXCEEDED
    dl.pending.append(PendingLaunch(kernel, grid, block, shared, params, stream == STREAM_TAIL))
    return _SUCCESS


def h_get_last_error(st, ins, idx) -> None:
    _last_error(st, ins, idx, clear=True)


def h_peek_at_last_error(st, ins, idx) -> None:
    _last_error(st, ins, idx, clear=False)


def _last_error(st, ins, idx, clear: bool) -> None:
    (ret_off,) = ins.x
    lanes = np.arange(st.n) if idx is None else idx
    dl = _launches(st)
    errs = dl.errors if dl is not None else {}
    fb = st.first_block
    codes = [
        errs.pop((fb, lane), 0) if clear else errs.get((fb, lane), 0) for lane in lanes.tolist()
    ]
    _put32(st, ins, lanes, ret_off, codes)


# ---- device-created streams and events ------------------------------------------------------


def _store_handles(st, addrs: np.ndarray, handles: np.ndarray, lanes: np.ndarray) -> None:
    """``*addr = handle`` for each lane, at generic addresses (a local variable's, usually)."""
    for sel, buf, off in resolve(st, "generic", addrs, 8, lanes, write=True):
        h = handles if sel is None else handles[sel]
        buf[np.asarray(off, np.int64).reshape(-1, 1) + np.arange(8)] = (
            h.astype(np.uint64).view(np.uint8).reshape(-1, 8)
        )


def _create(st, ins, idx, table: str, flag: int) -> None:
    """``cudaStreamCreateWithFlags``/``cudaEventCreateWithFlags``: a new handle per lane."""
    out_off, flags_off, ret_off = ins.x
    lanes = np.arange(st.n) if idx is None else idx
    outs, flags = _u64(st, ins, lanes, out_off), _u32(st, ins, lanes, flags_off)
    dl = _launches(st)
    codes = np.zeros(lanes.size, np.int32)
    handles = np.zeros(lanes.size, np.uint64)
    for j, lane in enumerate(lanes.tolist()):
        if dl is None or not outs[j] or not int(flags[j]) & flag:
            codes[j] = _INVALID_VALUE
        else:
            handles[j] = dl.next_handle
            getattr(dl, table).add(dl.next_handle)
            dl.next_handle += 16
        _set_error(st, dl, lane, int(codes[j]))
    ok = np.flatnonzero(codes == _SUCCESS)
    if ok.size:
        _store_handles(st, outs[ok], handles[ok], lanes[ok])
    _put32(st, ins, lanes, ret_off, codes)


def _check_handles(st, ins, idx, tables: tuple[str, ...], destroy: str | None) -> None:
    """Calls that only name handles (record, wait, destroy): each must be a live one of its
    table (streams also NULL, the tail or the fire-and-forget stream)."""
    *offs, ret_off = ins.x
    lanes = np.arange(st.n) if idx is None else idx
    dl = _launches(st)
    vals = [_u64(st, ins, lanes, o) for o in offs[: len(tables)]]
    codes = np.zeros(lanes.size, np.int32)
    for j, lane in enumerate(lanes.tolist()):
        for table, v in zip(tables, vals, strict=True):
            h = int(v[j])
            live = getattr(dl, table) if dl is not None else set()
            known = h in live or (table == "streams" and destroy is None and h in _PREDEFINED)
            if not known:
                codes[j] = _INVALID_RESOURCE_HANDLE
        if codes[j] == _SUCCESS and destroy is not None and dl is not None:
            getattr(dl, destroy).discard(int(vals[0][j]))
        _set_error(st, dl, lane, int(codes[j]))
    _put32(st, ins, lanes, ret_off, codes)


_PREDEFINED = (STREAM_NULL, STREAM_TAIL, STREAM_FIRE_AND_FORGET)


def h_stream_create(st, ins, idx) -> None:
    _create(st, ins, idx, "streams", _STREAM_NON_BLOCKING)


def h_event_create(st, ins, idx) -> None:
    _create(st, ins, idx, "events", _EVENT_DISABLE_TIMING)


def h_stream_destroy(st, ins, idx) -> None:
    _check_handles(st, ins, idx, ("streams",), destroy="streams")


def h_event_destroy(st, ins, idx) -> None:
    _check_handles(st, ins, idx, ("events",), destroy="events")


def h_event_record(st, ins, idx) -> None:
    _check_handles(st, ins, idx, ("events", "streams"), destroy=None)


def h_stream_wait_event(st, ins, idx) -> None:
    _check_handles(st, ins, idx, ("streams", "events"), destroy=None)


#: PTX name -> (handler, number of arguments)
BUILTINS = {
    "__cudaCDP2StreamCreateWithFlags": (h_stream_create, 2),
    "__cudaCDP2StreamDestroy": (h_stream_destroy, 1),
    "__cudaCDP2EventCreateWithFlags": (h_event_create, 2),
    "__cudaCDP2EventRecord": (h_event_record, 2),
    "__cudaCDP2EventDestroy": (h_event_destroy, 1),
    "__cudaCDP2StreamWaitEvent": (h_stream_wait_event, 3),
    "__cudaCDP2GetParameterBufferV2": (h_get_parameter_buffer, 4),
    "__cudaCDP2LaunchDeviceV2": (h_launch_device, 2),
    "__cudaCDP2GetLastError": (h_get_last_error, 0),
    "__cudaCDP2PeekAtLastError": (h_peek_at_last_error, 0),
}
