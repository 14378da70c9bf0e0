"""A VM's guest on ``vm://``, without a VM: an nvcc-built CUDA program under ``crane run`` (the
interposer as its libcuda) with ``CRANE_DAEMON=vm://127.0.0.1:PORT``, whose port a socat forward
ties to a domain socket, as QEMU's ``guestfwd`` does. Mid-run its session moves to another
daemon (live migration, or parked and restored there) and the forward is re-pointed to that
daemon's socket of the same domain, as when the VM lands on another host: the guest resumes by
token at the same address, now reaching another daemon, and finishes with the unmoved result.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from crane.cli.control_client import ControlClient
from crane.cli.demo_migrate import ITERATIVE_PROGRAM, STEPS, reference_checksum
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from tests.integration.vmfwd import Forward
from tests.interposer.conftest import guest_lib  # noqa: F401 - a fixture used below


def _line(prog: subprocess.Popen[str], timeout: float = 60) -> str:
    assert prog.stdout is not None
    ready, _, _ = select.select([prog.stdout], [], [], timeout)
    assert ready, "the program printed nothing"
    return prog.stdout.readline()


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.usefixtures("guest_lib")
@pytest.mark.parametrize("how", ["migrate", "park-restore"])
def test_vm_guest_resumes_at_the_same_address_on_another_daemon(
    tmp_path: Path, cuda_build: Callable[..., Path], how: str
) -> None:
    exe = cuda_build(ITERATIVE_PROGRAM, suffix=".exe")
    dom = ["--domain", "vm1=alice"]
    with (
        DaemonProcess(
            tmp_path / "a", ["sim:a100-80gb"], extra_args=dom, checkpoint_dir=tmp_path
        ) as a,
        DaemonProcess(
            tmp_path / "b", ["sim:h100-80gb"], extra_args=dom, checkpoint_dir=tmp_path
        ) as b,
    ):
        fwd = Forward(a.run_dir / "domains" / "vm1.sock")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRANE_")}
        cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", fwd.address, "--"]
        prog = subprocess.Popen(
            [*cmd, str(exe)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            first = _line(prog)
            assert first == "step 0\n", first + (prog.stderr.read() if prog.poll() else "")
            ps_cmd = ["ps", "--daemon", a.address, "--domain", "vm1"]
            ps = subprocess.run(
                [sys.executable, "-m", "crane.cli.main", *ps_cmd],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert ps.returncode == 0, ps.stderr
            _, row = ps.stdout.splitlines()
            assert row.split()[1:3] == ["alice", "vm1"], ps.stdout
            sid = row.split()[0]
            if how == "migrate":
                last = migrate(a.address, sid, b.address)[-1]
                assert last.phase == "done", last.error
            else:
                with ControlClient(a.address, timeout=None) as c:
                    assert c.checkpoint(sid, "vm.ckpt", release=True).state == "parked"
            # the VM "moves": every connection of its forward resets, and the guest's
            # address reaches the destination's socket of the same domain
            fwd.stop()
            if how == "park-restore":
                with ControlClient(b.address, timeout=None) as c:
                    c.restore("vm.ckpt")
            fwd.start(b.run_dir / "domains" / "vm1.sock")

            def running_on_b() -> bool:
                with ControlClient(b.address) as c:
                    got = c.sessions("vm1").sessions
                return (bool(got) and got[0].state == "running") or prog.poll() is not None

            _wait_for(running_on_b, "the guest did not resume on the destination")
            with ControlClient(b.address) as c:
                seen = c.sessions("vm1").sessions
            out, err = prog.communicate(timeout=180)
        finally:
            if prog.poll() is None:
                prog.kill()
                prog.communicate()
            fwd.close()
        assert prog.returncode == 0, err
        steps = "".join(f"step {s}\n" for s in range(0, STEPS, 50))
        assert first + out == steps + f"checksum {reference_checksum()} (no error)\n"
        assert [(s.id, s.domain, s.tenant) for s in seen] == [(sid, "vm1", "alice")]
