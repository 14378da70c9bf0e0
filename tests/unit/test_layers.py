"""The layering is enforced: the import contracts in pyproject.toml hold with no exemptions, and
no module imports another module's underscore (private) names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    pytest.importorskip("importlinter", reason="import-linter is not installed (test extras)")
    run = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    p = subprocess.run(
        [sys.executable, "-c", run, "--no-logo", "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout, p.stdout[-3000:]


def _private_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("crane"):
            out += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return out


def test_no_module_imports_private_names() -> None:
    found = [hit for f in sorted((ROOT / "crane").rglob("*.py")) for hit in _private_imports(f)]
    assert not found, "\n".join(found)
