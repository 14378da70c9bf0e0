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

Synchronizing calls with the same kind of arguments (:func:`packable_sync`: stream, event and
context synchronizes and queries, ``cuMemGetInfo``, ...) travel as records too
(:data:`SYNC_OPS`), so the commonest synchronizing call needs no protobuf object on either
side. A batch that holds nothing but records and its flags is written and read by hand
(:func:`encode_batch`, :func:`records_only`): the very bytes protobuf writes, so the relay and
every parser still see an ordinary ``CallBatch``.
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
    "RECORD_OPS",
    "SYNC_OPS",
    "encode_batch",
    "layout",
    "packable",
    "packable_sync",
    "record_struct",
    "records",
    "records_only",
    "split",
]

#: Bytes per packed call.
RECORD = 64
#: The header: seq, op, padding (the arguments start 8-aligned).
HEADER = struct.Struct("<QI4x")
ARGS_AT = HEADER.size
ARGS_MAX = RECORD - ARGS_AT


def _fixed(o: Op) -> bool:
    """``o``'s calls carry nothing but fixed-size arguments that fit a record."""
    return (
        not o.retired
        and o.data_in is None
        and not o.data_out
        and not o.staged
        and struct.calcsize("<" + "".join(p.kind.code for p in o.args)) <= ARGS_MAX
    )


def packable(o: Op) -> bool:
    """True when ``o``'s asynchronous calls travel as packed records (the module's docstring)."""
    return not o.sync and _fixed(o)


def packable_sync(o: Op) -> bool:
    """True when ``o`` is a synchronizing op whose calls travel as records (its answer is a
    result code and the op's fixed-size results, ``Reply.out``, at most)."""
    return o.sync and _fixed(o)


def record_struct(o: Op) -> struct.Struct:
    """The whole record of one ``o`` call: ``pack(seq, op id, *args)`` (args one wire field
    each: a packable op has no LAUNCH_CONFIG, which only launches carry)."""
    codes = "".join(p.kind.code for p in o.args)
    size = struct.calcsize("<" + codes)
    return struct.Struct(f"<QI4x{codes}{ARGS_MAX - size}x")


#: Packable asynchronous ops by id.
PACKED_OPS: dict[int, Op] = {o.id: o for o in OPS if packable(o)}
#: Synchronizing ops whose calls travel as records, by id.
SYNC_OPS: dict[int, Op] = {o.id: o for o in OPS if packable_sync(o)}
#: Every op whose calls may come as a record.
RECORD_OPS: dict[int, Op] = {**PACKED_OPS, **SYNC_OPS}


def layout() -> str:
    """The record layout and the packed ops, as text (the protocol fingerprint hashes it)."""
    ops = ",".join(str(i) for i in sorted(PACKED_OPS))
    sync = ",".join(str(i) for i in sorted(SYNC_OPS))
    return f"packed record={RECORD} header={HEADER.format} ops={ops} sync={sync}"


# ---- a batch of records only, by hand --------------------------------------------------------
# CallBatch's flags (field 1, varint) then packed (field 3, length-delimited), in the order a
# protobuf serializer writes them: these are the bytes SerializeToString produces.
_FLAGS_TAG = 0x08
_PACKED_TAG = 0x1A


def encode_batch(flags: int, recs: bytes) -> bytes:
    """The serialized ``CallBatch{flags, packed: recs}`` (``flags`` below 128: every flag the
    guest sets) without building a message."""
    n = len(recs)
    if n < 0x80 and flags:  # one or two records: every idle synchronizing call
        return bytes((_FLAGS_TAG, flags, _PACKED_TAG, n)) + recs
    size = bytearray()
    while n >= 0x80:
        size.append(n & 0x7F | 0x80)
        n >>= 7
    size.append(n)
    head = bytes((_FLAGS_TAG, flags, _PACKED_TAG)) if flags else bytes((_PACKED_TAG,))
    return head + size + recs


def records_only(raw: bytes) -> bytes | None:
    """The records of a serialized ``CallBatch`` that holds nothing but them and its flags (a
    one-byte varint), as :func:`encode_batch` or protobuf writes it; None for any other batch
    (parsed as a message instead). The records themselves are not checked here."""
    if len(raw) > 4 and raw[0] == _FLAGS_TAG and raw[2] == _PACKED_TAG and raw[3] == len(raw) - 4:
        return raw[4:]  # (the common case: flags, then fewer than 128 bytes of records)
    at = 2 if len(raw) > 2 and raw[0] == _FLAGS_TAG and raw[1] < 0x80 else 0
    if len(raw) <= at or raw[at] != _PACKED_TAG:
        return None
    n = shift = 0
    for i in range(at + 1, min(at + 6, len(raw))):
        b = raw[i]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return raw[i + 1 :] if i + 1 + n == len(raw) else None
        shift += 7
    return None


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
