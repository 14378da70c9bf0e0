"""packaging/craned.service: systemd accepts it (``systemd-analyze verify``, where systemd is
installed), and it keeps what craned relies on: notify with the watchdog, the GPU's device
nodes reachable under a closed device policy, and no W^X ban that the workers' JIT would hit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "packaging" / "craned.service"


def settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line.strip() and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    # ExecStart must name an executable here: this environment's craned stands in for the
    # installed /usr/local/bin/craned
    craned = Path(sys.executable).with_name("craned")
    if not craned.exists():
        pytest.skip(f"no craned next to {sys.executable} (not an installed environment)")
    unit = tmp_path / "craned.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/craned", str(craned)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    complaints = [line for line in (done.stdout + done.stderr).splitlines() if "craned" in line]
    assert done.returncode == 0 and not complaints, done.stdout + done.stderr


def test_the_unit_keeps_what_craned_needs() -> None:
    s = settings()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["WatchdogSec"] and s["Restart"] == ["on-failure"]
    assert s["DevicePolicy"] == ["closed"]
    allowed = {v.split()[0] for v in s["DeviceAllow"]}
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= allowed
    assert {"char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps"} <= allowed
    families = s["RestrictAddressFamilies"][0].split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6", "AF_VSOCK", "AF_NETLINK"} <= set(families)
    assert "MemoryDenyWriteExecute" not in s and "PrivateDevices" not in s
    assert s["ProtectSystem"] == ["strict"] and "/run/crane" in s["ReadWritePaths"][0]
