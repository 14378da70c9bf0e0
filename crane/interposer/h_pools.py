"""Memory pools and stream-ordered allocation (cuMemAllocAsync, cuMemPool*).

A pool is a guest record over the session's device allocator: its allocations are ordinary
session allocations (so checkpoints and migrations carry them), and a freed block is kept for
reuse up to the pool's release threshold. Reuse is only ever in the stream that freed the block,
where stream order makes it safe without events (CUDA's other reuse policies, following event
dependencies or opportunistic reuse, are accepted as attributes but never needed for
correctness). The device's default pool serves cuMemAllocAsync until cuDeviceSetMemPool names
another. Pools for IPC (shareable handle types) and host-located pools are refused as not
supported: a pool's memory lives on the daemon's GPU.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass, field
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.interposer import graphs
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

# CUmemPool_attribute
_FOLLOW_EVENTS, _OPPORTUNISTIC, _INTERNAL_DEPS, _THRESHOLD = 1, 2, 3, 4
_RESERVED_CURRENT, _RESERVED_HIGH, _USED_CURRENT, _USED_HIGH = 5, 6, 7, 8
_INT_ATTRS = (_FOLLOW_EVENTS, _OPPORTUNISTIC, _INTERNAL_DEPS)
_ALLOC_PINNED, _LOC_DEVICE = 1, 1
_ACCESS_NONE, _ACCESS_READWRITE = 0, 3
# CUmemPoolProps: allocType, handleTypes, location {type, id}, win32 attrs, maxSize, usage, ...
_PROPS = struct.Struct("<iiiiQQH")
_HANDLE_BASE = 0xC0DE_0000_0000  # pool handles: opaque, never dereferenced
_handles = itertools.count(1)


@dataclass
class Pool:
    handle: int
    max_size: int = 0  # 0: the device's memory
    attrs: dict[int, int] = field(
        default_factory=lambda: {
            _FOLLOW_EVENTS: 1,
            _OPPORTUNISTIC: 1,
            _INTERNAL_DEPS: 1,
            _THRESHOLD: 0,
        }
    )
    live: dict[int, int] = field(default_factory=dict)  # address -> size
    cached: list[tuple[int, int, int]] = field(default_factory=list)  # (stream, address, size)
    used_high: int = 0
    reserved_high: int = 0

    @property
    def used(self) -> int:
        return sum(self.live.values())

    @property
    def reserved(self) -> int:
        return self.used + sum(n for _, _, n in self.cached)

    def note_high(self) -> None:
        self.used_high = max(self.used_high, self.used)
        self.reserved_high = max(self.reserved_high, self.reserved)


_default = Pool(_HANDLE_BASE)
_pools: dict[int, Pool] = {_default.handle: _default}
_current: list[Pool] = [_default]  # cuDeviceSetMemPool's choice for device 0
_owner: dict[int, Pool] = {}  # live address -> its pool


def pool_of(addr: int) -> int:
    """CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: the pool an allocation came from (0: none)."""
    p = _owner.get(addr)
    return p.handle if p is not None else 0


def _pool(handle: Any) -> Pool:
    p = _pools.get(RT.ptr(handle))
    if p is None:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown memory pool {RT.ptr(handle):#x}"
        )
    return p


def _device(dev: int) -> None:
    if dev != 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_DEVICE, f"no device {dev}")


def _release(p: Pool, keep: int) -> None:
    """Give cached blocks back to the session until the pool reserves at most ``keep`` bytes
    beyond its live allocations' needs (cuMemPoolTrimTo's and the threshold's rule)."""
    s = RT.session()
    while p.cached and p.reserved > max(keep, p.used):
        _, addr, _ = p.cached.pop(0)
        s.mem_free(addr)


def _allocate(p: Pool, size: int, stream: int) -> int:
    if size == 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "zero-size allocation")
    s = RT.session()
    s.check_stream(stream)
    for i, (st, addr, n) in enumerate(p.cached):
        if st == stream and size <= n < 2 * size + 4096:  # reuse in stream order only
            del p.cached[i]
            p.live[addr] = n
            break
    else:
        if p.max_size and p.reserved + size > p.max_size:
            _release(p, 0)
            if p.used + size > p.max_size:
                raise CudaError(
                    CUresult.CUDA_ERROR_OUT_OF_MEMORY,
                    f"pool limit {p.max_size} bytes ({p.used} in use)",
                )
        addr = s.mem_alloc(size, RT.ctx())
        p.live[addr] = size
    _owner[addr] = p
    p.note_high()
    return addr


def free_async(addr: int, stream: int) -> bool:
    """cuMemFreeAsync of a pool allocation: back to its pool (True), or not a pool's (False)."""
    p = _owner.pop(addr, None)
    if p is None:
        return False
    size = p.live.pop(addr)
    p.cached.append((stream, addr, size))
    _release(p, p.attrs[_THRESHOLD])
    return True


def _captured_alloc(size: int, stream: int) -> int | None:
    """During stream capture: a memory allocation node, its memory owned by the graph."""
    if graphs.capture_of(stream) is None:
        return None
    if size == 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "zero-size allocation")
    addr = RT.session().mem_alloc(size, RT.ctx())
    graphs.own_memory(addr, size)
    graphs.record(stream, graphs.MEM_ALLOC, graphs.MemParams(addr, size))
    return addr


@handles("cuMemAllocAsync@11020")
def mem_alloc_async(out: Any, size: int, stream: Any) -> None:
    """From the device's current pool. The memory exists when the call returns, which stream
    order allows (it must exist by the time the stream reaches this point)."""
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL dptr")
    h = RT.stream(stream)
    addr = _captured_alloc(size, h)
    out[0] = addr if addr is not None else _allocate(_current[0], size, h)


@handles("cuMemAllocFromPoolAsync@11020")
def mem_alloc_from_pool_async(out: Any, size: int, pool: Any, stream: Any) -> None:
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL dptr")
    h = RT.stream(stream)
    p = _pool(pool)
    addr = _captured_alloc(size, h)
    out[0] = addr if addr is not None else _allocate(p, size, h)


def free_now(addr: int, stream: int) -> None:
    """Free ``addr`` in ``stream``'s order: back to its pool, to its graph (graph memory stays
    with the graphs that allocate it), or to the session."""
    if graphs.is_graph_memory(addr):
        return
    if not free_async(addr, stream):
        RT.session().mem_free(addr)


@handles("cuMemFreeAsync@11020")
def mem_free_async(dptr: int, stream: Any) -> None:
    """The worker applies calls in order, so a free follows the stream's earlier work; during
    capture it becomes a memory free node."""
    s = RT.session()
    h = RT.stream(stream)
    s.check_stream(h)
    if graphs.record(h, graphs.MEM_FREE, graphs.MemParams(dptr)):
        return
    free_now(dptr, h)


@handles("cuDeviceGetDefaultMemPool@11020")
def device_get_default_mem_pool(out: Any, dev: int) -> None:
    _device(dev)
    RT.out(out, RT.ffi.cast("void *", _default.handle))


@handles("cuDeviceGetMemPool@11020")
def device_get_mem_pool(out: Any, dev: int) -> None:
    _device(dev)
    RT.out(out, RT.ffi.cast("void *", _current[0].handle))


@handles("cuDeviceSetMemPool@11020")
def device_set_mem_pool(dev: int, pool: Any) -> None:
    _device(dev)
    _current[0] = _pool(pool)


@handles("cuMemPoolCreate@11020")
def mem_pool_create(out: Any, props: Any) -> None:
    if out == RT.ffi.NULL or props == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL pool or properties")
    alloc_type, handle_types, loc_type, loc_id, _win32, max_size, _usage = _PROPS.unpack(
        bytes(RT.ffi.buffer(RT.ffi.cast("char *", props), _PROPS.size))
    )
    if alloc_type != _ALLOC_PINNED:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"allocation type {alloc_type}")
    if loc_type != _LOC_DEVICE:
        raise CudaError(
            CUresult.CUDA_ERROR_NOT_SUPPORTED, "host-located pools (memory is on the daemon's GPU)"
        )
    _device(loc_id)
    if handle_types:
        raise CudaError(
            CUresult.CUDA_ERROR_NOT_SUPPORTED, "pools exportable to other processes (IPC)"
        )
    RT.session()
    p = Pool(_HANDLE_BASE + next(_handles) * 0x100, max_size=max_size)
    _pools[p.handle] = p
    out[0] = RT.ffi.cast("void *", p.handle)


@handles("cuMemPoolDestroy@11020")
def mem_pool_destroy(pool: Any) -> None:
    """Cached memory goes back at once; live allocations stay valid until freed (CUDA frees
    them with the pool only once they are freed)."""
    p = _pool(pool)
    if p is _default:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "the default pool cannot be destroyed")
    _release(p, 0)
    del _pools[p.handle]
    if _current[0] is p:
        _current[0] = _default


@handles("cuMemPoolTrimTo@11020")
def mem_pool_trim_to(pool: Any, keep: int) -> None:
    _release(_pool(pool), keep)


def _pool_with_value(pool: Any, value: Any) -> Pool:
    if value == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL value")
    return _pool(pool)


def _u64(value: Any) -> int:
    return int(RT.ffi.cast("unsigned long long *", value)[0])


@handles("cuMemPoolSetAttribute@11020")
def mem_pool_set_attribute(pool: Any, attr: int, value: Any) -> None:
    p = _pool_with_value(pool, value)
    if attr in _INT_ATTRS:
        p.attrs[attr] = int(RT.ffi.cast("int *", value)[0] != 0)
    elif attr == _THRESHOLD:
        p.attrs[attr] = _u64(value)
        _release(p, p.attrs[attr])
    elif attr in (_RESERVED_HIGH, _USED_HIGH):
        if _u64(value) != 0:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "a high watermark resets to 0 only")
        if attr == _RESERVED_HIGH:
            p.reserved_high = p.reserved
        else:
            p.used_high = p.used
    elif attr in (_RESERVED_CURRENT, _USED_CURRENT):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"pool attribute {attr} is read-only")
    else:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown pool attribute {attr}")


@handles("cuMemPoolGetAttribute@11020")
def mem_pool_get_attribute(pool: Any, attr: int, value: Any) -> None:
    p = _pool_with_value(pool, value)
    if attr in _INT_ATTRS:
        RT.ffi.cast("int *", value)[0] = p.attrs[attr]
        return
    values = {
        _THRESHOLD: p.attrs[_THRESHOLD],
        _RESERVED_CURRENT: p.reserved,
        _RESERVED_HIGH: p.reserved_high,
        _USED_CURRENT: p.used,
        _USED_HIGH: p.used_high,
    }
    if attr not in values:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown pool attribute {attr}")
    RT.ffi.cast("unsigned long long *", value)[0] = values[attr]


@handles("cuMemPoolSetAccess@11020")
def mem_pool_set_access(pool: Any, desc: Any, count: int) -> None:
    """One device: it always has read-write access to its own pools."""
    _pool(pool)
    for i in range(count):
        loc_type, loc_id, flags = struct.unpack(
            "<iii", bytes(RT.ffi.buffer(RT.ffi.cast("char *", desc) + 12 * i, 12))
        )
        if loc_type != _LOC_DEVICE:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"location type {loc_type}")
        _device(loc_id)
        if flags != _ACCESS_READWRITE:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE, "a pool's own device keeps read-write access"
            )


@handles("cuMemPoolGetAccess@11020")
def mem_pool_get_access(out: Any, pool: Any, location: Any) -> None:
    _pool(pool)
    if out == RT.ffi.NULL or location == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL argument")
    loc_type, loc_id = struct.unpack(
        "<ii", bytes(RT.ffi.buffer(RT.ffi.cast("char *", location), 8))
    )
    out[0] = _ACCESS_READWRITE if (loc_type, loc_id) == (_LOC_DEVICE, 0) else _ACCESS_NONE
