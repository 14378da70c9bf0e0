"""Shared fixtures: a CUDA compiler for tests that build real CUDA code, and capability skips."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

#: CRANE_PTX_JIT as the run started (this file is imported before any test package's own
#: conftest): a package may change it for its own tests only (tests/ptx runs in diff mode)
PTX_JIT_AT_START = os.environ.get("CRANE_PTX_JIT")


def find_nvcc() -> str | None:
    from crane.cli.demo import find_nvcc as find

    return find()


@pytest.fixture
def ptx_jit_at_start() -> str | None:
    return PTX_JIT_AT_START


@pytest.fixture(scope="session")
def nvcc() -> str:
    path = find_nvcc()
    if path is None:
        pytest.skip("no CUDA compiler: install nvcc or `pip install nvidia-cuda-nvcc`")
    return path


@pytest.fixture(scope="session")
def cuda_build(nvcc: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Compile CUDA source with nvcc once per (source, flags) for the whole run."""
    cache: dict[tuple[str, tuple[str, ...]], Path] = {}
    root = tmp_path_factory.mktemp("cuda-build")

    def build(source: str, *flags: str, suffix: str = ".fatbin") -> Path:
        key = (source, flags)
        if key not in cache:
            d = root / f"b{len(cache)}"
            d.mkdir()
            src = d / "k.cu"
            src.write_text(source)
            out = d / f"out{suffix}"
            subprocess.run(
                [nvcc, *flags, "-o", str(out), str(src)], check=True, capture_output=True
            )
            cache[key] = out
        return cache[key]

    return build


def have(cmd: str) -> bool:
    return shutil.which(cmd) is not None


def _xdist_scope(nodeid: str) -> str:
    """The scope pytest-xdist keeps in one process (``make test``: ``-n 2 --dist loadscope``).

    Why these scopes: a file's tests share module-scoped fixtures (a daemon, a built program)
    that would start once per process if its tests were spread; the VM tests boot TCG guests,
    two of which at once would starve each other (and the rest of the run) on a 2-core machine;
    the PTX tests share a session-wide nvcc build of every kernel for three architectures
    (about a minute), which a second process would repeat."""
    path = nodeid.split("::", 1)[0]
    for folder in ("tests/vm/", "tests/ptx/"):
        if path.startswith(folder):
            return folder.rstrip("/")
    return path


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadscope`` with :func:`_xdist_scope`'s scopes (xdist's own are a class or a
    module). Not ``loadgroup`` with marks: with pytest 9 its renaming of the tests' ids no
    longer takes, and every test was scheduled alone."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuiteScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _xdist_scope(nodeid)

    return SuiteScopes(config, log)
