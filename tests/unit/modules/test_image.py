"""inspect_image: the daemon's single entry point, over every kind of image nvcc produces."""

from __future__ import annotations

import contextlib
import hashlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crane.modules import ImageError, NoCompatibleCode, inspect_image, inspect_images
from crane.modules.fatbin import ENTRY_KIND_ELF, ENTRY_KIND_PTX, WRAPPER_MAGIC, parse_fatbin

from .fatbin_builder import RawEntry, build_fatbin

WEIRD = ((0, 1), (8, 24), (32, 2), (40, 8), (48, 16))


def test_default_fatbin_on_its_cubin_arch(builds: dict[str, bytes]) -> None:
    data = builds["default"]
    img = inspect_image(data, (7, 5))
    assert (img.kind, img.arch, img.container, img.relocatable) == (
        "cubin",
        "sm_75",
        "fatbin",
        False,
    )
    assert isinstance(img.code, bytes) and img.code[:4] == b"\x7fELF"
    assert img.ptx is not None and ".target sm_75" in img.ptx  # for a simulated GPU
    assert img.sha256 == hashlib.sha256(data).hexdigest()
    assert "sm_75 cubin" in img.description and "compute_75 PTX" in img.description
    weird = img.kernels["weird"]
    assert weird.params == WEIRD and weird.param_bytes == 64 and weird.layout_source == "cubin"
    assert weird.static_shared_bytes == 256 and weird.num_regs
    assert img.kernels["scalars"].max_threads_per_block == 128
    assert img.globals["table"].init == struct.pack("<16i", *range(1, 17))


def test_default_fatbin_jits_ptx_on_newer_devices(builds: dict[str, bytes]) -> None:
    for cc in ((8, 0), (8, 9), (9, 0)):
        img = inspect_image(builds["default"], cc)
        assert (img.kind, img.arch) == ("ptx", "compute_75")
        assert img.code == img.ptx and isinstance(img.code, str)
        assert img.kernels["weird"].layout_source == "ptx"
        assert img.kernels["weird"].num_regs is None


def test_cubin_and_ptx_paths_agree(builds: dict[str, bytes]) -> None:
    via_cubin = inspect_image(builds["default"], (7, 5))
    via_ptx = inspect_image(builds["default"], (8, 0))
    assert set(via_cubin.kernels) == set(via_ptx.kernels)
    for name, k in via_cubin.kernels.items():
        p = via_ptx.kernels[name]
        assert (k.params, k.param_bytes, k.static_shared_bytes, k.max_threads_per_block) == (
            p.params,
            p.param_bytes,
            p.static_shared_bytes,
            p.max_threads_per_block,
        ), name
    assert via_cubin.globals == via_ptx.globals


@pytest.mark.parametrize(
    ("cc", "kind", "arch", "has_ptx"),
    [
        ((7, 5), "cubin", "sm_75", False),
        ((8, 0), "cubin", "sm_80", False),
        ((8, 9), "cubin", "sm_80", False),
        ((9, 0), "cubin", "sm_90", True),
        ((10, 0), "ptx", "compute_90", True),
    ],
)
def test_multi_target_selection(
    builds: dict[str, bytes], cc: tuple[int, int], kind: str, arch: str, has_ptx: bool
) -> None:
    img = inspect_image(builds["multi"], cc)
    assert (img.kind, img.arch, img.ptx is not None) == (kind, arch, has_ptx)
    assert img.kernels["weird"].params == WEIRD


@pytest.mark.parametrize("build", ["compress_all", "lz4", "lz4_all", "no_compress"])
def test_every_compression_mode(builds: dict[str, bytes], build: str) -> None:
    assert (
        inspect_image(builds[build], (7, 5)).kernels
        == inspect_image(builds["default"], (7, 5)).kernels
    )


def test_incompatible_image(builds: dict[str, bytes]) -> None:
    with pytest.raises(NoCompatibleCode) as info:
        inspect_image(builds["sm90_only"], (8, 0))
    msg = str(info.value)
    assert "sm_90 cubin" in msg and "device is sm_80" in msg
    assert "-gencode arch=compute_80,code=sm_80" in msg
    assert isinstance(info.value, ImageError)


def test_arch_specific_only_on_its_device(builds: dict[str, bytes]) -> None:
    assert inspect_image(builds["sm90a"], (9, 0)).arch == "sm_90a"
    with pytest.raises(NoCompatibleCode, match="sm_90a cubin, compute_90a PTX"):
        inspect_image(builds["sm90a"], (10, 0))


def test_bare_cubin(builds: dict[str, bytes]) -> None:
    img = inspect_image(builds["cubin80"], (8, 6))
    assert (img.kind, img.container, img.arch, img.ptx) == ("cubin", "cubin", "sm_80", None)
    assert img.code == builds["cubin80"] and img.kernels["weird"].params == WEIRD
    with pytest.raises(NoCompatibleCode, match="image contains sm_80 cubin; device is sm_90"):
        inspect_image(builds["cubin80"], (9, 0))
    assert inspect_image(builds["cubin90"], (9, 0)).kernels["weird"].static_shared_bytes == 256


def test_relocatable_cubin(builds: dict[str, bytes]) -> None:
    img = inspect_image(builds["cubin_rdc"], (8, 0))
    assert img.relocatable and "relocatable" in img.description
    assert img.kernels["weird"].params == WEIRD
    assert img.kernels["weird"].static_shared_bytes is None  # placed by the linker


def test_bare_ptx(builds: dict[str, bytes]) -> None:
    raw = builds["ptx80"] + b"\0"  # cuModuleLoadData gets a NUL-terminated string
    img = inspect_image(raw, (8, 6))
    assert (img.kind, img.container, img.arch) == ("ptx", "ptx", "compute_80")
    assert img.code == img.ptx == builds["ptx80"].decode()
    assert img.kernels["weird"].params == WEIRD
    assert img.globals["cinit"].init == struct.pack("<2d", 1.5, -2.25)
    assert img.ptx_info is not None and "weird" in img.ptx_info.entries
    with pytest.raises(NoCompatibleCode, match="compute_80 PTX; device is sm_75"):
        inspect_image(raw, (7, 5))


def test_executable_nv_fatbin_section(nv_fatbin_section: bytes) -> None:
    img = inspect_image(nv_fatbin_section, (7, 5))
    assert img.kind == "cubin" and img.kernels["weird"].params == WEIRD
    assert "skipped" in img.description and "defines nothing" in img.description
    assert len(inspect_images(nv_fatbin_section, (7, 5))) == 1


def test_blob_with_two_modules(builds: dict[str, bytes]) -> None:
    blob = builds["default"] + bytes(-len(builds["default"]) % 8) + builds["multi"]
    with pytest.raises(ImageError, match="2 fatbins with code, each a separate module"):
        inspect_image(blob, (8, 0))
    images = inspect_images(blob, (8, 0))
    assert [i.arch for i in images] == ["compute_75", "sm_80"]


def test_layout_disagreement_is_an_error(builds: dict[str, bytes]) -> None:
    elf = next(e for e in parse_fatbin(builds["default"]) if e.is_elf)
    ptx = builds["ptx80"].decode().replace("sm_80", "sm_75")
    broken = ptx.replace(".param .u16 weird_param_2", ".param .u64 weird_param_2")
    good = build_fatbin(
        RawEntry(ENTRY_KIND_ELF, 75, elf.data),
        RawEntry(ENTRY_KIND_PTX, 75, ptx.encode(), compress="zstd", version=(9, 0)),
    )
    assert inspect_image(good, (7, 5)).kernels["weird"].params == WEIRD
    bad = build_fatbin(
        RawEntry(ENTRY_KIND_ELF, 75, elf.data),
        RawEntry(ENTRY_KIND_PTX, 75, broken.encode(), version=(9, 0)),
    )
    with pytest.raises(ImageError, match=r"kernel 'weird': cubin KPARAM_INFO layout .* disagrees"):
        inspect_image(bad, (7, 5))


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "unrecognised module image \\(0 bytes"),
        (b"hello world", "unrecognised module image"),
        (b"\xff\xfe\x00garbage", "unrecognised"),
        (struct.pack("<IiQQ", WRAPPER_MAGIC, 1, 0x1000, 0), "__fatBinC_Wrapper_t"),
        (b"\x7fELF", "ELF header needs 64 bytes"),
        (b".version 8.0\n.target sm_80\n.entry k(", "PTX line 3"),
    ],
)
def test_garbage(data: bytes, needle: str) -> None:
    with pytest.raises(ImageError, match=needle):
        inspect_image(data, (8, 0))


def test_host_executable_is_refused_with_a_hint(builds: dict[str, bytes]) -> None:
    with pytest.raises(ImageError, match="nv_fatbin"):
        inspect_image(builds["exe"], (7, 5))


_FUZZ_SOURCES = ("default", "no_compress", "lz4_all", "cubin80", "cubin_rdc", "ptx80")


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_fuzz_inspect_image(builds: dict[str, bytes], data: st.DataObject) -> None:
    image = bytearray(builds[data.draw(st.sampled_from(_FUZZ_SOURCES))])
    positions = st.one_of(st.integers(0, min(255, len(image) - 1)), st.integers(0, len(image) - 1))
    for pos, value in data.draw(
        st.lists(st.tuples(positions, st.integers(0, 255)), min_size=1, max_size=6)
    ):
        image[pos] = value
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(image))))
    cc = data.draw(st.sampled_from([(7, 5), (8, 0), (9, 0)]))
    with contextlib.suppress(ImageError):
        inspect_image(bytes(image[:cut] if cut is not None else image), cc)
