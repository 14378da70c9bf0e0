"""A CUDA graph instantiated before its session moves (parked to a file and restored on another
daemon, or migrated live) is launched again after the move, with correct results.

Graphs need no worker state (docs/design.md, state record): the guest keeps them and replays a
launch through ordinary session calls, whose objects (module, function, stream, memory, the
event ordering launches) are all in the state record."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crane.cli.control_client import ControlClient
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess


@pytest.mark.parametrize("how", ["park-restore", "migrate"])
def test_graph_instantiated_before_a_move_replays_after_it(
    program, guest_lib: Path, tmp_path: Path, how: str
) -> None:  # type: ignore[no-untyped-def]
    exe = program("graph_park.cu")
    # A100 -> H100: the H100 offers every limit the A100 told the guest
    with (
        DaemonProcess(tmp_path / "a", ["sim:a100-80gb"]) as a,
        DaemonProcess(tmp_path / "b", ["sim:h100-80gb"]) as b,
    ):
        env = dict(os.environ, CRANE_DAEMON_ALTERNATES=b.address)
        env.pop("CRANE_TRACE", None)
        prog = subprocess.Popen(
            [sys.executable, "-m", "crane.cli.main", "run", "--daemon", a.address, "--", str(exe)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert prog.stdout is not None and prog.stdin is not None
            first = prog.stdout.readline()
            assert first.strip() == (
                "before capture=cudaSuccess inst=cudaSuccess sync=cudaSuccess host_calls=3"
            ), first + prog.stderr.read() if prog.poll() is not None else first
            assert prog.stdout.readline().strip() == "ready"
            with ControlClient(a.address, timeout=None) as c:
                (info,) = c.sessions().sessions
                if how == "park-restore":
                    ckpt = tmp_path / "g.ckpt"
                    assert c.checkpoint(info.id, str(ckpt), release=True).state == "parked"
                    prog.stdin.write("go\n")  # its next synchronizing call waits, parked
                    prog.stdin.flush()
                    with ControlClient(b.address, timeout=None) as cb:
                        cb.restore(str(ckpt))
                else:
                    last = migrate(a.address, info.id, b.address)[-1]
                    assert last.phase == "done", last.error
                    prog.stdin.write("go\n")
                    prog.stdin.flush()
            out, err = prog.communicate(timeout=180)
        finally:
            if prog.poll() is None:
                prog.kill()
                prog.wait()
        assert prog.returncode == 0, err
        # ok=1: the program checked every element against its own host computation; the last
        # one, computed here too (7 launches of two steps, mod 2^32), pins the launch count
        want = 7 * 999
        for _ in range(7):
            want = (want * 3 + 1 + 999) * 3 + 2 + 999 & 0xFFFFFFFF
        assert out.splitlines() == [f"after launch=cudaSuccess ok=1 host_calls=7 out[999]={want}"]
        assert f"session {info.id}" in b.log_text()  # the second half ran on b
