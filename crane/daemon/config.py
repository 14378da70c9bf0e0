"""craned's configuration: a TOML file and command-line flags saying the same things.

Example ``/etc/crane/craned.toml``::

    listen = ["unix:///run/crane/crane.sock", "tcp://127.0.0.1:7480"]
    backend = ["sim:h100-80gb"]        # or "auto", "cuda", "cuda:1"; repeat for more devices
    run_dir = "/run/crane"
    log_level = "info"
    prespawn = 1                       # idle workers kept ready, so a session opens fast

Flags given on the command line replace the file's value for that key.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

__all__ = ["DaemonConfig", "load_config"]


@dataclass
class DaemonConfig:
    listen: list[str] = field(default_factory=lambda: ["unix:///run/crane/crane.sock"])
    backend: list[str] = field(default_factory=lambda: ["auto"])
    run_dir: str = "/run/crane"
    log_level: str = "info"
    prespawn: int = 1
    max_sessions: int = 64


def load_config(path: Path | str | None, overrides: dict[str, object]) -> DaemonConfig:
    """Read the TOML file (if any), then apply non-empty command-line overrides."""
    cfg = DaemonConfig()
    known = {f.name for f in fields(DaemonConfig)}
    if path:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        for k, v in data.items():
            if k in ("listen", "backend") and isinstance(v, str):
                v = [v]
            setattr(cfg, k, v)
    for k, v in overrides.items():
        if v not in (None, [], ""):
            setattr(cfg, k, v)
    return cfg
