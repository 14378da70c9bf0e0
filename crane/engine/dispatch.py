"""The thin dispatcher: each op of the call table bound to its method, and the table's rules.

Binding is by name: an op's handler is ``SessionDevice.<op.handler>`` and its parameters must
be called as the op's arguments (then its data), in order, or the dispatcher refuses to start:
the table and the device state cannot drift apart silently. Arguments are decoded by the op
(a launch's configuration arrives as one :class:`~crane.api.ops.LaunchConfig`).

The rules that depend on the op come from the table, not from lists kept here:

* after a sticky fault (:data:`crane.api.results.STICKY`) only ``teardown`` ops run; every
  other call is refused with the fault, quietly (the fault was reported once, when it
  happened), as a GPU fails every call on a faulted context;
* an op's ``writes`` arguments and, for launches (``writes_via_params``), whatever the
  parameters lead to are marked in the dirty tracker once the op succeeded;
* with accounting on (a :class:`~crane.engine.meter.Meter`), a launch or copy that succeeded
  (``Op.meter``) is added to the session's GPU work with its kernel or its bytes (every call
  is counted and timed by the codec's loop).

A batch's packed calls (crane.wire.packed) run as *runs* of one op where the device has a
handler for a whole run (``SessionDevice.<handler>_run``, bound by name like the single
handlers: :func:`bind_runs`); it runs the calls it can vouch for and stops before the first it
might refuse, which then runs as a single call, so errors, their messages and the sticky rule
are the single path's.
"""

from __future__ import annotations

import inspect
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from crane.api.generated.cuda_enums import CUresult
from crane.api.ops import OPS, Op
from crane.api.results import STICKY, CudaError
from crane.engine.meter import Meter
from crane.engine.model import SessionDevice
from crane.wire.packed import PACKED_OPS, RECORD_OPS

__all__ = ["Bound", "Dispatcher", "Refused", "bind", "bind_runs"]

_now = time.monotonic_ns


class Refused(Exception):
    """A call not run because the context holds a sticky fault (``fault`` is it)."""

    def __init__(self, fault: CudaError) -> None:
        super().__init__(fault.message)
        self.fault = fault


@dataclass(frozen=True, slots=True)
class Bound:
    """One op bound to the method that executes it, with the table's rules for it unpacked
    (the worker consults them on every call)."""

    op: Op
    fn: Callable[..., Any]
    decode: Callable[[bytes], tuple]  # raw argument bytes -> one value per argument
    writes: tuple[int, ...]  # indexes of the args whose allocations the op may write
    writes_via_params: bool
    #: A launch's ``function`` arg (whose kernel's parameter layout the tracker reads), or -1.
    kernel_arg: int
    teardown: bool
    data_in: bool
    #: The caller needs the outcome: a synchronous op or one that returns data.
    replies: bool
    #: Accounting needs its arguments: a launch (the kernel) or a copy (the bytes).
    work: bool
    #: Accounting needs its own duration: a launch's is its kernel's time (a copy's time is
    #: its call's, which the codec's loop takes anyway).
    timed: bool
    #: Its bytes travel in the bulk area (crane.engine.staged): "h2d", "d2h", or "".
    staged: str = ""
    #: The index of a staged op's ``size`` argument.
    staged_size: int = -1


def bind(device: SessionDevice, o: Op) -> Bound:
    """``o`` bound to ``device.<o.handler>``, whose parameters must be named as ``o``'s."""
    fn = getattr(device, o.handler, None)
    if fn is None:
        raise RuntimeError(f"the session device state has no handler for op {o.name}")
    names = tuple(inspect.signature(fn).parameters)
    if names != o.param_names:
        raise RuntimeError(
            f"handler {o.handler}{names} does not take op {o.name}'s arguments {o.param_names}"
        )
    args = [p.name for p in o.args]
    return Bound(
        op=o,
        fn=fn,
        decode=o.decoder,
        writes=tuple(args.index(w) for w in o.writes),
        writes_via_params=o.writes_via_params,
        kernel_arg=args.index("function") if o.writes_via_params else -1,
        teardown=o.teardown,
        data_in=o.data_in is not None,
        replies=o.sync or o.data_out,
        work=o.meter in ("launch", "h2d", "d2h", "d2d"),
        timed=o.meter == "launch",
        staged=o.staged,
        staged_size=args.index("size") if o.staged else -1,
    )


def bind_runs(device: SessionDevice) -> dict[int, Callable[..., int]]:
    """Per packed op id, the device's handler of a run of its calls (``<handler>_run``,
    parameters named as the op's arguments, one column each), where the device has one. Ops
    the meter needs each call's arguments of (launches, copies) are left to single calls."""
    out = {}
    for name, fn in device.run_handlers().items():
        o = next((o for o in PACKED_OPS.values() if o.handler == name), None)
        if o is None:
            raise RuntimeError(f"run handler {name!r} is not a packed op's")
        names = tuple(inspect.signature(fn).parameters)
        if names != tuple(p.name for p in o.args):
            raise RuntimeError(f"run handler {name}_run{names} does not take op {o.name}'s args")
        if o.meter in ("launch", "h2d", "d2h", "d2d"):
            raise RuntimeError(f"op {o.name} is metered per call: no run handler")
        out[o.id] = fn
    return out


class Dispatcher:
    """Executes single calls, and runs of packed calls, against one session's device state."""

    def __init__(self, device: SessionDevice, meter: Meter | None = None) -> None:
        self.device = device
        self.meter = meter
        self.bound: dict[int, Bound] = {o.id: bind(device, o) for o in OPS if not o.retired}
        #: The ops whose calls may come as records (crane.wire.packed), bound.
        self.record_bound = {i: b for i, b in self.bound.items() if i in RECORD_OPS}
        #: Per packed op id, the handler of a run of its calls (:meth:`invoke_run`).
        self.runs = bind_runs(device)

    def invoke_run(self, b: Bound, fn: Callable[..., int], cols: np.ndarray) -> int:
        """Run calls of ``b``'s op from the first (their arguments as ``cols``, one record
        each) through its run handler ``fn``: how many ran (the next one, if any, goes to
        :meth:`invoke`, which runs or refuses it as a single call); 0 after a sticky
        fault (each call is refused alone). The table's dirty rule is applied as one."""
        dev = self.device
        if dev.sticky is not None and not b.teardown:
            return 0
        args = [cols[p.name] for p in b.op.args]
        n = fn(*args)
        if n and b.writes:
            for i in b.writes:
                dev.dirty.write_many(args[i][:n])
        return n

    def invoke(self, b: Bound, raw_args: bytes, data: bytes) -> Any:
        """Run one call of ``b``'s op; its result, or :class:`CudaError` / :class:`Refused`."""
        try:
            args = b.decode(raw_args)
        except struct.error as e:
            why = f"malformed arguments: {e}"
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, why) from None
        dev = self.device
        if dev.sticky is not None and not b.teardown:
            raise Refused(dev.sticky)
        meter = self.meter if b.work else None
        t0 = _now() if meter is not None and b.timed else 0
        try:
            result = b.fn(*args, data) if b.data_in else b.fn(*args)
        except CudaError as e:
            if e.code in STICKY:
                dev.sticky = e
            raise
        if meter is not None:
            meter.work_call(b.op.id, args, data, _now() - t0 if t0 else 0)
        if b.writes:
            for i in b.writes:
                dev.dirty.write(args[i])
        if b.writes_via_params:
            dev.dirty.launch(data, dev.param_layout(args[b.kernel_arg]))
        return result
