"""The call table: every operation a guest can ask of a daemon, declared once.

Everything that crosses the wire is driven from :data:`OPS`: the guest library packs arguments
with :meth:`Op.pack`, the worker unpacks them with :meth:`Op.unpack` and dispatches to the
method named after the op on the session's device state (``SessionDevice.<op.handler>``, whose
parameters must carry the op's argument names in order: ``crane.engine.dispatch`` refuses to
start otherwise), replies are packed with the op's result format, and the handshake fingerprint
(:mod:`crane.wire.fingerprint`) hashes this table so mismatched builds refuse each other. The
rules that depend on the op rather than its arguments live here too, so no list elsewhere can
drift from the table: which ops still run after a sticky fault (``teardown``), which memory an
op may write (``writes``, ``writes_via_params``).

Rules for editing (the table is part of the protocol):

* op ids are **append-only**: never renumber, never reuse an id; retire an op by leaving its
  entry with ``retired=True``. ``tests/unit/api/op_ids.golden`` pins every id ever issued.
* parameters are described by what they *mean* on the wire (:class:`Kind`), not by C type.
* ``sync`` ops make the guest wait for a reply; async ops are batched and their errors surface at
  the next synchronizing call (architecture invariant 3).
* ``writes`` names the device-pointer parameters whose allocations the op may modify, and
  ``writes_via_params`` marks a launch: its kernel may write wherever its parameters lead. The
  dirty tracker uses both to know which memory changed since a mark (invariant 5).
* ``teardown`` ops still run after a sticky fault (destroying what the fault left behind is
  always allowed); every other op then fails with the fault, as on a GPU.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

__all__ = ["OPS", "OPS_BY_ID", "OPS_BY_NAME", "Kind", "LaunchConfig", "Op", "Param", "op"]


class LaunchConfig(NamedTuple):
    """A launch's configuration as one wire value: grid and block dimensions, dynamic shared
    memory bytes (cuLaunchKernel's gridDim, blockDim, sharedMemBytes)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int


class Kind(Enum):
    """Wire meaning of a fixed-size argument or result, with its struct code.

    Each member is its own meaning even where two share a C layout (a HANDLE is no DEVPTR), so
    the values are (meaning, struct code) pairs; :attr:`code` is the layout."""

    HANDLE = ("handle", "Q")  # guest-chosen object id (context, stream, event, module, function)
    DEVPTR = ("devptr", "Q")  # device virtual address inside the session window
    SIZE = ("size", "Q")  # byte count or element count
    U32 = ("u32", "I")
    I32 = ("i32", "i")
    U64 = ("u64", "Q")
    F32 = ("f32", "f")
    HASH = ("hash", "32s")  # sha-256 digest
    LAUNCH_CONFIG = ("launch_config", "7I")  # LaunchConfig: grid x/y/z, block x/y/z, shared

    @property
    def code(self) -> str:
        return self.value[1]


@dataclass(frozen=True)
class Param:
    name: str
    kind: Kind


def _params(spec: str) -> tuple[Param, ...]:
    """Parse ``"dst:DEVPTR size:SIZE"`` into params (keeps the table below readable)."""
    out = []
    for item in spec.split():
        name, kind = item.split(":")
        out.append(Param(name, Kind[kind]))
    return tuple(out)


@dataclass(frozen=True)
class Op:
    """One wire operation."""

    id: int
    name: str
    args: tuple[Param, ...]
    results: tuple[Param, ...] = ()
    sync: bool = False
    #: Name of the one variable-length input carried in ``Call.data`` (host bytes, image, name).
    data_in: str | None = None
    #: True when the reply carries variable-length bytes in ``Reply.data``.
    data_out: bool = False
    #: Device-pointer args whose allocations this op may write (dirty tracking).
    writes: tuple[str, ...] = ()
    #: A launch: its kernel (the ``function`` arg) may write wherever its pointer
    #: parameters (the data) lead; the kernel's parameter layout says where they are.
    writes_via_params: bool = False
    #: Still runs after a sticky fault (tearing down is always allowed).
    teardown: bool = False
    #: The op's bytes travel in the call ring's bulk area, not in the call (``"h2d"``: the
    #: guest writes ``size`` bytes there; ``"d2h"``: the worker does): the handler's data
    #: parameter is then that stream (crane.engine.staged), never ``Call.data``.
    staged: str = ""
    #: What the worker's accounting (crane.engine.meter) counts this op as besides a call:
    #: "launch" (a kernel: its function is the ``function`` arg), "h2d" (bytes copied: the
    #: data), "d2h" / "d2d" (bytes copied: the ``size`` arg), "memset" (copy-engine time, no
    #: bytes copied); "": a call only. Not part of the wire protocol (no signature change).
    meter: str = ""
    doc: str = ""
    retired: bool = False
    _args_struct: struct.Struct = field(init=False, repr=False, compare=False)
    _results_struct: struct.Struct = field(init=False, repr=False, compare=False)
    #: Position of the LAUNCH_CONFIG arg (the one arg that is several wire fields), or -1.
    _config_at: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fmt = "<" + "".join(p.kind.code for p in self.args)
        object.__setattr__(self, "_args_struct", struct.Struct(fmt))
        rfmt = "<" + "".join(p.kind.code for p in self.results)
        object.__setattr__(self, "_results_struct", struct.Struct(rfmt))
        kinds = [p.kind for p in self.args]
        at = kinds.index(Kind.LAUNCH_CONFIG) if Kind.LAUNCH_CONFIG in kinds else -1
        if kinds.count(Kind.LAUNCH_CONFIG) > 1:
            raise ValueError(f"op {self.name}: at most one LAUNCH_CONFIG argument")
        object.__setattr__(self, "_config_at", at)
        if self.writes_via_params and "function" not in (p.name for p in self.args):
            raise ValueError(f"op {self.name}: a launch (writes_via_params) needs a function arg")

    @property
    def handler(self) -> str:
        """Name of the session device-state method that executes this op."""
        return self.name.lower()

    @property
    def args_size(self) -> int:
        """Bytes of the packed arguments (:meth:`pack`'s output is always this long)."""
        return self._args_struct.size

    @property
    def param_names(self) -> tuple[str, ...]:
        """What the handler's parameters are called, in order: the args, then the data."""
        return tuple(p.name for p in self.args) + ((self.data_in,) if self.data_in else ())

    def pack(self, *values: Any) -> bytes:
        """One value per arg (a :class:`LaunchConfig`, or any (grid, block, shared) triple, for
        a LAUNCH_CONFIG arg)."""
        i = self._config_at
        if i < 0:
            return self._args_struct.pack(*values)
        if i == 1 and len(values) == 3:  # (handle, config, stream): every launch, so no slicing
            grid, block, shared = values[1]
            return self._args_struct.pack(values[0], *grid, *block, shared, values[2])
        grid, block, shared = values[i]
        return self._args_struct.pack(*values[:i], *grid, *block, shared, *values[i + 1 :])

    @property
    def decoder(self) -> Callable[[bytes], tuple]:
        """The fastest callable equivalent to :meth:`unpack` (the struct's own ``unpack`` when
        every arg is one wire field): the worker decodes every call with it."""
        return self._args_struct.unpack if self._config_at < 0 else self.unpack

    def unpack(self, raw: bytes) -> tuple:
        """Decode args, one value per arg; ``struct.error`` on a malformed call."""
        flat = self._args_struct.unpack(raw)
        i = self._config_at
        if i < 0:
            return flat
        config = LaunchConfig(flat[i : i + 3], flat[i + 3 : i + 6], flat[i + 6])
        return (*flat[:i], config, *flat[i + 7 :])

    def pack_results(self, *values: object) -> bytes:
        return self._results_struct.pack(*values)

    def unpack_results(self, raw: bytes) -> tuple:
        return self._results_struct.unpack(raw)

    def signature(self) -> str:
        """Stable text form used by the protocol fingerprint."""
        args = ",".join(f"{p.name}:{p.kind.name}" for p in self.args)
        res = ",".join(f"{p.name}:{p.kind.name}" for p in self.results)
        flags = f"sync={int(self.sync)} in={self.data_in} out={int(self.data_out)}"
        rules = f"writes={','.join(self.writes)} via_params={int(self.writes_via_params)}"
        rules += f" teardown={int(self.teardown)}"
        if self.staged:
            rules += f" staged={self.staged}"
        return f"{self.id} {self.name}({args})->({res}) {flags} {rules} retired={int(self.retired)}"


def op(id: int, name: str, args: str = "", results: str = "", **kw: object) -> Op:
    return Op(id, name, _params(args), _params(results), **kw)  # type: ignore[arg-type]


# fmt: off
#: The table. APPEND ONLY: ids are part of the wire protocol.
OPS: tuple[Op, ...] = (
    op(1, "SESSION_CLOSE", sync=True, teardown=True,
       doc="Orderly end of the session: the daemon frees everything and ends the stream."),
    op(2, "CTX_CREATE", "ctx:HANDLE flags:U32",
       doc="Create a context (primary or not) under a guest-chosen handle."),
    op(3, "CTX_DESTROY", "ctx:HANDLE", teardown=True,
       doc="Destroy a context and every object created in it."),
    op(4, "CTX_SYNCHRONIZE", "ctx:HANDLE", sync=True,
       doc="Wait for all work in the context; returns the first pending asynchronous error."),
    op(5, "MEM_MAP_CHUNK", "addr:DEVPTR size:SIZE", sync=True,
       doc="Commit device memory at a guest-chosen, 2 MiB-aligned address; the only call that "
           "can run out of device memory, so it is synchronous."),
    op(6, "MEM_UNMAP_CHUNK", "addr:DEVPTR", teardown=True,
       doc="Release a chunk that holds no allocation."),
    op(7, "MEM_ALLOC", "ctx:HANDLE addr:DEVPTR size:SIZE",
       doc="Record an allocation the guest placed inside a mapped chunk."),
    op(8, "MEM_FREE", "addr:DEVPTR", teardown=True,
       doc="Forget an allocation."),
    op(9, "MEM_GET_INFO", results="free:SIZE total:SIZE", sync=True,
       doc="Free and total device memory, as cuMemGetInfo."),
    op(10, "MEMCPY_HTOD", "dst:DEVPTR stream:HANDLE", data_in="src", writes=("dst",),
       meter="h2d",
       doc="Copy the call's data to device memory, in stream order."),
    op(11, "MEMCPY_DTOH", "src:DEVPTR size:SIZE stream:HANDLE", sync=True, data_out=True,
       meter="d2h",
       doc="Read device memory back, in stream order."),
    op(12, "MEMCPY_DTOD", "dst:DEVPTR src:DEVPTR size:SIZE stream:HANDLE", writes=("dst",),
       meter="d2d", doc="Device-to-device copy, in stream order."),
    op(13, "MEMSET", "dst:DEVPTR value:U32 elem_size:U32 count:SIZE stream:HANDLE",
       writes=("dst",), meter="memset", doc="cuMemsetD8/D16/D32, in stream order."),
    op(14, "STREAM_CREATE", "ctx:HANDLE stream:HANDLE flags:U32 priority:I32",
       doc="Create a stream under a guest-chosen handle."),
    op(15, "STREAM_DESTROY", "stream:HANDLE", teardown=True,
       doc="Destroy a stream once its work is done."),
    op(16, "STREAM_SYNCHRONIZE", "stream:HANDLE", sync=True,
       doc="Wait for the stream; returns the first pending asynchronous error."),
    op(17, "STREAM_QUERY", "stream:HANDLE", sync=True,
       doc="CUDA_SUCCESS when the stream is idle, CUDA_ERROR_NOT_READY otherwise."),
    op(18, "STREAM_WAIT_EVENT", "stream:HANDLE event:HANDLE flags:U32",
       doc="Later work in the stream waits for the event's last record."),
    op(19, "EVENT_CREATE", "ctx:HANDLE event:HANDLE flags:U32",
       doc="Create an event under a guest-chosen handle."),
    op(20, "EVENT_DESTROY", "event:HANDLE", teardown=True),
    op(21, "EVENT_RECORD", "event:HANDLE stream:HANDLE",
       doc="Record the event at the current end of the stream."),
    op(22, "EVENT_SYNCHRONIZE", "event:HANDLE", sync=True),
    op(23, "EVENT_QUERY", "event:HANDLE", sync=True),
    op(24, "EVENT_ELAPSED", "start:HANDLE end:HANDLE", results="ms:F32", sync=True),
    op(25, "MODULE_LOAD", "ctx:HANDLE module:HANDLE digest:HASH", sync=True, data_in="image",
       data_out=True,
       doc="Load a module (fatbin, cubin or PTX). Content-addressed (invariant 7): the guest "
           "first sends only the digest; a daemon without the image answers "
           "CRANE_NEED_IMAGE and the guest resends with the bytes. The reply describes "
           "kernels (parameter layouts) and globals (addresses, sizes) as JSON."),
    op(26, "MODULE_UNLOAD", "module:HANDLE", teardown=True),
    op(27, "FUNCTION_BIND", "function:HANDLE module:HANDLE", data_in="name",
       doc="Give a kernel of a loaded module a guest-chosen handle (no round trip: the guest "
           "already knows the kernel exists from the MODULE_LOAD reply)."),
    op(28, "LAUNCH", "function:HANDLE config:LAUNCH_CONFIG stream:HANDLE", data_in="params",
       writes_via_params=True, meter="launch",
       doc="Launch a kernel with its packed parameter buffer, in stream order; every "
           "allocation a pointer-sized parameter points into counts as written."),
    op(29, "FUNCTION_SET_MAX_DYNAMIC_SHARED", "function:HANDLE size:U32",
       doc="cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES): later launches "
           "of the function may use up to this much dynamic shared memory."),
    op(30, "LAUNCH_COOPERATIVE", "function:HANDLE config:LAUNCH_CONFIG stream:HANDLE",
       data_in="params", writes_via_params=True, meter="launch",
       doc="cuLaunchCooperativeKernel: as LAUNCH, but every block is resident at once and the "
           "kernel gets the grid-sync workspace (cooperative_groups grid.sync()); a grid above "
           "the device's co-residency limit fails with COOPERATIVE_LAUNCH_TOO_LARGE."),
    op(31, "DEVICE_RUNTIME_LIMITS", "ctx:HANDLE heap:SIZE pending:U32",
       doc="The context's CU_LIMIT_MALLOC_HEAP_SIZE and CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT "
           "(cuCtxSetLimit is answered in the guest): sent before a launch when they changed, "
           "for the device heap of malloc/free and the pending launches of dynamic parallelism."),
    op(32, "LAUNCH_CLUSTER",
       "function:HANDLE config:LAUNCH_CONFIG stream:HANDLE cluster_x:U32 cluster_y:U32 "
       "cluster_z:U32 flags:U32",
       data_in="params", writes_via_params=True, meter="launch",
       doc="cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (or a kernel whose "
           "REQUIRED_CLUSTER_* attributes were set): as LAUNCH, the grid made of clusters of "
           "cluster_x x cluster_y x cluster_z blocks that run together and share their shared "
           "memory. flags: 1 cooperative (as LAUNCH_COOPERATIVE), 2 the function allows "
           "non-portable cluster sizes (above 8 blocks)."),
    op(33, "MEMCPY_HTOD_STAGED", "dst:DEVPTR size:SIZE stream:HANDLE", data_in="src",
       writes=("dst",), meter="h2d", staged="h2d",
       doc="MEMCPY_HTOD whose size bytes (at most 16 MiB) come through the call ring's "
           "bulk area, in call order: a guest on the worker's host copies them there while "
           "the worker copies the previous ones to the device."),
    op(34, "MEMCPY_DTOH_STAGED", "src:DEVPTR size:SIZE stream:HANDLE", data_in="dst",
       sync=True, meter="d2h", staged="d2h",
       doc="MEMCPY_DTOH whose size bytes (at most MAX_CHUNK) go back through the call ring's "
           "bulk area, in call order (zeros when the read fails: the reply says so)."),
)
# fmt: on

OPS_BY_ID: dict[int, Op] = {o.id: o for o in OPS}
OPS_BY_NAME: dict[str, Op] = {o.name: o for o in OPS}

if len(OPS_BY_ID) != len(OPS) or len(OPS_BY_NAME) != len(OPS):
    raise RuntimeError("duplicate op id or name in crane.api.ops.OPS")
