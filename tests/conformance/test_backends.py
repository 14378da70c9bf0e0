"""The backend conformance suite (:mod:`tests.conformance.checks`) against every backend.

``sim`` runs everywhere. ``cuda`` runs wherever cuda-python is installed: on a GPU host its
checks drive the NVIDIA driver; without one they drive Crane's own ``libcuda.so.1`` (the
interposer) in front of a daemon on the simulated H100: cuda-python loads whichever
``libcuda.so.1`` the dynamic linker finds, so each of the backend's driver calls goes through
cuda-python's real bindings, argument conversion and result unpacking, and is executed with the
semantics Crane serves to CUDA programs. What that cannot show (timings, the real driver's JIT,
its VA placement) is left to the GPU suite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance.checks import CHECKS, KINDS, ONLY, SOURCE
from tests.conformance.conftest import real_gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fatbin(cuda_build) -> Path:  # type: ignore[no-untyped-def]
    # sm_90 machine code for an H100/H200 and PTX for the simulator (and JIT elsewhere)
    return cuda_build(
        SOURCE, "-fatbin", "-gencode", "arch=compute_90,code=[sm_90,compute_90]", suffix=".fatbin"
    )


#: The transports between the interposer and its worker that the cuda kind runs over without a
#: GPU: the shared-memory call ring and the worker's gRPC socket; the same checks on both.
TRANSPORTS = {"sim": ("",), "cuda": ("ring", "grpc")}

CASES = [
    pytest.param(
        kind,
        transport,
        check,
        id="-".join(filter(None, (kind, transport, check))),
        marks=pytest.mark.conformance,
    )
    for kind in KINDS
    for transport in TRANSPORTS[kind]
    for check in sorted(CHECKS)
    if kind in ONLY.get(check, KINDS)
]


@pytest.mark.parametrize(("kind", "transport", "check"), CASES)
def test_backend_conforms(
    kind: str, transport: str, check: str, fatbin: Path, request: pytest.FixtureRequest
) -> None:
    env = dict(request.getfixturevalue("driver_env" if kind == "cuda" else "sim_env"))
    if transport:
        if real_gpu() and transport != "ring":
            pytest.skip("the NVIDIA driver: no Crane transport to vary")
        env["CRANE_RING"] = "require" if transport == "ring" else "0"
    p = subprocess.run(
        [sys.executable, "-m", "tests.conformance.checks", kind, check, str(fatbin)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and p.stderr.rstrip().endswith("OK"), p.stderr[-4000:]


def test_inventory_without_nvml_asks_cuda_in_a_child_process(
    driver_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's fallback inventory (crane.backends.cuda.probe) through cuda-python."""
    from crane.daemon import gpu_inventory

    for key in ("LD_LIBRARY_PATH", "CRANE_DAEMON"):
        if key in driver_env:
            monkeypatch.setenv(key, driver_env[key])
    monkeypatch.setattr(gpu_inventory, "_cuda_only", False)
    gpus = gpu_inventory._cuda_inventory("NVML left out on purpose")
    assert gpus and gpus[0].index == 0
    g = gpus[0]
    assert g.name and g.total_mem > 0 and g.cc >= (7, 0), g
    assert g.uuid.startswith("GPU-") and len(g.uuid) == 40, g.uuid
    assert g.pci_bus_id == g.pci_bus_id.lower() and g.pci_bus_id.count(":") == 2
    assert g.driver_version.startswith("CUDA ")
    assert gpu_inventory.gpu_status(0).utilization_pct == -1  # no live figures without NVML
    monkeypatch.setenv("CRANE_DAEMON", "unix:///nonexistent/crane.sock")
    if "LD_LIBRARY_PATH" in driver_env:  # Crane's library with no daemon: a reason, no GPU
        with pytest.raises(gpu_inventory.NvmlUnavailable, match="NVML left out on purpose; CUDA"):
            gpu_inventory._cuda_inventory("NVML left out on purpose")
