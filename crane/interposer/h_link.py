"""JIT linking: cuLinkCreate/AddData/AddFile/Complete/Destroy, and cudart's prelinked fatbins.

The link runs in the guest (it needs nothing from the device but its compute capability, and
its inputs are already here): each input yields the PTX the device can JIT
(:mod:`crane.modules.link_inputs`), the PTX modules are linked into one
(:mod:`crane.modules.ptx_link`), and the result is an ordinary PTX image that cuModuleLoadData
sends to the daemon like any other, so the state record, checkpoints and migration see a plain
module. cuLinkComplete's "cubin" is therefore PTX text (NUL-terminated); it stays valid until
cuLinkDestroy, as the driver's does. The logs go to the buffers given at cuLinkCreate.

``nvcc -rdc=true`` for PTX only registers a version-2 fatbin wrapper whose own (device-link)
fatbin has no code for the device and whose ``filename_or_fatbins`` lists every translation
unit's relocatable fatbin; cudart hands that wrapper to cuLibraryLoadData and the driver links
them: :func:`linked_image` does the same here.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Any

from crane.api.generated.cuda_enums import CUdevice_attribute as DA
from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.interposer.jit_options import JitOptions
from crane.interposer.registry import handles
from crane.interposer.runtime import RT
from crane.modules.errors import ImageError, PtxImageError
from crane.modules.fatbin import (
    WRAPPER_MAGIC,
    WRAPPER_SIZE,
    fatbin_total_size,
    parse_fatbin,
    parse_wrapper,
    select_entry,
)
from crane.modules.link_inputs import UnsupportedInput, fatbin_inputs, link_inputs
from crane.modules.ptx_info import scan_ptx
from crane.modules.ptx_link import LinkError, LinkInput, LinkResult, link_ptx

__all__ = ["device_cc", "linked_image"]

#: Prelinked fatbins read from one wrapper at most (a guard against a corrupt array).
_MAX_PRELINKED = 4096


@dataclass
class _LinkState:
    options: JitOptions
    inputs: list[LinkInput] = field(default_factory=list)
    result: Any = None  # the cffi buffer cuLinkComplete handed out
    started: float = field(default_factory=time.perf_counter)


_states: dict[int, _LinkState] = {}
_next_state = [0x11A0_0000]


def device_cc() -> tuple[int, int]:
    a = RT.session().attributes
    return (
        int(a[DA.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR]),
        int(a[DA.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR]),
    )


def _state(handle: Any) -> _LinkState:
    st = _states.get(RT.ptr(handle))
    if st is None:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, "unknown link state")
    return st


@handles("cuLinkCreate@5050", "cuLinkCreate@6050")
def link_create(n: int, opts: Any, vals: Any, out: Any) -> None:
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL link state pointer")
    RT.require_init()
    st = _LinkState(JitOptions.read(RT.ffi, n, opts, vals))
    _next_state[0] += 16
    _states[_next_state[0]] = st
    out[0] = RT.ffi.cast("void *", _next_state[0])


def _add(st: _LinkState, kind: int, data: bytes, name: str) -> None:
    try:
        new = link_inputs(kind, data, name, device_cc())
        for inp in new:
            if inp.ptx is not None:
                scan_ptx(inp.ptx)  # the driver compiles each PTX input as it is added
    except UnsupportedInput as e:
        st.options.write_error(f"error   : {e}")
        raise CudaError(CUresult.CUDA_ERROR_NOT_SUPPORTED, str(e)) from None
    except ImageError as e:
        st.options.write_error(f"error   : {e}")
        code = (
            CUresult.CUDA_ERROR_INVALID_PTX
            if isinstance(e, PtxImageError)
            else CUresult.CUDA_ERROR_INVALID_IMAGE
        )
        raise CudaError(code, str(e)) from None
    for inp in new:
        if inp.ptx is None and not inp.optional:
            msg = f"'{inp.name}' {inp.note}"
            st.options.write_error(f"error   : {msg}")
            raise CudaError(CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU, msg)
    st.inputs += new


def _input_name(name: Any, fallback: str) -> str:
    return RT.ffi.string(name).decode("utf-8", "replace") if name != RT.ffi.NULL else fallback


@handles("cuLinkAddData@5050", "cuLinkAddData@6050")
def link_add_data(
    state: Any, kind: int, data: Any, size: int, name: Any, n: int, opts: Any, vals: Any
) -> None:
    st = _state(state)
    JitOptions.read(RT.ffi, n, opts, vals)
    if data == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL link input")
    blob = (
        bytes(RT.ffi.buffer(RT.ffi.cast("char *", data), int(size)))
        if size
        else RT.ffi.string(RT.ffi.cast("char *", data))
    )
    _add(st, int(kind), blob, _input_name(name, f"input {len(st.inputs)}"))


@handles("cuLinkAddFile@5050", "cuLinkAddFile@6050")
def link_add_file(state: Any, kind: int, path: Any, n: int, opts: Any, vals: Any) -> None:
    st = _state(state)
    JitOptions.read(RT.ffi, n, opts, vals)
    if path == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL path")
    name = RT.ffi.string(path).decode("utf-8", "replace")
    try:
        with open(name, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise CudaError(CUresult.CUDA_ERROR_FILE_NOT_FOUND, f"{name}: {e.strerror}") from None
    _add(st, int(kind), blob, name)


def _link(inputs: list[LinkInput], options: JitOptions) -> LinkResult:
    try:
        result = link_ptx(inputs)
    except LinkError as e:
        options.write_error(e.log)
        raise CudaError(CUresult.CUDA_ERROR_INVALID_IMAGE, e.log.replace("\n", "; ")) from None
    options.write_info(result.info_log)
    return result


@handles("cuLinkComplete@5050")
def link_complete(state: Any, cubin_out: Any, size_out: Any) -> None:
    st = _state(state)
    if cubin_out == RT.ffi.NULL or size_out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL output pointer")
    if not st.inputs:
        st.options.write_error("error   : no input to link")
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "cuLinkComplete with no inputs")
    result = _link(st.inputs, st.options)
    data = result.ptx.encode() + b"\0"
    st.result = RT.ffi.new("char[]", data)
    cubin_out[0] = RT.ffi.cast("void *", st.result)
    size_out[0] = len(data)
    st.options.write_wall_time((time.perf_counter() - st.started) * 1000.0)


@handles("cuLinkDestroy@5050")
def link_destroy(state: Any) -> None:
    if _states.pop(RT.ptr(state), None) is None:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, "unknown link state")


def linked_image(ptr: int, options: JitOptions) -> bytes | None:
    """For a version-2 fatbin wrapper at ``ptr`` whose own fatbin has no code for the device:
    the PTX image its prelinked fatbins link into (``None``: not such a wrapper)."""

    def read(addr: int, n: int) -> bytes:
        return bytes(RT.ffi.buffer(RT.ffi.cast("char *", addr), n))

    if ptr == 0 or struct.unpack("<I", read(ptr, 4))[0] != WRAPPER_MAGIC:
        return None
    try:
        wrapper = parse_wrapper(read(ptr, WRAPPER_SIZE))
        if wrapper.version != 2 or wrapper.prelinked_ptr == 0:
            return None
        cc = device_cc()
        own = read(wrapper.data_ptr, fatbin_total_size(read(wrapper.data_ptr, 16)))
        entries = parse_fatbin(own)
        if entries:
            try:
                select_entry(entries, cc)
                return None  # the device-linked code runs here: load it as it is
            except ImageError:
                pass
        inputs: list[LinkInput] = []
        for k in range(_MAX_PRELINKED):
            fb = struct.unpack("<Q", read(wrapper.prelinked_ptr + 8 * k, 8))[0]
            if fb == 0:
                break
            blob = read(fb, fatbin_total_size(read(fb, 16)))
            # translation units without PTX for this device (libcudadevrt's SASS) join only
            # if something needs them, and then fail the link by name
            found = fatbin_inputs(blob, f"prelinked fatbin {k}", cc)
            inputs += [
                inp if inp.ptx is not None else LinkInput(inp.name, None, inp.note, True)
                for inp in found
            ]
    except ImageError as e:
        options.write_error(f"error   : {e}")
        raise CudaError(CUresult.CUDA_ERROR_INVALID_IMAGE, str(e)) from None
    started = time.perf_counter()
    result = _link(inputs, options)
    options.write_wall_time((time.perf_counter() - started) * 1000.0)
    return result.ptx.encode()
