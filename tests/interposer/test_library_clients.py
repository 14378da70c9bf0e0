"""NVIDIA's CUDA libraries as PyPI ships them (the client venv's nvidia-* wheels: cudart 13.2,
cuBLAS, cuFFT) as guests: C programs built by the local nvcc against the wheels' headers and
libraries, run under ``crane run`` on ``sim:ptx-next`` (the device on which libraries take their
PTX paths), each checking its own results on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from crane.craned.launcher import DaemonProcess
from tests.interposer.conftest import Clients, Result


@pytest.fixture(scope="module")
def next_daemon(daemon_of: Callable[[str], DaemonProcess]) -> DaemonProcess:
    return daemon_of("sim:ptx-next")


@pytest.fixture
def run_next(guest_lib, next_daemon: DaemonProcess) -> Callable[..., Result]:  # type: ignore[no-untyped-def]
    """Run a program under ``crane run`` on the ptx-next daemon with the wheels' libraries first
    on the library path (the shared cudart a ``-cudart shared`` program loads is the wheel's)."""

    def run(exe, clients: Clients, timeout: float = 120) -> Result:  # type: ignore[no-untyped-def]
        env = {k: v for k, v in os.environ.items() if k != "CRANE_TRACE"}
        env["LD_LIBRARY_PATH"] = str(clients.cuda / "lib")
        cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", next_daemon.address]
        p = subprocess.run(
            [*cmd, "--", str(exe)], env=env, capture_output=True, text=True, timeout=timeout
        )
        return Result(p.returncode, p.stdout, p.stderr)

    return run


def test_wheel_cudart_13_2_initializes_and_runs_a_kernel(program, run_next, clients) -> None:
    """cudart 13.2 calls CUDART_INTERFACE slot 12 at init; any error there failed every runtime
    call with cudaErrorNotSupported."""
    assert (clients.cuda / "lib" / "libcudart.so.13").exists()
    r = run_next(program("vadd.cu", "-cudart", "shared"), clients)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "sync=cudaSuccess sum=1498500.0 c[999]=2997.0"
