"""Packed calls' records (crane.wire.packed): which ops travel packed (decided from the call
table), the bytes of a record (the header, then exactly what Op.pack writes), and the worker's
NumPy view of them (crane.engine.runs) reading back what the guest packed, and a batch of
records only written and read by hand as protobuf would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from crane.api.ops import OPS, OPS_BY_NAME, Kind, Op
from crane.engine.runs import PackedCalls
from crane.v1 import guest_pb2
from crane.wire import packed
from crane.wire.packed import HEADER, PACKED_OPS, RECORD, packable, record_struct


def _values(o: Op, salt: int) -> list[object]:
    out: list[object] = []
    for i, p in enumerate(o.args):
        if p.kind is Kind.HASH:
            out.append(bytes([i + salt]) * 32)
        elif p.kind is Kind.F32:
            out.append(1.5 + salt)
        elif p.kind is Kind.I32:
            out.append(-i - 1 - salt)
        else:
            out.append(0x1000 + i + salt)
    return out


def test_the_hot_asynchronous_ops_are_packed_and_nothing_that_needs_more() -> None:
    for name in ("MEMSET", "EVENT_RECORD", "STREAM_WAIT_EVENT", "MEMCPY_DTOD", "MEM_ALLOC"):
        assert OPS_BY_NAME[name].id in PACKED_OPS, name
    for o in OPS:
        if o.sync or o.data_in or o.data_out or o.staged or o.retired:
            assert not packable(o) and o.id not in PACKED_OPS, o.name


def test_a_record_is_the_header_then_what_op_pack_writes() -> None:
    for o in PACKED_OPS.values():
        values = _values(o, 3)
        rec = record_struct(o).pack(77, o.id, *values)
        assert len(rec) == RECORD, o.name
        args = o.pack(*values)
        assert rec == HEADER.pack(77, o.id) + args + bytes(RECORD - HEADER.size - len(args))


def test_the_worker_reads_back_every_packed_op_s_arguments() -> None:
    for o in PACKED_OPS.values():
        recs = b"".join(record_struct(o).pack(10 + k, o.id, *_values(o, k)) for k in range(3))
        calls = PackedCalls(recs)
        assert calls.until(1 << 64) == (o.id, 0, 3) and calls.seqs == [10, 11, 12]
        cols = calls.columns(o, 0, 3)
        for k in range(3):
            assert [cols[p.name][k].item() for p in o.args] == _values(o, k), o.name


def test_runs_stop_at_another_op_and_before_a_plain_call_s_seq() -> None:
    memset, record = OPS_BY_NAME["MEMSET"], OPS_BY_NAME["EVENT_RECORD"]
    ms, er = record_struct(memset), record_struct(record)
    recs = b"".join(ms.pack(s, memset.id, 0x1000, 1, 1, 1, 0) for s in (1, 2, 3, 5))
    recs += er.pack(6, record.id, 9, 0)
    calls = PackedCalls(recs)
    assert calls.until(4) == (memset.id, 0, 3)  # a plain call has seq 4
    assert calls.until(4) is None and calls.next_seq() == 5
    assert calls.until(1 << 64) == (memset.id, 3, 4)
    assert calls.until(1 << 64) == (record.id, 4, 5)
    assert calls.until(1 << 64) is None and calls.last_seq == 6


def test_split_cuts_records_at_sequence_bounds() -> None:
    er = OPS_BY_NAME["EVENT_RECORD"]
    recs = b"".join(record_struct(er).pack(s, er.id, 9, 0) for s in (1, 4, 5, 9))
    pieces = packed.split(recs, [4, 8])
    assert [[s for s, _, _ in packed.records(p)] for p in pieces] == [[1, 4], [5], [9]]


@given(st.integers(0, 127), st.binary(min_size=1, max_size=70000))
@settings(max_examples=60)
def test_a_batch_of_records_only_is_what_protobuf_writes_and_reads(flags: int, recs: bytes) -> None:
    raw = packed.encode_batch(flags, recs)
    assert raw == guest_pb2.CallBatch(flags=flags, packed=recs).SerializeToString()
    assert packed.records_only(raw) == recs


def test_any_other_batch_is_not_taken_for_records_only() -> None:
    with_call = guest_pb2.CallBatch(flags=1, packed=b"r" * RECORD)
    with_call.calls.add(seq=1, op=2)
    wide_flags = guest_pb2.CallBatch(flags=1 << 20, packed=b"r" * RECORD)
    for raw in (with_call.SerializeToString(), wide_flags.SerializeToString(), b"", b"\x08\x01"):
        assert packed.records_only(raw) is None
    cut = packed.encode_batch(1, b"r" * 300)
    assert packed.records_only(cut[:-1]) is None and packed.records_only(cut + b"\x10\x01") is None


def test_synchronizing_calls_with_fixed_arguments_travel_as_records() -> None:
    for name in ("STREAM_SYNCHRONIZE", "CTX_SYNCHRONIZE", "EVENT_SYNCHRONIZE", "STREAM_QUERY"):
        assert OPS_BY_NAME[name].id in packed.SYNC_OPS, name
    for o in OPS:
        if o.data_in or o.data_out or o.staged or o.retired or not o.sync:
            assert o.id not in packed.SYNC_OPS, o.name
    assert not set(packed.SYNC_OPS) & set(PACKED_OPS)
