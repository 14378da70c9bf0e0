"""Running a framework script (``hosts/*_guest.py``) with the client venv's Python under
``crane run``, and reading the lines its checks print (``hosts/guest_checks.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.interposer.conftest import Clients

HOSTS = Path(__file__).parent / "hosts"


@dataclass
class ScriptRun:
    """One run of a script: exit status, output, wall time, and each check's outcome
    (``"ok"`` or the failure's reason) in the order they ran."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    checks: dict[str, str] = field(default_factory=dict)
    #: seconds per check, and the script's own import time of the framework
    seconds: dict[str, float] = field(default_factory=dict)

    def describe(self, tail: int = 3000) -> str:
        return (
            f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr[-tail:]}"
        )

    def outcome(self, name: str) -> str:
        return self.checks.get(name, f"not reached\n{self.describe()}")


def run_script(
    clients: Clients,
    daemon: str,
    script: str,
    env: dict[str, str] | None = None,
    timeout: float = 240,
) -> ScriptRun:
    """``crane run --daemon DAEMON -- CLIENT_PYTHON hosts/SCRIPT``."""
    full = {k: v for k, v in os.environ.items() if k != "CRANE_TRACE"}
    full.update(env or {})
    cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", daemon, "--"]
    t = time.perf_counter()
    p = subprocess.run(
        [*cmd, str(clients.python), str(HOSTS / script)],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    run = ScriptRun(p.returncode, p.stdout, p.stderr, time.perf_counter() - t)
    for line in p.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "ok":
            name, _, secs = rest.partition(" ")
            run.checks[name] = "ok"
            run.seconds[name] = float(secs)
        elif word == "FAIL":
            name, _, why = rest.partition(": ")
            run.checks[name] = why
        elif word == "import":
            wall, _, cpu = rest.partition(" ")
            run.seconds["import"] = float(wall)
            if cpu:
                run.seconds["import_cpu"] = float(cpu)
    return run
