"""A device model on the cuda backend (``--backend cuda:0@MODEL``).

The daemon reads its GPU through cuda-python (on a GPU host the NVIDIA driver; elsewhere
Crane's own ``libcuda.so.1`` in front of a simulated H100, see conftest.py), checks the model
against every attribute the GPU reports and presents the model (sessions are not opened here:
the nested set-up cannot reserve a second session window); a model of a higher
compute capability than the GPU is refused (code built for it would not run there).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crane.backends.sim.profiles import PROFILES
from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.device.model_file import model_from_dict, model_to_dict, model_to_toml


def test_cuda_device_presents_a_lower_model(driver_env: dict[str, str], tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "a", ["cuda:0@a100-40gb"], env=driver_env, prespawn=0)
    try:
        with ControlClient(d.address) as c:
            (dev,) = c.devices().devices
        assert dev.backend == "cuda" and dev.model == "a100-40gb"
        assert dev.model_name == "NVIDIA A100-SXM4-40GB"
        assert (dev.model_cc_major, dev.model_cc_minor) == (8, 0)
        assert dev.model_total_mem == min(dev.total_mem, PROFILES["a100-40gb"].total_mem)
        assert len(dev.attributes) > 100  # the GPU's own, for crane baseline
    finally:
        d.stop()


def test_cuda_device_refuses_a_higher_compute_capability(
    driver_env: dict[str, str], tmp_path: Path
) -> None:
    data = model_to_dict(PROFILES["a100-40gb"])
    data["compute_capability"] = [12, 0]
    path = tmp_path / "future.toml"
    path.write_text(model_to_toml(model_from_dict(data, "future")))
    with pytest.raises(RuntimeError, match=r"compute capability: model 12\.0 > device"):
        DaemonProcess(tmp_path / "b", [f"cuda:0@{path}"], env=driver_env, prespawn=0)
