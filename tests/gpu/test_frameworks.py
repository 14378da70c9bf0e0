"""CuPy and JAX through the interposer, unmodified, on the real GPU: each script checks its own
results (against NumPy, or JAX's CPU backend) and prints one line per check; natively and
through ``crane run`` both must pass with the same lines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from crane.craned.launcher import DaemonProcess
from tests.gpu.conftest import SCRIPTS
from tests.gpu.harness import Target, run_crane, run_native

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


@pytest.mark.parametrize(
    ("module", "script"), [("cupy", "cupy_workload.py"), ("jax", "jax_workload.py")]
)
def test_framework_runs_as_natively(
    module: str, script: str, target: Target, daemon_a: DaemonProcess, guest_lib: Path
) -> None:
    if target.simulated:
        pytest.skip("plumbing mode: these frameworks compile machine code for the real GPU")
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not importable by {sys.executable}")
    argv = [sys.executable, str(SCRIPTS / script)]
    nat = run_native(argv, timeout=300)
    assert nat.returncode == 0, "the native run failed:\n" + nat.describe()
    got = run_crane(daemon_a.address, argv, timeout=300)
    assert got.returncode == 0, "the run through Crane failed:\n" + got.describe(4000)
    assert got.stdout.splitlines() == nat.stdout.splitlines()
