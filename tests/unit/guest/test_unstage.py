"""Resending staged copies after a resume: as plain copies with their bytes inline, in batches
that fit any path, the calls that already ran left out, every other call kept in order."""

from __future__ import annotations

from crane.api.ops import OPS_BY_NAME as O
from crane.guest.ring_bulk import unstage
from crane.v1 import guest_pb2
from crane.wire import packed
from crane.wire.batch_flags import EXPECTS_REPLY
from crane.wire.packed import record_struct
from crane.wire.status import MAX_CHUNK


def _call(seq: int, name: str, *args: int, data: bytes = b"") -> guest_pb2.Call:
    return guest_pb2.Call(seq=seq, op=O[name].id, args=O[name].pack(*args), data=data)


def test_a_batch_without_staged_calls_is_resent_as_it_is() -> None:
    b = guest_pb2.CallBatch(calls=[_call(1, "MEMSET", 0x1000, 1, 1, 8, 0)])
    assert unstage(b, {}, 0) == [b]


def test_staged_calls_become_plain_copies_in_batches_that_fit() -> None:
    src = memoryview(bytes(range(256)) * (MAX_CHUNK // 256))
    b = guest_pb2.CallBatch(flags=EXPECTS_REPLY)
    b.calls.append(_call(5, "MEMSET", 0x1000, 1, 1, 8, 0))
    b.calls.append(_call(6, "MEMCPY_HTOD_STAGED", 0x2000, MAX_CHUNK, 7))  # ran already
    b.calls.append(_call(7, "MEMCPY_HTOD_STAGED", 0x3000, MAX_CHUNK, 7))
    b.calls.append(_call(8, "MEMCPY_HTOD_STAGED", 0x4000, 100, 7))
    b.calls.append(_call(9, "MEMCPY_DTOH_STAGED", 0x5000, MAX_CHUNK, 7))
    sources = {7: src.tobytes, 8: src[:100].tobytes}  # 6 ran: its bytes may be gone
    out = unstage(b, sources, done_seq=6)
    calls = [c for batch in out for c in batch.calls]
    assert [c.seq for c in calls] == [5, 7, 8, 9]  # the memset stays: the worker skips it
    assert all(batch.flags == EXPECTS_REPLY for batch in out)
    htod, dtoh = O["MEMCPY_HTOD"], O["MEMCPY_DTOH"]
    assert calls[1].op == htod.id and htod.unpack(calls[1].args) == (0x3000, 7)
    assert calls[1].data == bytes(src)
    assert calls[2].op == htod.id and calls[2].data == bytes(src[:100])
    assert calls[3].op == dtoh.id and dtoh.unpack(calls[3].args) == (0x5000, MAX_CHUNK, 7)
    # each batch carries at most about MAX_CHUNK bytes (a gRPC message holds it)
    for batch in out:
        moved = sum(
            len(c.data) or (dtoh.unpack(c.args)[1] if c.op == dtoh.id else 0) for c in batch.calls
        )
        assert moved <= MAX_CHUNK + 100
    assert len(out) >= 3


def test_packed_calls_stay_between_the_same_calls_when_a_batch_is_cut() -> None:
    src = memoryview(bytes(MAX_CHUNK))
    memset = O["MEMSET"]
    rec = record_struct(memset)
    b = guest_pb2.CallBatch()
    b.calls.append(_call(2, "MEMCPY_HTOD_STAGED", 0x3000, MAX_CHUNK, 7))
    b.calls.append(_call(4, "MEMCPY_HTOD_STAGED", 0x4000, MAX_CHUNK, 7))
    b.packed = b"".join(rec.pack(s, memset.id, 0x1000 + s, s, 1, 1, 0) for s in (1, 3, 5, 6))
    out = unstage(b, {2: src.tobytes, 4: src.tobytes}, done_seq=0)
    assert len(out) == 2
    order = [
        sorted([c.seq for c in piece.calls] + [s for s, _, _ in packed.records(piece.packed)])
        for piece in out
    ]
    assert order == [[1, 2], [3, 4, 5, 6]]  # every call once, in order across the pieces
