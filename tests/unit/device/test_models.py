"""Device model files, what a model may promise on a device, and the baseline of several."""

from __future__ import annotations

from pathlib import Path

import pytest

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.backends.sim.profiles import PROFILES
from crane.device.model_file import (
    ModelFileError,
    model_from_dict,
    model_to_dict,
    model_to_toml,
    read_model_file,
)
from crane.device.presented import attribute_kind, baseline, present, promises_more

OPTIN = int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
TEX_ALIGN = int(A.CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT)
CLOCK = int(A.CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
WARP = int(A.CU_DEVICE_ATTRIBUTE_WARP_SIZE)
POOL_TYPES = int(A.CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES)


def test_model_file_round_trip(tmp_path: Path) -> None:
    for m in PROFILES.values():
        path = tmp_path / f"{m.key}.toml"
        path.write_text(model_to_toml(m))
        back = read_model_file(path)
        assert (back.key, back.name, back.cc, back.total_mem) == (
            m.key,
            m.name,
            m.cc,
            m.total_mem,
        )
        assert dict(back.attributes) == dict(m.attributes)


def test_model_file_names_attributes_and_may_leave_cc_to_the_device(tmp_path: Path) -> None:
    text = model_to_toml(PROFILES["l4"]).replace("compute_capability = [8, 9]\n", "")
    assert "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 101376" in text
    path = tmp_path / "l4.toml"
    path.write_text(text)
    with pytest.raises(ModelFileError, match="compute_capability is missing"):
        read_model_file(path)
    m = read_model_file(path, default_cc=(9, 0))
    assert m.cc == (9, 0) and m.attribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) == 9
    # the full cuda.h name is accepted too
    data = model_to_dict(PROFILES["l4"])
    data["attributes"]["CU_DEVICE_ATTRIBUTE_WARP_SIZE"] = data["attributes"].pop("WARP_SIZE")
    assert model_from_dict(data, "x").attribute(WARP) == 32


def test_model_file_errors_say_what_is_wrong(tmp_path: Path) -> None:
    data = model_to_dict(PROFILES["l4"])
    data["attributes"]["NO_SUCH_THING"] = 1
    with pytest.raises(ModelFileError, match="unknown device attribute 'NO_SUCH_THING'"):
        model_from_dict(data, "f")
    data = model_to_dict(PROFILES["l4"])
    del data["attributes"]["MAX_THREADS_PER_BLOCK"]
    with pytest.raises(ModelFileError, match="missing attributes required by cudart 13"):
        model_from_dict(data, "f")
    bad = tmp_path / "bad.toml"
    bad.write_text("key = [")
    with pytest.raises(ModelFileError, match="not TOML"):
        read_model_file(bad)
    with pytest.raises(ModelFileError, match="No such file"):
        read_model_file(tmp_path / "absent.toml")


def test_attribute_kinds() -> None:
    assert attribute_kind(OPTIN) == "limit"
    assert attribute_kind(A.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH) == "limit"  # a feature
    assert attribute_kind(TEX_ALIGN) == "requirement"
    assert attribute_kind(CLOCK) == "informational"
    assert attribute_kind(WARP) == "exact"
    assert attribute_kind(POOL_TYPES) == "mask"


def test_a_model_may_not_promise_more_than_the_device() -> None:
    h100, a100 = PROFILES["h100-80gb"], PROFILES["a100-40gb"]
    assert promises_more(a100, h100.attributes, h100.cc, simulated=False) == []
    why = promises_more(h100, a100.attributes, a100.cc, simulated=False)
    assert "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: model 232448 > device 166912" in why
    assert "compute capability: model 9.0 > device 8.0" in why[0]
    # the simulator runs PTX of any target: no compute-capability refusal there
    assert not any(
        "compute capability" in w for w in promises_more(h100, {}, (8, 0), simulated=True)
    )
    # requirements the other way round, masks by bit, the warp size exactly
    attrs = dict(a100.attributes)
    attrs[TEX_ALIGN] = a100.attribute(TEX_ALIGN) * 2
    attrs[POOL_TYPES] = a100.attribute(POOL_TYPES) & ~1
    attrs[WARP] = 64
    why = promises_more(a100, attrs, a100.cc, simulated=False)
    assert any(w.startswith("TEXTURE_ALIGNMENT: model 512 < device 1024") for w in why), why
    assert any(w.startswith("MEMPOOL_SUPPORTED_HANDLE_TYPES") for w in why)
    assert any(w.startswith("WARP_SIZE: model 32 != device 64") for w in why)
    # informational values promise nothing
    attrs = dict(a100.attributes)
    attrs[CLOCK] = 1
    assert promises_more(a100, attrs, a100.cc, simulated=False) == []


def test_present_clips_memory_only() -> None:
    a100 = PROFILES["a100-80gb"]
    told = present(a100, 1 << 30)
    assert told.total_mem == 1 << 30 and dict(told.attributes) == dict(a100.attributes)
    assert present(a100, 1 << 50).total_mem == a100.total_mem


def test_baseline_is_the_greatest_common_model() -> None:
    keys = ("h100-80gb", "a100-40gb", "l4")
    models = [PROFILES[k] for k in keys]
    b = baseline(models, "pool")
    assert b.key == "pool" and b.cc == (8, 0)
    assert b.total_mem == min(m.total_mem for m in models)
    for a, v in b.attributes.items():
        values = [m.attribute(a) for m in models]
        kind = attribute_kind(a)
        if a in (75, 76):
            continue
        want = {"requirement": max(values), "mask": values[0] & values[1] & values[2]}.get(
            kind, min(values)
        )
        assert v == want, A(a).name
    # every device can present it
    for m in models:
        assert promises_more(b, m.attributes, m.cc, simulated=False) == []
    assert b.name.startswith("Crane baseline (NVIDIA H100")
    assert baseline([PROFILES["l4"], PROFILES["l4"]], "two-l4").name == "NVIDIA L4"
    # a stricter requirement on one device wins
    data = model_to_dict(PROFILES["l4"])
    data["attributes"]["TEXTURE_ALIGNMENT"] = 1024
    strict = model_from_dict(data, "strict")
    assert baseline([PROFILES["h100-80gb"], strict], "p").attribute(TEX_ALIGN) == 1024


def test_baseline_refuses_devices_of_different_warp_sizes() -> None:
    data = model_to_dict(PROFILES["l4"])
    data["attributes"]["WARP_SIZE"] = 64
    with pytest.raises(ValueError, match="WARP_SIZE"):
        baseline([PROFILES["l4"], model_from_dict(data, "x")], "p")
