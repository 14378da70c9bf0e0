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
  parameters lead to are marked in the dirty tracker once the op succeeded.
"""

from __future__ import annotations

import inspect
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.ops import OPS, Op
from crane.api.results import STICKY, CudaError
from crane.engine.model import SessionDevice

__all__ = ["Bound", "Dispatcher", "Refused", "bind"]


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
    teardown: bool
    data_in: bool
    #: The caller needs the outcome: a synchronous op or one that returns data.
    replies: bool


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
        teardown=o.teardown,
        data_in=o.data_in is not None,
        replies=o.sync or o.data_out,
    )


class Dispatcher:
    """Executes single calls against one session's device state."""

    def __init__(self, device: SessionDevice) -> None:
        self.device = device
        self.bound: dict[int, Bound] = {o.id: bind(device, o) for o in OPS if not o.retired}

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
        try:
            result = b.fn(*args, data) if b.data_in else b.fn(*args)
        except CudaError as e:
            if e.code in STICKY:
                dev.sticky = e
            raise
        if b.writes:
            for i in b.writes:
                dev.dirty.write(args[i])
        if b.writes_via_params:
            dev.dirty.launch(data)
        return result
