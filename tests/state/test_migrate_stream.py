"""The migration transfer's data path (crane.migrate.stream): framing, parsing, reading back.

A round written by the checkpoint writer into a WireSink, cut into wire messages, parsed as the
destination daemon parses them and read back through a FrameReader must be the same checkpoint,
byte for byte, however the sections fall across messages; and the sink must never keep a
backend view past the write that handed it over (the cuda backend reuses its staging buffer).
"""

from __future__ import annotations

import io
import os
import threading

import numpy as np
import pytest

from crane.migrate.stream import (
    READ_CHUNK,
    WIRE_CHUNK,
    FrameReader,
    Outbox,
    StreamClosed,
    WireSink,
    parse_chunk,
)
from crane.state.checkpoint import CheckpointReader, CheckpointWriter, Kind
from crane.v1 import peer_pb2


def _messages(out: Outbox) -> list[bytes]:
    msgs = []
    while not out.q.empty():
        m = out.q.get()
        assert m is not None
        msgs.append(m)
    return msgs


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"data": b""},
        {"round": 3, "fresh": True, "end_of_round": True, "data": b"x" * 1000},
        {"session_id": "s", "token": b"\1\2", "identity_json": "{}", "device": -1, "data": b"d"},
    ],
)
def test_parse_chunk_agrees_with_protobuf(fields: dict) -> None:
    raw = peer_pb2.TransferChunk(**fields).SerializeToString()
    want = peer_pb2.TransferChunk.FromString(raw)
    got = parse_chunk(raw)
    assert isinstance(got.data, memoryview) and bytes(got.data) == want.data
    for name in ("session_id", "token", "identity_json", "device", "round", "fresh", "final"):
        assert getattr(got, name) == getattr(want, name), name
    assert got.end_of_round == want.end_of_round


def test_parse_chunk_refuses_a_truncated_message() -> None:
    raw = peer_pb2.TransferChunk(round=1, data=b"y" * 100).SerializeToString()
    with pytest.raises(ValueError):
        parse_chunk(raw[:-10])


def test_sink_frames_messages_protobuf_reads() -> None:
    out = Outbox(depth=1000)
    sink = WireSink(out, {"session_id": "abc", "device": -1})
    sink.begin(2, False, True)
    pieces = [b"a" * 10, memoryview(b"b" * (300 << 10)), b"c" * (2 * WIRE_CHUNK + 5)]
    for p in pieces:
        sink.write(p)
    sink.end()
    msgs = [peer_pb2.TransferChunk.FromString(m) for m in _messages(out)]
    assert b"".join(m.data for m in msgs) == b"".join(bytes(p) for p in pieces)
    assert msgs[0].session_id == "abc" and all(not m.session_id for m in msgs[1:])
    assert all(m.round == 2 and m.final for m in msgs)
    assert [m.end_of_round for m in msgs] == [False] * (len(msgs) - 1) + [True]
    assert max(len(m.data) for m in msgs) <= WIRE_CHUNK + (300 << 10) + 10
    assert sink.sent == sum(len(p) for p in pieces)


def test_sink_consumes_a_view_before_the_write_returns() -> None:
    """A backend view is valid only until the next backend call: overwriting the buffer right
    after the write must not change what was sent."""
    out = Outbox(depth=1000)
    sink = WireSink(out, {})
    buf = bytearray(b"1" * READ_CHUNK)
    small = bytearray(b"2" * 100)
    sink.write(memoryview(buf))
    sink.write(memoryview(small))
    buf[:] = b"x" * len(buf)
    small[:] = b"y" * len(small)
    sink.end()
    data = b"".join(bytes(parse_chunk(m).data) for m in _messages(out))
    assert data == b"1" * READ_CHUNK + b"2" * 100


def test_outbox_put_gives_up_once_the_call_is_over() -> None:
    out = Outbox(depth=1)
    out.put(b"m")
    threading.Timer(0.05, out.closed.set).start()
    with pytest.raises(StreamClosed):
        out.put(b"m")  # full, and nobody drains it
    out.end()  # never blocks


def _round(memory: list[tuple[int, bytes | memoryview]], level: int | None) -> list[bytes]:
    out = Outbox(depth=1000)
    sink = WireSink(out, {"session_id": "s"})
    sink.begin(1, False, True)
    w = CheckpointWriter(sink, level=level)  # type: ignore[arg-type]
    w.json(Kind.META, {"format": "crane-checkpoint", "mode": "final"})
    w.json(Kind.OBJECTS, {"allocations": ["x" * 2_000_000]})  # a graph larger than a message
    for addr, data in memory:
        w.memory(addr, data)
    w.finish()
    sink.end()
    return _messages(out)


@pytest.mark.parametrize("level", [None, 1])
@pytest.mark.parametrize("min_view", [None, 64 << 10])
def test_a_round_reads_back_through_the_frame_reader(level: int | None, min_view: int) -> None:
    noise = np.random.default_rng(5).standard_normal(READ_CHUNK // 4).astype(np.float32)
    memory: list[tuple[int, bytes | memoryview]] = [
        (0x10000, memoryview(noise.view(np.uint8))),  # a backend view, raw
        (0x900000, bytes(READ_CHUNK)),  # zeros: compressed at level 1
        (0x2000, os.urandom(12345)),  # small
    ]
    msgs = _round(memory, level)
    reader = FrameReader(min_view)
    for m in msgs:
        reader.q.put(bytes(parse_chunk(m).data))
    reader.q.put(None)
    r = CheckpointReader(reader, "round")  # type: ignore[arg-type]
    assert r.expect(Kind.META).json()["mode"] == "final"
    got = []
    views = 0
    for s in r.sections():
        if s.kind == Kind.OBJECTS:
            assert len(bytes(s.payload)) > 2_000_000
        if s.kind == Kind.MEMORY:
            addr, data = s.memory()
            got.append((addr, bytes(data)))
            views += isinstance(s.payload, memoryview)
    assert got == [(a, bytes(d)) for a, d in memory]
    if min_view is None:
        assert views == 0
    else:
        assert views >= 1  # the large raw chunk came straight from its message
    # the same bytes as the checkpoint writer writes to a file
    f = io.BytesIO()
    w = CheckpointWriter(f, level=level)
    w.json(Kind.META, {"format": "crane-checkpoint", "mode": "final"})
    w.json(Kind.OBJECTS, {"allocations": ["x" * 2_000_000]})
    for addr, data in memory:
        w.memory(addr, data)
    w.finish()
    assert b"".join(bytes(parse_chunk(m).data) for m in msgs) == f.getvalue()


def test_frame_reader_drain_discards_the_rest() -> None:
    reader = FrameReader(None)
    reader.q.put(b"abc")
    reader.q.put(b"def")
    assert reader.read(4) == b"abcd"
    reader.q.put(None)
    reader.drain()
    assert reader.read(10) == b""
