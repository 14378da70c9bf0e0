"""The daemon's peek at CallBatch.flags agrees with protobuf's own encoding."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from crane.v1 import guest_pb2
from crane.wire.batch_flags import EXPECTS_REPLY, peek_flags


@given(st.integers(0, 2**32 - 1), st.lists(st.binary(max_size=50), max_size=5))
def test_peek_matches_serializer(flags: int, datas: list[bytes]) -> None:
    batch = guest_pb2.CallBatch(flags=flags, calls=[guest_pb2.Call(seq=1, data=d) for d in datas])
    assert peek_flags(batch.SerializeToString()) == flags


def test_garbage_reads_as_no_flags() -> None:
    assert peek_flags(b"") == 0
    assert peek_flags(b"\x08") == 0
    assert peek_flags(b"\x08\xff\xff\xff\xff\xff\xff") == 0
    assert peek_flags(b"\x12\x00") == 0
    assert peek_flags(b"\x08\x01") == EXPECTS_REPLY
