"""A batch's packed calls (``CallBatch.packed``, :mod:`crane.wire.packed`) as NumPy columns.

The worker reads the fixed-size records without an object per call: one structured view of
the whole byte string gives every record's ``seq`` and ``op``; a *run* (consecutive records of
one op) is viewed again with that op's argument columns, whose dtype comes from the call
table (an argument's :class:`~crane.api.ops.Kind` code), never from a list kept here. The
codec (crane.engine.codec) walks the runs in seq order among the batch's plain calls.
"""

from __future__ import annotations

import bisect
from functools import cache

import numpy as np

from crane.api.ops import Op
from crane.wire.packed import ARGS_AT, RECORD

__all__ = ["PackedCalls", "record_dtype"]

#: NumPy's little-endian type for each struct code a packable op's argument may have.
_NP = {"Q": "<u8", "I": "<u4", "i": "<i4", "f": "<f4", "32s": "S32"}
_HEADER = np.dtype({"names": ["seq", "op"], "formats": ["<u8", "<u4"], "itemsize": RECORD})


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
        head = np.frombuffer(packed, _HEADER)
        self.seq = head["seq"]
        self.op = head["op"]
        self.n = len(head)
        #: the seqs as Python ints (the codec's loops index them one by one)
        self.seqs: list[int] = self.seq.tolist()
        if self.n > 1 and not (self.seq[1:] > self.seq[:-1]).all():
            raise ValueError("packed calls are not in ascending sequence order")
        #: where each run of one op starts, and the end
        self._cuts = [*(np.flatnonzero(self.op[1:] != self.op[:-1]) + 1).tolist(), self.n]
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
        return int(self.op[i]), i, end

    def columns(self, o: Op, first: int, end: int) -> np.ndarray:
        """Records ``[first, end)`` (all of op ``o``) as a structured array of its arguments."""
        return np.frombuffer(self.raw, record_dtype(o), end - first, first * RECORD)
