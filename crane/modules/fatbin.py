"""Reader for NVIDIA fatbinaries (the ``.nv_fatbin`` images nvcc embeds in programs).

Why: cudart hands the driver a ``__fatBinC_Wrapper_t`` pointer with no size; the guest must
find the image's length from its 16-byte header to copy it, and the host must pick the
cubin or PTX inside it that suits its device (or the simulated one). The layout is not
documented by NVIDIA; the field meanings below were observed with nvcc 13.0 (see
``shared/reference/cuda-driver-shim-facts.md`` section 3) plus these findings:

* entry header offset 8 is a u64 payload size; offset 24 holds (minor u16, major u16): the
  PTX ISA version for PTX, 1.8 for ELF;
* offset 20 points at an 8-byte (u32 offset, u32 length) descriptor of the options bytes
  inside the entry header — ptxas options text for PTX, a binary blob for sm_100+ ELF;
* flag 0x100000 marks arch-specific code (``sm_90a`` / ``compute_90a``), 0x200000
  family-specific code (``sm_100f``); the ELF itself does not say so in ``e_flags``;
* kind 8 is LTO-IR (``code=lto_XX``); its payload is not a plain zstd frame even though
  flag 0x8000 is set, so it is kept as stored.

Every read is bounds-checked; malformed input raises :class:`FatbinError` naming the
offset, and decompression is capped by the sizes the header declares.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import lz4.block
import zstandard

from crane.modules.arch import Arch, cc_to_sm, format_cc
from crane.modules.errors import FatbinError, NoCompatibleCode

__all__ = [
    "ENTRY_KIND_ELF",
    "ENTRY_KIND_LTO",
    "ENTRY_KIND_PTX",
    "FATBIN_HEADER_SIZE",
    "FATBIN_MAGIC",
    "FLAG_ARCH_SPECIFIC",
    "FLAG_DEBUG",
    "FLAG_FAMILY_SPECIFIC",
    "FLAG_LZ4",
    "FLAG_ZSTD",
    "WRAPPER_MAGIC",
    "WRAPPER_SIZE",
    "FatbinEntry",
    "FatbinError",
    "FatbinHeader",
    "FatbinWrapper",
    "NoCompatibleCode",
    "describe_entries",
    "fatbin_total_size",
    "is_fatbin",
    "no_compatible_code",
    "parse_fatbin",
    "parse_fatbin_headers",
    "parse_wrapper",
    "select_entry",
    "select_ptx",
    "split_fatbins",
]

WRAPPER_MAGIC = 0x466243B1
WRAPPER_SIZE = 24
FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER_SIZE = 16
_ENTRY_MIN_HEADER = 64

ENTRY_KIND_PTX = 1
ENTRY_KIND_ELF = 2
ENTRY_KIND_LTO = 8

FLAG_64BIT = 0x1
FLAG_DEBUG = 0x2
FLAG_LINUX = 0x10
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000

#: Largest image we agree to inflate one entry to; real entries are far smaller.
MAX_UNCOMPRESSED = 1 << 31
#: LZ4 cannot expand input by more than ~255x (one token byte per 255 bytes of match).
_LZ4_MAX_RATIO = 256
_ZSTD_CHUNK = 1 << 20

_KIND_NAMES = {ENTRY_KIND_PTX: "PTX", ENTRY_KIND_ELF: "cubin", ENTRY_KIND_LTO: "LTO-IR"}


@dataclass(frozen=True, slots=True)
class FatbinWrapper:
    """``__fatBinC_Wrapper_t``: what ``__cudaRegisterFatBinary`` / ``cuLibraryLoadData`` get."""

    magic: int
    version: int
    #: Guest address of the fatbin header.
    data_ptr: int
    #: Version 2 only: guest address of a NULL-terminated array of prelinked-fatbin pointers.
    prelinked_ptr: int


@dataclass(frozen=True, slots=True)
class FatbinHeader:
    """One 16-byte fatbin header found at ``offset`` of the input."""

    offset: int
    version: int
    header_size: int
    files_size: int

    @property
    def end(self) -> int:
        """Offset just past this fatbin's last entry."""
        return self.offset + self.header_size + self.files_size


@dataclass(frozen=True, slots=True)
class FatbinEntry:
    """One code object inside a fatbin, with its payload decompressed."""

    #: Which fatbin of a concatenated blob (0 for a single fatbin) the entry belongs to.
    fatbin_index: int
    #: Offset of the entry header within the parsed buffer.
    offset: int
    kind: int
    header_size: int
    #: Bytes the payload occupies in the file (compressed size rounded up to 8).
    payload_size: int
    #: Exact compressed size, 0 when not compressed.
    compressed_size: int
    #: Raw options bytes (ptxas options for PTX, a binary blob for sm_100+ ELF).
    options: bytes
    #: Offset 24 as (major, minor): the PTX ISA version for PTX, (1, 8) for ELF.
    code_version: tuple[int, int]
    #: SM number (75, 80, 90, 100, ...).
    sm: int
    source_name: str
    flags: int
    #: Declared uncompressed size, 0 when not compressed.
    uncompressed_size: int
    #: Decompressed payload; PTX has trailing NULs stripped; other kinds are kept as stored.
    data: bytes = field(repr=False)

    @property
    def is_ptx(self) -> bool:
        return self.kind == ENTRY_KIND_PTX

    @property
    def is_elf(self) -> bool:
        return self.kind == ENTRY_KIND_ELF

    @property
    def compression(self) -> str | None:
        if self.flags & FLAG_ZSTD:
            return "zstd"
        if self.flags & FLAG_LZ4:
            return "lz4"
        return None

    @property
    def arch(self) -> Arch:
        if self.flags & FLAG_ARCH_SPECIFIC:
            return Arch(self.sm, "a")
        if self.flags & FLAG_FAMILY_SPECIFIC:
            return Arch(self.sm, "f")
        return Arch(self.sm)

    @property
    def ptx_version(self) -> tuple[int, int] | None:
        return self.code_version if self.is_ptx else None

    @property
    def ptx_text(self) -> str:
        """The PTX source; raises :class:`FatbinError` for non-PTX or non-ASCII payloads."""
        if not self.is_ptx:
            raise FatbinError(f"entry at offset {self.offset:#x} is {self.label}, not PTX")
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FatbinError(
                f"PTX entry at offset {self.offset:#x} is not UTF-8 text "
                f"(byte {exc.start} of the decompressed payload)"
            ) from None

    @property
    def options_text(self) -> str | None:
        """The options as text when they are printable ASCII (PTX entries), else ``None``."""
        raw = self.options.rstrip(b"\0")
        if raw and all(32 <= b < 127 for b in raw):
            return raw.decode("ascii").strip()
        return None

    @property
    def label(self) -> str:
        """Human name, e.g. ``"sm_90a cubin"``, ``"compute_80 PTX"``."""
        if self.is_ptx:
            return f"{self.arch.ptx_name()} PTX"
        if self.is_elf:
            return f"{self.arch.cubin_name()} cubin"
        if self.kind == ENTRY_KIND_LTO:
            return f"lto_{self.sm}{self.arch.suffix} LTO-IR"
        return f"kind-{self.kind} entry for sm_{self.sm}"


def parse_wrapper(buf: bytes) -> FatbinWrapper:
    """Decode a 24-byte ``__fatBinC_Wrapper_t`` (extra trailing bytes are ignored)."""
    if len(buf) < WRAPPER_SIZE:
        raise FatbinError(f"fatbin wrapper needs {WRAPPER_SIZE} bytes, got {len(buf)}")
    magic, version, data_ptr, prelinked = struct.unpack_from("<IiQQ", buf, 0)
    if magic != WRAPPER_MAGIC:
        raise FatbinError(
            f"bad fatbin wrapper magic {magic:#010x} at offset 0 (expected {WRAPPER_MAGIC:#010x})"
        )
    if version not in (1, 2):
        raise FatbinError(f"unsupported fatbin wrapper version {version} at offset 4 (1 or 2)")
    return FatbinWrapper(magic, version, data_ptr, prelinked)


def is_fatbin(data: bytes) -> bool:
    """Whether ``data`` starts with a fatbin header magic."""
    return len(data) >= 4 and struct.unpack_from("<I", data, 0)[0] == FATBIN_MAGIC


def _read_header(data: bytes, off: int) -> FatbinHeader:
    if off + FATBIN_HEADER_SIZE > len(data):
        raise FatbinError(
            f"truncated fatbin header at offset {off:#x}: need {FATBIN_HEADER_SIZE} bytes, "
            f"{len(data) - off} left"
        )
    magic, version, header_size, files_size = struct.unpack_from("<IHHQ", data, off)
    if magic != FATBIN_MAGIC:
        raise FatbinError(
            f"bad fatbin magic {magic:#010x} at offset {off:#x} (expected {FATBIN_MAGIC:#010x})"
        )
    if version != 1:
        raise FatbinError(f"unsupported fatbin version {version} at offset {off + 4:#x}")
    if header_size < FATBIN_HEADER_SIZE:
        raise FatbinError(f"fatbin header size {header_size} < 16 at offset {off + 6:#x}")
    end = off + header_size + files_size
    if end > len(data):
        raise FatbinError(
            f"fatbin at offset {off:#x} declares {files_size} bytes of entries after a "
            f"{header_size}-byte header, but only {len(data) - off - header_size} bytes follow"
        )
    return FatbinHeader(off, version, header_size, files_size)


def fatbin_total_size(header: bytes) -> int:
    """Size of the whole fatbin (header plus entries) given at least its 16-byte header.

    This is what a guest copies when all it has is a pointer to the image.
    """
    if len(header) < FATBIN_HEADER_SIZE:
        raise FatbinError(f"fatbin header needs {FATBIN_HEADER_SIZE} bytes, got {len(header)}")
    magic, version, header_size, files_size = struct.unpack_from("<IHHQ", header, 0)
    if magic != FATBIN_MAGIC:
        raise FatbinError(
            f"bad fatbin magic {magic:#010x} at offset 0 (expected {FATBIN_MAGIC:#010x})"
        )
    if version != 1:
        raise FatbinError(f"unsupported fatbin version {version} at offset 0x4")
    if header_size < FATBIN_HEADER_SIZE:
        raise FatbinError(f"fatbin header size {header_size} < 16 at offset 0x6")
    return header_size + files_size


def parse_fatbin_headers(data: bytes) -> list[FatbinHeader]:
    """Locate every fatbin in ``data``: one, or several concatenated at 8-byte alignment.

    Zero bytes after the last fatbin (section padding) are allowed; anything else is an error.
    """
    headers: list[FatbinHeader] = []
    off = 0
    while off < len(data):
        if headers and not any(data[off:]):
            break
        hdr = _read_header(data, off)
        headers.append(hdr)
        off = (hdr.end + 7) & ~7
    if not headers:
        raise FatbinError("empty input: no fatbin header at offset 0x0")
    return headers


def split_fatbins(data: bytes) -> list[bytes]:
    """The bytes of each fatbin in a concatenated blob (e.g. a program's ``.nv_fatbin``)."""
    return [data[h.offset : h.end] for h in parse_fatbin_headers(data)]


def parse_fatbin(data: bytes) -> list[FatbinEntry]:
    """Every entry of every fatbin in ``data``, payloads decompressed."""
    entries: list[FatbinEntry] = []
    for index, hdr in enumerate(parse_fatbin_headers(data)):
        off = hdr.offset + hdr.header_size
        while off < hdr.end:
            if not any(data[off : hdr.end]):
                break  # zero padding at the end of the entry area
            entry, off = _parse_entry(data, off, hdr.end, index)
            entries.append(entry)
    return entries


def _parse_entry(data: bytes, off: int, end: int, index: int) -> tuple[FatbinEntry, int]:
    if off + _ENTRY_MIN_HEADER > end:
        raise FatbinError(
            f"truncated fatbin entry header at offset {off:#x}: need {_ENTRY_MIN_HEADER} "
            f"bytes, {end - off} left in this fatbin"
        )
    kind, _unk, header_size, payload_size = struct.unpack_from("<HHIQ", data, off)
    if header_size < _ENTRY_MIN_HEADER:
        raise FatbinError(
            f"fatbin entry at offset {off:#x}: header size {header_size} < {_ENTRY_MIN_HEADER}"
        )
    if off + header_size > end:
        raise FatbinError(
            f"fatbin entry at offset {off:#x}: header size {header_size} runs past the end "
            f"of the fatbin at {end:#x}"
        )
    payload_off = off + header_size
    if payload_off + payload_size > end:
        raise FatbinError(
            f"fatbin entry at offset {off:#x}: payload of {payload_size} bytes at "
            f"{payload_off:#x} runs past the end of the fatbin at {end:#x}"
        )
    (compressed_size, opt_off, ver_minor, ver_major, sm, name_off, name_len, flags) = (
        struct.unpack_from("<IIHHIIIQ", data, off + 16)
    )
    (uncompressed_size,) = struct.unpack_from("<Q", data, off + 56)
    hdr = data[off : off + header_size]
    options = _options_block(hdr, opt_off, off)
    source_name = _header_string(hdr, name_off, name_len, off, "source name").decode(
        "utf-8", "replace"
    )
    payload = data[payload_off : payload_off + payload_size]
    if kind in (ENTRY_KIND_PTX, ENTRY_KIND_ELF):
        body = _decompress(payload, compressed_size, uncompressed_size, flags, off)
        if kind == ENTRY_KIND_PTX:
            body = body.rstrip(b"\0")
    else:
        body = payload
    entry = FatbinEntry(
        fatbin_index=index,
        offset=off,
        kind=kind,
        header_size=header_size,
        payload_size=payload_size,
        compressed_size=compressed_size,
        options=options,
        code_version=(ver_major, ver_minor),
        sm=sm,
        source_name=source_name,
        flags=flags,
        uncompressed_size=uncompressed_size,
        data=body,
    )
    return entry, payload_off + payload_size


def _header_string(hdr: bytes, str_off: int, length: int, entry_off: int, what: str) -> bytes:
    if str_off == 0 and length == 0:
        return b""
    if str_off + length > len(hdr):
        raise FatbinError(
            f"fatbin entry at offset {entry_off:#x}: {what} ({length} bytes at header "
            f"offset {str_off:#x}) lies outside the {len(hdr)}-byte entry header"
        )
    return hdr[str_off : str_off + length]


def _options_block(hdr: bytes, opt_off: int, entry_off: int) -> bytes:
    if opt_off == 0:
        return b""
    if opt_off + 8 > len(hdr):
        raise FatbinError(
            f"fatbin entry at offset {entry_off:#x}: options descriptor at header offset "
            f"{opt_off:#x} lies outside the {len(hdr)}-byte entry header"
        )
    str_off, length = struct.unpack_from("<II", hdr, opt_off)
    return _header_string(hdr, str_off, length, entry_off, "options")


def _decompress(payload: bytes, csize: int, usize: int, flags: int, off: int) -> bytes:
    zstd, lz4 = bool(flags & FLAG_ZSTD), bool(flags & FLAG_LZ4)
    if not zstd and not lz4:
        if csize:
            raise FatbinError(
                f"fatbin entry at offset {off:#x}: compressed size {csize} but no known "
                f"compression flag in {flags:#x}"
            )
        return payload
    if zstd and lz4:
        raise FatbinError(f"fatbin entry at offset {off:#x}: both LZ4 and ZSTD flags set")
    if not 0 < csize <= len(payload):
        raise FatbinError(
            f"fatbin entry at offset {off:#x}: compressed size {csize} is not within the "
            f"{len(payload)}-byte payload"
        )
    if not 0 < usize <= MAX_UNCOMPRESSED:
        raise FatbinError(
            f"fatbin entry at offset {off:#x}: declared uncompressed size {usize} is out of "
            f"range (1..{MAX_UNCOMPRESSED})"
        )
    src = payload[:csize]
    out = _inflate_zstd(src, usize, off) if zstd else _inflate_lz4(src, usize, off)
    if len(out) > usize:
        raise FatbinError(
            f"fatbin entry at offset {off:#x}: decompresses to more than the {usize} bytes "
            "the header declares"
        )
    if len(out) < usize:
        raise FatbinError(
            f"fatbin entry at offset {off:#x}: decompressed to {len(out)} bytes, header "
            f"declares {usize}"
        )
    return out


def _inflate_zstd(src: bytes, usize: int, off: int) -> bytes:
    out = bytearray()
    try:
        # Bound the window (memory) by the size the header declares: corrupt frames cannot
        # make us reserve more than the image could legitimately need.
        window = 1 << max(20, (usize - 1).bit_length())
        reader = zstandard.ZstdDecompressor(max_window_size=window).stream_reader(src)
        while True:
            chunk = reader.read(min(_ZSTD_CHUNK, usize + 1 - len(out)))
            if not chunk:
                break
            out += chunk
            if len(out) > usize:
                break
    except Exception as exc:  # zstandard raises ZstdError and friends; report them all alike
        raise FatbinError(f"fatbin entry at offset {off:#x}: bad ZSTD data: {exc}") from None
    return bytes(out)


def _inflate_lz4(src: bytes, usize: int, off: int) -> bytes:
    if usize > _LZ4_MAX_RATIO * len(src) + 64:
        raise FatbinError(
            f"fatbin entry at offset {off:#x}: {usize} bytes cannot come from {len(src)} "
            "bytes of LZ4"
        )
    try:
        return lz4.block.decompress(src, uncompressed_size=usize)
    except Exception as exc:  # lz4.block.LZ4BlockError
        raise FatbinError(f"fatbin entry at offset {off:#x}: bad LZ4 block: {exc}") from None


def describe_entries(entries: Sequence[FatbinEntry]) -> str:
    """``"sm_90 cubin, compute_90 PTX"``: the distinct code objects, in image order."""
    labels: list[str] = []
    for e in entries:
        if e.label not in labels:
            labels.append(e.label)
    return ", ".join(labels) if labels else "no code entries"


def _requirement(cc: tuple[int, int]) -> str:
    sm = cc_to_sm(cc)
    return (
        f"device is {format_cc(cc)}: needs an sm_{cc[0]}0..sm_{sm} cubin or PTX for "
        f"compute <= {sm}; rebuild with -gencode arch=compute_{sm},code=sm_{sm} or embed "
        "PTX (code=compute_XX)"
    )


def no_compatible_code(contents: str, cc: tuple[int, int]) -> NoCompatibleCode:
    """The error for an image holding ``contents`` (e.g. "sm_90 cubin") on a ``cc`` device."""
    return NoCompatibleCode(f"image contains {contents}; {_requirement(cc)}")


def _best(entries: Sequence[FatbinEntry], ok: Callable[[FatbinEntry], bool]) -> FatbinEntry | None:
    best: FatbinEntry | None = None
    for e in entries:
        if ok(e) and (
            best is None or (e.sm, e.arch.specificity()) > (best.sm, best.arch.specificity())
        ):
            best = e
    return best


def select_ptx(entries: Sequence[FatbinEntry], cc: tuple[int, int]) -> FatbinEntry | None:
    """The PTX entry with the highest compute version a ``cc`` device can JIT, if any."""
    cc_to_sm(cc)
    return _best(entries, lambda e: e.is_ptx and e.arch.ptx_runs_on(cc))


def select_entry(entries: Sequence[FatbinEntry], cc: tuple[int, int]) -> FatbinEntry:
    """Best entry for a device of compute capability ``cc``.

    A cubin of the device's major with the highest minor <= the device's wins; failing that,
    the PTX with the highest compute version the device can JIT. Among equal versions,
    ``a`` (arch-specific) code beats ``f`` (family) code beats plain code; among identical
    architectures the first entry wins.
    """
    cc_to_sm(cc)  # validates cc
    best = _best(entries, lambda e: e.is_elf and e.arch.cubin_runs_on(cc))
    if best is None:
        best = select_ptx(entries, cc)
    if best is None:
        raise no_compatible_code(describe_entries(entries), cc)
    return best
