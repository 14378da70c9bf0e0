"""Simulated device profiles: completeness, plausibility, internal consistency, identity."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.backends.sim.profiles import (
    DEFAULT_PROFILE_KEY,
    PROFILES,
    UnknownProfileError,
    get_profile,
)
from crane.device.model import (
    CUDART13_QUERIED_ATTRIBUTES,
    DEVICE_ATTRIBUTES,
    NVIDIA_PCI_VENDOR_ID,
    DeviceModel,
)

# key -> (cuDeviceGetName, compute capability, SM count, nominal memory in GiB)
EXPECTED = {
    "a100-40gb": ("NVIDIA A100-SXM4-40GB", (8, 0), 108, 40),
    "a100-80gb": ("NVIDIA A100-SXM4-80GB", (8, 0), 108, 80),
    "l4": ("NVIDIA L4", (8, 9), 58, 24),
    "h100-80gb": ("NVIDIA H100 80GB HBM3", (9, 0), 132, 80),
    "h200": ("NVIDIA H200", (9, 0), 132, 144),
    # not a product: an unreleased compute capability so libraries take their PTX paths
    "ptx-next": ("Crane simulated GPU (compute 13.0, runs PTX only)", (13, 0), 132, 80),
}

# The attributes cudart 13.0 queries: 1-143 minus these (facts file, section 2).
NOT_QUERIED = {13, 15, 17, 20, 36, 44, 69, 87, 92, 93, 94, 96, 98, 102, 103, 104, 105, 107}
NOT_QUERIED |= {110, 122, 123, 124, 126, 127, 128, 132, 135, 136, 137, 138, 141, 142}

BOOLEAN = {
    15, 17, 18, 19, 31, 32, 35, 41, 44, 78, 79, 80, 83, 84, 86, 88, 89, 90, 91, 92, 93, 94,
    95, 96, 98, 99, 100, 101, 102, 103, 104, 105, 107, 110, 112, 113, 114, 115, 116, 120,
    121, 122, 123, 124, 125, 127, 128, 129, 132, 133, 135, 138, 141, 142, 143, 144, 145,
    146, 147,
}  # fmt: skip

ALL_PROFILES = pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))


def test_profile_set() -> None:
    assert set(PROFILES) == set(EXPECTED)
    assert DEFAULT_PROFILE_KEY in PROFILES


def test_required_attribute_set_matches_the_facts_file() -> None:
    assert len(CUDART13_QUERIED_ATTRIBUTES) == 111
    assert set(range(1, 144)) - NOT_QUERIED == CUDART13_QUERIED_ATTRIBUTES
    assert set(range(1, 148)) == DEVICE_ATTRIBUTES  # every value cuda.h 13.0 defines


@ALL_PROFILES
def test_identity_matches_the_product(profile: DeviceModel) -> None:
    name, cc, sm_count, _ = EXPECTED[profile.key]
    assert profile.name == name
    assert profile.compute_capability == cc
    assert profile.sm_arch == cc[0] * 10 + cc[1]
    assert profile.sm_count == sm_count
    assert profile.attributes[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] == sm_count
    assert profile.attributes[A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR] == cc[0]
    assert profile.attributes[A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR] == cc[1]


@ALL_PROFILES
def test_every_attribute_is_answered(profile: DeviceModel) -> None:
    assert profile.attributes.keys() >= CUDART13_QUERIED_ATTRIBUTES
    assert set(profile.attributes) == DEVICE_ATTRIBUTES
    assert all(type(v) is int and -(2**31) <= v < 2**31 for v in profile.attributes.values())


@ALL_PROFILES
def test_values_are_plausible(profile: DeviceModel) -> None:
    attrs = profile.attributes
    for attribute in BOOLEAN:
        assert attrs[attribute] in (0, 1), A(attribute).name
    signed = {A.CU_DEVICE_ATTRIBUTE_NUMA_ID, A.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID}
    assert all(v >= 0 for k, v in attrs.items() if k not in signed)
    assert attrs[A.CU_DEVICE_ATTRIBUTE_NUMA_ID] >= -1

    assert profile.warp_size == 32
    assert profile.max_threads_per_block == 1024
    assert profile.max_block == (1024, 1024, 64)
    assert profile.max_grid == (2**31 - 1, 65535, 65535)
    assert profile.max_shared_per_block == 48 * 1024
    assert profile.regs_per_block == 65536
    assert profile.regs_per_sm == 65536
    assert profile.total_const_mem == 64 * 1024
    assert 1_000_000 <= profile.clock_khz <= 2_500_000
    assert 1_000_000 <= profile.mem_clock_khz <= 10_000_000
    assert profile.bus_width in (192, 5120, 6144)
    assert 32 * 2**20 <= profile.l2_size <= 64 * 2**20
    assert 1 <= profile.async_engine_count <= 8
    assert attrs[A.CU_DEVICE_ATTRIBUTE_ECC_ENABLED] == 1
    assert attrs[A.CU_DEVICE_ATTRIBUTE_INTEGRATED] == 0


@ALL_PROFILES
def test_internal_consistency(profile: DeviceModel) -> None:
    attrs = profile.attributes
    x, y, z = profile.max_block
    assert max(x, y, z) <= profile.max_threads_per_block
    assert profile.max_threads_per_block % profile.warp_size == 0
    assert profile.max_threads_per_block <= profile.max_threads_per_sm
    assert profile.max_threads_per_sm % profile.warp_size == 0
    assert profile.max_blocks_per_sm * profile.warp_size <= profile.max_threads_per_sm

    # Opt-in shared memory is the SM's capacity minus the driver's per-block reservation.
    assert profile.max_shared_per_block_optin >= profile.max_shared_per_block
    assert (
        profile.max_shared_per_block_optin + profile.reserved_shared_per_block
        == profile.max_shared_per_sm
    )
    assert profile.regs_per_block <= profile.regs_per_sm

    persisting = attrs[A.CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE]
    assert 0 < persisting < profile.l2_size
    assert attrs[A.CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE] > 0

    hopper = profile.compute_capability >= (9, 0)
    assert attrs[A.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH] == int(hopper)
    assert attrs[A.CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED] == int(hopper)

    # Texture limits nest: layered/mipmapped/gather never exceed the plain 2D limits.
    assert (
        attrs[A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH]
        <= (attrs[A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH])
    )
    assert (
        attrs[A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH]
        <= (attrs[A.CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH])
    )

    # NUMA: a GPU that is not a NUMA node reports node id -1.
    if attrs[A.CU_DEVICE_ATTRIBUTE_NUMA_CONFIG] == 0:
        assert attrs[A.CU_DEVICE_ATTRIBUTE_NUMA_ID] == -1


@ALL_PROFILES
def test_memory_size(profile: DeviceModel) -> None:
    nominal = EXPECTED[profile.key][3] * 2**30
    # cuDeviceTotalMem excludes what the driver reserves, never more than ~10% of the board.
    assert 0.9 * nominal <= profile.total_mem <= nominal


@ALL_PROFILES
def test_pci_identity(profile: DeviceModel) -> None:
    attrs = profile.attributes
    for attribute in (
        A.CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID,
        A.CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID,
    ):
        assert attrs[attribute] & 0xFFFF == NVIDIA_PCI_VENDOR_ID
    assert profile.pci_domain_id == attrs[A.CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID]
    assert profile.pci_bus_id == attrs[A.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID]
    assert profile.pci_device_id == attrs[A.CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID]
    assert 0 <= profile.pci_bus_id <= 0xFF
    domain, bus, rest = profile.pci_bus_id_string.split(":")
    assert (int(domain, 16), int(bus, 16), rest) == (
        profile.pci_domain_id,
        profile.pci_bus_id,
        "00.0",
    )


def test_distinct_products_have_distinct_pci_device_ids() -> None:
    ids = {p.attribute(A.CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID) for p in PROFILES.values()}
    assert len(ids) == len(PROFILES)


@ALL_PROFILES
def test_uuid_stable_per_seed(profile: DeviceModel) -> None:
    first = profile.uuid_for(b"session-1")
    assert len(first) == 16
    assert profile.uuid_for(b"session-1") == first
    assert profile.uuid_for(b"session-2") != first
    parsed = uuid.UUID(bytes=first)
    assert parsed.variant == uuid.RFC_4122
    assert parsed.version == 5


def test_uuid_differs_across_profiles() -> None:
    seed = bytes(range(32))
    uuids = {p.uuid_for(seed) for p in PROFILES.values()}
    assert len(uuids) == len(PROFILES)


def test_get_profile() -> None:
    assert get_profile("h100-80gb") is PROFILES["h100-80gb"]
    with pytest.raises(KeyError) as info:
        get_profile("v100")
    assert isinstance(info.value, UnknownProfileError)
    message = str(info.value)
    assert "v100" in message
    assert all(key in message for key in PROFILES)


def test_profiles_are_immutable() -> None:
    profile = get_profile("l4")
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        profile.attributes[1] = 1  # type: ignore[index]
    with pytest.raises(KeyError):
        profile.attribute(9999)


def test_invalid_profile_is_rejected() -> None:
    good = get_profile("a100-40gb")
    missing = {k: v for k, v in good.attributes.items() if k != A.CU_DEVICE_ATTRIBUTE_WARP_SIZE}
    with pytest.raises(ValueError, match="missing attributes"):
        DeviceModel("x", "X", (8, 0), good.total_mem, missing)
    with pytest.raises(ValueError, match="compute_capability"):
        DeviceModel("x", "X", (9, 0), good.total_mem, good.attributes)
