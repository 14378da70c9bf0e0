"""The cuda backend against cuda-python, with or without a GPU.

On a GPU host the checks in :mod:`tests.backends.cuda_checks` drive the NVIDIA driver. Without
one they drive Crane's own ``libcuda.so.1`` (the interposer) in front of a daemon on the
simulated H100: cuda-python loads whichever ``libcuda.so.1`` the dynamic linker finds, so each
of the backend's driver calls goes through cuda-python's real bindings, argument conversion and
result unpacking, and is executed with the semantics Crane serves to CUDA programs. What that
cannot show (timings, the real driver's JIT, its VA placement) is left to the GPU suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.daemon.launcher import DaemonProcess
from tests.backends.cuda_checks import CHECKS, SOURCE

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")


def _real_gpu() -> bool:
    return Path("/dev/nvidiactl").exists()


@pytest.fixture(scope="module")
def driver_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k not in ("CRANE_TRACE", "CRANE_DAEMON")}
    env["PYTHONPATH"] = str(ROOT)
    if _real_gpu():
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


@pytest.fixture(scope="module")
def fatbin(cuda_build) -> Path:  # type: ignore[no-untyped-def]
    # sm_90 machine code for an H100/H200 and PTX for the simulator (and JIT elsewhere)
    return cuda_build(
        SOURCE, "-fatbin", "-gencode", "arch=compute_90,code=[sm_90,compute_90]", suffix=".fatbin"
    )


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_cuda_backend(check: str, driver_env: dict[str, str], fatbin: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "tests.backends.cuda_checks", check, str(fatbin)],
        env=driver_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and p.stderr.rstrip().endswith("OK"), p.stderr[-4000:]
