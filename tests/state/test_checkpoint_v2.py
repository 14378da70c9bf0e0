"""Checkpoint format 2: what the guest was told travels in META, version 1 files still read;
memory is stored compressed only where that pays; a restore reads ahead of the device writes."""

from __future__ import annotations

import io
import struct
import threading
import zlib

import numpy as np
import pytest

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.backends.sim.profiles import get_profile
from crane.state.checkpoint import (
    FORMAT_VERSION,
    MEMORY_CHUNK,
    CheckpointError,
    CheckpointReader,
    CheckpointWriter,
    Kind,
    prefetched,
    read_head,
    worth_compressing,
)
from crane.state.told import identity_to_json, told_from_meta, told_to_json
from crane.v1 import common_pb2

NOISE = np.random.default_rng(7).standard_normal(MEMORY_CHUNK // 4).astype(np.float32).tobytes()
SMEM_OPTIN = int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)


def _file(memory: list[tuple[int, bytes | memoryview]], version: int = FORMAT_VERSION) -> bytes:
    out = io.BytesIO()
    w = CheckpointWriter(out)
    w.json(Kind.META, {"format": "crane-checkpoint", "session": {"id": "x"}})
    w.section(Kind.IMAGE, b"\x02" * 32 + b"an image")
    w.json(Kind.OBJECTS, {"version": 1, "allocations": []})
    for addr, data in memory:
        w.memory(addr, data)
    w.finish()
    data = bytearray(out.getvalue())
    if version != FORMAT_VERSION:  # as an older build wrote it (the layout is the same)
        struct.pack_into("<H", data, 8, version)
        struct.pack_into("<I", data, 12, zlib.crc32(bytes(data[:12])))
    return bytes(data)


def _codecs(data: bytes) -> list[int]:
    return [
        struct.unpack_from("<QII", s.payload)[2]
        for s in CheckpointReader(io.BytesIO(data)).sections()
        if s.kind == Kind.MEMORY
    ]


def test_noise_is_stored_raw_and_redundant_memory_compressed() -> None:
    sparse = bytearray(MEMORY_CHUNK)
    sparse[::4096] = b"\x01" * (MEMORY_CHUNK // 4096)
    assert not worth_compressing(NOISE) and worth_compressing(bytes(sparse))
    half = NOISE[: MEMORY_CHUNK // 2] + bytes(MEMORY_CHUNK // 2)  # judged on spread samples
    assert worth_compressing(half)
    data = _file([(0x10000, memoryview(NOISE)), (0x20000000, bytes(sparse)), (0x40000000, half)])
    assert _codecs(data) == [0, 1, 1]  # raw, zstd, zstd
    got = [
        (a, bytes(d))
        for s in CheckpointReader(io.BytesIO(data)).sections()
        if s.kind == Kind.MEMORY
        for a, d in [s.memory()]
    ]
    assert got == [(0x10000, NOISE), (0x20000000, bytes(sparse)), (0x40000000, half)]
    assert len(data) < len(NOISE) + len(half)  # the sparse chunk and half the other shrank


def test_a_view_is_written_before_the_writer_returns() -> None:
    """A memoryview is only valid until the caller's next backend call: the writer must not
    keep it, whether it stores the chunk raw or compresses it later."""
    buf = bytearray(NOISE)
    zeros = bytearray(MEMORY_CHUNK)
    out = io.BytesIO()
    w = CheckpointWriter(out)
    w.json(Kind.META, {"format": "crane-checkpoint"})
    w.memory(0, memoryview(buf))
    w.memory(MEMORY_CHUNK, memoryview(zeros))
    buf[:] = bytes(len(buf))  # the "device" changes under the views
    zeros[:] = b"\xff" * len(zeros)
    w.finish()
    mem = [
        s.memory()
        for s in CheckpointReader(io.BytesIO(out.getvalue())).sections()
        if s.kind == Kind.MEMORY
    ]
    assert [(a, bytes(d)) for a, d in mem] == [(0, NOISE), (MEMORY_CHUNK, bytes(MEMORY_CHUNK))]


def test_version_1_files_are_read_and_other_versions_refused_by_name() -> None:
    old = _file([(0, b"abc" * 100)], version=1)
    r = CheckpointReader(io.BytesIO(old))
    assert r.version == 1 and [s.kind for s in r.sections()][-1] == Kind.END
    head = read_head(io.BytesIO(old), "old.ckpt")
    assert head.version == 1 and head.graph == {"version": 1, "allocations": []}
    for v in (0, 3):
        with pytest.raises(CheckpointError, match=f"format version {v}; this build reads"):
            CheckpointReader(io.BytesIO(_file([], version=v)))


def test_read_head_checks_images_and_stops_before_memory() -> None:
    data = _file([(0, NOISE)])
    seen: list[tuple[bytes, bytes]] = []
    src = io.BytesIO(data)
    head = read_head(src, "h", lambda d, img: seen.append((bytes(d), bytes(img))))
    assert head.meta["session"] == {"id": "x"} and seen == [(b"\x02" * 32, b"an image")]
    assert src.tell() < len(NOISE)  # the memory was not read


def test_prefetched_keeps_order_passes_errors_and_stops_early() -> None:
    assert list(prefetched(iter(range(50)), depth=2)) == list(range(50))

    def failing():  # type: ignore[no-untyped-def]
        yield 1
        yield 2
        raise CheckpointError("truncated at byte 99")

    got = []
    with pytest.raises(CheckpointError, match="byte 99"):
        for x in prefetched(failing()):
            got.append(x)
    assert got == [1, 2]
    produced = []

    def endless():  # type: ignore[no-untyped-def]
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    before = threading.active_count()
    for x in prefetched(endless(), depth=2):
        if x == 3:
            break
    assert threading.active_count() == before  # the helper thread ended
    assert len(produced) <= 3 + 1 + 2 + 1


def _identity() -> common_pb2.DeviceIdentity:
    p = get_profile("a100-80gb")
    return common_pb2.DeviceIdentity(
        name=p.name,
        uuid=bytes(range(16)),
        total_mem=p.total_mem,
        cc_major=8,
        cc_minor=0,
        attributes={int(k): int(v) for k, v in p.attributes.items()},
        profile=p.key,
        pci_bus_id="0000:3b:00.0",
    )


def test_told_identity_round_trips_through_meta() -> None:
    ident = _identity()
    meta = {
        "session": {"told": told_to_json(ident.attributes), "device": identity_to_json(ident)},
    }
    import json

    told = told_from_meta(json.loads(json.dumps(meta)), 2, "f")
    assert told.identity == ident and told.limits[SMEM_OPTIN] == 166912 and not told.note


def test_told_limits_of_a_version_1_file_come_from_its_source_profile() -> None:
    told = told_from_meta({"session": {}, "source": {"profile": "h100-80gb"}}, 1, "old.ckpt")
    assert told.limits[SMEM_OPTIN] == 232448 and told.identity is None
    assert "format 1" in told.note and "h100-80gb" in told.note
    told = told_from_meta({"session": {}, "source": {"profile": "cuda:0"}}, 1, "old.ckpt")
    assert told.limits == {} and "not checked" in told.note
    with pytest.raises(ValueError, match="lacks the limits"):
        told_from_meta({"session": {}}, 2, "new.ckpt")
    with pytest.raises(ValueError, match="malformed"):
        told_from_meta({"session": {"told": {"x": 1}}}, 2, "bad.ckpt")


def test_reading_ahead_reports_damage_where_it_is() -> None:
    data = _file([(0, NOISE), (MEMORY_CHUNK, NOISE)])
    offsets = [s.offset for s in CheckpointReader(io.BytesIO(data)).sections()]

    def read_ahead(raw: bytes) -> list[int]:
        got = []
        for s in CheckpointReader(io.BufferedReader(io.BytesIO(raw))).sections(prefetch=True):
            if s.kind == Kind.MEMORY:
                s.memory()
            got.append(s.index)
        return got

    assert read_ahead(data) == list(range(len(offsets)))
    bad = bytearray(data)
    bad[offsets[4] + 5000] ^= 1  # inside the second MEMORY section
    with pytest.raises(CheckpointError, match=r"checksum mismatch in section 4 \(MEMORY\)"):
        read_ahead(bytes(bad))
    with pytest.raises(CheckpointError, match="truncated"):
        read_ahead(data[: offsets[4] + 100])
    with pytest.raises(CheckpointError, match="data after END"):
        read_ahead(data + b"!")
