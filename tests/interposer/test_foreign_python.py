"""The guest library inside an application's own Python, in another venv than Crane's and on
another Python version: ``crane run`` selects a library built for that interpreter, with
Crane's guest dependencies in a private directory (crane/cli/guest_runtime.py); a dependency
the application holds at a version Crane cannot use is reported and answered with a CUDA
error; a library built for another Python version refuses to start instead of crashing.

Each interpreter's runtime is prepared once per test session (in a session-scoped cache
directory), and that first preparation is timed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from crane.craned.launcher import DaemonProcess
from crane.interposer import library_path
from crane.interposer.guest_env import GUEST_DISTRIBUTIONS

PYENV = Path("/root/.pyenv/versions")
CUDA_ERROR_NOT_INITIALIZED = 3

# Driver calls through ctypes, after importing the modules named on the command line; prints
# the results, sys.path and where each top-level module the process holds came from.
APP = textwrap.dedent(
    """
    import ctypes, json, sys
    for name in sys.argv[1:]:
        __import__(name)
    cuda = ctypes.CDLL("libcuda.so.1")
    n, dev, ctx, ptr = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    name = ctypes.create_string_buffer(256)
    codes = [
        cuda.cuInit(0),
        cuda.cuDeviceGetCount(ctypes.byref(n)),
        cuda.cuDeviceGet(ctypes.byref(dev), 0),
        cuda.cuDeviceGetName(name, 256, dev),
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
        cuda.cuCtxSetCurrent(ctx),
        cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)),
        cuda.cuMemsetD8_v2(ptr, 7, ctypes.c_size_t(1 << 20)),
    ]
    out = (ctypes.c_ubyte * 4)()
    codes.append(cuda.cuMemcpyDtoH_v2(out, ptr, ctypes.c_size_t(4)))
    codes.append(cuda.cuMemFree_v2(ptr))
    files = {m: getattr(v, "__file__", None) or next(iter(getattr(v, "__path__", [])), None)
             for m, v in list(sys.modules.items()) if "." not in m}
    files = {m: f for m, f in files.items() if isinstance(f, str)}
    print(json.dumps({"codes": codes, "count": n.value, "name": name.value.decode(),
                      "bytes": list(out), "path": sys.path, "files": files}))
    """
)


def _python(version: str) -> Path:
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"no Python {version} under {PYENV}")
    return found[-1]


@pytest.fixture(scope="session")
def guest_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this session's guest runtimes are built (each interpreter's once)."""
    return tmp_path_factory.mktemp("guest-cache")


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``bare_venv(version, *requirements)``: a throwaway venv without pip on pyenv's Python
    ``version`` (Crane's pip installs the requirements into it), made once per session."""
    made: dict[tuple[str, ...], Path] = {}

    def make(version: str, *requirements: str) -> Path:
        key = (version, *requirements)
        if key not in made:
            venv = tmp_path_factory.mktemp(f"venv{version}")
            base = _python(version)
            subprocess.run([base, "-m", "venv", "--without-pip", venv], check=True)
            if requirements:
                pip = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python"]
                subprocess.run(
                    [*pip, "install", "-q", "--disable-pip-version-check", *requirements],
                    check=True,
                    capture_output=True,
                )
            made[key] = venv / "bin" / "python"
        return made[key]

    return make


@pytest.fixture(scope="session")
def prepared(guest_cache: Path) -> Callable[[Path], tuple[Path, float]]:
    """``prepared(python)``: the guest library ``crane guest-lib --python`` gives for it and
    how long that took the first time (a build and a dependency install)."""
    seen: dict[str, tuple[Path, float]] = {}

    def get(python: Path) -> tuple[Path, float]:
        key = str(python)
        if key not in seen:
            t0 = time.monotonic()
            r = subprocess.run(
                [sys.executable, "-m", "crane.cli.main", "guest-lib", "--python", key],
                env=dict(os.environ, CRANE_GUEST_CACHE=str(guest_cache)),
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert r.returncode == 0, r.stderr
            seen[key] = (Path(r.stdout.strip()), time.monotonic() - t0)
        return seen[key]

    return get


def _run(
    daemon: DaemonProcess,
    cache: Path,
    *argv: str | Path,
    timeout: float = 180,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    env = dict(os.environ, CRANE_GUEST_CACHE=str(cache), **(env or {}))
    env.pop("CRANE_TRACE", None)
    cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", daemon.address, "--"]
    try:
        return subprocess.run(
            [*cmd, *map(str, argv)], env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv} hung under crane run")


def _report(r: subprocess.CompletedProcess) -> dict:
    import json

    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _site(lib: Path) -> Path:
    """The runtime's private site directory (next to its lib/)."""
    return lib.parent.parent / "site"


def _check_works(r: subprocess.CompletedProcess, runtime_lib: Path) -> dict:
    out = _report(r)
    assert out["codes"] == [0] * 10, r.stderr
    assert out["count"] == 1 and "H100" in out["name"]
    assert out["bytes"] == [7, 7, 7, 7]
    # Crane's own environment stays out of the application: only the runtime's private site
    crane_env = [p for p in out["path"] if p.startswith(sys.prefix)]
    assert crane_env == [], crane_env
    assert str(_site(runtime_lib)) in out["path"]
    return out


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_driver_calls_from_a_bare_venv_on_another_python(
    version, bare_venv, prepared, guest_cache, idaemon
) -> None:
    """A venv with nothing installed (no cffi, grpcio, protobuf, numpy) on Python 3.12 / 3.13:
    crane run prepares a runtime for it and the driver calls reach the daemon. The runtime's
    third-party modules the process loads are exactly Crane's guest dependencies (and what
    they import themselves): the set stays minimal and the list in guest_env stays true. Its
    calls go through the call ring (required here: the ring's C core is built for the stable
    ABI, so another interpreter loads it too)."""
    python = bare_venv(version)
    lib, seconds = prepared(python)
    assert seconds < 45, f"preparing the runtime took {seconds:.1f} s"
    app = guest_cache / "app.py"
    app.write_text(APP)
    out = _check_works(_run(idaemon, guest_cache, python, app, env={"CRANE_RING": "require"}), lib)
    names = {n.split(".")[0] for ms in GUEST_DISTRIBUTIONS.values() for n in ms}
    site = str(_site(lib))
    mods = {m for m, f in out["files"].items() if f.startswith(site)} - {"crane"}
    # grpcio imports typing_extensions; the cffi package itself is not needed at run time
    assert mods - {"cffi"} == (names - {"cffi"}) | {"typing_extensions"}, mods


def test_driver_calls_in_the_client_venv_after_torch(clients, prepared, guest_cache, idaemon):
    """The torch/CuPy client venv (Python 3.12, no Crane dependencies): torch imported first,
    then driver calls through ctypes reach the daemon; torch.cuda.is_available() then runs to
    an answer (whether cudart accepts the device is not this library's loading)."""
    lib, _ = prepared(clients.python)
    app = guest_cache / "app.py"
    app.write_text(APP)
    _check_works(_run(idaemon, guest_cache, clients.python, app, "torch"), lib)
    r = _run(
        idaemon,
        guest_cache,
        clients.python,
        "-c",
        "import torch; print('available', torch.cuda.is_available())",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "available", r.stdout + r.stderr
    assert "cannot start" not in r.stderr and "built for Python" not in r.stderr


def test_cupy_counts_the_device_from_the_client_venv(clients, prepared, guest_cache, idaemon):
    prepared(clients.python)
    r = _run(
        idaemon,
        guest_cache,
        clients.python,
        "-c",
        "import cupy; print(cupy.cuda.runtime.getDeviceCount())",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1", r.stdout + r.stderr


@pytest.mark.parametrize("first", [["google.protobuf"], []], ids=["imported-first", "installed"])
def test_conflicting_dependency_is_reported_with_a_cuda_error(
    first, bare_venv, prepared, guest_cache, idaemon
) -> None:
    """The application holds protobuf 4.x (Crane needs >= 5.26), already imported or only
    installed: one line names both versions and what to do, and driver calls answer
    CUDA_ERROR_NOT_INITIALIZED; the process neither crashes nor hangs."""
    python = bare_venv("3.12", "protobuf<5")
    prepared(python)
    app = guest_cache / "app.py"
    app.write_text(APP)
    r = _run(idaemon, guest_cache, python, app, *first, timeout=60)
    out = _report(r)
    assert set(out["codes"][:4]) == {CUDA_ERROR_NOT_INITIALIZED}, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if "protobuf" in ln]
    assert "application's protobuf 4." in line and "protobuf>=5.26" in line, line
    assert "Crane ships" in line and "-m pip install 'protobuf>=5.26'" in line, line
    assert ("already imported" in line) == bool(first), line


def test_library_for_another_python_version_refuses_to_start(
    guest_lib, bare_venv, guest_cache
) -> None:
    """Crane's default library (built for Crane's own Python) preloaded straight into a
    process running another Python version: a log line naming both versions and the fix,
    CUDA_ERROR_NOT_INITIALIZED, exit 0 (it would run code compiled for one version against
    the other's runtime)."""
    other = "3.12" if sys.version_info[:2] != (3, 12) else "3.13"
    python = bare_venv(other)
    app = guest_cache / "app.py"
    app.write_text(APP)
    env = dict(os.environ, LD_PRELOAD=str(guest_lib), LD_LIBRARY_PATH=str(guest_lib.parent))
    r = subprocess.run([python, app], env=env, capture_output=True, text=True, timeout=60)
    out = _report(r)
    assert set(out["codes"][:4]) == {CUDA_ERROR_NOT_INITIALIZED}, r.stderr
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"built for Python {mine} but the process runs Python {other}." in r.stderr
    assert "crane guest-lib --python" in r.stderr


def test_c_program_started_by_a_foreign_python_app(
    program, bare_venv, prepared, guest_cache, idaemon
) -> None:
    """The runtime's library is inherited by the application's children: a CUDA program
    started from the 3.12 application starts Python 3.12 inside itself and works."""
    exe = program("vadd.cu")
    python = bare_venv("3.12")
    prepared(python)
    r = _run(
        idaemon,
        guest_cache,
        python,
        "-c",
        "import subprocess, sys; sys.exit(subprocess.run([sys.argv[1]]).returncode)",
        exe,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "sync=cudaSuccess sum=1498500.0 c[999]=2997.0"


def test_guest_lib_names_the_library_crane_run_uses(prepared, bare_venv, guest_cache) -> None:
    """``crane guest-lib --python`` (the one step for LD_PRELOAD users and VM images) gives
    the cached build without building again; Crane's own interpreter gets Crane's default
    library."""
    python = bare_venv("3.12")
    lib, _ = prepared(python)
    assert lib.is_file() and lib.parent.parent.parent == guest_cache

    def guest_lib(py: str | Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "crane.cli.main", "guest-lib", "--python", str(py)],
            env=dict(os.environ, CRANE_GUEST_CACHE=str(guest_cache)),
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = guest_lib(python)
    assert r.returncode == 0 and Path(r.stdout.strip()) == lib, r.stderr
    assert "preparing" not in r.stderr
    r = guest_lib(sys.executable)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == library_path()
