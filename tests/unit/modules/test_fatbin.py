"""Fatbinary reader: wrappers, headers, every nvcc compression mode, selection, bad input."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crane.modules.cubin import parse_cubin
from crane.modules.elf import parse_elf
from crane.modules.fatbin import (
    ENTRY_KIND_ELF,
    ENTRY_KIND_PTX,
    FLAG_ARCH_SPECIFIC,
    FLAG_FAMILY_SPECIFIC,
    FLAG_LZ4,
    FLAG_ZSTD,
    WRAPPER_MAGIC,
    FatbinError,
    NoCompatibleCode,
    fatbin_total_size,
    parse_fatbin,
    parse_fatbin_headers,
    parse_wrapper,
    select_entry,
    select_ptx,
    split_fatbins,
)

from .fatbin_builder import RawEntry, build_fatbin

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def labels(data: bytes) -> list[str]:
    return [e.label for e in parse_fatbin(data)]


# -- wrapper and header ------------------------------------------------------------------------


def test_parse_wrapper_fields() -> None:
    w = parse_wrapper(struct.pack("<IiQQ", WRAPPER_MAGIC, 2, 0x7F00_1000, 0x7F00_2000))
    assert (w.magic, w.version, w.data_ptr, w.prelinked_ptr) == (
        WRAPPER_MAGIC,
        2,
        0x7F00_1000,
        0x7F00_2000,
    )


@pytest.mark.parametrize(
    ("buf", "needle"),
    [
        (b"\xb1\x43\x62\x46", "needs 24 bytes"),
        (struct.pack("<IiQQ", 0x12345678, 1, 0, 0), "bad fatbin wrapper magic 0x12345678"),
        (struct.pack("<IiQQ", WRAPPER_MAGIC, 3, 0, 0), "version 3"),
    ],
)
def test_parse_wrapper_rejects(buf: bytes, needle: str) -> None:
    with pytest.raises(FatbinError, match=needle):
        parse_wrapper(buf)


def test_wrappers_in_executable_point_at_the_fatbins(builds: dict[str, bytes]) -> None:
    """What the guest does: wrapper -> data pointer -> 16-byte header -> whole image."""
    elf = parse_elf(builds["exe"])
    seg, fat = elf.section(".nvFatBinSegment"), elf.section(".nv_fatbin")
    assert seg is not None and fat is not None
    section = elf.section_data(fat)
    segment = elf.section_data(seg)
    copied = []
    for off in range(0, len(segment) - 23, 24):
        w = parse_wrapper(segment[off : off + 24])
        assert w.version in (1, 2)
        start = w.data_ptr - fat.addr
        assert 0 <= start < len(section)
        size = fatbin_total_size(section[start : start + 16])
        copied.append(section[start : start + size])
    assert sorted(copied) == sorted(split_fatbins(section))


def test_total_size_from_header_only(builds: dict[str, bytes]) -> None:
    for name in ("default", "compress_all", "lz4_all", "multi", "sm90a"):
        data = builds[name]
        assert fatbin_total_size(data[:16]) == len(data), name


@pytest.mark.parametrize(
    ("header", "needle"),
    [
        (b"\x50\xed\x55", "needs 16 bytes"),
        (struct.pack("<IHHQ", 0xDEADBEEF, 1, 16, 0), "bad fatbin magic 0xdeadbeef at offset 0"),
        (struct.pack("<IHHQ", 0xBA55ED50, 2, 16, 0), "version 2"),
        (struct.pack("<IHHQ", 0xBA55ED50, 1, 8, 0), "header size 8"),
    ],
)
def test_total_size_rejects(header: bytes, needle: str) -> None:
    with pytest.raises(FatbinError, match=needle):
        fatbin_total_size(header)


# -- entries and compression ---------------------------------------------------------------


def test_default_build_entries(builds: dict[str, bytes]) -> None:
    elf, ptx = parse_fatbin(builds["default"])
    assert (elf.kind, elf.sm, elf.compression) == (ENTRY_KIND_ELF, 75, None)
    assert elf.data[:4] == b"\x7fELF" and elf.code_version == (1, 8)
    assert (ptx.kind, ptx.sm, ptx.compression) == (ENTRY_KIND_PTX, 75, "zstd")
    assert ptx.ptx_version == (9, 0) and elf.ptx_version is None
    assert ptx.uncompressed_size >= len(ptx.data) > ptx.compressed_size > 0
    assert not ptx.data.endswith(b"\0")
    text = ptx.ptx_text
    assert ".version 9.0" in text and ".target sm_75" in text
    assert ptx.header_size >= 64 and ptx.offset == elf.offset + elf.header_size + elf.payload_size
    assert ptx.flags & 0x1 and ptx.flags & 0x10  # 64-bit, Linux


@pytest.mark.parametrize(
    ("build", "elf_comp", "ptx_comp"),
    [
        ("default", None, "zstd"),
        ("compress_all", "zstd", "zstd"),
        ("lz4", None, "lz4"),
        ("lz4_all", "lz4", "lz4"),
        ("no_compress", None, None),
    ],
)
def test_compression_modes_decode_to_the_same_code(
    builds: dict[str, bytes], build: str, elf_comp: str | None, ptx_comp: str | None
) -> None:
    elf, ptx = parse_fatbin(builds[build])
    assert (elf.compression, ptx.compression) == (elf_comp, ptx_comp)
    if elf_comp:
        assert elf.flags & (FLAG_ZSTD if elf_comp == "zstd" else FLAG_LZ4)
        assert elf.uncompressed_size == len(elf.data)
    ref_elf, ref_ptx = parse_fatbin(builds["no_compress"])
    assert elf.data == ref_elf.data
    assert ptx.data == ref_ptx.data


def test_several_gencode_targets(builds: dict[str, bytes]) -> None:
    assert labels(builds["multi"]) == [
        "sm_75 cubin",
        "sm_80 cubin",
        "compute_90 PTX",
        "sm_90 cubin",
    ]


@pytest.mark.parametrize(
    ("cc", "expected"),
    [
        ((7, 5), "sm_75 cubin"),
        ((8, 0), "sm_80 cubin"),
        ((8, 6), "sm_80 cubin"),
        ((8, 9), "sm_80 cubin"),
        ((9, 0), "sm_90 cubin"),
        ((10, 0), "compute_90 PTX"),
        ((12, 0), "compute_90 PTX"),
    ],
)
def test_select_multi(builds: dict[str, bytes], cc: tuple[int, int], expected: str) -> None:
    assert select_entry(parse_fatbin(builds["multi"]), cc).label == expected


@pytest.mark.parametrize(
    ("cc", "expected"),
    [((7, 5), "sm_75 cubin"), ((8, 0), "compute_75 PTX"), ((8, 9), "compute_75 PTX"),
     ((9, 0), "compute_75 PTX")],
)  # fmt: skip
def test_select_default(builds: dict[str, bytes], cc: tuple[int, int], expected: str) -> None:
    assert select_entry(parse_fatbin(builds["default"]), cc).label == expected


def test_select_ptx_only_when_compatible(builds: dict[str, bytes]) -> None:
    entries = parse_fatbin(builds["multi"])
    assert select_ptx(entries, (8, 9)) is None
    ptx = select_ptx(entries, (9, 0))
    assert ptx is not None and ptx.label == "compute_90 PTX"


def test_no_compatible_code_message(builds: dict[str, bytes]) -> None:
    with pytest.raises(NoCompatibleCode) as info:
        select_entry(parse_fatbin(builds["sm90_only"]), (8, 0))
    assert str(info.value) == (
        "image contains sm_90 cubin; device is sm_80: needs an sm_80..sm_80 cubin or PTX for "
        "compute <= 80; rebuild with -gencode arch=compute_80,code=sm_80 or embed PTX "
        "(code=compute_XX)"
    )
    assert isinstance(info.value, FatbinError) and isinstance(info.value, ValueError)
    with pytest.raises(NoCompatibleCode, match=r"device is sm_86: needs an sm_80\.\.sm_86 cubin"):
        select_entry(parse_fatbin(builds["sm90_only"]), (8, 6))


def test_arch_specific_sm90a(builds: dict[str, bytes]) -> None:
    entries = parse_fatbin(builds["sm90a"])
    assert [e.label for e in entries] == ["sm_90a cubin", "compute_90a PTX"]
    assert all(e.flags & FLAG_ARCH_SPECIFIC and e.sm == 90 for e in entries)
    assert select_entry(entries, (9, 0)).label == "sm_90a cubin"
    for cc in ((8, 9), (10, 0), (12, 0)):
        with pytest.raises(NoCompatibleCode, match="sm_90a cubin, compute_90a PTX"):
            select_entry(entries, cc)
    # The ELF header cannot tell sm_90a from sm_90; only the fatbin flag and tkinfo can.
    cubin = parse_cubin(entries[0].data)
    plain = parse_cubin(builds["cubin90"])
    assert cubin.e_flags == plain.e_flags
    assert cubin.arch.suffix == "a" and plain.arch.suffix == ""


def test_family_specific_sm100f(builds: dict[str, bytes]) -> None:
    (entry,) = parse_fatbin(builds["sm100f"])
    assert entry.flags & FLAG_FAMILY_SPECIFIC and entry.label == "sm_100f cubin"
    assert select_entry([entry], (10, 0)) is entry
    assert select_entry([entry], (10, 3)) is entry
    for cc in ((9, 0), (12, 0)):
        with pytest.raises(NoCompatibleCode):
            select_entry([entry], cc)


# -- concatenated fatbins --------------------------------------------------------------------


def test_concatenated_section(nv_fatbin_section: bytes) -> None:
    headers = parse_fatbin_headers(nv_fatbin_section)
    assert len(headers) == 2
    assert headers[1].offset % 8 == 0 and headers[1].offset >= headers[0].end
    entries = parse_fatbin(nv_fatbin_section)
    assert {e.fatbin_index for e in entries} == {0, 1}
    assert [e.label for e in entries if e.fatbin_index == 1] == ["sm_75 cubin", "compute_75 PTX"]
    parts = split_fatbins(nv_fatbin_section)
    assert [len(p) for p in parts] == [h.end - h.offset for h in headers]
    # zero padding after the last fatbin is section alignment, not an error
    assert len(parse_fatbin(nv_fatbin_section + bytes(24))) == len(entries)
    with pytest.raises(FatbinError, match=r"bad fatbin magic .* at offset"):
        parse_fatbin(nv_fatbin_section + b"\x01" + bytes(15))


# -- malformed input -------------------------------------------------------------------------


def _ptx_entry(**kw: object) -> RawEntry:
    return RawEntry(ENTRY_KIND_PTX, 80, b".version 8.0\n.target sm_80\n\0\0", **kw)  # type: ignore[arg-type]


def test_builder_round_trip() -> None:
    for comp in (None, "zstd", "lz4"):
        (e,) = parse_fatbin(build_fatbin(_ptx_entry(compress=comp, header_size=80)))
        assert e.ptx_text == ".version 8.0\n.target sm_80\n" and e.compression == comp


def _patch(data: bytes, off: int, fmt: str, value: int) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, off, value)
    return bytes(buf)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: b"", "empty input"),
        (lambda d: d[:10], "truncated fatbin header at offset 0x0"),
        (lambda d: _patch(d, 8, "<Q", 1 << 40), "declares 1099511627776 bytes"),
        (lambda d: _patch(d, 16 + 4, "<I", 32), "header size 32 < 64"),
        (lambda d: _patch(d, 16 + 4, "<I", 4096), "runs past the end of the fatbin"),
        (lambda d: _patch(d, 16 + 8, "<Q", 1 << 33), "payload of 8589934592 bytes"),
        (lambda d: _patch(d, 16 + 16, "<I", 1 << 20), "compressed size 1048576 is not within"),
        (lambda d: _patch(d, 16 + 56, "<Q", 0), "declared uncompressed size 0"),
        (lambda d: _patch(d, 16 + 56, "<Q", 7), "more than the 7 bytes the header declares"),
        (lambda d: _patch(d, 16 + 56, "<Q", 99), "decompressed to 29 bytes, header declares 99"),
        (lambda d: _patch(d, 16 + 80, "<I", 0), "bad ZSTD data"),
        (lambda d: _patch(d, 16 + 40, "<Q", 0x11 | FLAG_ZSTD | FLAG_LZ4), "both LZ4 and ZSTD"),
        (lambda d: _patch(d, 16 + 40, "<Q", 0x11), "no known compression flag"),
        (lambda d: _patch(d, 16 + 20, "<I", 76), "options descriptor at header offset 0x4c"),
    ],
)
def test_malformed_fatbins(mutate, needle: str) -> None:  # type: ignore[no-untyped-def]
    good = build_fatbin(_ptx_entry(compress="zstd", header_size=80))
    parse_fatbin(good)
    with pytest.raises(FatbinError, match=needle):
        parse_fatbin(mutate(good))


def test_lz4_size_claim_is_bounded() -> None:
    good = build_fatbin(_ptx_entry(compress="lz4"))
    with pytest.raises(FatbinError, match="cannot come from"):
        parse_fatbin(_patch(good, 16 + 56, "<Q", 1 << 30))


def test_every_truncation_of_a_real_fatbin(builds: dict[str, bytes]) -> None:
    data = builds["compress_all"]
    for n in range(len(data)):
        with pytest.raises(FatbinError):
            parse_fatbin(data[:n])


_FUZZ_SOURCES = ("default", "lz4_all", "no_compress", "compress_all", "multi")


@FUZZ
@given(data=st.data())
def test_fuzz_parse_fatbin(builds: dict[str, bytes], data: st.DataObject) -> None:
    image = bytearray(builds[data.draw(st.sampled_from(_FUZZ_SOURCES))])
    # Bias mutations toward the headers, where a flipped byte changes the structure.
    hot = st.integers(0, min(len(image) - 1, 255))
    anywhere = st.integers(0, len(image) - 1)
    for pos, value in data.draw(
        st.lists(st.tuples(st.one_of(hot, anywhere), st.integers(0, 255)), min_size=1, max_size=6)
    ):
        image[pos] = value
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(image))))
    blob = bytes(image[:cut] if cut is not None else image)
    with contextlib.suppress(FatbinError):
        parse_fatbin(blob)


@FUZZ
@given(
    fields=st.lists(
        st.tuples(
            st.sampled_from([0, 4, 6, 8, 16, 20, 22, 24, 32, 40, 48, 56, 64, 72, 96]),
            st.sampled_from(["<I", "<Q", "<H"]),
            st.one_of(st.integers(0, 300), st.integers(0, 2**16 - 1), st.just(2**32 - 1)),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_fuzz_header_fields(builds: dict[str, bytes], fields: list[tuple[int, str, int]]) -> None:
    image = bytearray(builds["lz4_all"])
    for rel, fmt, value in fields:
        off = 16 + rel  # inside the first entry header
        struct.pack_into(fmt, image, off, value & ((1 << (8 * struct.calcsize(fmt))) - 1))
    with contextlib.suppress(FatbinError):
        parse_fatbin(bytes(image))
