"""Stream capture and CUDA graph entry points, and the replay of an instantiated graph.

The model lives in :mod:`crane.interposer.graphs`. Node parameter structs are read with
``struct`` at the offsets of CUDA 13's ``cuda.h`` (checked against the header when written):
CUDA_KERNEL_NODE_PARAMS (v1 56 bytes, v2 72), CUDA_MEMCPY3D (200), CUDA_MEMSET_NODE_PARAMS
(40), CUDA_HOST_NODE_PARAMS (16), CUDA_GRAPH_INSTANTIATE_PARAMS (32).
"""

from __future__ import annotations

import struct
import sys
from dataclasses import replace
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.interposer import graphs as G
from crane.interposer.h_copy import side
from crane.interposer.h_launch import (
    cluster_dims,
    launch_cluster,
    params_from_launch_args,
    run_host_func,
)
from crane.interposer.h_memory import copy, memset_rows
from crane.interposer.h_module import max_dynamic_shared
from crane.interposer.h_pools import free_now
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

_E = CUresult
_KNP = struct.Struct("<Q6II4xQQ")  # CUDA_KERNEL_NODE_PARAMS (v1); v2 adds kern, ctx
_KNP2 = struct.Struct("<Q6II4xQQQQ")
_M3D_SIDE = struct.Struct("<QQQQI4xQQQQQQ")
_M3D = struct.Struct("<" + _M3D_SIDE.format[1:] * 2 + "QQQ")
_MEMSET = struct.Struct("<QQIIQQ")
_HOST = struct.Struct("<QQ")
_INST_FLAGS_OK = 1 | 2 | 8  # auto-free (no alloc nodes here), upload, node priority
_UPDATE_TOPOLOGY_CHANGED = 2


def _p(cdata: Any) -> int:
    return RT.ptr(cdata)


def _vp(h: int) -> Any:
    return RT.ffi.cast("void *", h)


def _read(ptr: Any, st: struct.Struct) -> tuple:
    if ptr == RT.ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL node parameters")
    return st.unpack(bytes(RT.ffi.buffer(RT.ffi.cast("char *", ptr), st.size)))


def _write_out(out: Any, raw: bytes) -> None:
    """Fill a caller's parameter struct."""
    if out == RT.ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL node parameters")
    RT.ffi.memmove(RT.ffi.cast("char *", out), raw, len(raw))


def _deps(arr: Any, n: int) -> list[G.Node]:
    if n and arr == RT.ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL dependency list")
    return [G.node(_p(arr[i])) for i in range(n)]


def _add(out: Any, graph: Any, deps: Any, ndeps: int, kind: int, params: object) -> G.Node:
    if out == RT.ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL node pointer")
    g = G.graph(_p(graph))
    n = g.add(kind, params, _deps(deps, ndeps))
    out[0] = _vp(n.handle)
    return n


# ---- parameter structs ---------------------------------------------------------------------
def _kernel_params(ptr: Any, v2: bool) -> G.KernelParams:
    vals = _read(ptr, _KNP2 if v2 else _KNP)
    func, gx, gy, gz, bx, by, bz, shared, kparams, extra = vals[:10]
    if not func and v2:
        func = vals[10]  # CUkernel
    fn = RT.function(_vp(func))
    ffi = RT.ffi
    buf = params_from_launch_args(fn, ffi.cast("void **", kparams), ffi.cast("void **", extra))
    return G.KernelParams(fn, (gx, gy, gz), (bx, by, bz), shared, buf)


def _write_kernel_params(n: G.Node, p: G.KernelParams, ptr: Any, v2: bool) -> None:
    """Hand back the node's own copy of the argument values (kept alive with the node)."""
    ffi, lay = RT.ffi, p.fn.layout
    data = ffi.new("char[]", max(len(p.params), 1))
    ffi.memmove(data, p.params, len(p.params))
    ptrs = ffi.new("void *[]", max(len(lay.params), 1))
    for i, (off, _) in enumerate(lay.params):
        ptrs[i] = data + off
    n.keep[:] = [data, ptrs]
    vals = (p.fn.handle, *p.grid, *p.block, p.shared, _p(ptrs), 0)
    # cudart maps the node back to its host stub through kern/ctx: fill both as it does
    ctx = RT.ptr(RT.lib.crane_ctx_current())
    raw = _KNP2.pack(*vals, p.fn.handle, ctx) if v2 else _KNP.pack(*vals)
    if ptr == ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL node parameters")
    ffi.memmove(ffi.cast("char *", ptr), raw, len(raw))


def _copy_params(ptr: Any) -> G.CopyParams:
    v = _read(ptr, _M3D)
    src, dst, (w, h, d) = v[:11], v[11:22], v[22:]
    if src[3] or dst[3]:
        raise CudaError(_E.CUDA_ERROR_NOT_SUPPORTED, "memcpy nodes with a mipmap level")
    ext = (w, max(h, 1), max(d, 1))
    s = side(src[4], src[0], src[1], src[2], src[5], src[6], src[7], src[9], src[10], ext)
    t = side(dst[4], dst[0], dst[1], dst[2], dst[5], dst[6], dst[7], dst[9], dst[10], ext)
    return G.CopyParams(t.origin, s.origin, w, ext[1], ext[2], t.pitch, s.pitch, t.rows, s.rows)


def _memset_params(ptr: Any) -> G.MemsetParams:
    dst, pitch, value, elem, width, height = _read(ptr, _MEMSET)
    if elem not in (1, 2, 4):
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"bad memset element size {elem}")
    if height > 1 and pitch < width * elem:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "memset pitch smaller than the row")
    return G.MemsetParams(dst, pitch, value, elem, width, max(height, 1))


def _host_params(ptr: Any) -> G.HostParams:
    fn, data = _read(ptr, _HOST)
    if not fn:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL host function")
    return G.HostParams(fn, data)


# ---- replay --------------------------------------------------------------------------------
def run_node(kind: int, p: object, stream: int) -> None:
    """Execute one node on ``stream`` through the ordinary session calls."""
    s = RT.session()
    if kind == G.KERNEL:
        assert isinstance(p, G.KernelParams)
        dims = cluster_dims(p.fn, p.grid, p.cluster)
        if dims is not None:
            launch_cluster(p.fn, p.grid, p.block, dims, p.params, p.shared, stream)
        else:
            s.launch(p.fn, p.grid, p.block, p.params, p.shared, stream,
                     max_dynamic_shared=max_dynamic_shared(p.fn))  # fmt: skip
    elif kind == G.MEMCPY:
        assert isinstance(p, G.CopyParams)
        for dst, src, n in p.rows():
            copy(dst, src, n, stream)
    elif kind == G.MEMSET:
        assert isinstance(p, G.MemsetParams)
        fill = {1: s.memset_d8, 2: s.memset_d16, 4: s.memset_d32}[p.elem]
        for start, n in memset_rows(p):
            fill(start, p.value, n, stream)
    elif kind == G.HOST:
        assert isinstance(p, G.HostParams)
        run_host_func(stream, RT.ffi.cast("void *", p.fn), RT.ffi.cast("void *", p.user_data))
    elif kind == G.EVENT_RECORD:
        assert isinstance(p, G.EventParams)
        s.event_record(p.event, stream)
    elif kind == G.WAIT_EVENT:
        assert isinstance(p, G.EventParams)
        s.stream_wait_event(stream, p.event, 0)
    elif kind == G.MEM_FREE:
        assert isinstance(p, G.MemParams)
        free_now(p.addr, stream)
    elif kind == G.COND:
        assert isinstance(p, G.CondExec)
        run_conditional(p, stream)
    elif kind not in (G.EMPTY, G.MEM_ALLOC):  # allocation nodes' memory is the graph's
        raise CudaError(_E.CUDA_ERROR_NOT_SUPPORTED, f"graph node type {kind}")


# ---- capture -------------------------------------------------------------------------------
@handles("cuStreamBeginCapture@10000")
def stream_begin_capture_v1(stream: Any) -> None:
    G.begin(RT.stream(stream), G.MODE_GLOBAL)


@handles("cuStreamBeginCapture@10010")
def stream_begin_capture(stream: Any, mode: int) -> None:
    G.begin(RT.stream(stream), mode)


@handles("cuStreamBeginCaptureToGraph@12030")
def stream_begin_capture_to_graph(
    stream: Any, graph: Any, deps: Any, edge_data: Any, ndeps: int, mode: int
) -> None:
    g = G.graph(_p(graph))
    G.begin(RT.stream(stream), mode, into=g, deps=_deps(deps, ndeps))


@handles("cuStreamEndCapture@10000")
def stream_end_capture(stream: Any, out: Any) -> None:
    if out == RT.ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL graph pointer")
    out[0] = RT.ffi.NULL
    out[0] = _vp(G.end(RT.stream(stream)).handle)


@handles("cuStreamIsCapturing@10000")
def stream_is_capturing(stream: Any, out: Any) -> None:
    RT.out(out, G.status(RT.stream(stream))[0])


def _capture_info(
    stream: Any, st_out: Any, id_out: Any, graph_out: Any = None, deps_out: Any = None,
    edges_out: Any = None, n_out: Any = None,
) -> None:  # fmt: skip
    ffi = RT.ffi
    st, c = G.status(RT.stream(stream))
    RT.out(st_out, st)
    if id_out != ffi.NULL:
        id_out[0] = c.id if c else 0
    if c is None:
        return
    k = G.key(RT.stream(stream))
    front = c.frontier.get(k, [])
    arr = ffi.new("void *[]", [_vp(n.handle) for n in front] or 1)
    edges = ffi.new("char[]", 8 * max(len(front), 1))
    c.keep[:] = [arr, edges]  # valid until the next call on the stream, as in CUDA
    if graph_out is not None and graph_out != ffi.NULL:
        graph_out[0] = _vp(c.graph.handle)
    if deps_out is not None and deps_out != ffi.NULL:
        deps_out[0] = arr if front else ffi.NULL
    if edges_out is not None and edges_out != ffi.NULL:
        edges_out[0] = edges if front else ffi.NULL
    if n_out is not None and n_out != ffi.NULL:
        n_out[0] = len(front)


@handles("cuStreamGetCaptureInfo@10010")
def stream_get_capture_info_v1(stream: Any, st_out: Any, id_out: Any) -> None:
    _capture_info(stream, st_out, id_out)


@handles("cuStreamGetCaptureInfo@11030")
def stream_get_capture_info_v2(
    stream: Any, st_out: Any, id_out: Any, graph_out: Any, deps_out: Any, n_out: Any
) -> None:
    _capture_info(stream, st_out, id_out, graph_out, deps_out, None, n_out)


@handles("cuStreamGetCaptureInfo@12030")
def stream_get_capture_info_v3(
    stream: Any, st_out: Any, id_out: Any, graph_out: Any, deps_out: Any, edges_out: Any,
    n_out: Any,
) -> None:  # fmt: skip
    _capture_info(stream, st_out, id_out, graph_out, deps_out, edges_out, n_out)


@handles("cuStreamUpdateCaptureDependencies@11030")
def stream_update_capture_deps(stream: Any, deps: Any, ndeps: int, flags: int) -> None:
    if flags & ~1:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"bad flags {flags:#x}")
    G.update_dependencies(RT.stream(stream), _deps(deps, ndeps), bool(flags & 1))


@handles("cuStreamUpdateCaptureDependencies@12030")
def stream_update_capture_deps_v2(
    stream: Any, deps: Any, edge_data: Any, ndeps: int, flags: int
) -> None:
    stream_update_capture_deps(stream, deps, ndeps, flags)


@handles("cuThreadExchangeStreamCaptureMode@10010")
def thread_exchange_capture_mode(mode: Any) -> None:
    if mode == RT.ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL mode")
    mode[0] = G.exchange_mode(mode[0])


# ---- graphs and nodes ----------------------------------------------------------------------
@handles("cuGraphCreate@10000")
def graph_create(out: Any, flags: int) -> None:
    if flags:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "graph flags must be 0")
    RT.out(out, _vp(G.new_graph().handle))


@handles("cuGraphDestroy@10000")
def graph_destroy(graph: Any) -> None:
    G.destroy_graph(G.graph(_p(graph)))


@handles("cuGraphAddKernelNode@10000")
def graph_add_kernel_node_v1(out: Any, graph: Any, deps: Any, ndeps: int, params: Any) -> None:
    _add(out, graph, deps, ndeps, G.KERNEL, _kernel_params(params, False))


@handles("cuGraphAddKernelNode@12000")
def graph_add_kernel_node(out: Any, graph: Any, deps: Any, ndeps: int, params: Any) -> None:
    _add(out, graph, deps, ndeps, G.KERNEL, _kernel_params(params, True))


@handles("cuGraphAddMemcpyNode@10000")
def graph_add_memcpy_node(
    out: Any, graph: Any, deps: Any, ndeps: int, params: Any, ctx: Any
) -> None:
    _add(out, graph, deps, ndeps, G.MEMCPY, _copy_params(params))


@handles("cuGraphAddMemsetNode@10000")
def graph_add_memset_node(
    out: Any, graph: Any, deps: Any, ndeps: int, params: Any, ctx: Any
) -> None:
    _add(out, graph, deps, ndeps, G.MEMSET, _memset_params(params))


@handles("cuGraphAddHostNode@10000")
def graph_add_host_node(out: Any, graph: Any, deps: Any, ndeps: int, params: Any) -> None:
    _add(out, graph, deps, ndeps, G.HOST, _host_params(params))


@handles("cuGraphAddEmptyNode@10000")
def graph_add_empty_node(out: Any, graph: Any, deps: Any, ndeps: int) -> None:
    _add(out, graph, deps, ndeps, G.EMPTY, None)


@handles("cuGraphAddEventRecordNode@11010")
def graph_add_event_record_node(out: Any, graph: Any, deps: Any, ndeps: int, ev: Any) -> None:
    _add(out, graph, deps, ndeps, G.EVENT_RECORD, G.EventParams(RT.session().check_event(_p(ev))))


@handles("cuGraphAddEventWaitNode@11010")
def graph_add_event_wait_node(out: Any, graph: Any, deps: Any, ndeps: int, ev: Any) -> None:
    _add(out, graph, deps, ndeps, G.WAIT_EVENT, G.EventParams(RT.session().check_event(_p(ev))))


def _edges(frm: Any, to: Any, n: int) -> list[tuple[G.Node, G.Node]]:
    pairs = list(zip(_deps(frm, n), _deps(to, n), strict=True))
    for a, b in pairs:
        if a.graph is not b.graph:
            raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "edge between two graphs")
    return pairs


@handles("cuGraphAddDependencies@10000")
def graph_add_dependencies(graph: Any, frm: Any, to: Any, n: int) -> None:
    g = G.graph(_p(graph))
    for a, b in _edges(frm, to, n):
        if a.graph is not g or a is b:
            raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "bad edge")
        if a in b.deps:
            raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "the edge exists already")
        b.deps.append(a)


@handles("cuGraphAddDependencies@12030")
def graph_add_dependencies_v2(graph: Any, frm: Any, to: Any, edge_data: Any, n: int) -> None:
    graph_add_dependencies(graph, frm, to, n)


@handles("cuGraphRemoveDependencies@10000")
def graph_remove_dependencies(graph: Any, frm: Any, to: Any, n: int) -> None:
    g = G.graph(_p(graph))
    for a, b in _edges(frm, to, n):
        if a.graph is not g or a not in b.deps:
            raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "no such edge")
        b.deps.remove(a)


@handles("cuGraphRemoveDependencies@12030")
def graph_remove_dependencies_v2(graph: Any, frm: Any, to: Any, edge_data: Any, n: int) -> None:
    graph_remove_dependencies(graph, frm, to, n)


def _list_out(items: list[int], arr: Any, count: Any) -> None:
    """The driver's two-call convention: NULL array → count; else fill up to *count."""
    ffi = RT.ffi
    if count == ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL count")
    if arr == ffi.NULL:
        count[0] = len(items)
        return
    room = count[0]
    for i in range(room):
        arr[i] = _vp(items[i]) if i < len(items) else ffi.NULL
    count[0] = min(room, len(items))


@handles("cuGraphGetNodes@10000")
def graph_get_nodes(graph: Any, nodes: Any, count: Any) -> None:
    _list_out([n.handle for n in G.graph(_p(graph)).nodes], nodes, count)


@handles("cuGraphGetRootNodes@10000")
def graph_get_root_nodes(graph: Any, nodes: Any, count: Any) -> None:
    _list_out([n.handle for n in G.graph(_p(graph)).nodes if not n.deps], nodes, count)


def _get_edges(graph: Any, frm: Any, to: Any, count: Any) -> None:
    ffi = RT.ffi
    pairs = [(d.handle, n.handle) for n in G.graph(_p(graph)).nodes for d in n.deps]
    if count == ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL count")
    if frm == ffi.NULL and to == ffi.NULL:
        count[0] = len(pairs)
        return
    _list_out([a for a, _ in pairs], frm, count)
    count[0] = len(pairs)
    _list_out([b for _, b in pairs], to, count)


@handles("cuGraphGetEdges@10000")
def graph_get_edges(graph: Any, frm: Any, to: Any, count: Any) -> None:
    _get_edges(graph, frm, to, count)


@handles("cuGraphGetEdges@12030")
def graph_get_edges_v2(graph: Any, frm: Any, to: Any, edge_data: Any, count: Any) -> None:
    if edge_data != RT.ffi.NULL and count != RT.ffi.NULL:
        RT.ffi.memset(edge_data, 0, 8 * count[0])
    _get_edges(graph, frm, to, count)


@handles("cuGraphNodeGetType@10000")
def graph_node_get_type(node: Any, out: Any) -> None:
    RT.out(out, G.node(_p(node)).kind)


@handles("cuGraphNodeGetDependencies@10000")
def graph_node_get_dependencies(node: Any, deps: Any, count: Any) -> None:
    _list_out([d.handle for d in G.node(_p(node)).deps], deps, count)


@handles("cuGraphNodeGetDependentNodes@10000")
def graph_node_get_dependent_nodes(node: Any, deps: Any, count: Any) -> None:
    n = G.node(_p(node))
    _list_out([d.handle for d in n.graph.dependents(n)], deps, count)


@handles("cuGraphDestroyNode@10000")
def graph_destroy_node(node: Any) -> None:
    n = G.node(_p(node))
    n.graph.remove(n)


# ---- child graphs, clones, memory nodes ----------------------------------------------------
@handles("cuGraphAddChildGraphNode@10000")
def graph_add_child_graph_node(out: Any, graph: Any, deps: Any, ndeps: int, child: Any) -> None:
    """The child is cloned into the node, as CUDA does; instantiation inlines it."""
    _add(out, graph, deps, ndeps, G.GRAPH, G.ChildParams(G.graph(_p(child)).clone()))


@handles("cuGraphChildGraphNodeGetGraph@10000")
def graph_child_graph_node_get_graph(node: Any, out: Any) -> None:
    p = _typed(node, G.GRAPH).params
    assert isinstance(p, G.ChildParams)
    RT.out(out, _vp(p.graph.handle))


@handles("cuGraphClone@10000")
def graph_clone(out: Any, original: Any) -> None:
    RT.out(out, _vp(G.graph(_p(original)).clone().handle))


@handles("cuGraphNodeFindInClone@10000")
def graph_node_find_in_clone(out: Any, original: Any, cloned: Any) -> None:
    copy_ = G.graph(_p(cloned)).origins.get(_p(original))
    if copy_ is None or copy_.handle not in G.NODES:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "the node has no copy in that graph")
    RT.out(out, _vp(copy_.handle))


# CUDA_MEM_ALLOC_NODE_PARAMS: CUmemPoolProps (88 bytes: allocType, handleTypes, location
# {type, id}, win32 attributes, maxSize, usage, reserved), accessDescs, accessDescCount,
# bytesize, dptr (written by the driver)
_ALLOC_NODE = struct.Struct("<iiii8xQH54xQQQQ")


@handles("cuGraphAddMemAllocNode@11040")
def graph_add_mem_alloc_node(out: Any, graph: Any, deps: Any, ndeps: int, params: Any) -> None:
    alloc_type, handle_types, loc_type, loc_id, _max, _usage, _descs, _n, size, _ = _read(
        params, _ALLOC_NODE
    )
    if alloc_type != 1 or loc_type != 1 or loc_id != 0 or size == 0:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "allocation node: pinned memory on device 0")
    if handle_types:
        raise CudaError(_E.CUDA_ERROR_NOT_SUPPORTED, "exportable graph allocations (IPC)")
    G.graph(_p(graph))
    addr = RT.session().mem_alloc(size, RT.ctx())
    G.own_memory(addr, size)
    try:
        _add(out, graph, deps, ndeps, G.MEM_ALLOC, G.MemParams(addr, size))
    except CudaError:
        G.GRAPH_MEMORY.pop(addr, None)
        RT.session().mem_free(addr)
        raise
    RT.ffi.cast("unsigned long long *", RT.ffi.cast("char *", params) + 112)[0] = addr


@handles("cuGraphMemAllocNodeGetParams@11040")
def graph_mem_alloc_node_get_params(node: Any, out: Any) -> None:
    p = _typed(node, G.MEM_ALLOC).params
    assert isinstance(p, G.MemParams)
    _write_out(out, _ALLOC_NODE.pack(1, 0, 1, 0, 0, 0, 0, 0, p.size, p.addr))


@handles("cuGraphAddMemFreeNode@11040")
def graph_add_mem_free_node(out: Any, graph: Any, deps: Any, ndeps: int, dptr: int) -> None:
    if not G.is_graph_memory(dptr) and RT.session().va.find(dptr) is None:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"{dptr:#x} is not an allocation")
    _add(out, graph, deps, ndeps, G.MEM_FREE, G.MemParams(dptr))


@handles("cuGraphMemFreeNodeGetParams@11040")
def graph_mem_free_node_get_params(node: Any, out: Any) -> None:
    p = _typed(node, G.MEM_FREE).params
    assert isinstance(p, G.MemParams)
    RT.out(out, p.addr)


# CUgraphMem_attribute
_GMEM_USED, _GMEM_USED_HIGH, _GMEM_RESERVED, _GMEM_RESERVED_HIGH = 0, 1, 2, 3


@handles("cuDeviceGetGraphMemAttribute@11040")
def device_get_graph_mem_attribute(dev: int, attr: int, value: Any) -> None:
    if dev != 0:
        raise CudaError(_E.CUDA_ERROR_INVALID_DEVICE, f"no device {dev}")
    used = G.graph_memory_used()
    values = {
        _GMEM_USED: used,
        _GMEM_USED_HIGH: G.graph_memory_high()[0],
        _GMEM_RESERVED: used,  # graph memory is held while its graphs live: reserved = used
        _GMEM_RESERVED_HIGH: G.graph_memory_high()[1],
    }
    if attr not in values or value == RT.ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"bad graph memory attribute {attr}")
    RT.ffi.cast("unsigned long long *", value)[0] = values[attr]


@handles("cuDeviceSetGraphMemAttribute@11040")
def device_set_graph_mem_attribute(dev: int, attr: int, value: Any) -> None:
    if dev != 0:
        raise CudaError(_E.CUDA_ERROR_INVALID_DEVICE, f"no device {dev}")
    if attr not in (_GMEM_USED_HIGH, _GMEM_RESERVED_HIGH) or value == RT.ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "only the high watermarks can be reset")
    if RT.ffi.cast("unsigned long long *", value)[0] != 0:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "a high watermark resets to 0 only")
    G.reset_graph_memory_high(0 if attr == _GMEM_USED_HIGH else 1)


@handles("cuDeviceGraphMemTrim@11040")
def device_graph_mem_trim(dev: int) -> None:
    """Graph memory here is held exactly while graphs hold it: nothing unused to trim."""
    if dev != 0:
        raise CudaError(_E.CUDA_ERROR_INVALID_DEVICE, f"no device {dev}")


# ---- the generic node API (CUgraphNodeParams, CUDA 12.2+) ----------------------------------
_UNION = 16  # CUgraphNodeParams: type, reserved0[3], then the per-type union
_MEMCPY_3D_AT = 16  # CUDA_MEMCPY_NODE_PARAMS: flags, reserved, copyCtx, then CUDA_MEMCPY3D
_NODE_NAMES = {8: "external semaphore signal", 9: "external semaphore wait",
               12: "batch memory operation"}  # fmt: skip


def _generic(params: Any) -> tuple[int, Any]:
    """(node type, the address of its per-type parameters)."""
    if params == RT.ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL node parameters")
    kind = RT.ffi.cast("int *", params)[0]
    return kind, RT.ffi.cast("char *", params) + _UNION


def _handle_at(u: Any) -> Any:
    return RT.ffi.cast("void **", u)[0]


def _not_served(kind: int) -> CudaError:
    name = _NODE_NAMES.get(kind, f"type {kind}")
    print(f"crane: {name} graph nodes are not supported", file=sys.stderr)
    return CudaError(_E.CUDA_ERROR_NOT_SUPPORTED, f"{name} graph nodes")


@handles("cuGraphAddNode@12020")
def graph_add_node(out: Any, graph: Any, deps: Any, ndeps: int, params: Any) -> None:
    """Every node type the typed calls serve, through one parameter union."""
    kind, u = _generic(params)
    null = RT.ffi.NULL
    if kind == G.KERNEL:
        graph_add_kernel_node(out, graph, deps, ndeps, u)
    elif kind == G.MEMCPY:
        graph_add_memcpy_node(out, graph, deps, ndeps, u + _MEMCPY_3D_AT, null)
    elif kind == G.MEMSET:
        graph_add_memset_node(out, graph, deps, ndeps, u, null)
    elif kind == G.HOST:
        graph_add_host_node(out, graph, deps, ndeps, u)
    elif kind == G.GRAPH:
        graph_add_child_graph_node(out, graph, deps, ndeps, _handle_at(u))
    elif kind == G.EMPTY:
        graph_add_empty_node(out, graph, deps, ndeps)
    elif kind == G.WAIT_EVENT:
        graph_add_event_wait_node(out, graph, deps, ndeps, _handle_at(u))
    elif kind == G.EVENT_RECORD:
        graph_add_event_record_node(out, graph, deps, ndeps, _handle_at(u))
    elif kind == G.MEM_ALLOC:
        graph_add_mem_alloc_node(out, graph, deps, ndeps, u)
    elif kind == G.MEM_FREE:
        graph_add_mem_free_node(out, graph, deps, ndeps, RT.ffi.cast("unsigned long long *", u)[0])
    elif kind == G.COND:
        _add_conditional(out, graph, deps, ndeps, u)
    else:
        raise _not_served(kind)


# ---- conditional nodes ---------------------------------------------------------------------
_COND_PARAMS = struct.Struct("<QIIQQ")  # handle, type, size, phGraph_out, ctx


@handles("cuGraphConditionalHandleCreate@12030")
def graph_conditional_handle_create(
    out: Any, graph: Any, ctx: Any, default: int, flags: int
) -> None:
    """A handle is the device address of the condition's 32-bit slot (which the simulated
    GPU's cudaGraphSetConditional writes); it lives as long as its graph."""
    if out == RT.ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL handle pointer")
    if flags & ~G.COND_ASSIGN_DEFAULT:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"bad conditional handle flags {flags:#x}")
    g = G.graph(_p(graph))
    s = RT.session()
    addr = s.mem_alloc(4, RT.ctx(ctx))
    s.memset_d32(addr, default if flags & G.COND_ASSIGN_DEFAULT else 0, 1, 0)
    G.COND_HANDLES.setdefault(g.handle, []).append(G.CondHandle(addr, default, flags))
    out[0] = addr


def _add_conditional(out: Any, graph: Any, deps: Any, ndeps: int, u: Any) -> None:
    handle, kind, size, _, _ = _read(u, _COND_PARAMS)
    if not any(h.addr == handle for hs in G.COND_HANDLES.values() for h in hs):
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"unknown conditional handle {handle:#x}")
    ok = {G.COND_IF: size in (1, 2), G.COND_WHILE: size == 1, G.COND_SWITCH: size >= 1}
    if not ok.get(kind, False):
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"conditional type {kind} with {size} bodies")
    bodies = tuple(G.new_graph() for _ in range(size))
    n = _add(out, graph, deps, ndeps, G.COND, G.CondParams(handle, kind, bodies))
    array = RT.ffi.new("void *[]", [_vp(b.handle) for b in bodies])
    n.keep.append(array)  # CUDA-owned, valid for the node's lifetime
    RT.ffi.cast("void **", RT.ffi.cast("char *", u) + 16)[0] = array


def _condition(p: G.CondExec, stream: int) -> int:
    """The condition's value once ``stream`` reaches the node (waits for it)."""
    raw = RT.session().memcpy_dtoh(p.handle, 4, stream)
    return int.from_bytes(raw, "little")


def run_conditional(p: G.CondExec, stream: int) -> None:
    """If/while/switch over the bodies. The guest replays graphs, so the node reads the
    condition back: the launch waits here for the work before it."""
    if p.type == G.COND_WHILE:
        while _condition(p, stream):
            run_nodes(p.bodies[0], stream)
        return
    v = _condition(p, stream)
    if p.type == G.COND_IF:
        body = p.bodies[0] if v else (p.bodies[1] if len(p.bodies) > 1 else ())
    else:
        body = p.bodies[v] if v < len(p.bodies) else ()
    run_nodes(body, stream)


def run_nodes(nodes: Any, stream: int) -> None:
    for n in nodes:
        if n.enabled:
            run_node(n.kind, n.params, stream)


@handles("cuGraphAddNode@12030")
def graph_add_node_v2(
    out: Any, graph: Any, deps: Any, edge_data: Any, ndeps: int, params: Any
) -> None:
    """Edge data other than the default (programmatic dependent launch ports) is refused."""
    if edge_data != RT.ffi.NULL and any(bytes(RT.ffi.buffer(edge_data, 8 * ndeps))):
        raise CudaError(_E.CUDA_ERROR_NOT_SUPPORTED, "graph edges with port or type data")
    graph_add_node(out, graph, deps, ndeps, params)


@handles("cuGraphNodeSetParams@12020")
def graph_node_set_params(node: Any, params: Any) -> None:
    kind, u = _generic(params)
    n = G.node(_p(node))
    if n.kind != kind:
        raise CudaError(
            _E.CUDA_ERROR_INVALID_VALUE, f"a type {kind} update of a type {n.kind} node"
        )
    if kind == G.KERNEL:
        graph_kernel_node_set_params(node, u)
    elif kind == G.MEMCPY:
        graph_memcpy_node_set_params(node, u + _MEMCPY_3D_AT)
    elif kind == G.MEMSET:
        graph_memset_node_set_params(node, u)
    elif kind == G.HOST:
        graph_host_node_set_params(node, u)
    elif kind in (G.EVENT_RECORD, G.WAIT_EVENT):
        graph_event_node_set_event(node, _handle_at(u))
    elif kind in (G.MEM_ALLOC, G.MEM_FREE, G.GRAPH, G.EMPTY):
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"type {kind} nodes cannot be updated")
    else:
        raise _not_served(kind)


@handles("cuGraphExecNodeSetParams@12020")
def graph_exec_node_set_params(exec_: Any, node: Any, params: Any) -> None:
    kind, u = _generic(params)
    null = RT.ffi.NULL
    if kind == G.KERNEL:
        graph_exec_kernel_node_set_params(exec_, node, u)
    elif kind == G.MEMCPY:
        graph_exec_memcpy_node_set_params(exec_, node, u + _MEMCPY_3D_AT, null)
    elif kind == G.MEMSET:
        graph_exec_memset_node_set_params(exec_, node, u, null)
    elif kind == G.HOST:
        graph_exec_host_node_set_params(exec_, node, u)
    elif kind == G.EVENT_RECORD:
        graph_exec_event_record_node_set_event(exec_, node, _handle_at(u))
    elif kind == G.WAIT_EVENT:
        graph_exec_event_wait_node_set_event(exec_, node, _handle_at(u))
    elif kind == G.GRAPH:
        graph_exec_child_graph_node_set_params(exec_, node, _handle_at(u))
    elif kind in (G.MEM_ALLOC, G.MEM_FREE, G.EMPTY):
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"type {kind} nodes cannot be updated")
    else:
        raise _not_served(kind)


def _typed(node: Any, kind: int) -> G.Node:
    n = G.node(_p(node))
    if n.kind != kind:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "wrong node type")
    return n


@handles("cuGraphKernelNodeGetParams@10000")
def graph_kernel_node_get_params_v1(node: Any, out: Any) -> None:
    n = _typed(node, G.KERNEL)
    _write_kernel_params(n, n.params, out, False)  # type: ignore[arg-type]


@handles("cuGraphKernelNodeGetParams@12000")
def graph_kernel_node_get_params(node: Any, out: Any) -> None:
    n = _typed(node, G.KERNEL)
    _write_kernel_params(n, n.params, out, True)  # type: ignore[arg-type]


def _set_kernel(n: G.Node | G.ExecNode, new: G.KernelParams) -> None:
    """New launch parameters for a kernel node; its cluster dimensions are a node attribute
    (cuGraphKernelNodeSetAttribute), which setting the parameters leaves as they were."""
    old = n.params
    n.params = replace(new, cluster=old.cluster) if isinstance(old, G.KernelParams) else new


@handles("cuGraphKernelNodeSetParams@10000")
def graph_kernel_node_set_params_v1(node: Any, params: Any) -> None:
    _set_kernel(_typed(node, G.KERNEL), _kernel_params(params, False))


@handles("cuGraphKernelNodeSetParams@12000")
def graph_kernel_node_set_params(node: Any, params: Any) -> None:
    _set_kernel(_typed(node, G.KERNEL), _kernel_params(params, True))


@handles("cuGraphMemsetNodeSetParams@10000")
def graph_memset_node_set_params(node: Any, params: Any) -> None:
    _typed(node, G.MEMSET).params = _memset_params(params)


@handles("cuGraphMemcpyNodeSetParams@10000")
def graph_memcpy_node_set_params(node: Any, params: Any) -> None:
    _typed(node, G.MEMCPY).params = _copy_params(params)


@handles("cuGraphHostNodeGetParams@10000")
def graph_host_node_get_params(node: Any, out: Any) -> None:
    p = _typed(node, G.HOST).params
    assert isinstance(p, G.HostParams)
    _write_out(out, _HOST.pack(p.fn, p.user_data))


@handles("cuGraphHostNodeSetParams@10000")
def graph_host_node_set_params(node: Any, params: Any) -> None:
    _typed(node, G.HOST).params = _host_params(params)


# ---- instantiate, launch, update -----------------------------------------------------------
def _instantiate(out: Any, graph: Any, flags: int) -> None:
    if out == RT.ffi.NULL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "NULL exec pointer")
    if flags & ~_INST_FLAGS_OK:
        print(f"crane: graph instantiate flags {flags:#x} are not supported", file=sys.stderr)
        raise CudaError(_E.CUDA_ERROR_NOT_SUPPORTED, f"instantiate flags {flags:#x}")
    x = G.GraphExec.of(G.graph(_p(graph)), flags)
    G.EXECS[x.handle] = x
    out[0] = _vp(x.handle)


@handles("cuGraphInstantiate@10000", "cuGraphInstantiate@11000")
def graph_instantiate(out: Any, graph: Any, err_node: Any, log: Any, log_size: int) -> None:
    if err_node != RT.ffi.NULL:
        err_node[0] = RT.ffi.NULL
    if log != RT.ffi.NULL and log_size:
        log[0] = b"\0"
    _instantiate(out, graph, 0)


@handles("cuGraphInstantiateWithFlags@11040")
def graph_instantiate_with_flags(out: Any, graph: Any, flags: int) -> None:
    _instantiate(out, graph, flags)


@handles("cuGraphInstantiateWithParams@12000")
def graph_instantiate_with_params(out: Any, graph: Any, params: Any) -> None:
    flags = _read(params, struct.Struct("<Q"))[0]
    ffi = RT.ffi
    result = ffi.cast("char *", params)
    try:
        _instantiate(out, graph, flags)
        code = 0
    except CudaError:
        code = 1  # CUDA_GRAPH_INSTANTIATE_ERROR
        raise
    finally:
        ffi.memmove(result + 16, struct.pack("<QI", 0, code), 12)


@handles("cuGraphExecDestroy@10000")
def graph_exec_destroy(exec_: Any) -> None:
    x = G.EXECS.pop(_p(exec_), None)
    if x is None:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "unknown executable graph")
    if x.done_event is not None:
        RT.session().event_destroy(x.done_event)
    x.release()


@handles("cuGraphExecGetFlags@12000")
def graph_exec_get_flags(exec_: Any, out: Any) -> None:
    RT.out(out, G.graph_exec(_p(exec_)).flags)


@handles("cuGraphUpload@11010")
def graph_upload(exec_: Any, stream: Any) -> None:
    G.graph_exec(_p(exec_))  # nothing to upload: the graph lives in the guest
    RT.session().check_stream(RT.stream(stream))


@handles("cuGraphLaunch@10000")
def graph_launch(exec_: Any, stream: Any) -> None:
    x = G.graph_exec(_p(exec_))
    s = RT.stream(stream)
    c = G.capture_of(s)
    if c is not None:
        _inline_into_capture(x, s)
        return
    sess = RT.session()
    sess.check_stream(s)
    # one launch of an executable graph runs after the previous one, whatever the stream
    if x.last_stream is not None and x.last_stream != s and x.done_event is not None:
        sess.stream_wait_event(s, x.done_event, 0)
    for addr, default in x.cond_defaults:
        sess.memset_d32(addr, default, 1, s)
    run_nodes(x.nodes, s)
    if x.done_event is None:
        x.done_event = sess.event_create(2, RT.ctx())  # CU_EVENT_DISABLE_TIMING
    sess.event_record(x.done_event, s)
    x.last_stream = s


def _inline_into_capture(x: G.GraphExec, stream: int) -> None:
    """A graph launched into a capturing stream: its nodes join the capture graph, after the
    stream's frontier (the child-graph node CUDA makes, flattened)."""
    with G.LOCK:
        c = G.STREAMS[G.key(stream)]
        k = G.key(stream)
        roots = c.frontier.get(k, [])
        made: list[G.Node] = []
        used: set[int] = set()
        for n in x.nodes:
            deps = [made[i] for i in n.deps] if n.deps else roots
            used.update(n.deps)
            made.append(c.graph.add(n.kind, n.params, deps))
        sinks = [m for i, m in enumerate(made) if i not in used]
        c.frontier[k] = sinks or roots


@handles("cuGraphExecKernelNodeSetParams@10010")
def graph_exec_kernel_node_set_params_v1(exec_: Any, node: Any, params: Any) -> None:
    n = G.graph_exec(_p(exec_)).find(_p(node))
    if n.kind != G.KERNEL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "not a kernel node")
    _set_kernel(n, _kernel_params(params, False))


@handles("cuGraphExecKernelNodeSetParams@12000")
def graph_exec_kernel_node_set_params(exec_: Any, node: Any, params: Any) -> None:
    n = G.graph_exec(_p(exec_)).find(_p(node))
    if n.kind != G.KERNEL:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "not a kernel node")
    _set_kernel(n, _kernel_params(params, True))


def _exec_node(exec_: Any, node: Any, kind: int, what: str) -> G.ExecNode:
    n = G.graph_exec(_p(exec_)).find(_p(node))
    if n.kind != kind:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"not a {what} node")
    return n


@handles("cuGraphExecMemcpyNodeSetParams@10020")
def graph_exec_memcpy_node_set_params(exec_: Any, node: Any, params: Any, ctx: Any) -> None:
    _exec_node(exec_, node, G.MEMCPY, "memcpy").params = _copy_params(params)


@handles("cuGraphExecMemsetNodeSetParams@10020")
def graph_exec_memset_node_set_params(exec_: Any, node: Any, params: Any, ctx: Any) -> None:
    _exec_node(exec_, node, G.MEMSET, "memset").params = _memset_params(params)


@handles("cuGraphExecHostNodeSetParams@10020")
def graph_exec_host_node_set_params(exec_: Any, node: Any, params: Any) -> None:
    _exec_node(exec_, node, G.HOST, "host").params = _host_params(params)


@handles("cuGraphExecEventRecordNodeSetEvent@11010")
def graph_exec_event_record_node_set_event(exec_: Any, node: Any, event: Any) -> None:
    RT.session().check_event(_p(event))
    _exec_node(exec_, node, G.EVENT_RECORD, "event record").params = G.EventParams(_p(event))


@handles("cuGraphExecEventWaitNodeSetEvent@11010")
def graph_exec_event_wait_node_set_event(exec_: Any, node: Any, event: Any) -> None:
    RT.session().check_event(_p(event))
    _exec_node(exec_, node, G.WAIT_EVENT, "event wait").params = G.EventParams(_p(event))


@handles("cuGraphExecChildGraphNodeSetParams@11010")
def graph_exec_child_graph_node_set_params(exec_: Any, node: Any, child: Any) -> None:
    """The new child must have the topology of the one instantiated; its parameters are
    copied into the inlined nodes (allocation nodes keep their memory)."""
    x = G.graph_exec(_p(exec_))
    if G.node(_p(node)).kind != G.GRAPH:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "not a child graph node")
    old = x.inlined(_p(node))
    new = G.GraphExec.of(G.graph(_p(child)), retain=False).nodes
    if len(new) != len(old) or any(a.kind != b.kind for a, b in zip(old, new, strict=True)):
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "the child graph's topology differs")
    for a, b in zip(old, new, strict=True):
        if a.kind != G.MEM_ALLOC:
            a.params = b.params


@handles("cuGraphNodeSetEnabled@11060")
def graph_node_set_enabled(exec_: Any, node: Any, enabled: int) -> None:
    _switchable(exec_, node).enabled = bool(enabled)


@handles("cuGraphNodeGetEnabled@11060")
def graph_node_get_enabled(exec_: Any, node: Any, out: Any) -> None:
    RT.out(out, int(_switchable(exec_, node).enabled))


def _switchable(exec_: Any, node: Any) -> G.ExecNode:
    """An executable graph's node that may be disabled (CUDA: kernel, memcpy, memset)."""
    n = G.graph_exec(_p(exec_)).find(_p(node))
    if n.kind not in (G.KERNEL, G.MEMCPY, G.MEMSET):
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "only kernel, memcpy and memset nodes")
    return n


def _event_node(node: Any) -> G.Node:
    n = G.node(_p(node))
    if n.kind not in (G.EVENT_RECORD, G.WAIT_EVENT):
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "not an event node")
    return n


@handles("cuGraphEventRecordNodeGetEvent@11010", "cuGraphEventWaitNodeGetEvent@11010")
def graph_event_node_get_event(node: Any, out: Any) -> None:
    p = _event_node(node).params
    assert isinstance(p, G.EventParams)
    RT.out(out, _vp(p.event))


@handles("cuGraphEventRecordNodeSetEvent@11010", "cuGraphEventWaitNodeSetEvent@11010")
def graph_event_node_set_event(node: Any, event: Any) -> None:
    RT.session().check_event(_p(event))
    _event_node(node).params = G.EventParams(_p(event))


@handles("cuGraphMemsetNodeGetParams@10000")
def graph_memset_node_get_params(node: Any, out: Any) -> None:
    p = _typed(node, G.MEMSET).params
    assert isinstance(p, G.MemsetParams)
    _write_out(out, _MEMSET.pack(p.dst, p.pitch, p.value, p.elem, p.width, p.height))


def _update(exec_: Any, graph: Any) -> tuple[int, int]:
    """Copy parameters from a graph of the same topology: (CUgraphExecUpdateResult, node)."""
    x = G.graph_exec(_p(exec_))
    new = G.GraphExec.of(G.graph(_p(graph)), retain=False)
    if len(new.nodes) != len(x.nodes):
        return _UPDATE_TOPOLOGY_CHANGED, 0
    for a, b in zip(x.nodes, new.nodes, strict=True):
        if a.kind != b.kind or a.deps != b.deps:
            return _UPDATE_TOPOLOGY_CHANGED, b.origin
    for a, b in zip(x.nodes, new.nodes, strict=True):
        if a.kind != G.MEM_ALLOC:  # an allocation keeps its memory (CUDA: not updatable)
            a.params = b.params
    return 0, 0


@handles("cuGraphExecUpdate@12000")
def graph_exec_update(exec_: Any, graph: Any, info: Any) -> None:
    result, bad = _update(exec_, graph)
    if info != RT.ffi.NULL:
        raw = struct.pack("<I4xQQ", result, bad, 0)
        RT.ffi.memmove(RT.ffi.cast("char *", info), raw, len(raw))
    if result:
        raise CudaError(_E.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "graph topology changed")


@handles("cuGraphExecUpdate@10020")
def graph_exec_update_v1(exec_: Any, graph: Any, err_node: Any, result_out: Any) -> None:
    result, bad = _update(exec_, graph)
    if err_node != RT.ffi.NULL:
        err_node[0] = _vp(bad)
    if result_out != RT.ffi.NULL:
        result_out[0] = result
    if result:
        raise CudaError(_E.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "graph topology changed")
