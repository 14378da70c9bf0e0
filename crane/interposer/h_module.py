"""Modules, libraries, kernels and functions, globals, function attributes and occupancy.

A library and a module are the same session module here, and a CUkernel is the same session
function as the CUfunction cuKernelGetFunction returns (cudart launches CUkernels directly).
Everything except the load itself is answered locally from the layout the daemon returned
when the module was loaded."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from crane.api.generated.cuda_enums import CUdevice_attribute as DA
from crane.api.generated.cuda_enums import CUresult
from crane.api.launch_check import DEFAULT_SHARED_LIMIT, max_active_blocks_per_sm
from crane.api.results import CudaError
from crane.guest.session import Function
from crane.interposer.h_link import linked_image
from crane.interposer.images import image_from_pointer
from crane.interposer.jit_options import JitOptions
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

_MAX_DYN = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_CARVEOUT = 9
_names: dict[int, Any] = {}  # function handle -> C string kept alive for cuKernelGetName


def _load(out: Any, image: bytes, library: bool = False) -> None:
    """Load into the current context; a library is context-independent (cudart loads it before
    any context is current), so it goes to the primary context the session serves."""
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL module pointer")
    s = RT.session()
    ctx = s.primary_context if library else RT.ctx()
    mod = s.module_load(image, ctx)
    RT.modules[mod.handle] = mod
    out[0] = RT.ffi.cast("void *", mod.handle)


def _read_file(path: Any) -> bytes:
    name = RT.ffi.string(path).decode()
    try:
        with open(name, "rb") as f:
            return f.read()
    except OSError as e:
        raise CudaError(CUresult.CUDA_ERROR_FILE_NOT_FOUND, f"{name}: {e.strerror}") from None


def _load_logged(
    out: Any, image: Callable[[], bytes], options: JitOptions, library: bool = False
) -> None:
    """Load; failures fill the error log, successes the info log, as the JIT does."""
    try:
        _load(out, image(), library)
    except CudaError as e:
        options.write_error(f"error   : {e.message}")
        raise
    options.write_info(f"info    : loaded {RT.module(out[0]).description}")


def _load_pointer(out: Any, image: Any, options: JitOptions, library: bool = False) -> None:
    """Load an image given by pointer; a version-2 wrapper (``nvcc -rdc=true`` for PTX) is
    JIT-linked first."""

    def data() -> bytes:
        ptr = RT.ptr(image)
        linked = linked_image(ptr, options)
        return linked if linked is not None else image_from_pointer(RT.ffi, ptr)

    _load_logged(out, data, options, library)


@handles("cuModuleLoadData@2000", "cuModuleLoadFatBinary@2000")
def module_load_data(out: Any, image: Any) -> None:
    _load_pointer(out, image, JitOptions.read(RT.ffi, 0, RT.ffi.NULL, RT.ffi.NULL))


@handles("cuModuleLoadDataEx@2010")
def module_load_data_ex(out: Any, image: Any, n: int, opts: Any, vals: Any) -> None:
    """JIT options other than the logs and the wall time are hints to a compiler."""
    started = time.perf_counter()
    options = JitOptions.read(RT.ffi, n, opts, vals)
    _load_pointer(out, image, options)
    options.write_wall_time((time.perf_counter() - started) * 1000.0)


@handles("cuModuleLoad@2000")
def module_load(out: Any, path: Any) -> None:
    _load(out, _read_file(path))


@handles("cuLibraryLoadData@12000")
def library_load_data(
    out: Any, code: Any, jit_opts: Any, jit_vals: Any, n_jit: int, *library_options: Any
) -> None:
    started = time.perf_counter()
    options = JitOptions.read(RT.ffi, n_jit, jit_opts, jit_vals)
    _load_pointer(out, code, options, library=True)
    options.write_wall_time((time.perf_counter() - started) * 1000.0)


@handles("cuLibraryLoadFromFile@12000")
def library_load_from_file(
    out: Any, path: Any, jit_opts: Any, jit_vals: Any, n_jit: int, *library_options: Any
) -> None:
    options = JitOptions.read(RT.ffi, n_jit, jit_opts, jit_vals)
    _load_logged(out, lambda: _read_file(path), options, library=True)


@handles("cuModuleUnload@2000", "cuLibraryUnload@12000")
def module_unload(handle: Any) -> None:
    mod = RT.module(handle)
    RT.session().module_unload(mod)
    RT.forget_module(mod.handle)


@handles("cuModuleGetLoadingMode@11070")
def module_get_loading_mode(out: Any) -> None:
    eager = os.environ.get("CUDA_MODULE_LOADING", "").upper() == "EAGER"
    RT.out(out, 1 if eager else 2)  # CU_MODULE_EAGER_LOADING / CU_MODULE_LAZY_LOADING


@handles("cuLibraryGetKernel@12000", "cuModuleGetFunction@2000")
def library_get_kernel(out: Any, handle: Any, name: Any) -> None:
    if out == RT.ffi.NULL or name == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL argument")
    fn = RT.kernel(RT.module(handle), RT.ffi.string(name).decode())
    out[0] = RT.ffi.cast("void *", fn.handle)


@handles("cuModuleGetFunctionCount@12040", "cuLibraryGetKernelCount@12040")
def module_get_function_count(out: Any, handle: Any) -> None:
    RT.out(out, len(RT.module(handle).kernels))


@handles("cuModuleEnumerateFunctions@12040", "cuLibraryEnumerateKernels@12040")
def module_enumerate_functions(out: Any, n: int, handle: Any) -> None:
    """The module's first ``n`` functions, in the order its image lists them (a module's
    kernels are bound lazily, so this binds them)."""
    mod = RT.module(handle)
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL function array")
    if n > len(mod.kernels):
        have = len(mod.kernels)
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE, f"{n} functions asked, module has {have}"
        )
    for i, name in enumerate(list(mod.kernels)[:n]):
        out[i] = RT.ffi.cast("void *", RT.kernel(mod, name).handle)


@handles("cuLibraryGetModule@12000")
def library_get_module(out: Any, handle: Any) -> None:
    RT.out(out, RT.ffi.cast("void *", RT.module(handle).handle))


@handles("cuKernelGetFunction@12000")
def kernel_get_function(out: Any, kernel: Any) -> None:
    RT.out(out, RT.ffi.cast("void *", RT.function(kernel).handle))


@handles("cuLibraryGetGlobal@12000", "cuModuleGetGlobal@3020")
def library_get_global(dptr: Any, size: Any, handle: Any, name: Any) -> None:
    addr, n = RT.session().module_get_global(RT.module(handle), RT.ffi.string(name).decode())
    if dptr != RT.ffi.NULL:
        dptr[0] = addr
    if size != RT.ffi.NULL:
        size[0] = n


# ---- attributes ----------------------------------------------------------------------------
def max_dynamic_shared(fn: Function) -> int:
    set_value = RT.func_attrs.get(fn.handle, {}).get(_MAX_DYN)
    return (
        set_value
        if set_value is not None
        else max(DEFAULT_SHARED_LIMIT - fn.layout.static_shared, 0)
    )


# CUfunction_attribute values set at run time (cuFuncSetAttribute / cuKernelSetAttribute)
_REQ_CLUSTER = (11, 12, 13)  # REQUIRED_CLUSTER_WIDTH / HEIGHT / DEPTH
_NON_PORTABLE_CLUSTER, _CLUSTER_POLICY = 14, 15
_SETTABLE = {_MAX_DYN, _CARVEOUT, *_REQ_CLUSTER, _NON_PORTABLE_CLUSTER, _CLUSTER_POLICY}


def registers_per_thread(attributes: dict[int, int]) -> int:
    """NUM_REGS. The simulated device has no register file limit, so a kernel is said to use
    what a thread may use without lowering occupancy (registers per SM / threads per SM: 32 on
    an H100), which keeps occupancy formulas (cuda_occupancy.h, built into cuBLAS and CUB) in
    agreement with cuOccupancyMaxActiveBlocksPerMultiprocessor. Reporting 0 made cuBLAS's
    formula divide by zero (SIGFPE in cublasSdot)."""
    per_sm = attributes[DA.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR]
    return max(1, per_sm // attributes[DA.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR])


def function_attribute(fn: Function, attrib: int) -> int:
    s = RT.session()
    a = s.attributes
    lay = fn.layout
    stored = RT.func_attrs.get(fn.handle, {})
    values = {
        0: lay.max_threads or a[DA.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK],
        1: lay.static_shared,
        2: 0,  # constant bytes: module constants are globals here
        3: 0,  # local bytes: not reported by the daemon's layout
        4: registers_per_thread(a),
        5: lay.ptx_version,  # PTX_VERSION: the compute_XY the code was compiled from
        6: lay.binary_version,  # BINARY_VERSION: the code that runs (JIT-ed: the device's)
        7: 0,
        _MAX_DYN: max_dynamic_shared(fn),
        _CARVEOUT: stored.get(_CARVEOUT, -1),
        10: int(lay.cluster is not None),  # CLUSTER_SIZE_MUST_BE_SET: compiled for clusters
        11: required_cluster(fn)[0], 12: required_cluster(fn)[1], 13: required_cluster(fn)[2],
        14: stored.get(14, 0), 15: stored.get(15, 0),
    }  # fmt: skip
    if attrib not in values:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown function attribute {attrib}")
    return values[attrib]


def required_cluster(fn: Function) -> tuple[int, int, int]:
    """The kernel's required cluster dimensions (0s: none): compiled (``__cluster_dims__``),
    else set with REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH."""
    if fn.layout.cluster is not None:
        return fn.layout.cluster
    stored = RT.func_attrs.get(fn.handle, {})
    return (stored.get(11, 0), stored.get(12, 0), stored.get(13, 0))


def non_portable_cluster(fn: Function) -> bool:
    """Whether NON_PORTABLE_CLUSTER_SIZE_ALLOWED was set: clusters of up to 16 blocks."""
    return bool(RT.func_attrs.get(fn.handle, {}).get(_NON_PORTABLE_CLUSTER, 0))


def set_function_attribute(fn: Function, attrib: int, value: int) -> None:
    """The settable attributes of cuda.h's CUfunction_attribute, validated as the driver
    documents; the cluster ones are recorded, reported, and shape later launches
    (REQUIRED_CLUSTER_*: the launch's clusters when it names none)."""
    s = RT.session()
    if attrib not in _SETTABLE:
        if 0 <= attrib <= 15:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"attribute {attrib} is read-only")
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown function attribute {attrib}")
    if attrib == _MAX_DYN:
        optin = s.attributes[DA.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN]
        if value < 0 or value + fn.layout.static_shared > optin:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"{value} bytes of dynamic shared memory exceeds the device's opt-in limit",
            )
        s.function_set_max_dynamic_shared(fn, value)
    elif attrib == _CARVEOUT:
        if not -1 <= value <= 100:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad carveout {value}")
    elif attrib in _REQ_CLUSTER:
        if fn.layout.cluster is not None:
            raise CudaError(
                CUresult.CUDA_ERROR_NOT_PERMITTED,
                f"{fn.layout.name} is compiled with cluster dimensions {fn.layout.cluster}",
            )
        if value < 0:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad cluster dimension {value}")
        if s.attributes.get(DA.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 0) == 0 and value > 1:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "the device has no clusters")
    elif attrib == _NON_PORTABLE_CLUSTER:
        if value not in (0, 1):
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad non-portable flag {value}")
    elif not 0 <= value <= 2:  # CU_CLUSTER_SCHEDULING_POLICY_DEFAULT/SPREAD/LOAD_BALANCING
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad scheduling policy {value}")
    RT.func_attrs.setdefault(fn.handle, {})[attrib] = value


@handles("cuFuncGetAttribute@2020")
def func_get_attribute(out: Any, attrib: int, func: Any) -> None:
    RT.out(out, function_attribute(RT.function(func), attrib))


@handles("cuKernelGetAttribute@12000")
def kernel_get_attribute(out: Any, attrib: int, kernel: Any, dev: int) -> None:
    RT.out(out, function_attribute(RT.function(kernel), attrib))


@handles("cuFuncSetAttribute@9000")
def func_set_attribute(func: Any, attrib: int, value: int) -> None:
    set_function_attribute(RT.function(func), attrib, value)


@handles("cuKernelSetAttribute@12000")
def kernel_set_attribute(attrib: int, value: int, kernel: Any, dev: int) -> None:
    set_function_attribute(RT.function(kernel), attrib, value)


@handles("cuFuncSetCacheConfig@3000")
def func_set_cache_config(func: Any, config: int) -> None:
    RT.function(func)  # a preference only


@handles("cuKernelSetCacheConfig@12000")
def kernel_set_cache_config(kernel: Any, config: int, dev: int) -> None:
    RT.function(kernel)


@handles("cuFuncGetParamInfo@12040", "cuKernelGetParamInfo@12040")
def func_get_param_info(func: Any, index: int, offset: Any, size: Any) -> None:
    params = RT.function(func).layout.params
    if index >= len(params):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"no parameter {index}")
    if offset != RT.ffi.NULL:
        offset[0] = params[index][0]
    if size != RT.ffi.NULL:
        size[0] = params[index][1]


@handles("cuFuncGetName@12030", "cuKernelGetName@12030")
def func_get_name(out: Any, func: Any) -> None:
    fn = RT.function(func)
    if fn.handle not in _names:
        _names[fn.handle] = RT.ffi.new("char[]", fn.layout.name.encode())
    RT.out(out, _names[fn.handle])


# ---- occupancy -----------------------------------------------------------------------------
def max_active_blocks(fn: Function, block: int, dyn_shared: int) -> int:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor: the computation the cooperative-launch
    check also uses (crane.api.launch_check)."""
    return max_active_blocks_per_sm(
        RT.session().attributes,
        block,
        fn.layout.static_shared + dyn_shared,
        max_threads=function_attribute(fn, 0),
    )


@handles("cuOccupancyMaxActiveBlocksPerMultiprocessor@6050")
def occupancy(out: Any, func: Any, block: int, dyn: int) -> None:
    RT.out(out, max_active_blocks(RT.function(func), block, dyn))


@handles("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags@7000")
def occupancy_flags(out: Any, func: Any, block: int, dyn: int, flags: int) -> None:
    RT.out(out, max_active_blocks(RT.function(func), block, dyn))


def potential_block_size(
    fn: Function, smem_for: Callable[[int], int], block_limit: int
) -> tuple[int, int]:
    """cuOccupancyMaxPotentialBlockSize: the block size (a multiple of the warp size, within
    the function's and ``block_limit``'s maximum) that keeps the most threads resident per SM,
    preferring the larger block on ties, and the grid that fills every SM with it: the search
    NVIDIA's occupancy calculator (cuda_occupancy.h) makes, over the same per-SM limits."""
    a = RT.session().attributes
    max_block = function_attribute(fn, 0)
    if block_limit > 0:
        max_block = min(max_block, block_limit)
    warp = a[DA.CU_DEVICE_ATTRIBUTE_WARP_SIZE]
    full = a[DA.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR]
    best_threads, best_block, best_blocks = 0, 0, 0
    aligned = (max_block + warp - 1) // warp * warp
    while aligned > 0:
        block = min(max_block, aligned)
        blocks = max_active_blocks(fn, block, smem_for(block))
        if block * blocks > best_threads:
            best_threads, best_block, best_blocks = block * blocks, block, blocks
        if best_threads == full:
            break
        aligned -= warp
    return best_blocks * a[DA.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT], best_block


@handles("cuOccupancyMaxPotentialBlockSize@6050")
def occupancy_potential(
    min_grid: Any, block_out: Any, func: Any, b2smem: Any, dyn: int, limit: int
) -> None:
    occupancy_potential_flags(min_grid, block_out, func, b2smem, dyn, limit, 0)


@handles("cuOccupancyMaxPotentialBlockSizeWithFlags@7000")
def occupancy_potential_flags(
    min_grid: Any, block_out: Any, func: Any, b2smem: Any, dyn: int, limit: int, flags: int
) -> None:
    """``flags`` (CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE) only concerns the L1/shared split a
    real device may pick; the answer here does not depend on it."""
    if min_grid == RT.ffi.NULL or block_out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL output pointer")
    if flags & ~1:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad occupancy flags {flags:#x}")
    fn = RT.function(func)
    if b2smem != RT.ffi.NULL:
        callback = RT.ffi.cast("size_t (*)(int)", b2smem)

        def smem_for(block: int) -> int:
            return int(callback(block))
    else:

        def smem_for(block: int) -> int:
            return dyn

    grid, block = potential_block_size(fn, smem_for, limit)
    min_grid[0], block_out[0] = grid, block


@handles("cuOccupancyAvailableDynamicSMemPerBlock@10020")
def occupancy_dyn_smem(out: Any, func: Any, blocks: int, block: int) -> None:
    fn = RT.function(func)
    a = RT.session().attributes
    if blocks <= 0 or block <= 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "bad occupancy query")
    per_sm = a[DA.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR] // blocks
    per_sm -= a.get(DA.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 0)
    optin = a[DA.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN]
    RT.out(out, max(min(per_sm, optin) - fn.layout.static_shared, 0))
