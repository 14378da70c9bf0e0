"""A batch's packed calls (``CallBatch.packed``, :mod:`crane.wire.packed`) as NumPy columns.

The worker reads the fixed-size records without an object per call: one structured view of
the whole byte string gives every record's ``seq`` and ``op``; a *run* (consecutive records of
one op) is viewed again with that op's argument columns, whose dtype comes from the call
table (an argument's :class:`~crane.api.ops.Kind` code), never from a list kept here. The
codec (crane.engine.codec) walks the runs in seq order among the batch's plain calls. A few
records (a synchronizing call and what was queued before it) are read with ``struct``
instead: NumPy's set-up costs more than the records are worth there.
"""

from __future__ import annotations

import bisect
import struct
from functools import cache
from typing import NamedTuple

import numpy as np

from crane.api.ops import Op
from crane.wire.packed import ARGS_AT, HEADER, RECORD, RECORD_OPS

__all__ = ["FEW", "PackedCalls", "RecordCall", "record_calls", "record_dtype"]

#: NumPy's little-endian type for each struct code a packable op's argument may have.
_NP = {"Q": "<u8", "I": "<u4", "i": "<i4", "f": "<f4", "32s": "S32"}
_HEADER = np.dtype({"names": ["seq", "op"], "formats": ["<u8", "<u4"], "itemsize": RECORD})
#: Records up to this many are read with ``struct`` (no run handler takes so few).
FEW = 8
_HEADERS = struct.Struct(HEADER.format + f"{RECORD - HEADER.size}x").iter_unpack


class RecordCall(NamedTuple):
    """One record read as the plain calls of a batch are (``Call``'s fields)."""

    seq: int
    op: int
    args: bytes
    data: bytes = b""


_new = tuple.__new__


def record_calls(packed: bytes) -> list[RecordCall]:
    """A few records (at most :data:`FEW`: a synchronizing call and what was queued before
    it) as calls, each with its op's argument bytes (none for an op that does not travel as
    a record: the codec refuses it). ``ValueError`` as :class:`PackedCalls` raises it."""
    if len(packed) % RECORD:
        raise ValueError(f"packed calls of {len(packed)} bytes are not {RECORD}-byte records")
    out = []
    last = 0
    for at in range(0, len(packed), RECORD):
        seq, op = HEADER.unpack_from(packed, at)
        if seq <= last:
            raise ValueError("packed calls are not in ascending sequence order")
        last = seq
        o = RECORD_OPS.get(op)
        size = o.args_size if o is not None else 0
        args = packed[at + ARGS_AT : at + ARGS_AT + size]
        out.append(_new(RecordCall, (seq, op, args, b"")))  # (a namedtuple's __new__ is Python)
    return out


@cache
def record_dtype(o: Op) -> np.dtype:
    """One packed ``o`` call: its arguments by name, at their offsets in the record."""
    names, formats, offsets = [], [], []
    at = ARGS_AT
    for p in o.args:
        names.append(p.name)
        formats.append(_NP[p.kind.code])
        offsets.append(at)
        at += np.dtype(_NP[p.kind.code]).itemsize
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": RECORD})


class PackedCalls:
    """The records of one batch, walked in order (:meth:`until`)."""

    def __init__(self, packed: bytes) -> None:
        """``ValueError`` when ``packed`` is not whole records or not in ascending seq."""
        if len(packed) % RECORD:
            raise ValueError(f"packed calls of {len(packed)} bytes are not {RECORD}-byte records")
        self.raw = packed
        self.n = n = len(packed) // RECORD
        if n <= FEW:
            heads = list(_HEADERS(packed))
            #: the seqs as Python ints (the codec's loops index them one by one)
            self.seqs: list[int] = [h[0] for h in heads]
            self.ops: list[int] = [h[1] for h in heads]
            if any(a >= b for a, b in zip(self.seqs, self.seqs[1:], strict=False)):
                raise ValueError("packed calls are not in ascending sequence order")
            ops = self.ops
            cuts = [i for i in range(1, n) if ops[i] != ops[i - 1]]
        else:
            head = np.frombuffer(packed, _HEADER)
            seq, op = head["seq"], head["op"]
            self.seqs = seq.tolist()
            self.ops = op.tolist()
            if not (seq[1:] > seq[:-1]).all():
                raise ValueError("packed calls are not in ascending sequence order")
            cuts = (np.flatnonzero(op[1:] != op[:-1]) + 1).tolist()
        #: where each run of one op starts, and the end
        self._cuts = [*cuts, n]
        self._cut = 0  # the next run's end, as an index into _cuts
        self.at = 0  # the first record not walked yet

    @property
    def last_seq(self) -> int:
        return self.seqs[-1] if self.n else 0

    def next_seq(self) -> int:
        """The seq of the next record not walked yet (past every seq when none is left)."""
        return self.seqs[self.at] if self.at < self.n else 1 << 64

    def until(self, seq: int) -> tuple[int, int, int] | None:
        """The next run of records before ``seq`` as ``(op, first, end)`` record indexes
        (moving past it), or None when the next record is at or after ``seq``."""
        i = self.at
        if i >= self.n or self.seqs[i] >= seq:
            return None
        while self._cuts[self._cut] <= i:
            self._cut += 1
        end = self._cuts[self._cut]
        if self.seqs[end - 1] >= seq:  # a plain call falls inside the run
            end = bisect.bisect_left(self.seqs, seq, i, end)
        self.at = end
        return self.ops[i], i, end

    def columns(self, o: Op, first: int, end: int) -> np.ndarray:
        """Records ``[first, end)`` (all of op ``o``) as a structured array of its arguments."""
        return np.frombuffer(self.raw, record_dtype(o), end - first, first * RECORD)
