"""Error strings, pointer attributes and profiler control: purely local answers."""

from __future__ import annotations

from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError, error_name, error_string
from crane.interposer.h_memory import is_device
from crane.interposer.h_pools import pool_of
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

_strings: dict[tuple[str, int], Any] = {}  # C strings handed out stay alive for the process


def _cstr(kind: str, code: int, text: str) -> Any:
    key = (kind, code)
    if key not in _strings:
        _strings[key] = RT.ffi.new("char[]", text.encode())
    return _strings[key]


def _known(code: int) -> None:
    try:
        CUresult(code)
    except ValueError:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown CUresult {code}") from None


@handles("cuProfilerStart@4000", "cuProfilerStop@4000")
def profiler_control() -> None:
    """With no profiler attached a driver accepts both and does nothing; a profiler would
    attach to the daemon's GPU, not to this process."""
    RT.session()


@handles("cuGetErrorString@6000")
def get_error_string(code: int, out: Any) -> None:
    _known(code)
    RT.out(out, _cstr("s", code, error_string(code)))


@handles("cuGetErrorName@6000")
def get_error_name(code: int, out: Any) -> None:
    _known(code)
    RT.out(out, _cstr("n", code, error_name(code)))


# ---- pointer attributes --------------------------------------------------------------------
# attribute -> C type of its value
_ATTR_TYPES = {
    1: "void *",  # CONTEXT
    2: "unsigned int",  # MEMORY_TYPE
    3: "unsigned long long",  # DEVICE_POINTER
    4: "void *",  # HOST_POINTER
    # booleans are written as 4 bytes: cudart reserves an int for each
    6: "unsigned int",  # SYNC_MEMOPS
    7: "unsigned long long",  # BUFFER_ID
    8: "unsigned int",  # IS_MANAGED
    9: "int",  # DEVICE_ORDINAL
    10: "unsigned int",  # IS_LEGACY_CUDA_IPC_CAPABLE
    11: "unsigned long long",  # RANGE_START_ADDR
    12: "size_t",  # RANGE_SIZE
    13: "unsigned int",  # MAPPED
    14: "unsigned long long",  # ALLOWED_HANDLE_TYPES
    15: "unsigned int",  # IS_GPU_DIRECT_RDMA_CAPABLE
    16: "unsigned int",  # ACCESS_FLAGS
    17: "void *",  # MEMPOOL_HANDLE
    18: "size_t",  # MAPPING_SIZE
    19: "void *",  # MAPPING_BASE_ADDR
    20: "unsigned long long",  # MEMORY_BLOCK_ID
}


def pointer_attributes(ptr: int) -> dict[int, int] | None:
    """Every attribute's value for ``ptr``, or None if Crane does not know the pointer."""
    s = RT.session()
    m = (s.mirrors.by_host(ptr) or s.mirrors.by_dev(ptr)) if s.mirrors else None
    if m is not None:
        off = ptr - m.host if m.host <= ptr < m.host + m.size else ptr - m.dev
        ctx = RT.ptr(RT.lib.crane_primary_ctx(0))
        managed = m.kind == "managed"
        # managed memory is DEVICE memory with IS_MANAGED set (cudart then says "managed");
        # mapped pinned memory is HOST memory that has a device pointer
        return {
            1: ctx, 2: 2 if managed else 1, 3: m.dev + off, 4: m.host + off, 6: 0, 7: m.dev,
            8: int(managed), 9: 0, 10: 0, 11: m.dev, 12: m.size, 13: 1, 14: 0, 15: 0, 16: 3,
            17: 0, 18: m.size, 19: m.dev, 20: m.dev,
        }  # fmt: skip
    if is_device(s, ptr):
        hit = s.va.lookup(ptr)  # an allocation, or a VMM mapping
        if hit is None or ptr >= hit[0] + hit[1]:
            return None
        start, size = hit
        ctx = RT.ptr(RT.lib.crane_primary_ctx(0))
        return {
            1: ctx, 2: 2, 3: ptr, 4: 0, 6: 0, 7: start, 8: 0, 9: 0, 10: 0, 11: start, 12: size,
            13: 1, 14: 0, 15: 0, 16: 3, 17: pool_of(start), 18: size, 19: start, 20: start,
        }  # fmt: skip
    base, size, flags = RT.ffi.new("void **"), RT.ffi.new("size_t *"), RT.ffi.new("unsigned *")
    if not RT.lib.crane_host_lookup(RT.ffi.cast("void *", ptr), base, size, flags):
        return None
    b = RT.ptr(base[0])
    return {
        1: 0, 2: 1, 3: 0, 4: ptr, 6: 0, 7: b, 8: 0, 9: 0, 10: 0, 11: b, 12: size[0], 13: 0,
        14: 0, 15: 0, 16: 0, 17: 0, 18: size[0], 19: b, 20: b,
    }  # fmt: skip


def _write(attr: int, data: Any, value: int) -> None:
    ctype = _ATTR_TYPES[attr]
    p = RT.ffi.cast(ctype + " *", data)
    p[0] = RT.ffi.cast("void *", value) if ctype == "void *" else value


@handles("cuPointerGetAttribute@4000")
def pointer_get_attribute(data: Any, attribute: int, ptr: int) -> None:
    if data == RT.ffi.NULL or attribute not in _ATTR_TYPES:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad pointer attribute {attribute}")
    values = pointer_attributes(ptr)
    if values is None:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"{ptr:#x} is not a CUDA pointer")
    if (attribute == 4 and not values[4]) or (attribute == 3 and not values[3]):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"{ptr:#x} has no such mapping")
    _write(attribute, data, values[attribute])


@handles("cuPointerGetAttributes@7000")
def pointer_get_attributes(n: int, attributes: Any, data: Any, ptr: int) -> None:
    values = pointer_attributes(ptr) or {}
    for i in range(n):
        attr = attributes[i]
        if attr not in _ATTR_TYPES:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad pointer attribute {attr}")
        if data[i] != RT.ffi.NULL:
            _write(attr, data[i], values.get(attr, 0))
