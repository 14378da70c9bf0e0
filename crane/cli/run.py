"""``crane run`` and ``crane guest-lib``: run a program with the interposer as its libcuda.

``crane run [--daemon ADDR] -- CMD ARGS...`` puts the library first on LD_PRELOAD and its
folder first on LD_LIBRARY_PATH (so both a program linked against libcuda and cudart's
``dlopen("libcuda.so.1")`` find it), sets ``CRANE_DAEMON`` and replaces itself with the
program (its exit status is the program's). ``crane guest-lib`` prints the library's path, for
LD_PRELOAD or an ld.so configuration in a VM image.

When the program is a Python interpreter other than Crane's own (``python app.py``, ``python -m
mod``, a script whose shebang names one, as torch's or CuPy's users run them from their own
venv), the library runs inside that interpreter: both commands then use the one built for it
(crane/cli/guest_runtime.py prepares it on first use and caches it).

On a daemon whose devices are all simulated, ``crane run`` also sets what makes frameworks
hand the device PTX, which the simulated GPU runs, instead of SASS, which it refuses (unless the
user set them): CuPy's ``CUPY_COMPILE_WITH_PTX=1`` (NVRTC output as PTX) and an empty
``CUPY_ACCELERATORS`` (its CUB and cuTENSOR routines are SASS in the wheel). Users of
LD_PRELOAD directly set them themselves (README says so).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from crane.cli import guest_runtime
from crane.interposer import library_path

__all__ = [
    "SIMULATED_DEVICE_DEFAULTS",
    "cmd_guest_lib",
    "cmd_run",
    "guest_environment",
    "library_for",
    "simulated_defaults",
]


def guest_environment(
    daemon: str | None, base: dict[str, str] | None = None, lib: Path | None = None
) -> dict[str, str]:
    """The environment a program needs to run through the interposer (``lib``: the guest
    library to use, Crane's own by default)."""
    env = dict(os.environ if base is None else base)
    lib = lib or library_path()
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != str(lib)]
    env["LD_PRELOAD"] = ":".join([str(lib), *preload])
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and p != str(lib.parent)]
    env["LD_LIBRARY_PATH"] = ":".join([str(lib.parent), *paths])
    if daemon:
        env["CRANE_DAEMON"] = daemon
    return env


#: Framework settings for a simulated device (see the module docstring).
SIMULATED_DEVICE_DEFAULTS = {"CUPY_COMPILE_WITH_PTX": "1", "CUPY_ACCELERATORS": ""}


def simulated_defaults(env: dict[str, str], backends: list[str]) -> dict[str, str]:
    """``env`` with :data:`SIMULATED_DEVICE_DEFAULTS` added where unset, when every device the
    daemon offers is simulated (``backends``: each device's backend, "sim" or "cuda")."""
    if not backends or any(b != "sim" for b in backends):
        return env
    return {**SIMULATED_DEVICE_DEFAULTS, **env}


def _daemon_backends(daemon: str | None) -> list[str]:
    """The daemon's devices' backends; none when it cannot be asked (the program then reports
    the daemon's absence itself)."""
    import grpc

    from crane.cli.control_client import ControlClient

    try:
        with ControlClient(daemon, timeout=3.0) as c:
            return [d.backend for d in c.devices().devices]
    except (grpc.RpcError, OSError, ValueError):
        return []


def _require_library() -> str | None:
    lib = library_path()
    if not lib.exists():
        return (
            f"crane: the guest library is not built ({lib} is missing): "
            "run `crane guest-lib --build` (needs a C compiler and a shared libpython)"
        )
    return None


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def library_for(python: str | None) -> Path:
    """The guest library for a program running in ``python`` (None: not a Python program):
    Crane's own, or one built for that interpreter (see crane/cli/guest_runtime.py)."""
    if python is None:
        return library_path()
    interp = guest_runtime.describe(python)
    if guest_runtime.is_own(interp):
        return library_path()
    return guest_runtime.prepare(interp, log=_log)


def cmd_run(args: argparse.Namespace) -> int:
    cmd = [c for c in args.cmd if c != "--"] if args.cmd[:1] == ["--"] else list(args.cmd)
    if not cmd:
        print("crane run: no command given (crane run -- PROGRAM ARGS...)", file=sys.stderr)
        return 2
    problem = _require_library()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    try:
        lib = library_for(guest_runtime.python_of(cmd, os.environ.get("PATH")))
    except guest_runtime.GuestRuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    daemon = args.daemon
    env = guest_environment(daemon, None, lib)
    env = simulated_defaults(env, _daemon_backends(env.get("CRANE_DAEMON")))
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        print(f"crane run: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


def cmd_guest_lib(args: argparse.Namespace) -> int:
    python = getattr(args, "python", None)
    if getattr(args, "build", False) and not python:
        try:
            guest_runtime.build_own()
        except guest_runtime.GuestRuntimeError as e:
            print(e, file=sys.stderr)
            return 1
    problem = None if python else _require_library()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    try:
        lib = library_for(python)
    except guest_runtime.GuestRuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    print(lib.parent if args.dir else lib)
    return 0
