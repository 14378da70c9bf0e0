"""Cubin reader: kernels, parameter layouts, resources and globals from nvcc's ELF output."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crane.modules.cubin import (
    EIATTR_KPARAM_INFO_V2,
    CubinError,
    is_cubin,
    parse_cubin,
    parse_nv_info,
)
from crane.modules.errors import ImageError

WEIRD = ((0, 1), (8, 24), (32, 2), (40, 8), (48, 16))
SCALARS = ((0, 4), (4, 4), (8, 8), (16, 8), (24, 1), (26, 2), (32, 8))
VECTORS = ((0, 16), (16, 16), (32, 3), (40, 8), (48, 12), (64, 8), (72, 8))
KERNELS = {
    "weird",
    "scalars",
    "vectors",
    "empty",
    "dynshared",
    "uses_modshared",
    "bigparam",
    "_Z7manglediPi",
}


@pytest.mark.parametrize("build", ["cubin80", "cubin90", "cubin_rdc"])
def test_kernels_and_layouts(builds: dict[str, bytes], build: str) -> None:
    cubin = parse_cubin(builds[build])
    assert set(cubin.kernels) == KERNELS
    k = cubin.kernels
    assert k["weird"].layout == WEIRD and k["weird"].param_bytes == 64
    assert k["scalars"].layout == SCALARS and k["scalars"].param_bytes == 40
    assert k["vectors"].layout == VECTORS and k["vectors"].param_bytes == 80
    assert k["empty"].layout == () and k["empty"].param_bytes == 0
    assert k["_Z7manglediPi"].layout == ((0, 4), (8, 8))
    assert [p.ordinal for p in k["weird"].params or ()] == [0, 1, 2, 3, 4]
    for kernel in k.values():
        assert kernel.num_regs is not None and kernel.num_regs > 0
        assert kernel.frame_size == 0


def test_large_parameters_use_kparam_info_v2(builds: dict[str, bytes]) -> None:
    big = parse_cubin(builds["cubin80"]).kernels["bigparam"]
    assert big.layout == ((0, 20000), (20000, 8)) and big.param_bytes == 20008
    assert any(r.attr == EIATTR_KPARAM_INFO_V2 for r in big.records)


def test_architecture_and_type(builds: dict[str, bytes]) -> None:
    c80, c90, rdc = (parse_cubin(builds[n]) for n in ("cubin80", "cubin90", "cubin_rdc"))
    assert (c80.sm, c80.arch.cubin_name(), c80.relocatable) == (80, "sm_80", False)
    assert (c90.sm, rdc.sm, rdc.relocatable, rdc.elf_type) == (90, 80, True, 1)
    assert c80.tool_options is not None and "-arch sm_80" in c80.tool_options
    assert is_cubin(builds["cubin80"]) and not is_cubin(builds["exe"])


def test_launch_bounds(builds: dict[str, bytes]) -> None:
    k = parse_cubin(builds["cubin80"]).kernels
    assert k["scalars"].max_threads == (128, 1, 1)
    assert k["scalars"].max_threads_per_block == 128
    assert k["weird"].max_threads_per_block is None


def test_reqntid_from_ptxas(builds: dict[str, bytes]) -> None:
    k = parse_cubin(builds["handwritten_cubin"]).kernels["annotated"]
    assert k.req_threads == (64, 2, 1) and k.max_threads_per_block == 128
    assert k.layout == ((0, 8), (8, 4), (16, 8), (24, 12)) and k.param_bytes == 36


def test_static_shared_memory(builds: dict[str, bytes]) -> None:
    k80 = parse_cubin(builds["cubin80"]).kernels
    assert k80["weird"].static_shared_bytes == 256
    assert k80["uses_modshared"].static_shared_bytes == 128  # module-scope __shared__
    assert k80["dynshared"].static_shared_bytes == 0  # extern __shared__ is dynamic
    assert k80["weird"].reserved_shared_bytes == 0


def test_sm90_reserved_shared_prefix(builds: dict[str, bytes]) -> None:
    k90 = parse_cubin(builds["cubin90"]).kernels
    weird = k90["weird"]
    assert (weird.shared_section_bytes, weird.reserved_shared_bytes) == (1280, 1024)
    assert weird.static_shared_bytes == 256
    assert (k90["empty"].shared_section_bytes, k90["empty"].static_shared_bytes) == (1024, 0)
    assert k90["uses_modshared"].static_shared_bytes == 128


def test_relocatable_shared_is_unknown_until_link(builds: dict[str, bytes]) -> None:
    rdc = parse_cubin(builds["cubin_rdc"])
    # the module-scope __shared__ array is placed by nvlink, so no kernel total is final
    assert all(k.static_shared_bytes is None for k in rdc.kernels.values())


@pytest.mark.parametrize("build", ["cubin80", "cubin90", "cubin_rdc"])
def test_globals(builds: dict[str, bytes], build: str) -> None:
    g = parse_cubin(builds[build]).globals
    assert set(g) == {"table", "coeffs", "cinit", "gscalar"}
    assert (g["table"].size, g["table"].space) == (64, "global")
    assert g["table"].init == struct.pack("<16i", *range(1, 17))
    assert (g["coeffs"].size, g["coeffs"].space, g["coeffs"].init) == (16, "const", None)
    assert g["cinit"].init == struct.pack("<2d", 1.5, -2.25)
    assert (g["gscalar"].size, g["gscalar"].init) == (8, None)


def test_nv_info_records() -> None:
    blob = bytes([0x04, 0x17, 12, 0]) + struct.pack("<IHHI", 0, 1, 8, 8 << 18)
    blob += bytes([0x03, 0x19, 16, 0, 0x02, 0x4C, 1, 0, 0x01, 0x35, 0, 0])
    recs = parse_nv_info(blob, "test")
    assert [(r.fmt, r.attr) for r in recs] == [(4, 0x17), (3, 0x19), (2, 0x4C), (1, 0x35)]
    assert recs[1].value == 16 and recs[2].value == 1
    with pytest.raises(CubinError, match="unknown record format 9 at offset 0x0"):
        parse_nv_info(bytes([9, 0, 0, 0]), "test")
    with pytest.raises(CubinError, match="declares 12 bytes"):
        parse_nv_info(blob[:10], "test")


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d[:40], "ELF header needs 64 bytes"),
        (lambda d: b"\x7fELF\x01" + d[5:], "not ELFCLASS64"),
        (lambda d: d[:18] + struct.pack("<H", 62) + d[20:], "e_machine is 62, not EM_CUDA"),
        (lambda d: d[:16] + struct.pack("<H", 3) + d[18:], "e_type 3"),
        (lambda d: d[: len(d) // 2], "section header table at 0x[0-9a-f]+ lies past the end"),
    ],
)
def test_malformed_cubins(builds: dict[str, bytes], mutate, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CubinError, match=needle):
        parse_cubin(mutate(builds["cubin80"]))


def test_host_executable_is_not_a_cubin(builds: dict[str, bytes]) -> None:
    with pytest.raises(CubinError, match=r"\.nv_fatbin section"):
        parse_cubin(builds["exe"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_parse_cubin(builds: dict[str, bytes], data: st.DataObject) -> None:
    image = bytearray(builds[data.draw(st.sampled_from(["cubin80", "cubin_rdc"]))])
    edits = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(image) - 1), st.integers(0, 255)), min_size=1, max_size=8
        )
    )
    for pos, value in edits:
        image[pos] = value
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(image))))
    with contextlib.suppress(ImageError):
        parse_cubin(bytes(image[:cut] if cut is not None else image))
