"""Thread-block clusters in the driver API beyond the launch itself.

* Occupancy: cuOccupancyMaxActiveClusters and cuOccupancyMaxPotentialClusterSize (also what
  cudart's cudaOccupancy* forms call), answered locally from the device's limits with the
  computation of :mod:`crane.api.launch_check`: a cluster's blocks share one GPC, each SM
  holding as many blocks as the ordinary occupancy calculation allows for the configuration's
  block size and shared memory.
* Graph kernel nodes' cluster dimensions, a node attribute: cuGraphKernelNodeGet/SetAttribute
  (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; COOPERATIVE reads 0, nodes here are never
  cooperative) and cuGraphKernelNodeCopyAttributes. Other attributes (access policy windows,
  priorities, ...) stay CUDA_ERROR_NOT_SUPPORTED, naming the attribute."""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import Any

from crane.api.generated.cuda_enums import CUdevice_attribute as DA
from crane.api.generated.cuda_enums import CUresult
from crane.api.launch_check import (
    MAX_CLUSTER_SIZE,
    PORTABLE_CLUSTER_SIZE,
    SMS_PER_GPC,
    max_active_blocks_per_sm,
    max_active_clusters,
)
from crane.api.results import CudaError
from crane.guest.session import Function
from crane.interposer import graphs as G
from crane.interposer.h_launch import ExConfig, read_launch_config
from crane.interposer.h_module import function_attribute, non_portable_cluster, required_cluster
from crane.interposer.registry import handles
from crane.interposer.runtime import RT


def _query(fn: Function, c: ExConfig) -> tuple[dict, int, int]:
    """(device attributes, block threads, shared bytes) of an occupancy query, refused on a
    device without clusters as the driver does."""
    a = RT.session().attributes
    if not a.get(DA.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 0):
        raise CudaError(CUresult.CUDA_ERROR_NOT_SUPPORTED, "the device has no clusters")
    threads = c.block[0] * c.block[1] * c.block[2]
    return a, threads, fn.layout.static_shared + c.shared


def _given(fn: Function, c: ExConfig) -> tuple[int, int, int] | None:
    """The cluster shape of the query: the config's (CLUSTER_DIMENSION) or the function's
    REQUIRED_CLUSTER_*, which must agree when both are set."""
    req = required_cluster(fn)
    req = req if any(req) else None
    given = c.cluster if c.cluster is not None and any(c.cluster) else None
    if given is not None and not all(d >= 1 for d in given):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE, f"cluster {given}")
    if req is not None and given is not None and tuple(given) != tuple(req):
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE,
            f"cluster {tuple(given)} differs from the function's required {tuple(req)}",
        )
    return given or req


def _limit(fn: Function) -> int:
    return MAX_CLUSTER_SIZE if non_portable_cluster(fn) else PORTABLE_CLUSTER_SIZE


@handles("cuOccupancyMaxActiveClusters@11070")
def occupancy_max_active_clusters(out: Any, func: Any, config: Any) -> None:
    """Most clusters of the configuration's shape resident at once (0 if one cannot fit)."""
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL output pointer")
    fn = RT.function(func)
    c = read_launch_config(config)
    a, threads, shared = _query(fn, c)
    dims = _given(fn, c)
    if dims is None:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE, "the query names no cluster dimensions"
        )
    size = dims[0] * dims[1] * dims[2]
    if size > _limit(fn):
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE,
            f"a cluster of {size} blocks is above the limit of {_limit(fn)}",
        )
    most = function_attribute(fn, 0)
    RT.out(out, max_active_clusters(a, size, threads, shared, max_threads=most))


@handles("cuOccupancyMaxPotentialClusterSize@11070")
def occupancy_max_potential_cluster_size(out: Any, func: Any, config: Any) -> None:
    """The largest cluster (in blocks) of the configuration's block size and shared memory
    that one GPC holds, within the portable limit of 8 (16 with
    NON_PORTABLE_CLUSTER_SIZE_ALLOWED); a required cluster shape answers its own size if it
    fits, else 0."""
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL output pointer")
    fn = RT.function(func)
    c = read_launch_config(config)
    a, threads, shared = _query(fn, c)
    per_sm = max_active_blocks_per_sm(a, threads, shared, max_threads=function_attribute(fn, 0))
    sms = min(SMS_PER_GPC, a[DA.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT])
    fits = min(per_sm * sms, _limit(fn))
    dims = _given(fn, c)
    if dims is not None:
        size = dims[0] * dims[1] * dims[2]
        fits = size if size <= fits else 0
    RT.out(out, fits)


# ---- graph kernel node attributes ------------------------------------------------------------
_COOPERATIVE, _CLUSTER_DIMENSION = 2, 4  # CUlaunchAttributeID (= CUkernelNodeAttrID)
_DIMS = struct.Struct("<3I")


def _kernel_node(node: Any) -> G.Node:
    n = G.node(RT.ptr(node))
    if n.kind != G.KERNEL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "not a kernel node")
    return n


def _unsupported(attr: int) -> CudaError:
    return CudaError(
        CUresult.CUDA_ERROR_NOT_SUPPORTED,
        f"kernel node attribute {attr} (only the cluster dimension is served)",
    )


@handles("cuGraphKernelNodeGetAttribute@11000")
def graph_kernel_node_get_attribute(node: Any, attr: int, value_out: Any) -> None:
    n = _kernel_node(node)
    if value_out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL attribute value")
    if attr == _CLUSTER_DIMENSION:
        raw = _DIMS.pack(*(n.params.cluster or (0, 0, 0)))  # type: ignore[attr-defined]
    elif attr == _COOPERATIVE:
        raw = struct.pack("<i", 0)
    else:
        raise _unsupported(attr)
    RT.ffi.memmove(value_out, raw, len(raw))


@handles("cuGraphKernelNodeSetAttribute@11000")
def graph_kernel_node_set_attribute(node: Any, attr: int, value: Any) -> None:
    """The cluster dimension of a kernel node (checked, as the driver does, when the graph
    launches it); COOPERATIVE 0 is accepted, a cooperative node is not served."""
    n = _kernel_node(node)
    if value == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL attribute value")
    if attr == _CLUSTER_DIMENSION:
        dims = _DIMS.unpack(bytes(RT.ffi.buffer(value, _DIMS.size)))
        n.params = replace(n.params, cluster=dims if any(dims) else None)  # type: ignore[type-var]
    elif attr == _COOPERATIVE and struct.unpack("<i", bytes(RT.ffi.buffer(value, 4)))[0] == 0:
        pass
    else:
        raise _unsupported(attr)


@handles("cuGraphKernelNodeCopyAttributes@11000")
def graph_kernel_node_copy_attributes(dst: Any, src: Any) -> None:
    d, s = _kernel_node(dst), _kernel_node(src)
    d.params = replace(d.params, cluster=s.params.cluster)  # type: ignore[type-var, attr-defined]
