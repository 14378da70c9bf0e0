"""Unmodified CUDA programs built by nvcc for the device's architecture, each run natively and
through ``crane run`` on a craned serving the same GPU: exit status and stdout must be identical
(every program prints only deterministic results; compute.cu hashes every output bit).

The programs are the interposer suite's (tests/interposer/programs: runtime API with static and
shared cudart, driver API with PTX JIT and fatbins, streams/events/callbacks, graphs, errors and
sticky faults, host threads, cooperative launches) plus tests/gpu/programs/compute.cu.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from tests.gpu.conftest import GPU_PROGRAMS
from tests.gpu.harness import Target, output_mismatch, ptx_only_flags
from tests.interposer.conftest import CUDA_LIB64, PROGRAMS

pytestmark = pytest.mark.gpu


@dataclass(frozen=True)
class Case:
    id: str
    source: Path
    flags: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    sim_args: tuple[str, ...] | None = None  # smaller sizes for the simulator (plumbing mode)
    ptx_only: bool = False  # embed PTX only: the driver JIT-compiles it at module load
    link_cuda: bool = False  # a driver-API program: linked with -lcuda
    image: str = ""  # "ptx" / "fatbin": kernels.cu built so, its path appended to the args
    env: dict[str, str] = field(default_factory=dict)


P, G = PROGRAMS, GPU_PROGRAMS
CASES = [
    Case("vadd", P / "vadd.cu"),
    Case("vadd-shared-cudart", P / "vadd.cu", ("-cudart", "shared")),
    Case("vadd-ptx-jit", P / "vadd.cu", ptx_only=True),
    Case("compute", G / "compute.cu", args=("1024", "8", "2000"), sim_args=("32", "2", "8")),
    Case("compute-ptx-jit", G / "compute.cu", (), ("512", "4", "500"), ("32", "2", "8"), True),
    Case("streams-events", P / "streams_events.cu"),
    Case("errors", P / "errors.cu"),
    Case("features", P / "features.cu"),
    Case("threads-own-streams", P / "threads.cu", args=("own",)),
    Case("threads-legacy-stream", P / "threads.cu"),
    Case("threads-per-thread-stream", P / "threads.cu", ("--default-stream", "per-thread")),
    Case("graph-capture", P / "graph_capture.cu"),
    Case("graph-explicit", P / "graph_explicit.cu"),
    Case("graph-errors", P / "graph_errors.cu"),
    Case("cooperative", P / "cooperative.cu"),
    Case("uva-pinned", P / "uva_pinned.cu", link_cuda=True),
    Case("driver-api-ptx", P / "driver_api.cpp", args=("ptx",), link_cuda=True, image="ptx"),
    Case(
        "driver-api-fatbin-data",
        P / "driver_api.cpp",
        args=("fatbin-data",),
        link_cuda=True,
        image="fatbin",
    ),
    Case("driver-api-file", P / "driver_api.cpp", args=("file",), link_cuda=True, image="fatbin"),
]


def _cudart_dir(nvcc: str) -> Path | None:
    """Where the toolkit's libcudart.so.13 lives (for the shared-cudart build)."""
    for d in (CUDA_LIB64, Path(nvcc).resolve().parents[1] / "lib64"):
        if (d / "libcudart.so.13").exists():
            return d
    return None


@pytest.fixture(scope="module")
def built(gpu_build, ptx_arch: int, link_flags) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Every case's executable (and kernels.cu images), compiled concurrently."""
    jobs: dict[str, object] = {}
    for c in CASES:
        flags = list(c.flags)
        if c.link_cuda:
            flags += link_flags
        if c.ptx_only:
            jobs[c.id] = gpu_build.submit(
                c.source, *ptx_only_flags(ptx_arch), *flags, with_arch=False
            )
        else:
            jobs[c.id] = gpu_build.submit(c.source, *flags)
    kernels = PROGRAMS / "kernels.cu"
    jobs["image:ptx"] = gpu_build.submit(
        kernels, "-ptx", f"-arch=compute_{ptx_arch}", suffix=".ptx", with_arch=False
    )
    jobs["image:fatbin"] = gpu_build.submit(kernels, "-fatbin", suffix=".fatbin")
    return jobs


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_native_and_crane_print_the_same(
    case: Case, built, native, via_crane, target, nvcc
) -> None:  # type: ignore[no-untyped-def]
    env = dict(case.env)
    if "-cudart" in case.flags:
        lib = _cudart_dir(nvcc)
        if lib is None:
            pytest.skip("no libcudart.so.13 next to nvcc or in /usr/local/cuda/lib64")
        env["LD_LIBRARY_PATH"] = str(lib)
    exe = built[case.id].result()
    args = list(case.sim_args if target.simulated and case.sim_args is not None else case.args)
    if case.image:
        args.append(str(built[f"image:{case.image}"].result()))
    ref = native([exe, *args], env=env)
    assert ref.returncode == 0 and ref.stdout, "the native run itself failed:\n" + ref.describe()
    got = via_crane([exe, *args], env=env)
    problem = output_mismatch(ref, got)
    assert problem is None, f"{case.id}: native and Crane differ\n{problem}"


def test_daemon_lists_the_gpu_as_the_driver_sees_it(
    target: Target, daemon_a: DaemonProcess
) -> None:
    """``crane devices``: the GPU the daemon serves, named and sized as the driver reports it
    (NVML's total may differ from cuDeviceTotalMem by the driver's reservation)."""
    with ControlClient(daemon_a.address) as c:
        (d,) = c.devices().devices
    assert d.backend == target.backend.partition(":")[0]
    assert d.name == target.name
    assert (d.cc_major, d.cc_minor) == target.cc
    assert abs(d.total_mem - target.total_mem) <= 0.05 * target.total_mem, d
    if not target.simulated:
        assert d.uuid.startswith("GPU-") and d.driver_version, d
