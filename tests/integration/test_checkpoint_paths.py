"""Checkpoint files only inside the daemon's checkpoint directory (issue 13, "Paths").

A name is taken inside the directory, an absolute path only when it lies there; anything else
(an absolute path elsewhere, ``..``, a symbolic link leading out, a linked sub-directory) is
refused by name with one message that says nothing about whether the outside file exists, and
nothing outside is created or read. Files are 0600, the directory 0700.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import grpc
import pytest

from crane.cli.control_client import ControlClient
from crane.cli.main import main as crane_main
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession


def _refusal(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def _shape(e: grpc.RpcError, name: str) -> str:
    """The refusal with the refused name taken out: the same for every outside path."""
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED, (e.code(), e.details())
    details = e.details() or ""
    assert repr(name) in details, details
    return details.replace(repr(name), "NAME")


def test_only_inside_the_checkpoint_directory(
    daemon: DaemonProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (tmp_path / "link.ckpt").symlink_to(outside / "x.ckpt")  # a file leading out
    (tmp_path / "linkdir").symlink_to(outside)  # a directory leading out
    with GuestSession(daemon.address, client="paths") as s, ControlClient(daemon.address) as c:
        p = s.mem_alloc(4096)
        s.memcpy_htod(p, b"inside" * 10)
        s.synchronize()
        sid = s.session_id
        refusals = {
            name: _refusal(lambda n=name: c.checkpoint(sid, n, release=False))
            for name in (
                "/etc/x",
                "../x.ckpt",
                f"{tmp_path}/../{tmp_path.name}-outside/x.ckpt",
                "link.ckpt",
                "linkdir/x.ckpt",
                str(outside / "x.ckpt"),
            )
        }
        refusals |= {
            name: _refusal(lambda n=name: c.restore(n))
            for name in ("/etc/passwd", "/etc/no-such-crane-checkpoint", "../x.ckpt", "link.ckpt")
        }
        shapes = {_shape(e, name) for name, e in refusals.items()}
        assert len(shapes) == 1, shapes  # /etc/passwd exists, the other does not: same answer
        (shape,) = shapes
        assert str(tmp_path) in shape and "checkpoint directory" in shape
        assert not list(outside.iterdir()), "something was written outside the directory"
        assert "refused a checkpoint path" in daemon.log_text()

        # inside: by name, and by an absolute path in it; the reply says where it went
        r = c.checkpoint(sid, "good.ckpt", release=False)
        assert r.path == str(tmp_path / "good.ckpt")
        r = c.checkpoint(sid, str(tmp_path / "abs.ckpt"), release=False)
        assert r.path == str(tmp_path / "abs.ckpt")
        for name in ("good.ckpt", "abs.ckpt"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
        assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700
        assert not [f for f in os.listdir(tmp_path) if f.endswith(".partial")]
        argv = ["--daemon", daemon.address, "checkpoint", "--session", sid, "-o", "cli.ckpt"]
        assert crane_main(argv) == 0
        assert f"written to {tmp_path / 'cli.ckpt'}" in capsys.readouterr().out
        # the session is unharmed and restores from its file by name
        assert s.memcpy_dtoh(p, 6) == b"inside"
        argv = ["--daemon", daemon.address, "checkpoint", "--session", sid, "-o", "/etc/x"]
        assert crane_main(argv) == 1
        err = capsys.readouterr().err
        assert "checkpoint path '/etc/x' is not a file inside the checkpoint directory" in err
        assert c.checkpoint(sid, "parked.ckpt", release=True).state == "parked"
        assert c.restore("parked.ckpt").session_id == sid
        assert s.memcpy_dtoh(p, 6) == b"inside"


def test_default_directory_is_the_run_directorys(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path / "run") as d:
        where = tmp_path / "run" / "checkpoints"
        assert stat.S_IMODE(where.stat().st_mode) == 0o700
        with GuestSession(d.address) as s, ControlClient(d.address) as c:
            s.mem_alloc(4096)
            r = c.checkpoint(s.session_id, "x.ckpt", release=False)
        assert r.path == str(where / "x.ckpt")
        assert stat.S_IMODE((where / "x.ckpt").stat().st_mode) == 0o600
