"""craned's configuration: the lifetimes of entries for sessions that left (TOML and flags)."""

from __future__ import annotations

from pathlib import Path

import pytest

from crane.craned.config import DaemonConfig, load_config
from crane.craned.main import parse_args


def test_defaults_keep_redirects_ten_minutes_and_parked_sessions_an_hour() -> None:
    cfg = DaemonConfig()
    assert cfg.moved_ttl_s == 600 and cfg.parked_ttl_s == 3600


def test_file_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "craned.toml"
    f.write_text("moved_ttl_s = 30\nparked_ttl_s = 0\n")
    cfg = load_config(f, {})
    assert cfg.moved_ttl_s == 30.0 and cfg.parked_ttl_s == 0.0  # 0: until restored
    args = parse_args(["--parked-ttl", "86400", "--moved-ttl", "1.5"])
    cfg = load_config(f, {"moved_ttl_s": args.moved_ttl, "parked_ttl_s": args.parked_ttl})
    assert cfg.moved_ttl_s == 1.5 and cfg.parked_ttl_s == 86400.0
    assert parse_args([]).parked_ttl is None  # no flag: the file's (or default) value stands


@pytest.mark.parametrize("bad", ["-1", '"ten minutes"', "true", "nan"])
def test_bad_lifetimes_are_refused_by_name(tmp_path: Path, bad: str) -> None:
    f = tmp_path / "craned.toml"
    f.write_text(f"parked_ttl_s = {bad}\n")
    with pytest.raises(ValueError, match="parked_ttl_s must be a number of seconds >= 0"):
        load_config(f, {})
