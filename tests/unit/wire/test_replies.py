"""The hand-encoded data reply and short answer are byte-identical to protobuf's own encoding."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from crane.v1 import guest_pb2
from crane.wire.replies import (
    ANSWER,
    ANSWER_OUT_MAX,
    decode_answer,
    encode_answer,
    encode_data_reply,
)


@given(st.integers(1, 2**63), st.binary(max_size=5000), st.integers(0, 2**63))
def test_matches_generated_serializer(seq: int, data: bytes, done: int) -> None:
    want = guest_pb2.ReplyBatch(
        replies=[guest_pb2.Reply(seq=seq, result=0, data=data)], done_seq=done
    ).SerializeToString()
    assert encode_data_reply(seq, data, done) == want
    assert encode_data_reply(seq, memoryview(data), done) == want


def test_large_payload_parses_back() -> None:
    data = bytes(range(256)) * 20000
    batch = guest_pb2.ReplyBatch.FromString(encode_data_reply(7, memoryview(data), 9))
    assert batch.replies[0].seq == 7 and batch.replies[0].data == data and batch.done_seq == 9


@given(
    st.integers(0, 2**64 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(max_size=ANSWER_OUT_MAX),
    st.integers(0, 2**64 - 1),
)
def test_a_short_answer_is_a_reply_batch_holding_only_its_answer(
    seq: int, result: int, out: bytes, done: int
) -> None:
    raw = encode_answer(seq, result, out, done)
    body = ANSWER.pack(seq, done, result) + out
    assert raw == guest_pb2.ReplyBatch(answer=body).SerializeToString()
    assert decode_answer(raw) == (seq, done, result, out)


def test_no_other_reply_batch_reads_as_a_short_answer() -> None:
    full = guest_pb2.ReplyBatch(replies=[guest_pb2.Reply(seq=1)], done_seq=1).SerializeToString()
    for raw in (full, encode_data_reply(3, b"x" * 40, 3), b"", encode_answer(1, 0, b"", 1)[:-1]):
        assert decode_answer(raw) is None
