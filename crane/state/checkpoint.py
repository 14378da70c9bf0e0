"""The checkpoint file: a versioned, self-describing, checksummed stream of typed sections.

Why a stream of sections rather than one archive: a session may hold gigabytes of device memory,
so the writer emits memory in bounded chunks as it reads them from the device and the reader
applies each chunk as it arrives; neither side ever holds the whole state in RAM. Every section
carries its own length and CRC-32, so corruption is reported at the section where it happened,
and an explicit END section (with counts) tells a truncated file from a complete one.

Layout (all integers little-endian)::

    header   (16 bytes)  magic b"CRANECKP" | u16 version (2) | u16 header size (16)
                         | u32 crc32 of the 12 bytes before it
    section* (16-byte header + payload)
                         u16 kind | u16 flags | u32 crc | u64 payload length
                         (crc: CRC-32 of kind, flags and length as "<HHQ", continued over the
                         payload, so a damaged section header is caught too)
    kinds, in file order:
      1 META     JSON: format, session identity (id, token, window slot, virtual device seed,
                 client, and since version 2 the device identity and limits the guest was told:
                 crane.state.told), the device memory the session needs (version 2:
                 "mem_needed"), the source device (profile, compute capability), creation time
      3 IMAGE    32-byte sha-256 digest | module image bytes (one per distinct image, once)
      2 OBJECTS  JSON: the object graph (crane.state.record)
      5 REPLIES  u32 count | (u32 length | serialized ReplyBatch)*: the answers to the last
                 synchronizing batch, replayed if the guest never received them
      4 MEMORY   u64 device address | u32 raw length | u32 codec (0 raw, 1 zstd) | bytes
                 (raw length <= MEMORY_CHUNK; one allocation is several sections). A chunk is
                 stored compressed only where zstd saves at least 1/MIN_SAVING of it: on
                 near-incompressible data (float noise, trained weights) zstd's entropy coding
                 saves a few percent at ~1 GB/s per core each way, slower than the disk.
      255 END    JSON: {"sections": n, "memory_bytes": total} (n counts the sections before END)

Flags bit 0 (OPTIONAL): a reader that does not know the kind skips the section; an unknown kind
without it is refused. Every read is bounded by a per-kind size limit (:data:`LIMITS`), so a
corrupted length cannot make a reader allocate gigabytes.

Versions: 2 records what the guest was told (a restore refuses a device offering less, and keeps
answering with it); the layout is version 1's. This build reads both (:data:`READABLE_VERSIONS`):
a version 1 file's told limits are taken from its source device (crane.state.told). A build that
reads only version 1 refuses a version 2 file by its header, rather than restoring it without
the checks. A file of any other version is refused by its header, naming both versions.
"""

from __future__ import annotations

import json
import queue
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TypeVar

import zstandard

from crane.state.crc32 import crc32

__all__ = [
    "FORMAT_VERSION",
    "LIMITS",
    "MAGIC",
    "MEMORY_CHUNK",
    "MIN_SAVING",
    "READABLE_VERSIONS",
    "CheckpointError",
    "CheckpointReader",
    "CheckpointWriter",
    "Head",
    "Kind",
    "Section",
    "pack_chunk",
    "prefetched",
    "read_head",
    "read_meta",
    "unpack_chunk",
]

MAGIC = b"CRANECKP"
FORMAT_VERSION = 2
#: Versions this build reads (see the module's docstring for what differs).
READABLE_VERSIONS = (1, 2)
_HEADER = struct.Struct("<8sHH")  # + u32 crc
_SECTION = struct.Struct("<HHIQ")
_MEM = struct.Struct("<QII")
OPTIONAL = 1

#: Raw bytes of device memory per MEMORY section: large enough to amortize the per-section cost,
#: small enough that a reader or writer holds only a few of them at a time.
MEMORY_CHUNK = 8 << 20

CODEC_RAW = 0
CODEC_ZSTD = 1

#: A chunk is stored compressed only if zstd makes it at least 1/MIN_SAVING smaller. Deciding
#: costs a compression of a few samples spread over the chunk (:data:`_SAMPLES` x
#: :data:`_SAMPLE` bytes); the chunk's full compression re-checks the saving.
MIN_SAVING = 8
_SAMPLE = 32 << 10
_SAMPLES = 4

_local = threading.local()  # per-thread zstd contexts (a context is not thread-safe)


def _compressor(level: int) -> zstandard.ZstdCompressor:
    c = getattr(_local, "c", None)
    if c is None or _local.level != level:
        c = _local.c = zstandard.ZstdCompressor(level=level)
        _local.level = level
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "d", None)
    if d is None:
        d = _local.d = zstandard.ZstdDecompressor()
    return d


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
    flags: int = 0
    crc: int = 0  # as the header says (CheckpointReader verifies it)
    trailing: int = 0  # END only: the offset of data found after it (0: none)

    def json(self) -> Any:
        try:
            return json.loads(self.payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(
                f"section {self.index} ({kind_name(self.kind)}) at byte {self.offset}: "
                f"not valid JSON: {e}"
            ) from None

    def memory(self) -> tuple[int, bytes | memoryview]:
        """(device address, raw bytes) of a MEMORY section, decompressed and length-checked
        (a stored chunk comes as a view of the payload, not a copy)."""
        where = f"section {self.index} (MEMORY) at byte {self.offset}"
        if len(self.payload) < _MEM.size:
            raise CheckpointError(f"{where}: {len(self.payload)} bytes, too short")
        addr, raw_len, codec = _MEM.unpack_from(self.payload)
        if raw_len > MEMORY_CHUNK:
            raise CheckpointError(f"{where}: chunk of {raw_len} bytes exceeds {MEMORY_CHUNK}")
        body = memoryview(self.payload)[_MEM.size :]
        data: bytes | memoryview
        if codec == CODEC_RAW:
            data = body
        elif codec == CODEC_ZSTD:
            try:
                data = _decompressor().decompress(body, max_output_size=raw_len)
            except zstandard.ZstdError as e:
                raise CheckpointError(f"{where}: zstd payload does not decompress: {e}") from None
        else:
            raise CheckpointError(f"{where}: unknown codec {codec}")
        if len(data) != raw_len:
            raise CheckpointError(f"{where}: {len(data)} bytes decompressed, header says {raw_len}")
        return addr, data


Buffer = bytes | bytearray | memoryview


def _crc(kind: int, flags: int, payload: Buffer) -> int:
    return crc32(payload, crc32(struct.pack("<HHQ", kind, flags, len(payload))))


@dataclass
class _Sealed:
    """A section ready to write: its header (with the CRC) and its payload in pieces."""

    kind: int
    parts: list[Buffer] = field(default_factory=list)
    head: bytes = b""


def _seal(kind: int, parts: list[Buffer], flags: int = 0) -> _Sealed:
    """Checksum a payload given in pieces (so a chunk of device memory is never concatenated
    with its header; this runs on the compression threads too)."""
    length = sum(len(p) for p in parts)
    if length > LIMITS.get(kind, 1 << 20):
        raise CheckpointError(f"{kind_name(kind)} section of {length} bytes is too large")
    crc = crc32(struct.pack("<HHQ", kind, flags, length))
    for p in parts:
        crc = crc32(p, crc)
    return _Sealed(kind, parts, _SECTION.pack(kind, flags, crc, length))


def _compress(addr: int, data: Buffer, level: int) -> _Sealed:
    packed = pack_chunk(data, level)
    n = len(data)
    if packed is None:  # not worth decompressing at restore: store it
        return _seal(Kind.MEMORY, [_MEM.pack(addr, n, CODEC_RAW), data])
    return _seal(Kind.MEMORY, [_MEM.pack(addr, n, CODEC_ZSTD), packed])


def pack_chunk(data: Buffer, level: int) -> bytes | None:
    """``data`` compressed with zstd at ``level`` (this thread's context), or None when that
    does not save 1/MIN_SAVING of it: the same rule as a checkpoint's MEMORY sections, for the
    migration data plane (:mod:`crane.migrate.dataplane`)."""
    packed = _compressor(level).compress(data)
    n = len(data)
    return None if len(packed) > n - n // MIN_SAVING else packed


def unpack_chunk(packed: Buffer, raw_len: int) -> bytes:
    """The inverse of :func:`pack_chunk`; :class:`CheckpointError` for a damaged payload."""
    try:
        return _decompressor().decompress(packed, max_output_size=raw_len)
    except zstandard.ZstdError as e:
        raise CheckpointError(f"zstd payload does not decompress: {e}") from None


def worth_compressing(data: Buffer, level: int = 1) -> bool:
    """Whether zstd at ``level`` is likely to save 1/MIN_SAVING of ``data``, judged on samples
    spread over it (zeros, repeated or sparse data: yes; float noise, trained weights: no)."""
    n = len(data)
    if n <= _SAMPLES * _SAMPLE * 2:
        return True  # small: compress it whole, :func:`_compress` decides
    view = memoryview(data).cast("B")
    step = (n - _SAMPLE) // (_SAMPLES - 1)
    c = _compressor(level)
    packed = sum(len(c.compress(view[i * step : i * step + _SAMPLE])) for i in range(_SAMPLES))
    total = _SAMPLES * _SAMPLE
    return packed <= total - total // MIN_SAVING


class CheckpointWriter:
    """Writes sections to a binary stream; memory is compressed on a small thread pool.

    zstd releases the GIL, so compressing the next chunks overlaps writing the previous one;
    at most ``2 * threads`` chunks are in flight, which bounds the writer's memory. A chunk not
    worth compressing (:func:`worth_compressing`) is checksummed and written at once from the
    caller's buffer, with no copy.
    """

    def __init__(self, out: BinaryIO, level: int | None = 1, threads: int = 2) -> None:
        """``level``: zstd level for memory chunks worth compressing; None stores all raw."""
        self.out = out
        self.level = level
        self.sections = 0
        self.memory_bytes = 0
        self.bytes_written = 0
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckpt-zstd")
        self._pending: list[Future[bytes]] = []
        self._depth = 2 * threads
        head = _HEADER.pack(MAGIC, FORMAT_VERSION, 16)
        self._write(head + struct.pack("<I", crc32(head)))

    def _write(self, data: bytes | memoryview) -> None:
        self.out.write(data)
        self.bytes_written += len(data)

    def section(self, kind: int, payload: bytes, flags: int = 0) -> None:
        self._drain(0)
        self._emit(_seal(kind, [payload], flags))

    def _emit(self, sealed: _Sealed) -> None:
        self._write(sealed.head)
        for p in sealed.parts:
            self._write(p)
        self.sections += 1

    def json(self, kind: int, value: Any) -> None:
        self.section(kind, json.dumps(value, separators=(",", ":")).encode())

    def memory(self, addr: int, data: Buffer) -> None:
        """Write or queue one chunk (<= MEMORY_CHUNK bytes).

        A ``bytes``/``bytearray`` chunk may be queued as is (the caller must not modify it
        meanwhile); a ``memoryview`` is only valid until the caller's next backend call, so it
        is written before this returns or copied before it is queued."""
        if len(data) > MEMORY_CHUNK:
            raise ValueError(f"memory chunk of {len(data)} bytes exceeds {MEMORY_CHUNK}")
        self.memory_bytes += len(data)
        if self.level is None or not worth_compressing(data, self.level):
            self._emit(_seal(Kind.MEMORY, [_MEM.pack(addr, len(data), CODEC_RAW), data]))
            return
        if isinstance(data, memoryview):
            data = bytes(data)
        self._drain(self._depth - 1)
        self._pending.append(self._pool.submit(_compress, addr, data, self.level))

    def _drain(self, keep: int) -> None:
        while len(self._pending) > keep:
            self._emit(self._pending.pop(0).result())

    def finish(self) -> None:
        """Write END (the reader's proof that the file is complete) and flush."""
        self._drain(0)
        self._pool.shutdown()
        end = {"sections": self.sections, "memory_bytes": self.memory_bytes}
        self._emit(_seal(Kind.END, [json.dumps(end).encode()]))
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
        if crc != crc32(raw[:12]):
            raise CheckpointError(f"{name}: file header checksum mismatch")
        if version not in READABLE_VERSIONS:
            raise CheckpointError(
                f"{name}: checkpoint format version {version}; this build reads versions "
                + " and ".join(map(str, READABLE_VERSIONS))
                + (" (the file was written by a newer Crane)" if version > FORMAT_VERSION else "")
            )
        if size != 16:
            raise CheckpointError(f"{name}: header size {size}, expected 16")
        self.version = version
        self._index = 0  # sections verified
        self._ended = False  # END verified
        self._fetched = 0  # sections read
        self._fetched_end = False

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
        return self._check(self._fetch())

    def _fetch(self) -> Section:
        """Read the next section, checking its header (kind, length limit) but not yet its
        checksum: :meth:`_check` does, in file order (possibly on another thread)."""
        if self._fetched_end:
            raise CheckpointError(f"{self.name}: read past the END section")
        at = self.offset
        idx = self._fetched
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
        self._fetched += 1
        section = Section(kind, payload, at, idx, flags, crc)
        if kind == Kind.END:
            self._fetched_end = True
            if self.src.read(1):
                section.trailing = self.offset
        return section

    def _check(self, section: Section) -> Section:
        kind, idx, at = section.kind, section.index, section.offset
        if _crc(kind, section.flags, section.payload) != section.crc:
            raise CheckpointError(
                f"{self.name}: checksum mismatch in section {idx} ({kind_name(kind)}) at byte {at}"
            )
        self._index += 1
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
            if section.trailing:
                raise CheckpointError(f"{self.name}: data after END (byte {section.trailing})")
            self._ended = True
        elif kind == Kind.MEMORY and len(section.payload) >= _MEM.size:
            self.memory_bytes += _MEM.unpack_from(section.payload)[1]
        return section

    def _fetch_all(self) -> Iterator[Section]:
        while not self._fetched_end:
            yield self._fetch()

    def sections(self, prefetch: bool = False) -> Iterator[Section]:
        """Every section up to and including END (unknown optional kinds skipped).

        ``prefetch``: read the following sections on a helper thread while the caller handles
        this one (file reads release the GIL); each is still verified before it is yielded,
        here, so checksumming overlaps the reading too."""
        fetched = self._fetch_all()
        if prefetch:
            fetched = prefetched(fetched)
        for s in fetched:
            self._check(s)
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


def _meta(r: CheckpointReader) -> dict[str, Any]:
    meta = r.expect(Kind.META).json()
    if not isinstance(meta, dict) or meta.get("format") != "crane-checkpoint":
        raise CheckpointError(f"{r.name}: META section does not describe a Crane checkpoint")
    return meta


def read_meta(src: BinaryIO, name: str = "checkpoint") -> dict[str, Any]:
    """The META section alone."""
    return _meta(CheckpointReader(src, name))


@dataclass
class Head:
    """What precedes a checkpoint's memory: what a daemon checks before starting a restore."""

    version: int
    meta: dict[str, Any]
    graph: dict[str, Any] | None  # the OBJECTS section (None if the file has none)


def read_head(
    src: BinaryIO, name: str, on_image: Callable[[bytes, bytes], None] | None = None
) -> Head:
    """Read (and verify) META, every IMAGE (``on_image(digest, image)``) and OBJECTS, which
    the format puts before the rest; stops there."""
    r = CheckpointReader(src, name)
    meta = _meta(r)
    graph = None
    while True:
        s = r.next()
        if s.kind == Kind.IMAGE:
            if len(s.payload) < 32:
                raise CheckpointError(f"{name}: IMAGE section {s.index} is empty")
            if on_image is not None:
                on_image(s.payload[:32], s.payload[32:])
        elif s.kind == Kind.OBJECTS:
            graph = s.json()
            if not isinstance(graph, dict):
                raise CheckpointError(f"{name}: OBJECTS section {s.index} is not an object")
            return Head(r.version, meta, graph)
        elif s.kind in (Kind.MEMORY, Kind.REPLIES, Kind.END):
            return Head(r.version, meta, graph)


T = TypeVar("T")


def prefetched(items: Iterable[T], depth: int = 3) -> Iterator[T]:
    """Iterate ``items`` on a helper thread, up to ``depth`` ahead of the consumer.

    Why: a restore reads section N+1 (file reads release the GIL) while the caller verifies
    and applies section N. An exception raised by ``items`` reaches the consumer in order,
    after the items before it. Leaving the loop early stops the helper."""
    q: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put((0, item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            msg: tuple[int, Any] = (1, None)
        except BaseException as e:  # handed to the consumer
            msg = (2, e)
        while not stop.is_set():
            try:
                q.put(msg, timeout=0.1)
                return
            except queue.Full:
                continue

    t = threading.Thread(target=produce, name="ckpt-prefetch", daemon=True)
    t.start()
    try:
        while True:
            tag, value = q.get()
            if tag == 0:
                yield value
            elif tag == 1:
                return
            else:
                raise value
    finally:
        stop.set()
        t.join()
