"""Which interpreter a command runs in (crane/cli/guest_runtime.py's python_of): the program
itself when it is named python*, the shebang's interpreter for a script, nothing otherwise."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from crane.cli.guest_runtime import python_of


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    for name in ("python3", "python3.12", "python"):
        exe = d / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    return d


def _script(d: Path, name: str, text: str | bytes) -> Path:
    p = d / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    p.chmod(0o755)
    return p


def test_interpreter_named_directly(bindir: Path) -> None:
    path = str(bindir)
    assert python_of(["python3", "app.py"], path) == str(bindir / "python3")
    assert python_of([str(bindir / "python3.12"), "-m", "pytest"], path) == str(
        bindir / "python3.12"
    )
    assert python_of(["env", "FOO=1", "python", "-c", "0"], path) == str(bindir / "python")


def test_shebangs(bindir: Path) -> None:
    path = str(bindir)
    direct = _script(bindir, "torchrun", f"#!{bindir / 'python3.12'}\nimport sys\n")
    assert python_of([str(direct)], path) == str(bindir / "python3.12")
    _script(bindir, "tool", "#!/usr/bin/env python3\n")
    assert python_of(["tool", "--flag"], path) == str(bindir / "python3")
    _script(bindir, "tool2", "#!/usr/bin/env -S python3 -u\n")
    assert python_of(["tool2"], path) == str(bindir / "python3")


def test_other_programs(bindir: Path) -> None:
    path = str(bindir)
    _script(bindir, "run.sh", "#!/bin/sh\nexec python3 app.py\n")
    assert python_of(["run.sh"], path) is None
    true = shutil.which("true")
    assert true is not None
    assert python_of([true], os.environ.get("PATH")) is None  # an ELF program
    assert python_of(["no-such-program"], path) is None
    assert python_of(["pythonic"], path) is None
