"""README.md's Python examples run as written: every fenced ``python`` block, against a real
craned on the simulated GPU (``CRANE_DAEMON``), in a fresh interpreter. An example that stops
working (an import the package no longer exports, a method renamed) fails here. The blocks
check their own results (asserts), so exiting 0 is the example doing what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.craned.launcher import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def python_blocks(text: str) -> list[str]:
    """The ```python fenced blocks of a Markdown text."""
    return [m.group(1) for m in FENCE.finditer(text)]


BLOCKS = python_blocks((ROOT / "README.md").read_text())


def test_the_readme_has_python_examples() -> None:
    assert BLOCKS, "README.md has no ```python block (the extraction below would test nothing)"
    assert python_blocks("x\n```python\nprint(1)\n```\n```sh\nls\n```\n") == ["print(1)\n"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("readme") / "run", ["sim:h100-80gb"])
    try:
        yield d
    finally:
        d.stop()


def test_public_api_is_what_the_package_exports() -> None:
    import crane.guest

    for name in crane.guest.__all__:
        assert getattr(crane.guest, name) is not None
    assert {"GuestSession", "CudaError"} <= set(crane.guest.__all__)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index: int, daemon: DaemonProcess, tmp_path: Path) -> None:
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(BLOCKS[index])
    env = {**os.environ, "CRANE_DAEMON": daemon.address}
    r = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"README block {index} failed:\n{BLOCKS[index]}\n{r.stderr[-3000:]}"
