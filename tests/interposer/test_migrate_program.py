"""A real nvcc-built CUDA program, run through the interposer, moved between daemons of two GPU
models mid-run (migrated live, the path ``crane demo`` shows; or parked to a file and restored);
its result must equal an unmoved run and the same computation done by NumPy. The GPU suite's
``iterate`` program, whose kernels write only through pointers stored in device memory, is
migrated live too: its output must equal an unmoved run's, bit for bit."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from crane.cli.control_client import ControlClient
from crane.cli.demo_migrate import ITERATIVE_PROGRAM, demo_migration, reference_checksum
from crane.cli.main import main as crane_main
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from tests.interposer.conftest import ROOT, Runner

#: tests/gpu/programs/iterate.cu: ``step`` reads and writes its two buffers only through a table
#: of their pointers kept in device memory (its one pointer parameter is the table), and ``swap``
#: exchanges the two table entries every step.
ITERATE = ROOT / "tests" / "gpu" / "programs" / "iterate.cu"
#: steps, pause per step (us), ballast MiB: about 2 s of steps on the simulator, ample time to
#: move it after its first progress line, and little memory to copy
ITERATE_ARGS = ("400", "2000", "1")


def test_reference_is_the_unmigrated_computation() -> None:
    assert reference_checksum() == reference_checksum()  # deterministic, pure NumPy
    assert reference_checksum() != 0


def test_program_migrated_mid_run_finishes_correctly(tmp_path: Path, nvcc: str) -> None:
    lines: list[str] = []
    with DaemonProcess(tmp_path / "run-a", ["sim:h100-80gb"]) as source:
        code = demo_migration(source.address, tmp_path, nvcc, lines.append)
        log = source.log_text()
    text = "\n".join(lines)
    assert code == 0, text
    assert "migrated to" in text and "matches NumPy" in text
    assert "'running'" in text  # the session was live on the destination after the move
    # down to the A100: refused by attribute until the operator accepts the lower limits
    assert "(H200 -> A100): refused:" in text and "told 232448, offered 166912" in text, text
    assert re.search(r"--accept-lower-limits: session \w+ migrated to", text), text
    assert "moved to" in log  # the source released it and redirects the guest


def _first_line(prog: subprocess.Popen[str], timeout: float = 60) -> str:
    """The program's first line of output, without hanging the test if it never comes."""
    assert prog.stdout is not None
    ready, _, _ = select.select([prog.stdout], [], [], timeout)
    assert ready, "the program printed nothing"
    return prog.stdout.readline()


def test_program_parked_mid_run_resumes_on_another_model(
    tmp_path: Path, run_guest: Runner, cuda_build: Callable[..., Path]
) -> None:
    """``crane checkpoint --release`` of a real program (static cudart, through the interposer)
    mid-run, ``crane restore`` on another daemon of another model (A100 to H100: the PTX is
    JIT-compiled for sm_90 there): the program, which only waited, prints exactly what an
    unmoved run prints."""
    exe = cuda_build(ITERATIVE_PROGRAM, suffix=".exe")
    unmoved = run_guest(exe)
    assert unmoved.returncode == 0, unmoved.stderr
    assert f"checksum {reference_checksum()} (no error)" in unmoved.stdout
    ckpt = tmp_path / "prog.ckpt"
    with (
        DaemonProcess(tmp_path / "a", ["sim:a100-40gb"], checkpoint_dir=tmp_path) as a,
        DaemonProcess(tmp_path / "b", ["sim:h100-80gb"], checkpoint_dir=tmp_path) as b,
    ):
        env = {k: v for k, v in os.environ.items() if k != "CRANE_TRACE"}
        env["CRANE_DAEMON_ALTERNATES"] = b.address  # where the guest looks once it is parked
        cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", a.address, "--"]
        prog = subprocess.Popen(
            [*cmd, str(exe)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            first = _first_line(prog)
            assert first == "step 0\n"
            with ControlClient(a.address) as c:
                (info,) = c.sessions().sessions
            argv = ["--daemon", a.address, "checkpoint", "--session", info.id, "-o", str(ckpt)]
            assert crane_main([*argv, "--release"]) == 0
            with ControlClient(a.address) as c:
                (parked,) = c.sessions().sessions
                assert parked.state == "parked"
                assert all(d.used_mem == 0 for d in c.devices().devices)
            assert prog.poll() is None  # parked mid-run: the program waits at its next call
            assert crane_main(["restore", str(ckpt), "--daemon", b.address]) == 0
            out, err = prog.communicate(timeout=120)
        finally:
            if prog.poll() is None:
                prog.kill()
                prog.communicate()
        assert prog.returncode == 0, err
        assert first + out == unmoved.stdout
        with ControlClient(b.address) as c:  # the program ended: its session with it
            deadline = time.monotonic() + 10
            while c.sessions().sessions and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not c.sessions().sessions
            assert all(d.used_mem == 0 for d in c.devices().devices)


def test_pointer_table_program_migrated_live_is_bit_identical(
    tmp_path: Path, run_guest: Runner, cuda_build: Callable[..., Path]
) -> None:
    """``crane migrate`` of ``iterate`` (static cudart, PTX JIT-compiled for each model) from an
    A100 to an H100 after its first progress line. Its kernels reach the two state buffers only
    through the pointer table, so pre-copy must learn the table (from its upload) to know that
    a launch given the table writes the buffers: a step run after round 0 was otherwise never
    copied again, and the program resumed on stale state."""
    exe = cuda_build(ITERATE.read_text(), suffix=".exe")
    unmoved = run_guest(exe, *ITERATE_ARGS)
    assert unmoved.returncode == 0, unmoved.stderr
    assert f"result steps_done={ITERATE_ARGS[0]} " in unmoved.stdout
    assert "err=cudaSuccess" in unmoved.stdout
    with (
        DaemonProcess(tmp_path / "a", ["sim:a100-40gb"], checkpoint_dir=tmp_path) as a,
        DaemonProcess(tmp_path / "b", ["sim:h100-80gb"], checkpoint_dir=tmp_path) as b,
    ):
        env = {k: v for k, v in os.environ.items() if k != "CRANE_TRACE"}
        cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", a.address, "--"]
        prog = subprocess.Popen(
            [*cmd, str(exe), *ITERATE_ARGS],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            first = _first_line(prog)
            assert first == "step 0\n"
            with ControlClient(a.address) as c:
                (info,) = c.sessions().sessions
            last = migrate(a.address, info.id, b.address)[-1]
            assert last.phase == "done", last.error
            assert last.round >= 1  # round 0 ran while the program did, then the stopped round
            assert prog.poll() is None, "the program ended before the move finished"
            with ControlClient(b.address) as c:
                assert [s.id for s in c.sessions().sessions] == [info.id]  # B holds it now
            out, err = prog.communicate(timeout=120)
        finally:
            if prog.poll() is None:
                prog.kill()
                prog.communicate()
        assert prog.returncode == 0, err
        assert first + out == unmoved.stdout, "the migrated program's output differs from unmoved"
