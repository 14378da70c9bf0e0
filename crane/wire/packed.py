"""Packed calls: a batch's small asynchronous calls as fixed-size records (``CallBatch.packed``).

Why: a protobuf ``Call`` costs a message object per call on both sides (the guest builds one,
the worker's loop reads three fields of another), about half of what a one-byte memset cost
end to end. The calls that return nothing and carry only fixed-size arguments (memsets, event
records, stream waits, creations under guest-chosen handles: the bulk of what an inference
loop or a training step enqueues) travel instead as records of :data:`RECORD` bytes, so the
worker reads a run of them as columns (one NumPy view, no object per call) and the guest
appends one ``struct`` pack per call.

Which ops are packed is decided here from the call table (:func:`packable`), never listed:
asynchronous, no variable-length input or output, not staged, arguments of at most
:data:`ARGS_MAX` bytes. A record is ``seq`` (u64), ``op`` (u32), 4 zero bytes, then the op's
arguments exactly as :meth:`crane.api.ops.Op.pack` writes them, zero-padded to
:data:`RECORD`. A batch's calls are the union of ``calls`` and ``packed``; the worker runs them
in ``seq`` order (the guest numbers every call of a batch in order under one lock, so both
lists are sorted). The layout enters the protocol fingerprint (:func:`layout`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from crane.api.ops import OPS, Op

__all__ = [
    "ARGS_AT",
    "ARGS_MAX",
    "HEADER",
    "PACKED_OPS",
    "RECORD",
    "layout",
    "packable",
    "record_struct",
    "records",
    "split",
]

#: Bytes per packed call.
RECORD = 64
#: The header: seq, op, padding (the arguments start 8-aligned).
HEADER = struct.Struct("<QI4x")
ARGS_AT = HEADER.size
ARGS_MAX = RECORD - ARGS_AT


def packable(o: Op) -> bool:
    """True when ``o``'s calls travel as packed records (see the module's docstring)."""
    return (
        not o.retired
        and not o.sync
        and o.data_in is None
        and not o.data_out
        and not o.staged
        and struct.calcsize("<" + "".join(p.kind.code for p in o.args)) <= ARGS_MAX
    )


def record_struct(o: Op) -> struct.Struct:
    """The whole record of one ``o`` call: ``pack(seq, op id, *args)`` (args one wire field
    each: a packable op has no LAUNCH_CONFIG, which only launches carry)."""
    codes = "".join(p.kind.code for p in o.args)
    size = struct.calcsize("<" + codes)
    return struct.Struct(f"<QI4x{codes}{ARGS_MAX - size}x")


#: Packable ops by id.
PACKED_OPS: dict[int, Op] = {o.id: o for o in OPS if packable(o)}


def layout() -> str:
    """The record layout and the packed ops, as text (the protocol fingerprint hashes it)."""
    return f"packed record={RECORD} header={HEADER.format} ops=" + ",".join(
        str(i) for i in sorted(PACKED_OPS)
    )


def records(packed: bytes) -> Iterator[tuple[int, int, bytes]]:
    """``(seq, op, record)`` of each record (the guest's resend path; the worker reads runs of
    records as NumPy columns instead). ``ValueError`` when ``packed`` is not whole records."""
    if len(packed) % RECORD:
        raise ValueError(f"packed calls of {len(packed)} bytes are not {RECORD}-byte records")
    for at in range(0, len(packed), RECORD):
        seq, op = HEADER.unpack_from(packed, at)
        yield seq, op, packed[at : at + RECORD]


def split(packed: bytes, bounds: list[int]) -> list[bytes]:
    """``packed`` cut before the first record whose seq exceeds each of the ascending
    ``bounds``: ``len(bounds) + 1`` pieces, the last holding the records after every bound
    (a resend splits a batch in several and each piece must keep its place among the calls)."""
    out: list[bytearray] = [bytearray() for _ in range(len(bounds) + 1)]
    i = 0
    for seq, _, rec in records(packed):
        while i < len(bounds) and seq > bounds[i]:
            i += 1
        out[i] += rec
    return [bytes(b) for b in out]
