"""craned start-up, configuration, shutdown, and the `crane` CLI against it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession


def crane(*args: str, daemon: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crane.cli.main", "--daemon", daemon, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_devices_and_ps_tables_and_json(daemon: DaemonProcess) -> None:
    out = crane("devices", daemon=daemon.address)
    assert out.returncode == 0, out.stderr
    assert "NVIDIA H100 80GB HBM3" in out.stdout and "9.0" in out.stdout
    data = json.loads(crane("devices", "--json", daemon=daemon.address).stdout)
    assert data["devices"][0]["profile"] == "h100-80gb"
    with GuestSession(daemon.address, client="cli-test"):
        ps = crane("ps", daemon=daemon.address)
        assert "cli-test" in ps.stdout and "running" in ps.stdout
        js = json.loads(crane("ps", "--json", daemon=daemon.address).stdout)
        assert js["sessions"][0]["client"] == "cli-test"


def test_cli_reports_unreachable_daemon(tmp_path: Path) -> None:
    out = crane("ps", daemon=f"unix://{tmp_path}/none.sock")
    assert out.returncode == 1 and "cannot reach the daemon" in out.stderr


def test_several_devices_and_tcp_listen(tmp_path: Path) -> None:
    """Plain TCP is a development setting: craned says so at start (mutual TLS is
    tests/integration/test_auth.py's)."""
    with DaemonProcess(
        tmp_path / "run",
        ["sim:a100-40gb", "sim:l4"],
        extra_listen=["tcp://127.0.0.1:0"],
        extra_args=["--insecure-tcp"],
    ) as d:
        with ControlClient(d.address) as ctl:
            devs = ctl.devices().devices
        assert [x.name for x in devs] == ["NVIDIA A100-SXM4-40GB", "NVIDIA L4"]
        with GuestSession(d.address, device=1) as s:
            assert s.device.cc == (8, 9)
        assert "listening on tcp://127.0.0.1:" in d.log_text()
        assert "insecure_tcp: tcp listeners are plain TCP" in d.log_text()


def test_config_file(tmp_path: Path) -> None:
    sock = tmp_path / "c.sock"
    cfg = tmp_path / "craned.toml"
    cfg.write_text(
        f'listen = "unix://{sock}"\nbackend = ["sim:l4"]\n'
        f'run_dir = "{tmp_path / "run"}"\nprespawn = 0\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "crane.craned.main", "--config", str(cfg)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        import time

        for _ in range(200):
            if sock.exists():
                break
            time.sleep(0.05)
        with ControlClient(f"unix://{sock}") as ctl:
            assert ctl.devices().devices[0].name == "NVIDIA L4"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert "stopped" in err and not sock.exists()


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('listn = "x"\n')
    out = subprocess.run(
        [sys.executable, "-m", "crane.craned.main", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "unknown keys" in out.stderr
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "crane.craned.main",
            "--backend",
            "sim:nope",
            "--run-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "h100-80gb" in out.stderr


def test_sigterm_ends_sessions_cleanly(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "run")
    s = GuestSession(d.address)
    s.mem_alloc(1 << 20)
    s.synchronize()
    assert d.stop(signal.SIGTERM) == 0
    log = d.log_text()
    assert "shutting down" in log and "daemon shutting down" in log
    from crane.api.results import CudaError

    with pytest.raises(CudaError):
        s.synchronize()


def test_auto_backend_logs_its_choice(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path / "run", ["auto"]) as d:
        assert "auto:" in d.log_text() and "sim:h100-80gb" in d.log_text()
