"""Interposer fixtures: the built guest library, one craned per module, and a runner that
executes a CUDA program under ``crane run`` and returns its output."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crane.craned.launcher import DaemonProcess
from crane.interposer import library_path

PROGRAMS = Path(__file__).parent / "programs"
ROOT = Path(__file__).resolve().parents[2]
CUDA_LIB64 = Path("/usr/local/cuda/lib64")


def _sources() -> list[Path]:
    """What the library is built from (pyproject.toml: the guest requirements it bakes in)."""
    inter = ROOT / "interposer"
    return [
        *inter.glob("src/*"),
        *inter.glob("generated/*"),
        inter / "build_interposer.py",
        ROOT / "pyproject.toml",
    ]


@pytest.fixture(scope="session")
def guest_lib() -> Path:
    """The interposer, rebuilt when any of its sources is newer than the built library."""
    lib = library_path()
    newest = max(p.stat().st_mtime for p in _sources())
    if not lib.exists() or lib.stat().st_mtime < newest:
        subprocess.run(
            [sys.executable, str(ROOT / "interposer" / "build_interposer.py")],
            check=True,
            capture_output=True,
        )
    return lib


@pytest.fixture(scope="module")
def daemon_of(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], DaemonProcess]]:
    """``daemon_of(backend)``: a craned with that one device for the module's tests."""
    made: list[DaemonProcess] = []

    def make(backend: str) -> DaemonProcess:
        made.append(DaemonProcess(tmp_path_factory.mktemp("idaemon") / "run", [backend]))
        return made[-1]

    try:
        yield make
    finally:
        for d in made:
            d.stop()


@pytest.fixture(scope="module")
def idaemon(daemon_of: Callable[[str], DaemonProcess]) -> DaemonProcess:
    return daemon_of("sim:h100-80gb")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[..., Result]


@pytest.fixture
def run_guest(guest_lib: Path, idaemon: DaemonProcess) -> Runner:
    """Run ``argv`` under ``crane run --daemon ADDR --``; extra env entries may be given."""

    def run(*argv: str | Path, env: dict[str, str] | None = None, timeout: float = 180) -> Result:
        full_env = dict(os.environ)
        full_env.pop("CRANE_TRACE", None)
        full_env.update(env or {})
        cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", idaemon.address, "--"]
        p = subprocess.run(
            [*cmd, *map(str, argv)],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Result(p.returncode, p.stdout, p.stderr)

    return run


@dataclass
class Moved:
    """A program run across a move: its first line (before), its exit, the rest of its output,
    the session that moved and the daemon it ended on."""

    first: str
    returncode: int
    stdout: str
    stderr: str
    session: str
    destination: DaemonProcess


@pytest.fixture
def run_moved(guest_lib: Path, tmp_path: Path) -> Callable[[Path, str], Moved]:
    """``run_moved(exe, how)``: run ``exe`` under ``crane run`` on an A100 daemon; after it
    prints its first line and "ready" it is parked to a file and restored on an H100 daemon
    (``how="park-restore"``) or migrated there live (``"migrate"``), then told to go on (a
    line on its stdin). A100 -> H100: the H100 offers every limit the A100 told the guest."""
    from crane.cli.control_client import ControlClient
    from crane.cli.migrate import migrate

    def run(exe: Path, how: str) -> Moved:
        with (
            DaemonProcess(tmp_path / "a", ["sim:a100-80gb"], checkpoint_dir=tmp_path) as a,
            DaemonProcess(tmp_path / "b", ["sim:h100-80gb"], checkpoint_dir=tmp_path) as b,
        ):
            env = dict(os.environ, CRANE_DAEMON_ALTERNATES=b.address)
            env.pop("CRANE_TRACE", None)
            cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", a.address, "--"]
            prog = subprocess.Popen(
                [*cmd, str(exe)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            try:
                assert prog.stdout is not None and prog.stdin is not None
                first = prog.stdout.readline()
                ready = prog.stdout.readline().strip()
                assert ready == "ready", (
                    first + ready + (prog.stderr.read() if prog.poll() is not None else "")
                )
                with ControlClient(a.address, timeout=None) as c:
                    (info,) = c.sessions().sessions
                    if how == "park-restore":
                        ckpt = tmp_path / "moved.ckpt"
                        assert c.checkpoint(info.id, str(ckpt), release=True).state == "parked"
                        prog.stdin.write("go\n")  # its next synchronizing call waits, parked
                        prog.stdin.flush()
                        with ControlClient(b.address, timeout=None) as cb:
                            cb.restore(str(ckpt))
                    else:
                        last = migrate(a.address, info.id, b.address)[-1]
                        assert last.phase == "done", last.error
                        prog.stdin.write("go\n")
                        prog.stdin.flush()
                out, err = prog.communicate(timeout=180)
            finally:
                if prog.poll() is None:
                    prog.kill()
                    prog.wait()
            return Moved(first.strip(), prog.returncode, out, err, info.id, b)

    return run


@pytest.fixture(scope="session")
def link_flags(guest_lib: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ...]:
    """nvcc flags to link a driver-API program against the interposer (there is no libcuda.so
    stub on a GPU-less machine: the guest library stands in for it at link time too)."""
    d = tmp_path_factory.mktemp("link")
    (d / "libcuda.so").symlink_to(guest_lib)
    return (f"-L{d}", "-lcuda")


@pytest.fixture
def program(cuda_build: Callable[..., Path]) -> Callable[..., Path]:
    """Compile ``programs/<name>`` with nvcc and extra flags (cached for the whole run)."""

    def build(name: str, *flags: str) -> Path:
        return cuda_build((PROGRAMS / name).read_text(), f"-I{PROGRAMS}", *flags, suffix=".exe")

    return build


@pytest.fixture(scope="session")
def program_dir(nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Compile every ``.cu`` file of ``programs/<name>/`` into one program with nvcc and extra
    flags (multi-file programs: ``-rdc=true`` relocatable device code), cached per run."""
    cache: dict[tuple[str, tuple[str, ...]], Path] = {}
    root = tmp_path_factory.mktemp("program-dir")

    def build(name: str, *flags: str) -> Path:
        key = (name, flags)
        if key not in cache:
            out = root / f"{name}-{len(cache)}.exe"
            sources = sorted(str(p) for p in (PROGRAMS / name).glob("*.cu"))
            subprocess.run(
                [nvcc, *flags, "-o", str(out), *sources], check=True, capture_output=True
            )
            cache[key] = out
        return cache[key]

    return build


@dataclass(frozen=True)
class Clients:
    """The application environment scripts/client_libs.sh makes: PyPI's CUDA libraries and
    frameworks in their own venv, on another Python than Crane's where the machine has one."""

    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site(self) -> Path:
        (site,) = (self.venv / "lib").glob("python3*/site-packages")
        return site

    @property
    def cuda(self) -> Path:
        """The nvidia-* wheels' CUDA 13 tree (include/, lib/: cudart, cuBLAS, cuFFT, NVRTC)."""
        return self.site / "nvidia" / "cu13"

    @property
    def cudnn(self) -> Path:
        return self.site / "nvidia" / "cudnn"


@pytest.fixture(scope="session")
def clients() -> Clients:
    """The client libraries' venv (``CRANE_CLIENTS`` overrides ``.clients``); ``make test``
    creates it, so in CI these tests always run."""
    venv = Path(os.environ.get("CRANE_CLIENTS", ROOT / ".clients")) / "venv"
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"no client libraries at {venv}: run scripts/client_libs.sh")
    return Clients(venv)
