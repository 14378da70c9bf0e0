"""craned's metrics and accounting settings (TOML and flags)."""

from __future__ import annotations

from pathlib import Path

import pytest

from crane.craned.config import DaemonConfig, load_config
from crane.craned.main import parse_args


def test_accounting_is_on_and_the_exporter_off_by_default() -> None:
    cfg = DaemonConfig()
    assert cfg.accounting is True and cfg.metrics_listen == "" and cfg.profile_window_s == 60


def test_file_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "craned.toml"
    f.write_text('metrics_listen = "127.0.0.1:9400"\naccounting = true\nprofile_window_s = 30\n')
    cfg = load_config(f, {})
    assert cfg.metrics_listen == "127.0.0.1:9400" and cfg.profile_window_s == 30.0
    args = parse_args(["--metrics-listen", ":9500", "--no-accounting"])
    cfg = load_config(f, {"metrics_listen": args.metrics_listen, "accounting": args.accounting})
    assert cfg.metrics_listen == ":9500" and cfg.accounting is False
    assert parse_args([]).accounting is None  # no flag: the file's (or default) value stands


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('accounting = "yes"', "accounting must be true or false"),
        ("profile_window_s = 0", "profile_window_s must be"),
        ("profile_window_s = true", "profile_window_s must be"),
        ("metrics_listen = 9400", "metrics_listen must be"),
    ],
)
def test_bad_values_are_refused_by_name(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "craned.toml"
    f.write_text(text + "\n")
    with pytest.raises(ValueError, match=message):
        load_config(f, {})
