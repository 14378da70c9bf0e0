"""Start a craned in a child process and wait until it serves (demo, tests, benchmarks)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from crane.v1 import control_pb2, control_pb2_grpc
from crane.wire.channel import open_channel

__all__ = ["DaemonProcess"]


class DaemonProcess:
    """A craned listening on a unix socket in ``run_dir``."""

    def __init__(
        self,
        run_dir: Path | str,
        backends: list[str] | None = None,
        extra_listen: list[str] | None = None,
        log_path: Path | str | None = None,
        prespawn: int = 1,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        checkpoint_dir: Path | str | None = None,
        program: list[str] | None = None,
    ) -> None:
        """``extra_args``: more craned flags (``--parked-ttl 2``, ...); ``env``: the daemon's
        environment (default: this process's), which its workers inherit;
        ``checkpoint_dir``: where it writes and reads checkpoints (default: its run
        directory's ``checkpoints``); ``program``: the craned to run (default: this
        interpreter's ``-m crane.craned.main``; another installation's ``craned``)."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.address = f"unix://{self.run_dir / 'crane.sock'}"
        self.log_path = Path(log_path) if log_path else self.run_dir / "craned.log"
        cmd = [
            *(program or [sys.executable, "-m", "crane.craned.main"]),
            "--listen",
            self.address,
            "--run-dir",
            str(self.run_dir),
            "--prespawn",
            str(prespawn),
        ]
        for extra in extra_listen or []:
            cmd += ["--listen", extra]
        for b in backends or ["sim:h100-80gb"]:
            cmd += ["--backend", b]
        if checkpoint_dir is not None:
            cmd += ["--checkpoint-dir", str(checkpoint_dir)]
        cmd += extra_args or []
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with open_channel(self.address) as ch:
            stub = control_pb2_grpc.ControlStub(ch)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"craned exited with {self.proc.returncode}: {self.log_text()[-2000:]}"
                    )
                try:
                    stub.ListDevices(control_pb2.ListDevicesRequest(), timeout=1)
                    return
                except grpc.RpcError:
                    time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"craned did not become ready in {timeout} s")

    def tcp_address(self, timeout: float = 10.0) -> str:
        """The ``tcp://`` address it bound for an ``extra_listen`` of ``tcp://HOST:0`` (the
        port the system chose), from the line it logs just after it starts serving."""
        deadline = time.monotonic() + timeout
        while not (m := re.search(r"listening on (tcp://[^\s]+:\d+)", self.log_text())):
            if time.monotonic() > deadline:
                raise TimeoutError("the daemon does not listen on TCP")
            time.sleep(0.02)
        return m.group(1)

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
