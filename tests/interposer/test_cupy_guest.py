"""CuPy from the client venv (PyPI's cupy-cuda13x, unmodified) as a guest on ``sim:ptx-next``:
``hosts/cupy_guest.py`` checks arange, elementwise ops, reductions, ElementwiseKernel,
RawKernel (NVRTC's PTX), cp.dot (cuBLAS), cp.fft (cuFFT), cp.linalg.solve/inv (cuSOLVER) and
cp.sort (the wheel's prebuilt Thrust module, PTX for compute_120) against NumPy, and exits 0."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from crane.craned.launcher import DaemonProcess
from tests.interposer.conftest import Clients
from tests.interposer.guest_scripts import ScriptRun, run_script

CHECKS = [
    "environment",
    "arange",
    "elementwise",
    "reductions",
    "elementwise_kernel",
    "raw_kernel",
    "dot_cublas",
    "fft_cufft",
    "linalg_cusolver",
    "sort_thrust",
]


@pytest.fixture(scope="module")
def cupy_run(
    clients: Clients,
    guest_lib: Path,
    daemon_of: Callable[[str], DaemonProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> ScriptRun:
    """One run of the script; CuPy's kernel cache starts empty, so NVRTC compiles each kernel."""
    daemon = daemon_of("sim:ptx-next")
    cache = tmp_path_factory.mktemp("cupy-cache")
    run = run_script(clients, daemon.address, "cupy_guest.py", {"CUPY_CACHE_DIR": str(cache)})
    print(f"\ncupy_guest.py: {run.wall_s:.1f} s wall; per check: {run.seconds}")
    return run


def test_cupy_script_exits_0(cupy_run: ScriptRun, record_property) -> None:  # type: ignore[no-untyped-def]
    record_property("wall_s", round(cupy_run.wall_s, 2))
    assert cupy_run.returncode == 0, cupy_run.describe()
    assert sorted(cupy_run.checks) == sorted(CHECKS), cupy_run.describe()


@pytest.mark.parametrize("name", CHECKS)
def test_cupy_check(cupy_run: ScriptRun, name: str) -> None:
    assert cupy_run.outcome(name) == "ok", cupy_run.outcome(name)
