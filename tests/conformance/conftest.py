"""The environment in which cuda-python reaches a driver: the NVIDIA driver on a GPU host, or,
without one, Crane's own ``libcuda.so.1`` (the interposer) in front of a daemon on the
simulated H100. cuda-python loads whichever ``libcuda.so.1`` the dynamic linker finds, so either
way every driver call of the cuda backend goes through cuda-python's real bindings."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.craned.launcher import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]


def real_gpu() -> bool:
    return Path("/dev/nvidiactl").exists()


def _env() -> dict[str, str]:
    """This environment for a check's process: the repository importable, no trace."""
    env = {k: v for k, v in os.environ.items() if k not in ("CRANE_TRACE", "CRANE_DAEMON")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    return env


@pytest.fixture(scope="module")
def sim_env() -> dict[str, str]:
    return _env()


@pytest.fixture(scope="module")
def driver_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")
    env = _env()
    if real_gpu():
        yield env
        return
    from crane.interposer import library_path

    lib = library_path()
    if not lib.exists():
        pytest.skip(f"the interposer is not built ({lib})")
    d = DaemonProcess(tmp_path_factory.mktemp("cuda-backend") / "run", ["sim:h100-80gb"])
    try:
        env["LD_LIBRARY_PATH"] = f"{lib.parent}:{env.get('LD_LIBRARY_PATH', '')}"
        env["CRANE_DAEMON"] = d.address
        yield env
    finally:
        d.stop()
