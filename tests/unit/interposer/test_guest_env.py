"""The guest side's conflict check (crane/interposer/guest_env.py): requirement parsing and
version ordering as PEP 440 defines them, and the check over real installations' metadata."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

from crane.interposer.guest_env import (
    GUEST_DISTRIBUTIONS,
    conflicts,
    parse_requirement,
    satisfies,
    version_key,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("5.26.0", "protobuf>=5.26", True),
        ("5.26", "protobuf>=5.26.0", True),
        ("4.25.9", "protobuf>=5.26", False),
        ("5.26.0rc1", "protobuf>=5.26", False),  # a pre-release sorts before its release
        ("5.26.0.post1", "protobuf>=5.26", True),
        ("2.4.1+cpu", "numpy>=1.26", True),
        ("1.60", "grpcio>=1.60,<2", True),
        ("2.0", "grpcio>=1.60,<2", False),
        ("2.3", "x~=2.2", True),
        ("3.0", "x~=2.2", False),
        ("1.4.9", "x~=1.4.5", True),
        ("1.5.0", "x~=1.4.5", False),
        ("1.2.9", "x==1.2.*", True),
        ("1.3", "x==1.2.*", False),
        ("1.2.3", "x!=1.2.3", False),
        ("1.10", "x>1.9", True),  # numeric, not lexical
    ],
)
def test_satisfies(version: str, spec: str, ok: bool) -> None:
    assert satisfies(version, parse_requirement(spec)) is ok


def test_version_key_orders_pre_releases_first() -> None:
    assert version_key("1.0a1") < version_key("1.0") == version_key("1.0.0") < version_key("1.0.1")


@pytest.mark.parametrize("bad", ["x[extra]>=1", "x @ https://example.org/x.whl", "x>=>1"])
def test_unsupported_requirements_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_requirement(bad)


def test_every_guest_dependency_has_one_requirement_in_pyproject() -> None:
    """The list of guest dependencies and pyproject's dependencies stay in step (the build
    bakes the requirement of each into the library)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [parse_requirement(d).name for d in deps]
    assert all(names.count(d) == 1 for d in GUEST_DISTRIBUTIONS), names
    spec = importlib.util.spec_from_file_location("bi", ROOT / "interposer" / "build_interposer.py")
    builder = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(builder)  # type: ignore[union-attr]
    got = [parse_requirement(r).name for r in builder.guest_requirements()]
    assert sorted(got) == sorted(GUEST_DISTRIBUTIONS)


def _install(site: Path, name: str, version: str) -> None:
    """An installation's metadata as pip writes it (what the check reads)."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_conflict_names_both_versions_and_the_fix(tmp_path: Path) -> None:
    app, ours = tmp_path / "app", tmp_path / "crane"
    _install(app, "lz4", "3.1.0")
    _install(ours, "lz4", "4.4.5")
    _install(app, "zstandard", "0.25.0")  # fits: no conflict for it
    (found,) = conflicts(["lz4>=4.3", "zstandard>=0.22"], [str(app)], [str(ours)], modules={})
    line = found.report("/venv/bin/python")
    assert "application's lz4 3.1.0 (installed at" in line
    assert "lz4>=4.3 (Crane ships 4.4.5)" in line
    assert "/venv/bin/python -m pip install 'lz4>=4.3'" in line
    assert "CUDA_ERROR_NOT_INITIALIZED" in line and "\n" not in line


def test_first_installation_on_the_path_is_the_one_checked(tmp_path: Path) -> None:
    """The application's path order decides which copy would be imported."""
    first, second = tmp_path / "a", tmp_path / "b"
    _install(first, "lz4", "4.4.0")
    _install(second, "lz4", "1.0")
    assert conflicts(["lz4>=4.3"], [str(first), str(second)], [], modules={}) == []
    assert len(conflicts(["lz4>=4.3"], [str(second), str(first)], [], modules={})) == 1


def test_absent_dependency_is_no_conflict(tmp_path: Path) -> None:
    assert conflicts(["lz4>=4.3"], [str(tmp_path)], [], modules={}) == []


def test_an_imported_module_decides_over_installations(tmp_path: Path) -> None:
    """What the process already holds is what Crane would share, whatever is installed."""
    import numpy

    _install(tmp_path, "numpy", "1.0")
    held = {"numpy": numpy}
    assert conflicts([f"numpy=={numpy.__version__}"], [str(tmp_path)], [], modules=held) == []
    (found,) = conflicts(["numpy<1.1"], [str(tmp_path)], [], modules=held)
    assert found.app.imported and found.app.version == numpy.__version__
