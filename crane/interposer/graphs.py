"""CUDA graphs and stream capture, kept entirely in the guest.

A graph is a DAG of recorded stream-ordered operations; instantiating it fixes a topological
order and copies every node's parameters, and launching it replays that order through the
ordinary session calls on one stream. No daemon work is needed: a serial replay is one valid
schedule of the DAG (any order consistent with the edges is), and every replayed call is
asynchronous (except host nodes and device-to-host copies, which wait as their stream-ordered
counterparts do), so a graph of N kernels goes out as one batch.

Stream capture follows the driver's model: a capture sequence owns a graph and, per stream that
takes part in it, a *frontier* (the nodes the next operation on that stream depends on). An
event recorded in a capturing stream remembers the frontier it saw; a wait on it forks another
stream into the capture (or joins two of its streams). Illegal calls during capture return the
error the driver returns and invalidate the sequence, after which every use of its streams
fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED until cuStreamEndCapture ends it.

This module is the model (no cffi); :mod:`crane.interposer.h_graph` holds the entry points and
the replay, the stream-ordered handlers call :func:`record` and the checks below.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.guest.session import Function
from crane.interposer.fastlane import FAST
from crane.interposer.runtime import RT

__all__ = [
    "COND",
    "COND_HANDLES",
    "EMPTY",
    "EVENT_RECORD",
    "GRAPH",
    "GRAPH_MEMORY",
    "HOST",
    "KERNEL",
    "LOCK",
    "MEMCPY",
    "MEMSET",
    "MEM_ALLOC",
    "MEM_FREE",
    "WAIT_EVENT",
    "Capture",
    "ChildParams",
    "CondExec",
    "CondHandle",
    "CondParams",
    "CopyParams",
    "EventParams",
    "Graph",
    "GraphExec",
    "HostParams",
    "KernelParams",
    "MemParams",
    "MemsetParams",
    "Node",
]

# CUgraphNodeType
KERNEL, MEMCPY, MEMSET, HOST, GRAPH, EMPTY, WAIT_EVENT, EVENT_RECORD = range(8)
MEM_ALLOC, MEM_FREE, COND = 10, 11, 13
# CUgraphConditionalNodeType
COND_IF, COND_WHILE, COND_SWITCH = 0, 1, 2
COND_ASSIGN_DEFAULT = 1  # CU_GRAPH_COND_ASSIGN_DEFAULT
# CUstreamCaptureMode / CUstreamCaptureStatus
MODE_GLOBAL, MODE_THREAD_LOCAL, MODE_RELAXED = 0, 1, 2
STATUS_NONE, STATUS_ACTIVE, STATUS_INVALIDATED = 0, 1, 2

_E = CUresult
_LEGACY = (0, 1)
_PER_THREAD = 2
_CU_STREAM_NON_BLOCKING = 1


# ---- node parameters (copied values: a node never aliases the caller's memory) -------------
@dataclass(frozen=True)
class KernelParams:
    fn: Function
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    params: bytes  # the packed parameter buffer, copied when the node is made
    #: thread-block cluster dimensions of a captured cluster launch (None: no clusters)
    cluster: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class CopyParams:
    """A copy of ``depth`` slices of ``height`` rows of ``width`` bytes (1D: one row).
    Host memory is read or written when the node runs, as on a GPU."""

    dst: int
    src: int
    width: int
    height: int = 1
    depth: int = 1
    dpitch: int = 0
    spitch: int = 0
    dheight: int = 0
    sheight: int = 0

    def rows(self) -> Iterable[tuple[int, int, int]]:
        """(dst, src, nbytes) pieces, contiguous ones merged."""
        if self.height * self.depth == 1 or (
            self.dpitch == self.spitch == self.width
            and (self.depth == 1 or self.dheight == self.sheight == self.height)
        ):
            yield self.dst, self.src, self.width * self.height * self.depth
            return
        for z in range(self.depth):
            for y in range(self.height):
                yield (
                    self.dst + (z * self.dheight + y) * self.dpitch,
                    self.src + (z * self.sheight + y) * self.spitch,
                    self.width,
                )


@dataclass(frozen=True)
class MemsetParams:
    dst: int
    pitch: int
    value: int
    elem: int
    width: int  # elements per row
    height: int


@dataclass(frozen=True)
class HostParams:
    fn: int
    user_data: int


@dataclass(frozen=True)
class EventParams:
    event: int


@dataclass(frozen=True)
class ChildParams:
    """A child-graph node: its own copy of the graph it was given (CUDA clones it)."""

    graph: Graph


@dataclass(frozen=True)
class CondParams:
    """A conditional node: the handle (the device address of the 32-bit condition a kernel
    sets with cudaGraphSetConditional), if/while/switch, and the body graphs the node owns."""

    handle: int
    type: int
    bodies: tuple[Graph, ...]


@dataclass(frozen=True)
class CondExec:
    """A conditional node as instantiated: each body's nodes in replay order (a snapshot, as
    instantiation makes of every node)."""

    handle: int
    type: int
    bodies: tuple[tuple[ExecNode, ...], ...]


@dataclass(frozen=True)
class CondHandle:
    addr: int
    default: int
    flags: int


#: graph handle -> the conditional handles created for it (freed with the graph)
COND_HANDLES: dict[int, list[CondHandle]] = {}
#: node types a conditional body may hold (CUDA_CONDITIONAL_NODE_PARAMS' rule)
COND_BODY_KINDS = frozenset({KERNEL, EMPTY, GRAPH, MEMSET, MEMCPY, COND})


@dataclass(frozen=True)
class MemParams:
    """A memory allocation node (the address is fixed when the node is made) or a free node."""

    addr: int
    size: int = 0


# ---- graph-owned memory ----------------------------------------------------------------------
@dataclass
class GraphMemory:
    size: int
    refs: int = 0  # graph nodes (in graphs and clones) and executable graphs holding it


#: Memory of allocation nodes: allocated when the node is made, owned by the graphs and
#: executable graphs that hold the node, freed when the last one goes. Frees of it by the
#: application or by free nodes leave it with its graphs (the next launch allocates it again
#: at the same address, as a graph allocation does).
GRAPH_MEMORY: dict[int, GraphMemory] = {}
_graph_mem_high = [0, 0]  # used, reserved high watermarks


def graph_memory_used() -> int:
    return sum(m.size for m in GRAPH_MEMORY.values())


def own_memory(addr: int, size: int) -> None:
    """Register the memory of an allocation node about to be added (which holds it)."""
    with LOCK:
        GRAPH_MEMORY[addr] = GraphMemory(size)
        used = graph_memory_used()
        _graph_mem_high[0] = max(_graph_mem_high[0], used)
        _graph_mem_high[1] = max(_graph_mem_high[1], used)


def _retain(nodes: Iterable[object]) -> None:
    for params in nodes:
        if isinstance(params, MemParams) and params.addr in GRAPH_MEMORY and params.size:
            GRAPH_MEMORY[params.addr].refs += 1


def _release(nodes: Iterable[object]) -> None:
    for params in nodes:
        if isinstance(params, MemParams) and params.size and params.addr in GRAPH_MEMORY:
            m = GRAPH_MEMORY[params.addr]
            m.refs -= 1
            if m.refs == 0:
                del GRAPH_MEMORY[params.addr]
                RT.session().mem_free(params.addr)


def is_graph_memory(addr: int) -> bool:
    return addr in GRAPH_MEMORY


def graph_memory_high() -> tuple[int, int]:
    """cuDeviceGetGraphMemAttribute's used and reserved high watermarks."""
    return _graph_mem_high[0], _graph_mem_high[1]


def reset_graph_memory_high(which: int) -> None:
    _graph_mem_high[which] = graph_memory_used()


# ---- graphs --------------------------------------------------------------------------------
_ids = itertools.count(1)
#: Guards the capture and graph tables (the graph handlers take it too).
LOCK = threading.RLock()


def _handle(kind: int) -> int:
    """Opaque non-NULL handles; the top byte keeps graphs, nodes and execs apart from each
    other and from session handles (0xC1..0xC5)."""
    return (kind << 56) | next(_ids)


@dataclass(eq=False)
class Node:
    handle: int
    graph: Graph
    kind: int
    params: object
    deps: list[Node] = field(default_factory=list)
    keep: list[Any] = field(default_factory=list)  # cffi buffers handed out by getters


@dataclass(eq=False)
class Graph:
    handle: int = field(default_factory=lambda: _handle(0xC6))
    nodes: list[Node] = field(default_factory=list)
    origins: dict[int, Node] = field(default_factory=dict)  # for a clone: original -> copy

    def add(self, kind: int, params: object, deps: Iterable[Node] = ()) -> Node:
        deps = list(dict.fromkeys(deps))
        for d in deps:
            if d.graph is not self:
                raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "dependency from another graph")
        node = Node(_handle(0xC7), self, kind, params, deps)
        with LOCK:
            self.nodes.append(node)
            NODES[node.handle] = node
            _retain([params])  # an allocation node holds its graph memory
        return node

    def dependents(self, node: Node) -> list[Node]:
        return [n for n in self.nodes if node in n.deps]

    def remove(self, node: Node) -> None:
        with LOCK:
            self.nodes.remove(node)
            for n in self.nodes:
                if node in n.deps:
                    n.deps.remove(node)
            NODES.pop(node.handle, None)
            _release_node(node)

    def clone(self) -> Graph:
        """A copy with new handles (children cloned too, graph memory shared);
        ``clone.origins`` maps each original node's handle to its copy."""
        g = new_graph()
        copies: dict[Node, Node] = {}
        with LOCK:
            for n in self.nodes:
                params = n.params
                if n.kind == GRAPH:
                    params = ChildParams(n.params.graph.clone())
                elif n.kind == COND:
                    p = n.params
                    params = CondParams(p.handle, p.type, tuple(b.clone() for b in p.bodies))
                copies[n] = g.add(n.kind, params, [copies[d] for d in n.deps])
            g.origins = {n.handle: c for n, c in copies.items()}
        return g

    def flat(self) -> tuple[list[tuple[Node, list[int], int]], list[int]]:
        """The graph with child graphs inlined: ``(node, dependency indices, the top-level
        child-graph node it came from or 0)`` in a topological order, and the indices nothing
        depends on."""
        out: list[tuple[Node, list[int], int]] = []
        exits: dict[Node, list[int]] = {}
        for n in self.order():
            entry = sorted({i for d in n.deps for i in exits[d]})
            if n.kind == GRAPH:
                inner, sinks = n.params.graph.flat()
                base = len(out)
                for m, deps, _ in inner:
                    out.append((m, [base + i for i in deps] if deps else entry, n.handle))
                exits[n] = [base + i for i in sinks] if inner else entry
            else:
                out.append((n, entry, 0))
                exits[n] = [len(out) - 1]
        used = {i for _, deps, _ in out for i in deps}
        return out, [i for i in range(len(out)) if i not in used]

    def order(self) -> list[Node]:
        """A topological order (insertion order among ready nodes); a cycle is an error."""
        pending = {n: len(n.deps) for n in self.nodes}
        users: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for d in n.deps:
                users[d].append(n)
        ready = [n for n in self.nodes if not n.deps]
        out: list[Node] = []
        while ready:
            n = ready.pop(0)
            out.append(n)
            for u in users[n]:
                pending[u] -= 1
                if not pending[u]:
                    ready.append(u)
        if len(out) != len(self.nodes):
            raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "the graph has a cycle")
        return out


@dataclass(eq=False)
class ExecNode:
    origin: int  # the graph node it was instantiated from
    kind: int
    params: object
    deps: list[int]  # indices of earlier ExecNodes
    within: int = 0  # the top-level child-graph node it was inlined from (0: none)
    enabled: bool = True  # cuGraphNodeSetEnabled


@dataclass(eq=False)
class GraphExec:
    """An instantiated graph: its nodes in replay order, with parameters copied."""

    nodes: list[ExecNode]
    flags: int = 0
    handle: int = field(default_factory=lambda: _handle(0xC8))
    last_stream: int | None = None
    done_event: int | None = None  # orders a launch on another stream after the previous one
    #: (condition address, default) to set at each launch (CU_GRAPH_COND_ASSIGN_DEFAULT)
    cond_defaults: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def of(cls, graph: Graph, flags: int = 0, *, retain: bool = True) -> GraphExec:
        """``retain``: the executable graph holds graph memory (False for a throw-away copy
        of parameters, as cuGraphExecUpdate makes)."""
        flat, _ = graph.flat()
        x = cls(
            [ExecNode(n.handle, n.kind, _exec_params(n), deps, w) for n, deps, w in flat],
            flags,
        )
        x.cond_defaults = [
            (h.addr, h.default) for h in COND_HANDLES.get(graph.handle, ()) if h.flags & 1
        ]
        if retain:
            with LOCK:
                _retain(n.params for n in x.nodes)
        return x

    def inlined(self, child_node: int) -> list[ExecNode]:
        """The nodes a top-level child-graph node became."""
        return [n for n in self.nodes if n.within == child_node]

    def release(self) -> None:
        """cuGraphExecDestroy: drop its hold on graph memory."""
        with LOCK:
            _release(n.params for n in self.nodes)

    def find(self, node_handle: int) -> ExecNode:
        for n in self.nodes:
            if n.origin == node_handle:
                return n
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "node is not in this executable graph")


GRAPHS: dict[int, Graph] = {}
NODES: dict[int, Node] = {}
EXECS: dict[int, GraphExec] = {}


def new_graph() -> Graph:
    g = Graph()
    with LOCK:
        GRAPHS[g.handle] = g
    return g


def graph(handle: int) -> Graph:
    g = GRAPHS.get(handle)
    if g is None:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"unknown graph {handle:#x}")
    return g


def node(handle: int) -> Node:
    n = NODES.get(handle)
    if n is None:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"unknown graph node {handle:#x}")
    return n


def graph_exec(handle: int) -> GraphExec:
    x = EXECS.get(handle)
    if x is None:
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"unknown executable graph {handle:#x}")
    return x


def _exec_params(n: Node) -> object:
    """A node's parameters as an executable graph keeps them (conditional bodies flattened)."""
    if n.kind != COND or not isinstance(n.params, CondParams):
        return n.params
    bodies = []
    for body in n.params.bodies:
        nodes = tuple(GraphExec.of(body, retain=False).nodes)
        bad = [m.kind for m in nodes if m.kind not in COND_BODY_KINDS]
        if bad:
            raise CudaError(
                _E.CUDA_ERROR_INVALID_VALUE, f"a conditional body holds a type {bad[0]} node"
            )
        bodies.append(nodes)
    return CondExec(n.params.handle, n.params.type, tuple(bodies))


def _release_node(n: Node) -> None:
    if n.kind == GRAPH:
        destroy_graph(n.params.graph)
    elif n.kind == COND and isinstance(n.params, CondParams):
        for body in n.params.bodies:
            destroy_graph(body)
    else:
        _release([n.params])


def destroy_graph(g: Graph) -> None:
    with LOCK:
        for n in g.nodes:
            NODES.pop(n.handle, None)
            _release_node(n)
        GRAPHS.pop(g.handle, None)
        for h in COND_HANDLES.pop(g.handle, ()):
            RT.session().mem_free(h.addr)


# ---- capture -------------------------------------------------------------------------------
@dataclass(eq=False)
class Capture:
    graph: Graph
    origin: Hashable
    mode: int
    thread: int
    id: int = field(default_factory=lambda: next(_ids))
    status: int = STATUS_ACTIVE
    frontier: dict[Hashable, list[Node]] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)  # arrays returned by cuStreamGetCaptureInfo


STREAMS: dict[Hashable, Capture] = {}  # every stream taking part in a capture
EVENTS: dict[int, tuple[Capture, list[Node]]] = {}  # events last recorded in a capture
_tls = threading.local()


def key(stream: int) -> Hashable:
    """The per-thread default stream is a different stream in each thread."""
    return (_PER_THREAD, threading.get_ident()) if stream == _PER_THREAD else stream


def _blocking(k: Hashable) -> bool:
    if isinstance(k, tuple):
        return True  # the per-thread default stream synchronizes with the legacy one
    info = RT.streams.get(k)  # type: ignore[call-overload]
    return info is None or not info.flags & _CU_STREAM_NON_BLOCKING


def thread_mode() -> int:
    return getattr(_tls, "mode", MODE_GLOBAL)


def exchange_mode(mode: int) -> int:
    if mode not in (MODE_GLOBAL, MODE_THREAD_LOCAL, MODE_RELAXED):
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"bad capture mode {mode}")
    old = thread_mode()
    _tls.mode = mode
    return old


def _active() -> list[Capture]:
    return list({id(c): c for c in STREAMS.values()}.values())


def invalidate(c: Capture, why: str) -> None:
    if c.status == STATUS_ACTIVE:
        c.status = STATUS_INVALIDATED


def _fail(code: CUresult, why: str, captures: Iterable[Capture]) -> CudaError:
    for c in captures:
        invalidate(c, why)
    return CudaError(code, why)


def _legacy_check(stream: int) -> None:
    """Work on the legacy stream would wait for blocking streams that are capturing."""
    if stream in _LEGACY and not (stream == 0 and RT.lib.crane_in_ptds()):
        hit = [c for k, c in STREAMS.items() if _blocking(k)]
        if hit:
            raise _fail(
                _E.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                "the legacy stream would depend on a capturing blocking stream",
                hit,
            )


def capture_of(stream: int) -> Capture | None:
    """The capture ``stream`` takes part in (None: it executes), after the legacy-stream rule;
    an invalidated sequence refuses all further work."""
    if not STREAMS:
        return None
    with LOCK:
        _legacy_check(stream)
        c = STREAMS.get(key(stream))
        if c is not None and c.status != STATUS_ACTIVE:
            raise CudaError(_E.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "capture was invalidated")
        return c


def record(stream: int, kind: int, params: object) -> bool:
    """Add a node for a stream-ordered operation if ``stream`` is capturing (True)."""
    if not STREAMS:
        return False
    with LOCK:
        c = capture_of(stream)
        if c is None:
            return False
        k = key(stream)
        c.frontier[k] = [c.graph.add(kind, params, c.frontier.get(k, ()))]
        return True


def refuse(stream: int, what: str, code: CUresult = _E.CUDA_ERROR_NOT_SUPPORTED) -> None:
    """An operation Crane cannot record: refuse it during capture and end the sequence's hope
    of a complete graph (no silent hole in the recorded work)."""
    if not STREAMS:
        return
    with LOCK:
        c = capture_of(stream)
        if c is not None:
            if code == _E.CUDA_ERROR_NOT_SUPPORTED:
                print(f"crane: {what} during stream capture is not supported by Crane",
                      file=sys.stderr)  # fmt: skip
            raise _fail(code, f"{what} during stream capture", [c])


def _prohibiting() -> list[Capture]:
    """Captures that forbid this thread's potentially unsafe calls (cuThreadExchange-
    StreamCaptureMode's rules)."""
    mode = thread_mode()
    if mode == MODE_RELAXED:
        return []
    me = threading.get_ident()
    out = [c for c in _active() if c.thread == me and c.mode != MODE_RELAXED]
    if mode == MODE_GLOBAL:
        out += [c for c in _active() if c.thread != me and c.mode == MODE_GLOBAL]
    return out


def check_unsafe(what: str) -> None:
    """A potentially unsafe call (allocation, synchronous copy) during a capture that forbids
    it: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the capture is invalidated."""
    if not STREAMS:
        return
    with LOCK:
        hit = _prohibiting()
        if hit:
            raise _fail(_E.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, f"{what} during capture", hit)


def check_sync(stream: int, what: str) -> None:
    """A call that waits for ``stream`` (or is synchronous on it): illegal on a capturing
    stream, and on the legacy stream while a blocking stream captures."""
    if not STREAMS:
        return
    with LOCK:
        c = STREAMS.get(key(stream))
        if c is not None:
            raise _fail(
                _E.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, f"{what} on a capturing stream", [c]
            )
        _legacy_check(stream)


def check_device_sync(what: str) -> None:
    """Waiting for the whole context while any stream captures is illegal."""
    if not STREAMS:
        return
    with LOCK:
        hit = _active()
        if hit:
            raise _fail(_E.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, f"{what} during capture", hit)


def check_event(event: int, what: str) -> None:
    """Querying or waiting for an event recorded in a capture: CUDA_ERROR_CAPTURED_EVENT."""
    hit = EVENTS.get(event)
    if hit is not None and hit[0].status != STATUS_NONE:
        raise _fail(_E.CUDA_ERROR_CAPTURED_EVENT, f"{what} of a captured event", [hit[0]])


def begin(stream: int, mode: int, into: Graph | None = None, deps: Iterable[Node] = ()) -> None:
    if mode not in (MODE_GLOBAL, MODE_THREAD_LOCAL, MODE_RELAXED):
        raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, f"bad capture mode {mode}")
    if stream in _LEGACY and not (stream == 0 and RT.lib.crane_in_ptds()):
        raise CudaError(
            _E.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cannot capture the legacy stream"
        )
    RT.session().check_stream(stream)
    with LOCK:
        k = key(stream)
        if k in STREAMS:
            raise CudaError(_E.CUDA_ERROR_ILLEGAL_STATE, "the stream is already capturing")
        g = into if into is not None else new_graph()
        c = Capture(g, k, mode, threading.get_ident())
        c.frontier[k] = list(deps)
        STREAMS[k] = c
        FAST.forget()  # (calls on capturing streams are recorded: the Python side's work)


def _end(c: Capture) -> None:
    c.status = STATUS_NONE
    for k in [k for k, v in STREAMS.items() if v is c]:
        del STREAMS[k]
    for e in [e for e, v in EVENTS.items() if v[0] is c]:
        del EVENTS[e]


def _ancestors(nodes: Iterable[Node]) -> set[Node]:
    seen: set[Node] = set()
    todo = list(nodes)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.deps)
    return seen


def end(stream: int) -> Graph:
    """cuStreamEndCapture: the recorded graph, or the error that ended the sequence."""
    with LOCK:
        k = key(stream)
        c = STREAMS.get(k)
        if c is None:
            raise CudaError(_E.CUDA_ERROR_ILLEGAL_STATE, "the stream is not capturing")
        if c.origin != k:
            raise _fail(
                _E.CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture did not begin on this stream", [c]
            )
        if c.mode != MODE_RELAXED and c.thread != threading.get_ident():
            raise CudaError(_E.CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "ended in another thread")
        invalid = c.status == STATUS_INVALIDATED
        _end(c)
        joined = _ancestors(c.frontier.get(k, ()))
        if invalid:
            destroy_graph(c.graph)
            raise CudaError(_E.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "capture was invalidated")
        for other, front in c.frontier.items():
            if other != k and any(n not in joined for n in front):
                destroy_graph(c.graph)
                raise CudaError(
                    _E.CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "a forked stream was not joined back"
                )
        return c.graph


def status(stream: int) -> tuple[int, Capture | None]:
    """(CUstreamCaptureStatus, capture) for cuStreamIsCapturing / GetCaptureInfo."""
    with LOCK:
        if STREAMS:
            _legacy_check(stream)
        c = STREAMS.get(key(stream))
        return (STATUS_NONE, None) if c is None else (c.status, c)


def fast_ok() -> bool:
    """Whether a call served outside any capture may teach the C fast lane
    (crane.interposer.fastlane): no stream captures, no event holds a capture's frontier (each
    makes later calls the Python side's), no sticky fault stands."""
    return not STREAMS and not EVENTS and RT.sticky is None


def event_recorded(event: int, stream: int) -> bool:
    """cuEventRecord: in a capturing stream the event remembers the frontier (True: nothing
    to execute); elsewhere it is a real record again."""
    if not STREAMS and not EVENTS:
        return False
    with LOCK:
        c = capture_of(stream)
        if c is None:
            EVENTS.pop(event, None)
            return False
        EVENTS[event] = (c, list(c.frontier.get(key(stream), ())))
        FAST.forget()
        return True


def wait_event(stream: int, event: int) -> bool:
    """cuStreamWaitEvent on a captured event or from a capturing stream (True: handled)."""
    if not STREAMS:
        return False
    with LOCK:
        k = key(stream)
        here = STREAMS.get(k)
        rec = EVENTS.get(event)
        if rec is None:
            if here is None:
                return False
            capture_of(stream)  # an invalidated capture refuses first
            raise _fail(
                _E.CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                "wait on an event recorded outside the capture",
                [here],
            )
        c, nodes = rec
        if c.status != STATUS_ACTIVE:
            raise CudaError(_E.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "capture was invalidated")
        if here is None:
            if stream in _LEGACY:
                raise _fail(
                    _E.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "legacy stream joins a capture", [c]
                )
            STREAMS[k] = c  # fork: the stream joins the capture
            FAST.forget()
            c.frontier[k] = list(nodes)
            return True
        if here is not c:
            raise _fail(_E.CUDA_ERROR_STREAM_CAPTURE_MERGE, "wait merges two captures", [c, here])
        if here.status != STATUS_ACTIVE:
            raise CudaError(_E.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "capture was invalidated")
        c.frontier[k] = list(dict.fromkeys([*c.frontier.get(k, ()), *nodes]))
        return True


def update_dependencies(stream: int, nodes: list[Node], replace: bool) -> None:
    with LOCK:
        c = capture_of(stream)
        if c is None:
            raise CudaError(_E.CUDA_ERROR_ILLEGAL_STATE, "the stream is not capturing")
        k = key(stream)
        for n in nodes:
            if n.graph is not c.graph:
                raise CudaError(_E.CUDA_ERROR_INVALID_VALUE, "node is not in the capture graph")
        base = [] if replace else c.frontier.get(k, [])
        c.frontier[k] = list(dict.fromkeys([*base, *nodes]))
