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


def _xdist_group(nodeid: str) -> str:
    """The pytest-xdist group a test runs in (``make test``: ``--dist loadgroup``).

    Why grouped: a file's tests share module-scoped fixtures (a daemon, a built program) that
    would start once per process if its tests were spread; the VM tests boot TCG guests, two
    of which at once would starve each other (and the rest of the run) on a 2-core machine;
    the PTX tests share a session-wide nvcc build of every kernel for three architectures
    (about a minute), which a second process would repeat."""
    path = nodeid.split("::", 1)[0]
    for folder in ("tests/vm/", "tests/ptx/"):
        if path.startswith(folder):
            return folder.rstrip("/")
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its xdist group (before xdist reads the marks; no effect without
    ``-n``)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_xdist_group(item.nodeid)))
