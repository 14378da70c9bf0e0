"""``crane doctor`` on a healthy set-up (a real craned on the simulated GPU, its configuration
file, mutual-TLS certificates, a libvirt domain and the hook) and on set-ups broken one way at a
time: each must give the expected finding, with a fix, and a failing exit status."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from crane.cli.main import main as crane
from crane.craned.launcher import DaemonProcess


class Setup:
    """A host's files: run directory, config, certificates, libvirt hooks directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.run = root / "run"
        self.run.mkdir(mode=0o755)
        os.chmod(self.run, 0o755)
        self.hooks = root / "hooks"
        self.ca = trustme.CA()
        self.ca_path = root / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_path))
        self.cert, self.key = self.issue("craned")
        self.config = root / "craned.toml"
        self.write_config()

    def issue(self, cn: str, ca: trustme.CA | None = None, **kw: object) -> tuple[Path, Path]:
        leaf = (ca or self.ca).issue_cert(cn, "127.0.0.1", common_name=cn, **kw)
        cert, key = self.root / f"{cn}.pem", self.root / f"{cn}.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        return cert, key

    @property
    def socket(self) -> str:
        return f"unix://{self.run / 'crane.sock'}"

    def write_config(self, extra: str = "") -> None:
        self.config.write_text(
            f'listen = ["{self.socket}", "tcp://127.0.0.1:0"]\n'
            'backend = ["sim:h100-80gb"]\n'
            f'run_dir = "{self.run}"\n'
            f'tls_cert = "{self.cert}"\n'
            f'tls_key = "{self.key}"\n'
            f'client_ca = "{self.ca_path}"\n'
            f"{extra}"
            "[domains.vm1]\n"
        )

    def install_hook(self) -> None:
        assert (
            crane(
                ["libvirt-hook", "install", "--daemon", self.socket, "--hooks-dir", str(self.hooks)]
            )
            == 0
        )


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, dict[str, str]]]:
    capsys.readouterr()
    rc = crane(["doctor", "--json", *args])
    report = json.loads(capsys.readouterr().out)
    return rc, {f["check"]: f for f in report["findings"]}


def host(capsys: pytest.CaptureFixture[str], s: Setup) -> tuple[int, dict[str, dict[str, str]]]:
    return doctor(capsys, "--host", "--config", str(s.config), "--hooks-dir", str(s.hooks))


@pytest.fixture
def setup() -> Iterator[Setup]:
    with tempfile.TemporaryDirectory(prefix="crd", dir="/tmp") as d:  # short socket paths
        yield Setup(Path(d))


@pytest.fixture
def running(setup: Setup) -> Iterator[Setup]:
    """The set-up with its craned running from that configuration file."""
    setup.install_hook()
    d = DaemonProcess(setup.run, ["sim:h100-80gb"], extra_args=["--config", str(setup.config)])
    try:
        yield setup
    finally:
        d.stop()


def test_healthy_host_and_guest_pass(running: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    rc, found = host(capsys, running)
    assert rc == 0, found
    assert {f["status"] for f in found.values()} <= {"ok", "skip"}, found
    assert found["host: gpu"]["status"] == "skip"  # simulated only: said plainly, no failure
    assert "no GPU needed" in found["host: gpu"]["message"]
    assert found["host: socket crane.sock"]["status"] == "ok"
    assert found["host: socket vm1.sock"]["status"] == "ok"
    assert found["host: craned CA"]["status"] == "ok"
    rc, found = doctor(capsys, "--guest", "--daemon", running.socket)
    assert rc == 0, found
    assert [f["status"] for f in found.values()] == ["ok", "ok", "ok"], found
    assert "serving sessions" in found["guest: daemon"]["message"]
    assert "same protocol" in found["guest: fingerprint"]["message"]


def test_bad_config_key(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    setup.write_config("max_session = 4\n")
    rc, found = host(capsys, setup)
    assert rc == 1
    f = found["host: config"]
    assert f["status"] == "fail" and "unknown keys ['max_session']" in f["message"]
    assert f"edit {setup.config}" in f["fix"]


def test_expired_certificate(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    now = dt.datetime.now(dt.UTC)
    setup.cert, setup.key = setup.issue(
        "old", not_before=now - dt.timedelta(days=60), not_after=now - dt.timedelta(days=1)
    )
    setup.write_config()
    rc, found = host(capsys, setup)
    assert rc == 1
    f = found["host: craned certificate"]
    assert f["status"] == "fail" and "expired on" in f["message"] and "CN=old" in f["message"]
    assert "issue a new one" in f["fix"]


def test_certificate_soon_to_expire_warns(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    now = dt.datetime.now(dt.UTC)
    setup.cert, setup.key = setup.issue("soon", not_after=now + dt.timedelta(days=5))
    setup.write_config()
    setup.install_hook()
    rc, found = host(capsys, setup)
    assert found["host: craned certificate"]["status"] == "warn"
    assert "expires on" in found["host: craned certificate"]["message"]
    assert rc == 0  # a warning alone does not fail


def test_key_of_another_certificate(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    _, other_key = setup.issue("other")
    setup.key = other_key
    setup.write_config()
    rc, found = host(capsys, setup)
    assert rc == 1
    f = found["host: craned key"]
    assert f["status"] == "fail" and "is not the private key of" in f["message"]
    assert "the key the certificate was issued for" in f["fix"]


def test_certificate_from_another_ca(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    setup.cert, setup.key = setup.issue("stranger", ca=trustme.CA())
    setup.write_config('peers = ["craned-b"]\n')  # peers verify it against client_ca
    rc, found = host(capsys, setup)
    assert rc == 1
    f = found["host: craned CA"]
    assert f["status"] == "fail" and "was not signed by any certificate in" in f["message"]
    assert "openssl verify -CAfile" in f["fix"]


def test_world_writable_socket_dir(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    os.chmod(setup.run, 0o777)
    rc, found = host(capsys, setup)
    assert rc == 1
    f = found["host: run dir"]
    assert f["status"] == "fail" and "world-writable" in f["message"]
    assert f["fix"] == f"chmod 0755 {setup.run}"


def test_socket_dir_closed_to_other_users(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    os.chmod(setup.run, 0o700)
    _, found = host(capsys, setup)
    f = found["host: run dir"]
    assert f["status"] == "warn" and "not searchable by other users" in f["message"]
    assert f["fix"].startswith(f"chmod o+x {setup.run}")


def test_domain_socket_open_to_everyone(running: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    sock = running.run / "domains" / "vm1.sock"
    os.chmod(sock, 0o666)
    rc, found = host(capsys, running)
    assert rc == 1
    f = found["host: socket vm1.sock"]
    assert (
        f["status"] == "fail" and "every local user can act as that domain's guest" in f["message"]
    )
    assert f["fix"] == f"chmod 0660 {sock}"


def test_hook_not_installed(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    rc, found = host(capsys, setup)
    assert rc == 1
    f = found["host: libvirt hook"]
    assert f["status"] == "fail" and "is not installed" in f["message"]
    assert f["fix"].startswith(f"crane libvirt-hook install --daemon {setup.socket}")


def test_daemon_unreachable(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    rc, found = doctor(capsys, "--guest", "--daemon", setup.socket)  # nothing listens there
    assert rc == 1
    f = found["guest: daemon"]
    assert f["status"] == "fail" and "does not answer: UNAVAILABLE" in f["message"]
    assert "systemctl status craned" in f["fix"]
    assert "guest: fingerprint" not in found
    assert found["guest: guest library"]["status"] == "ok"


@pytest.mark.skipif(
    Path("/proc/driver/nvidia/version").exists(), reason="this machine has an NVIDIA driver"
)
def test_gpu_configured_without_a_driver(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    setup.config.write_text(setup.config.read_text().replace("sim:h100-80gb", "cuda:0"))
    rc, found = host(capsys, setup)
    assert rc == 1
    f = found["host: nvidia driver"]
    assert f["status"] == "fail" and "no NVIDIA kernel driver" in f["message"]
    assert "modprobe nvidia" in f["fix"]


def test_text_output_names_the_fix(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    os.chmod(setup.run, 0o777)
    capsys.readouterr()
    rc = crane(["doctor", "--host", "--config", str(setup.config), "--hooks-dir", str(setup.hooks)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL  host: run dir" in out and f"fix: chmod 0755 {setup.run}" in out
    assert out.rstrip().splitlines()[-1].endswith(" checks: 2 failed, 1 warnings")
