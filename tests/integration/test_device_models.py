"""Device models a guest is told (craned --backend SPEC@MODEL) and ``crane baseline``.

A daemon presenting a model tells its guests the model's identity and limits and holds their
launches to them; one promising more than its device has is refused at start, naming the
attribute; ``crane baseline`` over several daemons writes the model all of them accept.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.api.errors import CudaError
from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.backends.sim.profiles import PROFILES
from crane.cli.control_client import ControlClient
from crane.cli.main import main as crane_main
from crane.craned.launcher import DaemonProcess
from crane.device.model_file import attribute_name
from crane.device.presented import attribute_kind
from crane.guest.session import GuestSession
from tests.integration.workload import Workload

OPTIN = int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)


def test_guest_is_told_the_model_and_held_to_its_limits(daemon_factory, image: bytes) -> None:
    d = daemon_factory("h-as-a", ["sim:h100-80gb@a100-40gb"])
    a100, h100 = PROFILES["a100-40gb"], PROFILES["h100-80gb"]
    with GuestSession(d.address, client="told") as s:
        assert s.device.name == a100.name == "NVIDIA A100-SXM4-40GB"
        assert s.device.cc == (8, 0) and s.device.total_mem == a100.total_mem
        assert s.device.profile == "a100-40gb"
        assert s.attributes[OPTIN] == 166912 < h100.attribute(OPTIN)
        with ControlClient(d.address) as c:
            (info,) = c.sessions().sessions
            assert info.model == "a100-40gb" and info.model_name == a100.name
            (dev,) = c.devices().devices
        assert (dev.name, dev.profile, dev.model) == (h100.name, "h100-80gb", "a100-40gb")
        assert dev.total_mem == h100.total_mem and dev.model_total_mem == a100.total_mem
        assert (dev.model_cc_major, dev.model_cc_minor) == (8, 0)
        # the H100 would take 200000 bytes of opt-in shared memory; the A100 it presents not
        w = Workload(s, image)
        s.function_set_max_dynamic_shared(w.step_fn, 200_000)
        with pytest.raises(CudaError, match="166912"):
            s.synchronize()


def test_model_promising_more_than_the_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as e:
        DaemonProcess(tmp_path / "r", ["sim:a100-40gb@h100-80gb"])
    text = str(e.value)
    assert "model h100-80gb promises more than a100-40gb has" in text
    assert "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: model 232448 > device 166912" in text


def test_a_model_file_of_more_memory_is_clipped_to_the_device(daemon_factory, tmp_path) -> None:
    from crane.device.model_file import model_to_toml
    from crane.device.presented import present

    big = present(PROFILES["a100-40gb"], 1 << 50)  # same limits, 1 PiB promised
    path = tmp_path / "big.toml"
    path.write_text(model_to_toml(big))
    d = daemon_factory("clip", [f"sim:a100-40gb@{path}"])
    with GuestSession(d.address) as s:
        assert s.device.total_mem == PROFILES["a100-40gb"].total_mem


def test_baseline_of_three_daemons(daemon_factory, tmp_path: Path, capsys) -> None:
    keys = ("h100-80gb", "a100-40gb", "l4")
    ds = [daemon_factory(k, [f"sim:{k}"]) for k in keys]
    out = tmp_path / "pool.toml"
    assert crane_main(["baseline", *(d.address for d in ds), "-o", str(out), "--name", "pool"]) == 0
    data = tomllib.loads(out.read_text())
    models = [PROFILES[k] for k in keys]
    assert data["key"] == "pool"
    assert data["compute_capability"] == [8, 0]
    assert data["total_mem"] == min(m.total_mem for m in models)
    for name, value in data["attributes"].items():
        a = int(A["CU_DEVICE_ATTRIBUTE_" + name])
        values = [m.attribute(a) for m in models]
        want = max(values) if attribute_kind(a) == "requirement" else min(values)
        if attribute_kind(a) == "mask":
            want = values[0] & values[1] & values[2]
        assert value == want, attribute_name(a)
    assert data["attributes"]["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"] == 101376  # the L4's
    assert data["attributes"]["MULTIPROCESSOR_COUNT"] == 58
    # one daemon presenting it on all three models: none refuses it
    pool = daemon_factory("pool", [f"sim:{k}@{out}" for k in keys])
    with ControlClient(pool.address) as c:
        assert [x.model for x in c.devices().devices] == ["pool"] * 3
    with GuestSession(pool.address, device=1) as s:
        assert s.device.profile == "pool" and s.device.cc == (8, 0)
        assert s.attributes[OPTIN] == 101376


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator:
    started: list[DaemonProcess] = []

    def start(name: str, backends: list[str]) -> DaemonProcess:
        d = DaemonProcess(tmp_path / name, backends, prespawn=0)
        started.append(d)
        return d

    try:
        yield start
    finally:
        for d in started:
            d.stop()
