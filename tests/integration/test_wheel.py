"""The packages work without the source tree: ``python -m build`` on a clean ``git clone``
makes an sdist and, from that sdist, a wheel; the wheel installed into a fresh venv gives a
``craned`` and a ``crane`` that run an nvcc-built CUDA program on the simulated GPU.

This is what GPU hosts and guests do (README: ``pip install 'crane[host]'``), and what the
editable install of ``make setup`` hides: the generated gRPC modules (``crane.v1``), the guest
library, and its sources for rebuilding it must all be in the packages. The build is isolated,
so the build requirements in pyproject.toml are checked too; pip reaches the same package
indexes as scripts/setup.sh (pip's own configuration, inherited). The wheel is built from the
sdist, so an sdist missing a file the build needs fails here as well."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from crane.craned.launcher import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
VADD = ROOT / "tests" / "interposer" / "programs" / "vadd.cu"

pytestmark = pytest.mark.slow


def _clean_env(home: Path) -> dict[str, str]:
    """This environment less what would let the installed Crane find this source tree or this
    venv (PYTHONPATH, a preload, Crane's own settings)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CRANE_", "PYTHON", "LD_PRELOAD", "VIRTUAL_ENV"))
    }
    env["CRANE_GUEST_CACHE"] = str(home / "guest-cache")
    return env


def _run(cmd: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    r = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, (
        f"{cmd} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-4000:]}"
    )
    return r.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel built from a clean clone installed; its bin directory."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the test builds from a clean clone")
    base = tmp_path_factory.mktemp("wheel")
    env = _clean_env(base)
    src, dist, venv = base / "src", base / "dist", base / "venv"
    _run(["git", "clone", "--quiet", "--no-hardlinks", ROOT, src], base, env)
    _run([sys.executable, "-m", "build", "--outdir", dist, src], base, env, timeout=600)
    wheels, sdists = list(dist.glob("crane-*.whl")), list(dist.glob("crane-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())

    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for must in (
        "crane/v1/guest_pb2.py",
        "crane/v1/control_pb2_grpc.py",
        "crane/interposer/_lib/libcuda.so.1",
        "crane/interposer/_build/build_interposer.py",
        "crane/interposer/_build/src/pygate.c",
        "crane/interposer/_build/generated/entries.c",
    ):
        assert must in names, f"the wheel lacks {must}"
    # the call ring's C core, compiled for this interpreter (guests on the host use it)
    assert any(n.startswith("crane/wire/_ringcore.") and n.endswith(".so") for n in names), names
    # the guest's queue of packed calls and the simulator's fill loop, built the same way
    for core in ("crane/guest/_callq.", "crane/backends/sim/_fillcore."):
        assert any(n.startswith(core) and n.endswith(".so") for n in names), (core, names)
    # a compiled, Python-version-specific library inside: not a py3-none-any wheel
    assert f"-cp{sys.version_info[0]}{sys.version_info[1]}-" in wheels[0].name, wheels[0].name
    with tarfile.open(sdists[0]) as tar:
        members = tar.getnames()
    assert any(m.endswith("/proto/crane/v1/guest.proto") for m in members)
    assert any(m.endswith("/interposer/src/pygate.c") for m in members)
    assert any(m.endswith("/crane/wire/ringcore.c") for m in members)
    assert any(m.endswith("/crane/guest/callqcore.c") for m in members)
    assert any(m.endswith("/crane/backends/sim/fillcore.c") for m in members)
    assert not any(m.endswith(".so.1") for m in members), "a built library in the sdist"

    _run([sys.executable, "-m", "venv", venv], base, env)
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheels[0]], base, env)
    shutil.rmtree(src)  # nothing of a source tree is left to lean on
    return venv / "bin"


def test_wheel_runs_a_cuda_program(
    installed: Path, cuda_build: Callable[..., Path], tmp_path: Path
) -> None:
    env = _clean_env(tmp_path)
    where = _run(
        [installed / "python", "-c", "import crane, crane.v1.guest_pb2; print(crane.__file__)"],
        tmp_path,
        env,
    )
    assert where.startswith(str(installed.parent)), where  # the installed copy, not this tree
    lib = Path(_run([installed / "crane", "guest-lib"], tmp_path, env).strip())
    assert lib.is_file() and lib.is_relative_to(installed.parent), lib

    exe = cuda_build(VADD.read_text(), "-gencode", "arch=compute_80,code=compute_80", suffix=".exe")
    daemon = DaemonProcess(
        tmp_path / "run", ["sim:h100-80gb"], program=[str(installed / "craned")], env=env
    )
    try:
        devices = json.loads(
            _run(
                [installed / "crane", "devices", "--json", "--daemon", daemon.address],
                tmp_path,
                env,
            )
        )
        assert devices["devices"][0]["backend"] == "sim"
        out = _run(
            [installed / "crane", "run", "--daemon", daemon.address, "--", exe], tmp_path, env
        )
        assert out.strip() == "sync=cudaSuccess sum=1498500.0 c[999]=2997.0"
        # the installed guest reached its worker through the call ring the wheel carries
        assert "guest attached through the call ring" in daemon.log_text()
    finally:
        daemon.stop()
    assert "Traceback" not in daemon.log_text()
