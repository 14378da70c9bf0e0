"""Staged copies: calls whose bytes travel in the call ring's bulk area, not in the call.

``MEMCPY_HTOD_STAGED`` and ``MEMCPY_DTOH_STAGED`` (the table's ``staged`` ops) carry no data;
their bytes stream through a byte FIFO shared with the guest (:mod:`crane.wire.ring_bulk`), in
the order of the calls. The codec hands such a call's handler a :class:`StagedIn` or
:class:`StagedOut` in place of ``Call.data``: the handler reads or writes the bytes straight
between the FIFO and device memory while the guest copies the next ones.

Both sides must stay in step whatever happens to the call: after the call ran (or failed, or
was refused after a sticky fault) :meth:`StagedIn.finish` discards what the handler did not
read, :meth:`StagedOut.finish` writes zeros for what it did not write, so the next staged call
finds its own bytes. A call claiming more than its FIFO's ``STAGED_MAX`` bytes is refused
without touching the FIFO (a guest that sends one is broken; only its own session is affected).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.wire.ring import RingClosed
from crane.wire.ring_bulk import D2H, H2D, STAGED_MAX

__all__ = ["BulkPort", "StagedIn", "StagedOut", "run_staged", "staged_size"]


class BulkPort(Protocol):
    """The worker's side of a bulk area (``crane.wire.ring_bulk.BulkArea``)."""

    def put(self, which: int, src: Any, n: int) -> None: ...

    def get(self, which: int, dst: Any, n: int) -> None: ...


class _Staged:
    """The ``size`` bytes of one staged call, moved once, in order, through one FIFO."""

    def __init__(self, port: BulkPort, size: int) -> None:
        self._port = port
        self._size = size
        self._done = 0

    def __len__(self) -> int:
        return self._size

    def _move(self, fifo: int, buf: Any) -> None:
        n = memoryview(buf).nbytes
        if n > self._size - self._done:
            raise ValueError(f"moving {n} bytes of a staged copy with {self._size} left")
        try:
            if fifo == H2D:
                self._port.get(H2D, buf, n)
            else:
                self._port.put(D2H, buf, n)
        except RingClosed as e:
            self._done = self._size  # nothing more will move
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE, f"the copy's bytes did not arrive: {e}"
            ) from None
        self._done += n

    def _settle(self, fifo: int) -> None:
        """Skip (reading) or zero-fill (writing) what the call did not move."""
        rest = self._size - self._done
        self._done = self._size
        if rest > 0 and self._size <= STAGED_MAX[fifo]:
            with contextlib.suppress(RingClosed):  # the guest is gone: the drain sees it next
                if fifo == H2D:
                    self._port.get(H2D, None, rest)
                else:
                    self._port.put(D2H, None, rest)


class StagedIn(_Staged):
    """A host-to-device call's bytes, as the guest writes them."""

    def read_into(self, dst: Any) -> None:
        """Fill ``dst`` (a writable buffer: device memory's mapping, or host memory a backend
        uploads from) with the next bytes."""
        self._move(H2D, dst)

    def finish(self) -> None:
        """Skip what was not read (the call failed before its copy, or part way)."""
        self._settle(H2D)


class StagedOut(_Staged):
    """The bytes a device-to-host call owes the guest."""

    def write(self, src: Any) -> None:
        self._move(D2H, src)

    def finish(self) -> None:
        """Zeros for what was not written (the read failed: its reply says so)."""
        self._settle(D2H)


def run_staged(
    invoke: Callable[[Any, bytes, Any], Any], b: Any, args: bytes, port: BulkPort | None
) -> Any:
    """Run one staged call (``b`` its bound op) through ``invoke`` with its stream in place
    of data; the stream is settled whatever the call did."""
    if port is None:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE,
            f"{b.op.name} came without a bulk area (only the call ring has one)",
        )
    try:
        size = int(b.decode(args)[b.staged_size])
    except Exception:  # malformed: invoke reports it, nothing was staged for it
        return invoke(b, args, b"")
    stream = StagedIn(port, size) if b.op.staged == "h2d" else StagedOut(port, size)
    try:
        return invoke(b, args, stream)
    finally:
        stream.finish()


def staged_size(fifo: int, size: int) -> None:
    """Refuse a staged call larger than its FIFO's limit (the guest splits larger copies)."""
    if size > STAGED_MAX[fifo]:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE,
            f"staged copy of {size} bytes exceeds the per-call limit of {STAGED_MAX[fifo]}",
        )
