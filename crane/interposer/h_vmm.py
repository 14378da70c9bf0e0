"""The virtual memory management API: cuMemAddressReserve, cuMemCreate, cuMemMap and friends.

The guest-side state (reservations from the session's VA window, physical handles committed at
map time, mappings recorded by the worker as allocations) lives in :mod:`crane.guest.vmm`; these
handlers decode the C structures and report what Crane cannot do. Refusals with
CUDA_ERROR_NOT_SUPPORTED print their reason once, since the application only sees the code.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.guest.vmm import ACCESS_FLAGS, PROP, check_location, parse_prop
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

_LOCATION = struct.Struct("<ii")  # CUmemLocation
_ACCESS_DESC = struct.Struct("<iiI")  # CUmemAccessDesc: location, flags
_V = CUresult.CUDA_ERROR_INVALID_VALUE
_reported: set[str] = set()


def _read(p: Any, n: int, what: str) -> bytes:
    if p == RT.ffi.NULL:
        raise CudaError(_V, f"{what}: NULL pointer")
    return bytes(RT.ffi.buffer(RT.ffi.cast("char *", p), n))


def _explained(fn: Any) -> Any:
    """Print the reason of a NOT_SUPPORTED refusal once per reason."""

    def run(*args: Any) -> None:
        try:
            fn(*args)
        except CudaError as e:
            if e.code == CUresult.CUDA_ERROR_NOT_SUPPORTED and e.message not in _reported:
                _reported.add(e.message)
                print(f"crane: {e.message}", file=sys.stderr)
            raise

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


def _ctx() -> int:
    """The context VMM memory mapped now belongs to: the current one, else the primary."""
    try:
        return RT.ctx()
    except CudaError:
        return RT.session().primary_context


@handles("cuMemGetAllocationGranularity@10020")
@_explained
def get_allocation_granularity(out: Any, prop: Any, option: int) -> None:
    what = "cuMemGetAllocationGranularity"
    if out == RT.ffi.NULL or option not in (0, 1):  # MINIMUM, RECOMMENDED
        raise CudaError(_V, f"{what}: NULL output or bad option {option}")
    parse_prop(_read(prop, PROP.size, what), what)
    out[0] = RT.session().vmm.granularity


@handles("cuMemAddressReserve@10020")
def address_reserve(out: Any, size: int, alignment: int, addr: int, flags: int) -> None:
    if out == RT.ffi.NULL or flags:
        raise CudaError(_V, f"cuMemAddressReserve: NULL output or flags {flags:#x}")
    out[0] = RT.session().vmm.reserve(size, alignment, addr)


@handles("cuMemAddressFree@10020")
def address_free(ptr: int, size: int) -> None:
    RT.session().vmm.address_free(ptr, size)


@handles("cuMemCreate@10020")
@_explained
def mem_create(out: Any, size: int, prop: Any, flags: int) -> None:
    if out == RT.ffi.NULL or flags:
        raise CudaError(_V, f"cuMemCreate: NULL handle pointer or flags {flags:#x}")
    normal = parse_prop(_read(prop, PROP.size, "cuMemCreate"), "cuMemCreate")
    out[0] = RT.session().vmm.create(size, normal)


@handles("cuMemRelease@10020")
def mem_release(handle: int) -> None:
    RT.session().vmm.release(handle)


@handles("cuMemMap@10020")
@_explained
def mem_map(ptr: int, size: int, offset: int, handle: int, flags: int) -> None:
    if flags:
        raise CudaError(_V, f"cuMemMap: flags {flags:#x} must be 0")
    RT.session().vmm.map(_ctx(), ptr, size, offset, handle)


@handles("cuMemUnmap@10020")
def mem_unmap(ptr: int, size: int) -> None:
    RT.session().vmm.unmap(ptr, size)


@handles("cuMemSetAccess@10020")
@_explained
def mem_set_access(ptr: int, size: int, desc: Any, count: int) -> None:
    what = "cuMemSetAccess"
    if count == 0 or count > 64:
        raise CudaError(_V, f"{what}: {count} access descriptors")
    raw = _read(desc, _ACCESS_DESC.size * count, what)
    flags = None
    for loc_type, loc_id, f in _ACCESS_DESC.iter_unpack(raw):
        if loc_type != 1:  # only the device's own access can be set
            raise CudaError(CUresult.CUDA_ERROR_INVALID_DEVICE, f"{what}: location type {loc_type}")
        check_location(loc_type, loc_id, what)
        if f not in ACCESS_FLAGS:
            raise CudaError(_V, f"{what}: bad access flags {f:#x}")
        flags = f
    assert flags is not None
    RT.session().vmm.set_access(ptr, size, flags)


@handles("cuMemGetAccess@10020")
@_explained
def mem_get_access(out: Any, location: Any, ptr: int) -> None:
    what = "cuMemGetAccess"
    loc_type, loc_id = _LOCATION.unpack(_read(location, _LOCATION.size, what))
    if loc_type != 1:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_DEVICE, f"{what}: location type {loc_type}")
    check_location(loc_type, loc_id, what)
    RT.out(out, RT.session().vmm.get_access(ptr))


@handles("cuMemGetAllocationPropertiesFromHandle@10020")
def mem_get_allocation_properties(prop: Any, handle: int) -> None:
    if prop == RT.ffi.NULL:
        raise CudaError(_V, "cuMemGetAllocationPropertiesFromHandle: NULL output")
    raw = RT.session().vmm.handle(handle).prop
    RT.ffi.memmove(RT.ffi.cast("char *", prop), raw, len(raw))


@handles("cuMemRetainAllocationHandle@11000")
def mem_retain_allocation_handle(out: Any, addr: Any) -> None:
    if out == RT.ffi.NULL:
        raise CudaError(_V, "cuMemRetainAllocationHandle: NULL output")
    out[0] = RT.session().vmm.retain(RT.ptr(addr))


@handles("cuMemExportToShareableHandle@10020")
@_explained
def mem_export_to_shareable_handle(out: Any, handle: int, handle_type: int, flags: int) -> None:
    raise CudaError(
        CUresult.CUDA_ERROR_NOT_SUPPORTED,
        "cuMemExportToShareableHandle: sharing VMM memory between processes (IPC) is not "
        "supported by Crane",
    )


@handles("cuMemImportFromShareableHandle@10020")
@_explained
def mem_import_from_shareable_handle(out: Any, os_handle: Any, handle_type: int) -> None:
    raise CudaError(
        CUresult.CUDA_ERROR_NOT_SUPPORTED,
        "cuMemImportFromShareableHandle: sharing VMM memory between processes (IPC) is not "
        "supported by Crane",
    )
