"""The hand-encoded data reply is byte-identical to protobuf's own encoding."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from crane.v1 import guest_pb2
from crane.wire.replies import encode_data_reply


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
