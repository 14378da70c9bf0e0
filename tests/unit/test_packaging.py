"""The shipped example configuration is one craned accepts."""

from __future__ import annotations

from pathlib import Path

from crane.craned.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_loads() -> None:
    cfg = load_config(ROOT / "packaging" / "craned.toml", {})
    assert cfg.listen[0] == "unix:///run/crane/crane.sock" and cfg.backend == ["auto"]


def test_unit_is_type_notify() -> None:
    unit = (ROOT / "packaging" / "craned.service").read_text()
    assert "Type=notify" in unit and "craned --config /etc/crane/craned.toml" in unit
