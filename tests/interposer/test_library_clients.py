"""NVIDIA's CUDA libraries as PyPI ships them (the client venv's nvidia-* wheels: cudart 13.2,
cuBLAS, cuFFT, cuDNN) as guests: C programs built by the local nvcc against the wheels' headers and
libraries, run under ``crane run`` on ``sim:ptx-next`` (the device on which the libraries take
their PTX paths), each checking its own results on the CPU. Each library program runs twice:
with the local nvcc's static cudart 13.0 and with the wheel's shared cudart 13.2."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from crane.craned.launcher import DaemonProcess
from tests.interposer.conftest import Clients, Result

CUDARTS = {"static-13.0": (), "wheel-13.2": ("-cudart", "shared")}


@pytest.fixture(scope="module")
def next_daemon(daemon_of: Callable[[str], DaemonProcess]) -> DaemonProcess:
    return daemon_of("sim:ptx-next")


@pytest.fixture
def run_next(guest_lib: Path, next_daemon: DaemonProcess) -> Callable[..., Result]:
    """Run a program under ``crane run`` on the ptx-next daemon, with ``lib`` (the wheels'
    libraries: cuBLAS, cuFFT, and the shared cudart of a ``-cudart shared`` program) first on
    the library path."""

    def run(exe: Path, lib: Path | str | None = None, timeout: float = 120) -> Result:
        env = {k: v for k, v in os.environ.items() if k != "CRANE_TRACE"}
        if lib is not None:
            env["LD_LIBRARY_PATH"] = str(lib)
        cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", next_daemon.address]
        p = subprocess.run(
            [*cmd, "--", str(exe)], env=env, capture_output=True, text=True, timeout=timeout
        )
        return Result(p.returncode, p.stdout, p.stderr)

    return run


def _library_flags(clients: Clients, *names: str) -> tuple[str, ...]:
    """nvcc flags for a host program using the wheels' libraries: their headers after nvcc's
    own, and each library by its path (the wheels ship no unversioned .so link). No -L: the
    wheel's folder also holds cudart 13.2's static library, which would replace nvcc's."""
    flags = []
    for tree in (clients.cudnn, clients.cuda):
        flags += ["-Xcompiler", f"-idirafter,{tree / 'include'}"]
    for name in names:
        (found,) = [p for t in (clients.cuda, clients.cudnn) for p in t.glob(f"lib/lib{name}.so.*")]
        flags += ["-Xlinker", str(found)]
    return tuple(flags)


def test_wheel_cudart_13_2_initializes_and_runs_a_kernel(program, run_next, clients) -> None:
    """cudart 13.2 calls CUDART_INTERFACE slot 12 at init; any error there failed every runtime
    call with cudaErrorNotSupported."""
    assert (clients.cuda / "lib" / "libcudart.so.13").exists()
    r = run_next(program("vadd.cu", "-cudart", "shared"), clients.cuda / "lib")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "sync=cudaSuccess sum=1498500.0 c[999]=2997.0"


def test_library_driver_calls(program, run_next, link_flags) -> None:
    """TOOLS_TLS[2], TOOLS_CONTEXT[4]/[51]/[39] and TOOLS_MODULE[7] against cuCtxGetCurrent,
    cuCtxGetId, cuStreamGetId and cuModuleEnumerateFunctions (also checked themselves); what
    cublasCreate asks where it has SASS (CIG limit, cluster attributes and occupancy)."""
    r = run_next(program("library_driver_calls.cpp", *link_flags))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].endswith("streams_distinct=1 module_functions=2 stored=1"), r.stdout
    assert lines[1:] == ["cig=0 non_portable_clusters=1 regs_ok=1", "PASSED: 0 failures"], r.stdout


@pytest.fixture
def run_library_program(program, run_next, clients) -> Callable[..., list[str]]:  # type: ignore[no-untyped-def]
    """``(source, cudart, *libraries)``: build a program against the wheels' libraries with one
    of :data:`CUDARTS`, run it, check it succeeded without a refused call; its output lines."""

    def run(source: str, cudart: str, *libraries: str) -> list[str]:
        exe = program(source, *CUDARTS[cudart], *_library_flags(clients, *libraries))
        r = run_next(exe, f"{clients.cudnn / 'lib'}:{clients.cuda / 'lib'}")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "not supported" not in r.stderr, r.stderr
        return r.stdout.splitlines()

    return run


@pytest.mark.parametrize("cudart", CUDARTS)
def test_cublas_sgemm_and_gemmex(run_library_program, cudart: str) -> None:
    lines = run_library_program("cublas_gemm.cu", cudart, "cublas", "cublasLt")
    runtime = "13000" if cudart == "static-13.0" else "13020"
    assert lines[0].startswith(f"runtime={runtime} cublas=13"), lines
    assert lines[0].endswith(" create=0"), lines
    assert lines[1:] == [
        "sgemm status=0 err_ok=1",
        "gemmex_f32 status=0 err_ok=1",
        "gemmex_f16 status=0 err_ok=1",
        "sgemm_t status=0 err_ok=1",
        "dgemm status=0 exact=1 sdot status=0 exact=1",
        "strsm status=0 err_ok=1",
        "sgemm_stream status=0 err_ok=1",
        "destroy status=0",
        "PASSED: 0 failures",
    ]


@pytest.mark.parametrize("cudart", CUDARTS)
def test_cufft_plans_match_a_naive_dft(run_library_program, cudart: str) -> None:
    lines = run_library_program("cufft_transforms.cu", cudart, "cufft")
    assert lines[1:] == [
        "c2c_1d plan=0 forward_ok=1",
        "c2c_1d inverse_ok=1",
        "r2c_1d exec=0 ok=1",
        "c2c_2d exec=0 ok=1",
        "PASSED: 0 failures",
    ]


@pytest.mark.parametrize("cudart", CUDARTS)
def test_cudnn_convolution_forward(run_library_program, cudart: str) -> None:
    """cuDNN 9 ships its kernels as compute_121 PTX only, which ptx-next (13.0) JIT-runs."""
    lines = run_library_program("cudnn_conv.cu", cudart, "cudnn")
    assert lines[0].startswith("cudnn=9"), lines
    assert lines[1:] == ["conv out=1x3x6x6 ws=0 ok=1", "PASSED: 0 failures"]
