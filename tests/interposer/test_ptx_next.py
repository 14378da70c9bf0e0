"""``sim:ptx-next``: a simulated device newer than any shipping architecture, so that code built
as NVIDIA's libraries ship it (SASS for real GPUs, PTX only for the newest target) takes its
PTX path; the real-model profiles pick the SASS and refuse it at load."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from crane.cli.run import SIMULATED_DEVICE_DEFAULTS, simulated_defaults
from crane.craned.launcher import DaemonProcess

GENCODE = (
    "-gencode",
    "arch=compute_90,code=sm_90",
    "-gencode",
    "arch=compute_120,code=compute_120",
)


@pytest.fixture(scope="module")
def next_daemon(daemon_of: Callable[[str], DaemonProcess]) -> DaemonProcess:
    return daemon_of("sim:ptx-next")


def _run(exe, address: str) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k != "CRANE_TRACE"}
    cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", address, "--", str(exe)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_newest_ptx_runs_on_ptx_next(program, guest_lib, next_daemon) -> None:
    r = _run(program("newest_ptx.cu", *GENCODE), next_daemon.address)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "cc=13.0 launch=cudaSuccess y[999]=1999", r.stdout


def test_real_model_profiles_refuse_the_sass(program, run_guest) -> None:
    r = run_guest(program("newest_ptx.cu", *GENCODE))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cc=9.0 launch=cudaErrorNoKernelImageForDevice y[999]=1" in r.stdout, r.stdout


def test_crane_run_asks_frameworks_for_ptx_on_a_simulated_daemon(run_guest) -> None:
    """CuPy reads these at import: PTX from NVRTC and no SASS-only accelerators, unless the
    user chose otherwise."""
    show = "import os; print(repr(os.environ.get('CUPY_COMPILE_WITH_PTX')), "
    show += "repr(os.environ.get('CUPY_ACCELERATORS')))"
    r = run_guest(sys.executable, "-c", show)
    assert r.stdout.strip() == "'1' ''", r.stdout + r.stderr
    r = run_guest(sys.executable, "-c", show, env={"CUPY_ACCELERATORS": "cub"})
    assert r.stdout.strip() == "'1' 'cub'", r.stdout + r.stderr


def test_simulated_defaults_only_when_every_device_is_simulated() -> None:
    env = {"PATH": "/bin"}
    assert simulated_defaults(env, ["sim"]) == {**SIMULATED_DEVICE_DEFAULTS, **env}
    assert simulated_defaults(env, ["sim", "cuda"]) == env
    assert simulated_defaults(env, []) == env  # the daemon could not be asked
