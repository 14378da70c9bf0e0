"""The checkpoint file: a versioned, self-describing, checksummed stream of typed sections.

Why a stream of sections rather than one archive: a session may hold gigabytes of device memory,
so the writer emits memory in bounded chunks as it reads them from the device and the reader
applies each chunk as it arrives; neither side ever holds the whole state in RAM. Every section
carries its own length and CRC-32, so corruption is reported at the section where it happened,
and an explicit END section (with counts) tells a truncated file from a complete one.

Layout (all integers little-endian)::

    header   (16 bytes)  magic b"CRANECKP" | u16 version (1) | u16 header size (16)
                         | u32 crc32 of the 12 bytes before it
    section* (16-byte header + payload)
                         u16 kind | u16 flags | u32 crc | u64 payload length
                         (crc: CRC-32 of kind, flags and length as "<HHQ", continued over the
                         payload, so a damaged section header is caught too)
    kinds, in file order:
      1 META     JSON: format, session identity (id, token, window slot, virtual device seed,
                 client), the source device (profile, compute capability), creation time
      3 IMAGE    32-byte sha-256 digest | module image bytes (one per distinct image, once)
      2 OBJECTS  JSON: the object graph (crane.state.record)
      5 REPLIES  u32 count | (u32 length | serialized ReplyBatch)*: the answers to the last
                 synchronizing batch, replayed if the guest never received them
      4 MEMORY   u64 device address | u32 raw length | u32 codec (0 raw, 1 zstd) | bytes
                 (raw length <= MEMORY_CHUNK; one allocation is several sections)
      255 END    JSON: {"sections": n, "memory_bytes": total} (n counts the sections before END)

Flags bit 0 (OPTIONAL): a reader that does not know the kind skips the section; an unknown kind
without it is refused. Every read is bounded by a per-kind size limit (:data:`LIMITS`), so a
corrupted length cannot make a reader allocate gigabytes.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

import zstandard

__all__ = [
    "FORMAT_VERSION",
    "LIMITS",
    "MAGIC",
    "MEMORY_CHUNK",
    "CheckpointError",
    "CheckpointReader",
    "CheckpointWriter",
    "Kind",
    "Section",
]

MAGIC = b"CRANECKP"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHH")  # + u32 crc
_SECTION = struct.Struct("<HHIQ")
_MEM = struct.Struct("<QII")
OPTIONAL = 1

#: Raw bytes of device memory per MEMORY section: large enough to amortize the per-section cost,
#: small enough that a reader or writer holds only a few of them at a time.
MEMORY_CHUNK = 8 << 20

CODEC_RAW = 0
CODEC_ZSTD = 1


class Kind:
    META = 1
    OBJECTS = 2
    IMAGE = 3
    MEMORY = 4
    REPLIES = 5
    END = 255


_NAMES = {v: k for k, v in vars(Kind).items() if not k.startswith("_")}

#: Largest payload accepted per kind (bytes).
LIMITS = {
    Kind.META: 1 << 20,
    Kind.OBJECTS: 64 << 20,
    Kind.IMAGE: 2 << 30,
    Kind.MEMORY: _MEM.size + MEMORY_CHUNK + (MEMORY_CHUNK >> 7) + 4096,  # zstd worst case
    Kind.REPLIES: 256 << 20,
    Kind.END: 1 << 16,
}


class CheckpointError(Exception):
    """The file is not a usable checkpoint; the message says where and why."""


def kind_name(kind: int) -> str:
    return _NAMES.get(kind, f"kind {kind}")


@dataclass
class Section:
    kind: int
    payload: bytes
    offset: int  # of the section header in the file
    index: int

    def json(self) -> Any:
        try:
            return json.loads(self.payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(
                f"section {self.index} ({kind_name(self.kind)}) at byte {self.offset}: "
                f"not valid JSON: {e}"
            ) from None

    def memory(self) -> tuple[int, bytes]:
        """(device address, raw bytes) of a MEMORY section, decompressed and length-checked."""
        where = f"section {self.index} (MEMORY) at byte {self.offset}"
        if len(self.payload) < _MEM.size:
            raise CheckpointError(f"{where}: {len(self.payload)} bytes, too short")
        addr, raw_len, codec = _MEM.unpack_from(self.payload)
        if raw_len > MEMORY_CHUNK:
            raise CheckpointError(f"{where}: chunk of {raw_len} bytes exceeds {MEMORY_CHUNK}")
        body = memoryview(self.payload)[_MEM.size :]
        if codec == CODEC_RAW:
            data = bytes(body)
        elif codec == CODEC_ZSTD:
            try:
                data = zstandard.ZstdDecompressor().decompress(body, max_output_size=raw_len)
            except zstandard.ZstdError as e:
                raise CheckpointError(f"{where}: zstd payload does not decompress: {e}") from None
        else:
            raise CheckpointError(f"{where}: unknown codec {codec}")
        if len(data) != raw_len:
            raise CheckpointError(f"{where}: {len(data)} bytes decompressed, header says {raw_len}")
        return addr, data


def _crc(kind: int, flags: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack("<HHQ", kind, flags, len(payload))))


def _compress(addr: int, data: bytes | memoryview, level: int) -> bytes:
    packed = zstandard.ZstdCompressor(level=level).compress(data)
    if len(packed) >= len(data):  # incompressible: store it raw, reading it back is free
        return _MEM.pack(addr, len(data), CODEC_RAW) + bytes(data)
    return _MEM.pack(addr, len(data), CODEC_ZSTD) + packed


class CheckpointWriter:
    """Writes sections to a binary stream; memory is compressed on a small thread pool.

    zstd releases the GIL, so compressing the next chunks overlaps writing the previous one;
    at most ``2 * threads`` chunks are in flight, which bounds the writer's memory.
    """

    def __init__(self, out: BinaryIO, level: int = 1, threads: int = 2) -> None:
        self.out = out
        self.level = level
        self.sections = 0
        self.memory_bytes = 0
        self.bytes_written = 0
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckpt-zstd")
        self._pending: list[Future[bytes]] = []
        self._depth = 2 * threads
        head = _HEADER.pack(MAGIC, FORMAT_VERSION, 16)
        self._write(head + struct.pack("<I", zlib.crc32(head)))

    def _write(self, data: bytes | memoryview) -> None:
        self.out.write(data)
        self.bytes_written += len(data)

    def section(self, kind: int, payload: bytes, flags: int = 0) -> None:
        self._drain(0)
        self._emit(kind, payload, flags)

    def _emit(self, kind: int, payload: bytes, flags: int = 0) -> None:
        if len(payload) > LIMITS.get(kind, 1 << 20):
            raise CheckpointError(f"{kind_name(kind)} section of {len(payload)} bytes is too large")
        self._write(_SECTION.pack(kind, flags, _crc(kind, flags, payload), len(payload)))
        self._write(payload)
        self.sections += 1

    def json(self, kind: int, value: Any) -> None:
        self.section(kind, json.dumps(value, separators=(",", ":")).encode())

    def memory(self, addr: int, data: bytes | memoryview) -> None:
        """Queue one chunk (<= MEMORY_CHUNK bytes; the caller must not modify it meanwhile)."""
        if len(data) > MEMORY_CHUNK:
            raise ValueError(f"memory chunk of {len(data)} bytes exceeds {MEMORY_CHUNK}")
        self._drain(self._depth - 1)
        self._pending.append(self._pool.submit(_compress, addr, data, self.level))
        self.memory_bytes += len(data)

    def _drain(self, keep: int) -> None:
        while len(self._pending) > keep:
            self._emit(Kind.MEMORY, self._pending.pop(0).result())

    def finish(self) -> None:
        """Write END (the reader's proof that the file is complete) and flush."""
        self._drain(0)
        self._pool.shutdown()
        end = {"sections": self.sections, "memory_bytes": self.memory_bytes}
        self._emit(Kind.END, json.dumps(end).encode())
        self.out.flush()

    def abort(self) -> None:
        for f in self._pending:
            f.cancel()
        self._pending.clear()
        self._pool.shutdown()


class CheckpointReader:
    """Reads and verifies sections one at a time from a binary stream."""

    def __init__(self, src: BinaryIO, name: str = "checkpoint") -> None:
        self.src = src
        self.name = name
        self.offset = 0
        self.memory_bytes = 0
        raw = self._read(16, "file header")
        magic, version, size = _HEADER.unpack_from(raw)
        if magic != MAGIC:
            raise CheckpointError(f"{name}: not a Crane checkpoint (magic {magic!r})")
        (crc,) = struct.unpack_from("<I", raw, 12)
        if crc != zlib.crc32(raw[:12]):
            raise CheckpointError(f"{name}: file header checksum mismatch")
        if version != FORMAT_VERSION:
            raise CheckpointError(
                f"{name}: checkpoint format version {version}; this build reads {FORMAT_VERSION}"
            )
        if size != 16:
            raise CheckpointError(f"{name}: header size {size}, expected 16")
        self.version = version
        self._index = 0
        self._ended = False

    def _read(self, n: int, what: str) -> bytes:
        data = self.src.read(n)
        if len(data) != n:
            raise CheckpointError(
                f"{self.name} is truncated: {what} at byte {self.offset} needs {n} bytes, "
                f"the file has {len(data)} more"
            )
        self.offset += n
        return data

    def next(self) -> Section:
        """The next verified section (END included); raises at truncation or corruption."""
        if self._ended:
            raise CheckpointError(f"{self.name}: read past the END section")
        at = self.offset
        idx = self._index
        head = self._read(_SECTION.size, f"section {idx} header")
        kind, flags, crc, length = _SECTION.unpack(head)
        limit = LIMITS.get(kind)
        if limit is None and not flags & OPTIONAL:
            raise CheckpointError(
                f"{self.name}: section {idx} at byte {at} has unknown kind {kind} (corrupted, or "
                "written by a newer Crane)"
            )
        if length > (limit or 1 << 30):
            raise CheckpointError(
                f"{self.name}: section {idx} ({kind_name(kind)}) at byte {at} claims {length} "
                f"bytes, over the limit of {limit} (corrupted length)"
            )
        payload = self._read(length, f"section {idx} ({kind_name(kind)}) payload")
        if _crc(kind, flags, payload) != crc:
            raise CheckpointError(
                f"{self.name}: checksum mismatch in section {idx} ({kind_name(kind)}) at byte {at}"
            )
        self._index += 1
        section = Section(kind, payload, at, idx)
        if kind == Kind.END:
            end = section.json()
            if not isinstance(end, dict) or end.get("sections") != idx:
                raise CheckpointError(
                    f"{self.name}: END says {end.get('sections') if isinstance(end, dict) else '?'}"
                    f" sections, the file has {idx}"
                )
            if end.get("memory_bytes") != self.memory_bytes:
                raise CheckpointError(
                    f"{self.name}: END says {end.get('memory_bytes')} bytes of memory, the file "
                    f"has {self.memory_bytes}"
                )
            if self.src.read(1):
                raise CheckpointError(f"{self.name}: data after END (byte {self.offset})")
            self._ended = True
        elif kind == Kind.MEMORY and len(payload) >= _MEM.size:
            self.memory_bytes += _MEM.unpack_from(payload)[1]
        return section

    def sections(self) -> Iterator[Section]:
        """Every section up to and including END (unknown optional kinds skipped)."""
        while not self._ended:
            s = self.next()
            if s.kind in LIMITS:
                yield s

    def expect(self, kind: int) -> Section:
        s = self.next()
        if s.kind != kind:
            raise CheckpointError(
                f"{self.name}: section {s.index} at byte {s.offset} is {kind_name(s.kind)}, "
                f"expected {kind_name(kind)}"
            )
        return s


def read_meta(src: BinaryIO, name: str = "checkpoint") -> dict[str, Any]:
    """The META section alone (what a daemon needs to place a restore before starting it)."""
    meta = CheckpointReader(src, name).expect(Kind.META).json()
    if not isinstance(meta, dict) or meta.get("format") != "crane-checkpoint":
        raise CheckpointError(f"{name}: META section does not describe a Crane checkpoint")
    return meta
