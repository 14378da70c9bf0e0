"""The checkpoint stream format: round trip, and a precise refusal for every damage."""

from __future__ import annotations

import io
import struct

import pytest

from crane.state.checkpoint import (
    MEMORY_CHUNK,
    CheckpointError,
    CheckpointReader,
    CheckpointWriter,
    Kind,
    read_meta,
)


def _write(memory: list[tuple[int, bytes]]) -> tuple[bytes, list[int]]:
    """A small checkpoint and the byte offset of every section boundary."""
    out = io.BytesIO()
    w = CheckpointWriter(out)
    w.json(Kind.META, {"format": "crane-checkpoint", "session": {"id": "x"}})
    w.section(Kind.IMAGE, b"\x01" * 32 + b"image bytes")
    w.json(Kind.OBJECTS, {"version": 1})
    for addr, data in memory:
        w.memory(addr, data)
    w.finish()
    data = out.getvalue()
    r = CheckpointReader(io.BytesIO(data))
    bounds = [s.offset for s in r.sections()]
    return data, bounds


MEM = [(0x1000, bytes(range(256)) * 4096), (0x200000, b"\0" * MEMORY_CHUNK), (0x9000, b"zq" * 7)]


def test_round_trip_is_streamed_and_verified() -> None:
    data, _ = _write(MEM)
    r = CheckpointReader(io.BytesIO(data))
    kinds = []
    got = []
    for s in r.sections():
        kinds.append(s.kind)
        if s.kind == Kind.MEMORY:
            got.append(s.memory())
    assert kinds == [Kind.META, Kind.IMAGE, Kind.OBJECTS] + [Kind.MEMORY] * 3 + [Kind.END]
    assert got == MEM
    assert r.memory_bytes == sum(len(d) for _, d in MEM)
    assert len(data) < MEMORY_CHUNK  # the zero chunk compressed
    assert read_meta(io.BytesIO(data))["session"] == {"id": "x"}


def _read_all(data: bytes) -> None:
    for s in CheckpointReader(io.BytesIO(data)).sections():
        if s.kind == Kind.MEMORY:
            s.memory()


def test_truncation_at_every_section_boundary_and_inside_is_refused() -> None:
    data, bounds = _write(MEM[:1] + MEM[2:])
    cuts = sorted({0, 5, 15, *bounds, *(b + 7 for b in bounds), *(b + 20 for b in bounds)})
    for cut in cuts:
        if cut >= len(data):
            continue
        with pytest.raises(CheckpointError, match=r"truncated|not a Crane"):
            _read_all(data[:cut])


def test_a_flipped_byte_anywhere_is_refused() -> None:
    data, _ = _write(MEM[2:])
    for pos in range(len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0x40
        with pytest.raises(CheckpointError):
            _read_all(bytes(bad))


def test_errors_name_the_section_and_the_reason() -> None:
    data, bounds = _write(MEM[2:])
    bad = bytearray(data)
    bad[bounds[2] + 20] ^= 1  # inside the OBJECTS payload
    with pytest.raises(CheckpointError, match=r"checksum mismatch in section 2 \(OBJECTS\)"):
        _read_all(bytes(bad))
    bad = bytearray(data)
    struct.pack_into("<Q", bad, bounds[3] + 8, 1 << 40)  # the MEMORY section's length
    with pytest.raises(CheckpointError, match="over the limit"):
        _read_all(bytes(bad))
    bad = bytearray(data)
    struct.pack_into("<H", bad, 8, 9)
    struct.pack_into("<I", bad, 12, __import__("zlib").crc32(bytes(bad[:12])))
    with pytest.raises(CheckpointError, match="format version 9; this build reads versions 1 "):
        _read_all(bytes(bad))
    with pytest.raises(CheckpointError, match="data after END"):
        _read_all(data + b"x")


def test_unknown_optional_sections_are_skipped_required_ones_refused() -> None:
    out = io.BytesIO()
    w = CheckpointWriter(out)
    w.json(Kind.META, {"format": "crane-checkpoint"})
    w.section(77, b"from the future", flags=1)
    w.finish()
    kinds = [s.kind for s in CheckpointReader(io.BytesIO(out.getvalue())).sections()]
    assert kinds == [Kind.META, Kind.END]
    out = io.BytesIO()
    w = CheckpointWriter(out)
    w.section(77, b"from the future")
    w.finish()
    with pytest.raises(CheckpointError, match="unknown kind 77"):
        _read_all(out.getvalue())


def test_memory_chunks_are_bounded() -> None:
    w = CheckpointWriter(io.BytesIO())
    with pytest.raises(ValueError, match="exceeds"):
        w.memory(0, b"\0" * (MEMORY_CHUNK + 1))
    w.abort()
