"""GPU suite fixtures: the device under test, nvcc builds for its architecture, two craned on it,
and the two ways of running a program (natively, and through ``crane run``).

Every test marked ``gpu`` is skipped, with the reason, when no GPU is usable: no /dev/nvidia0,
cuda-python missing, or cuInit failing in a probe that runs with the system driver (Crane's own
``libcuda.so.1`` kept off LD_PRELOAD/LD_LIBRARY_PATH). A GPU without Crane's cuda backend skips
at the first daemon start, with craned's own words. ``CRANE_GPU_SUITE_BACKEND=sim:h100-80gb``
runs the suite's plumbing on the simulator instead (tests/gpu/harness.py).
"""

from __future__ import annotations

import functools
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from crane.craned.launcher import DaemonProcess
from tests.gpu.harness import (
    Run,
    Target,
    arch_flags,
    find_target,
    parse_gpu_archs,
    run_crane,
    run_native,
)
from tests.interposer.conftest import guest_lib, link_flags  # noqa: F401 - fixtures reused

HERE = Path(__file__).resolve().parent
GPU_PROGRAMS = HERE / "programs"
SCRIPTS = HERE / "scripts"


@functools.cache
def _target() -> Target | str:
    return find_target()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = [i for i in items if i.get_closest_marker("gpu")]
    if not gpu:
        return
    t = _target()
    if isinstance(t, str):
        skip = pytest.mark.skip(reason=t)
        for item in gpu:
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> str | None:
    t = _target()
    if isinstance(t, Target):
        return (
            f"GPU suite target: {t.backend} = {t.name} (sm_{t.cc[0]}{t.cc[1]}, "
            f"{t.total_mem >> 20} MiB, driver {t.driver or '-'}, libcuda {t.libcuda or '-'})"
        )
    return f"GPU suite target: none ({t})"


@pytest.fixture(scope="session")
def target() -> Target:
    t = _target()
    if isinstance(t, str):
        pytest.skip(t)
    return t


@pytest.fixture(scope="session")
def gpu_archs(nvcc: str) -> list[int]:
    out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=True)
    return parse_gpu_archs(out.stdout)


@pytest.fixture(scope="session")
def arch(target: Target, gpu_archs: list[int]) -> list[str]:
    """nvcc flags: the device's machine code and PTX (PTX of an older arch if nvcc is older)."""
    return arch_flags(target.cc, gpu_archs)


@pytest.fixture(scope="session")
def ptx_arch(target: Target, gpu_archs: list[int]) -> int:
    """The newest architecture <= the device's that nvcc can emit PTX for."""
    want = target.cc[0] * 10 + target.cc[1]
    return max(a for a in gpu_archs if a <= want)


class Builder:
    """nvcc builds on a thread pool, each (source, flags) once per run; ``prebuild`` queues many
    so that the suite pays for the slowest build rather than for all of them in turn."""

    def __init__(self, nvcc: str, arch: Sequence[str], root: Path) -> None:
        self.nvcc, self.arch, self.root = nvcc, list(arch), root
        self._pool = ThreadPoolExecutor(max_workers=8)
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, tuple[str, ...], bool], Future[Path]] = {}

    def submit(
        self, source: Path | str, *flags: str, suffix: str = "", with_arch: bool = True
    ) -> Future[Path]:
        text = source.read_text() if isinstance(source, Path) else source
        ext = source.suffix if isinstance(source, Path) else ".cu"
        key = (text + ext, flags, with_arch)
        with self._lock:
            if key not in self._jobs:
                d = self.root / f"b{len(self._jobs)}"
                d.mkdir()
                stem = source.stem if isinstance(source, Path) else "k"
                src = d / f"{stem}{ext}"
                src.write_text(text)
                out = d / f"{stem}{suffix}"
                # the source is compiled from a copy: its own folder's headers (check.h) stay
                # reachable
                inc = [f"-I{source.parent}"] if isinstance(source, Path) else []
                argv = [self.nvcc, *(self.arch if with_arch else []), *inc, *flags, "-o", str(out)]
                self._jobs[key] = self._pool.submit(self._compile, [*argv, str(src)], out)
            return self._jobs[key]

    @staticmethod
    def _compile(argv: list[str], out: Path) -> Path:
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"nvcc failed: {' '.join(argv)}\n{p.stdout}{p.stderr}")
        return out

    def __call__(
        self, source: Path | str, *flags: str, suffix: str = "", with_arch: bool = True
    ) -> Path:
        return self.submit(source, *flags, suffix=suffix, with_arch=with_arch).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def gpu_build(
    nvcc: str, arch: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Builder]:
    b = Builder(nvcc, arch, tmp_path_factory.mktemp("gpu-build"))
    try:
        yield b
    finally:
        b.close()


def _checkpoints(factory: pytest.TempPathFactory) -> Path:
    """The checkpoint directory both daemons share (one parks, the other restores); tests
    name their files in it."""
    return factory.getbasetemp() / "checkpoints"


def _start_daemon(run_dir: Path, backend: str, checkpoint_dir: Path) -> DaemonProcess:
    try:
        return DaemonProcess(run_dir, [backend], checkpoint_dir=checkpoint_dir)
    except RuntimeError as e:  # craned exited at start
        text = str(e)
        if "not part of this build" in text or "not available in this build" in text:
            pytest.skip(
                f"craned cannot serve --backend {backend}: Crane's cuda backend "
                f"(crane/backends/cuda) is not part of this build yet ({text.splitlines()[-1]})"
            )
        raise


@pytest.fixture(scope="session")
def daemon_a(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """The daemon the Crane side of each comparison runs on."""
    d = _start_daemon(
        tmp_path_factory.mktemp("craned-a") / "run", target.backend, _checkpoints(tmp_path_factory)
    )
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="session")
def daemon_b(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A second daemon on the same device: the destination of migrations and restores."""
    d = _start_daemon(
        tmp_path_factory.mktemp("craned-b") / "run", target.backend, _checkpoints(tmp_path_factory)
    )
    try:
        yield d
    finally:
        d.stop()


Runner = Callable[..., Run]


@pytest.fixture(scope="session")
def native(target: Target, guest_lib: Path, request: pytest.FixtureRequest) -> Runner:  # noqa: F811
    """Run ``argv`` on the system driver; on the simulator (plumbing mode) there is none, so the
    same program goes through the second daemon instead."""
    if target.simulated:
        b: DaemonProcess = request.getfixturevalue("daemon_b")

        def via_b(
            argv: Sequence[str | Path], env: Mapping[str, str] | None = None, timeout: float = 300
        ) -> Run:
            return run_crane(b.address, argv, env, timeout)

        return via_b

    def direct(
        argv: Sequence[str | Path], env: Mapping[str, str] | None = None, timeout: float = 180
    ) -> Run:
        return run_native(argv, env, timeout)

    return direct


@pytest.fixture(scope="session")
def via_crane(daemon_a: DaemonProcess, guest_lib: Path) -> Runner:  # noqa: F811
    """Run ``argv`` through ``crane run`` on daemon A."""

    def run(
        argv: Sequence[str | Path], env: Mapping[str, str] | None = None, timeout: float = 300
    ) -> Run:
        return run_crane(daemon_a.address, argv, env, timeout)

    return run
