"""What is left of a daemon's workers: the processes themselves and the daemon's records."""

from __future__ import annotations

from pathlib import Path

from crane.host.lifeline import alive

__all__ = ["recorded_workers", "worker_processes"]


def worker_processes(daemon_pid: int) -> list[int]:
    """Live worker processes started by ``daemon_pid`` (``crane.craned.worker --parent PID``),
    found in /proc whether or not the daemon still records them."""
    want = ["-m", "crane.craned.worker"]
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args[1:3] != want or "--parent" not in args:
            continue
        parent = args[args.index("--parent") + 1]
        if parent == str(daemon_pid) and alive(int(proc.name)):
            out.append(int(proc.name))
    return out


def recorded_workers(run_dir: Path) -> list[int]:
    """Live workers listed in ``<run_dir>/workers``."""
    folder = run_dir / "workers"
    return [int(p.name) for p in folder.iterdir() if p.name.isdigit() and alive(int(p.name))]
