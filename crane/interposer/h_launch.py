"""Kernel launches and host functions.

``cuLaunchKernel`` gets one pointer per argument and no sizes: the buffer is packed from the
parameter layout the daemon returned with the module (or taken as is from ``extra``), checked
locally against the device's limits (so an invalid configuration fails at the call) and
enqueued without a round trip. Host functions run in the guest at their point in stream order:
the stream is drained first and later work is enqueued only after the function returns."""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from crane.api.generated.cuda_enums import CUresult
from crane.api.launch_check import check_cluster
from crane.api.results import CudaError
from crane.guest.session import Function
from crane.interposer import device_limits, graphs
from crane.interposer.h_module import max_dynamic_shared, non_portable_cluster, required_cluster
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

_LAUNCH_CONFIG = struct.Struct("<7I4xQQI")  # CUlaunchConfig
_ATTR_SIZE = 72  # CUlaunchAttribute: id, padding, 64-byte value union
_COOPERATIVE, _CLUSTER_DIMENSION = 2, 4


def params_from_launch_args(fn: Function, params: Any, extra: Any) -> bytes:
    ffi, lay = RT.ffi, fn.layout
    if params != ffi.NULL:
        buf = bytearray(lay.param_bytes)
        for i, (off, size) in enumerate(lay.params):
            buf[off : off + size] = ffi.buffer(params[i], size)
        return bytes(buf)
    if extra == ffi.NULL:
        if lay.param_bytes:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"{lay.name} needs parameters")
        return b""
    ptr, size, i = None, None, 0
    while True:
        key = int(ffi.cast("uintptr_t", extra[i]))
        if key == 0:  # CU_LAUNCH_PARAM_END
            break
        if key == 1:  # CU_LAUNCH_PARAM_BUFFER_POINTER
            ptr = extra[i + 1]
        elif key == 2:  # CU_LAUNCH_PARAM_BUFFER_SIZE
            size = ffi.cast("size_t *", extra[i + 1])[0]
        else:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown launch extra key {key}")
        i += 2
    if ptr is None or size is None:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "extra lacks the buffer or its size")
    return bytes(ffi.buffer(ptr, size))


def cluster_dims(
    fn: Function, grid: tuple[int, int, int], cluster: tuple[int, int, int] | None
) -> tuple[int, int, int] | None:
    """The cluster dimensions a launch of ``fn`` runs with: the launch's own
    (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION), else the kernel's required ones (compiled with
    ``__cluster_dims__`` or set as REQUIRED_CLUSTER_*), else None; refused as the driver does
    (CUDA_ERROR_INVALID_CLUSTER_SIZE ...), the device side checking again."""
    req = required_cluster(fn)
    if cluster is None and not any(req):
        return None  # the common launch: nothing to check
    return check_cluster(
        RT.session().attributes,
        grid,
        cluster,
        required=req if any(req) else None,
        non_portable=non_portable_cluster(fn),
    )


def launch(
    f: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int, stream: int,
    params: Any, extra: Any, cooperative: bool = False,
    cluster: tuple[int, int, int] | None = None,
) -> None:  # fmt: skip
    fn = RT.function(f)
    dims = cluster_dims(fn, grid, cluster)
    buf = params_from_launch_args(fn, params, extra)  # a copy: a captured node keeps the values
    device_limits.before_launch()
    if cooperative:
        # graph kernel nodes carry no cooperative flag here: refuse rather than record a
        # node that would replay as an ordinary launch (its grid.sync() would then trap)
        graphs.refuse(stream, "a cooperative launch")
        if dims is not None:
            launch_cluster(fn, grid, block, dims, buf, shared, stream, cooperative=True)
            return
        RT.session().launch_cooperative(
            fn, grid, block, buf, shared, stream, max_dynamic_shared=max_dynamic_shared(fn)
        )
        return
    # (the node is made only while some stream captures: a launch's hot path)
    if graphs.STREAMS and graphs.record(
        stream, graphs.KERNEL, graphs.KernelParams(fn, grid, block, shared, buf, dims)
    ):
        return
    if dims is not None:
        launch_cluster(fn, grid, block, dims, buf, shared, stream)
        return
    RT.session().launch(
        fn, grid, block, buf, shared, stream, max_dynamic_shared=max_dynamic_shared(fn)
    )


def launch_cluster(
    fn: Function, grid: tuple[int, int, int], block: tuple[int, int, int],
    cluster: tuple[int, int, int], buf: bytes, shared: int, stream: int,
    cooperative: bool = False,
) -> None:  # fmt: skip
    """A launch of clusters (also how a graph kernel node with cluster dimensions runs)."""
    RT.session().launch_cluster(
        fn, grid, block, cluster, buf, shared, stream, max_dynamic_shared(fn),
        cooperative=cooperative, non_portable_cluster=non_portable_cluster(fn),
    )  # fmt: skip


@handles("cuLaunchKernel@4000")
def launch_kernel(
    f: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, stream: Any,
    params: Any, extra: Any,
) -> None:  # fmt: skip
    launch(f, (gx, gy, gz), (bx, by, bz), shared, RT.stream(stream), params, extra)


class ExConfig(NamedTuple):
    """A CUlaunchConfig as read from guest memory: its dimensions, stream and the attributes
    that change what runs (every other attribute is a scheduling or memory-ordering hint)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    stream: int
    cooperative: bool
    cluster: tuple[int, int, int] | None


def read_launch_config(config: Any) -> ExConfig:
    ffi = RT.ffi
    if config == ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL launch config")
    gx, gy, gz, bx, by, bz, shared, stream, attrs, nattrs = _LAUNCH_CONFIG.unpack(
        bytes(ffi.buffer(config, _LAUNCH_CONFIG.size))
    )
    if nattrs and not attrs:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL launch attributes")
    cooperative = False
    cluster = None
    for i in range(nattrs):
        raw = bytes(ffi.buffer(ffi.cast("char *", attrs + i * _ATTR_SIZE), _ATTR_SIZE))
        aid = struct.unpack_from("<I", raw)[0]
        if aid == _COOPERATIVE:
            cooperative = bool(struct.unpack_from("<i", raw, 8)[0])
        if aid == _CLUSTER_DIMENSION:
            cluster = struct.unpack_from("<3I", raw, 8)
    return ExConfig((gx, gy, gz), (bx, by, bz), shared, stream, cooperative, cluster)


@handles("cuLaunchKernelEx@11060")
def launch_kernel_ex(config: Any, f: Any, params: Any, extra: Any) -> None:
    c = read_launch_config(config)
    s = RT.stream(RT.ffi.cast("void *", c.stream))
    launch(f, c.grid, c.block, c.shared, s, params, extra, c.cooperative, c.cluster)


@handles("cuLaunchCooperativeKernel@9000")
def launch_cooperative_kernel(
    f: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, stream: Any,
    params: Any,
) -> None:  # fmt: skip
    """Also what cudart 13's cudaLaunchCooperativeKernel calls."""
    launch(f, (gx, gy, gz), (bx, by, bz), shared, RT.stream(stream), params, RT.ffi.NULL, True)


def _drain(stream: int) -> int:
    """Wait for the stream's earlier work; its error (if any) as a CUresult."""
    try:
        RT.session().stream_synchronize(stream)
    except CudaError as e:
        return int(e.code)
    return 0


def run_host_func(s: int, fn: Any, user_data: Any) -> None:
    """Run a host function at its point in the order of stream ``s``."""
    RT.session().check_stream(s)
    status = _drain(s)
    if status:
        raise CudaError(status, "stream failed before the host function")
    RT.ffi.cast("void (*)(void *)", fn)(user_data)


@handles("cuLaunchHostFunc@10000")
def launch_host_func(stream: Any, fn: Any, user_data: Any) -> None:
    s = RT.stream(stream)
    if fn == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL host function")
    if graphs.record(s, graphs.HOST, graphs.HostParams(RT.ptr(fn), RT.ptr(user_data))):
        return
    run_host_func(s, fn, user_data)


@handles("cuStreamAddCallback@5000")
def stream_add_callback(stream: Any, callback: Any, user_data: Any, flags: int) -> None:
    if flags != 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "flags must be 0")
    s = RT.stream(stream)
    # stream callbacks cannot be captured (cuLaunchHostFunc can)
    graphs.refuse(s, "cuStreamAddCallback", CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    RT.session().check_stream(s)
    status = _drain(s)
    RT.ffi.cast("void (*)(void *, int, void *)", callback)(stream, status, user_data)
