"""CUDA arrays, 2D/3D copies, texture and surface objects: a CUDA program built by nvcc at test
time runs through the interposer on the simulated GPU and checks every section against a
host-side reference itself (programs/textures.cu)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crane.cli.control_client import ControlClient
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess


def test_arrays_textures_surfaces(program, run_guest) -> None:
    r = run_guest(program("textures.cu"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "rotate ok",
        "array3d ok",
        "layered ok",
        "surface ok",
        "gather ok",
        "normalized ok",
        "linear ok",
        "mipmap ok",
        "graph ok",
        "done cudaSuccess",
    ], r.stdout + r.stderr
    assert "not supported" not in r.stderr.lower(), r.stderr


@pytest.mark.parametrize("how", ["park-restore", "migrate"])
def test_array_and_texture_objects_survive_a_move(program, tmp_path: Path, how: str) -> None:
    """Written before the session is parked and restored elsewhere (or migrated live), an
    array and the texture and surface objects over it sample, store and copy correctly after
    the move (programs/texture_park.cu checks every value against the host)."""
    exe = program("texture_park.cu")
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
                "before array=cudaSuccess tex=cudaSuccess surf=cudaSuccess sync=cudaSuccess"
            ), first
            assert prog.stdout.readline().strip() == "ready"
            with ControlClient(a.address, timeout=None) as c:
                (info,) = c.sessions().sessions
                if how == "park-restore":
                    ckpt = tmp_path / "t.ckpt"
                    assert c.checkpoint(info.id, str(ckpt), release=True).state == "parked"
                    prog.stdin.write("go\n")
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
        assert prog.returncode == 0, out + err
        assert out.splitlines() == ["after copy=cudaSuccess ok=1"], out + err
        assert f"session {info.id}" in b.log_text()  # the second half ran on b


def test_driver_api_arrays(program, run_guest, link_flags) -> None:
    """cuArrayCreate/cuArray3DCreate and descriptors, byte-offset and 2D copies with arrays,
    the documented refusals, texture descriptor queries (programs/arrays_driver.cpp)."""
    r = run_guest(program("arrays_driver.cpp", *link_flags))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "desc w=10 h=6 fmt=2 ch=2 depth=0 flags=0",
        "copies ok=1",
        "refused region=CUDA_ERROR_INVALID_VALUE lod=CUDA_ERROR_INVALID_VALUE "
        "span=CUDA_ERROR_INVALID_VALUE",
        "array3d cube=CUDA_ERROR_INVALID_VALUE channels=CUDA_ERROR_INVALID_VALUE size_ok=1",
        "mipmap size_ok=1 level4=1x1 past=CUDA_ERROR_INVALID_VALUE "
        "destroy_level=CUDA_ERROR_INVALID_HANDLE",
        "tex desc_ok=1 res_ok=1 view=CUDA_ERROR_NOT_SUPPORTED surf=CUDA_ERROR_INVALID_VALUE",
        "destroyed again tex=CUDA_ERROR_INVALID_HANDLE array=CUDA_ERROR_INVALID_HANDLE",
        "ok",
    ], r.stdout + r.stderr
