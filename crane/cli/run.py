"""``crane run`` and ``crane guest-lib``: run a program with the interposer as its libcuda.

``crane run [--daemon ADDR] -- CMD ARGS...`` puts the library first on LD_PRELOAD and its
folder first on LD_LIBRARY_PATH (so both a program linked against libcuda and cudart's
``dlopen("libcuda.so.1")`` find it), sets ``CRANE_DAEMON`` and replaces itself with the
program (its exit status is the program's). ``crane guest-lib`` prints the library's path, for
LD_PRELOAD or an ld.so configuration in a VM image.
"""

from __future__ import annotations

import argparse
import os
import sys

from crane.interposer import library_path

__all__ = ["cmd_guest_lib", "cmd_run", "guest_environment"]


def guest_environment(daemon: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a program needs to run through the interposer."""
    env = dict(os.environ if base is None else base)
    lib = library_path()
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != str(lib)]
    env["LD_PRELOAD"] = ":".join([str(lib), *preload])
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and p != str(lib.parent)]
    env["LD_LIBRARY_PATH"] = ":".join([str(lib.parent), *paths])
    if daemon:
        env["CRANE_DAEMON"] = daemon
    return env


def _require_library() -> str | None:
    lib = library_path()
    if not lib.exists():
        return (
            f"crane: the guest library is not built ({lib} is missing): "
            "run `python interposer/build_interposer.py` or scripts/setup.sh"
        )
    return None


def cmd_run(args: argparse.Namespace) -> int:
    cmd = [c for c in args.cmd if c != "--"] if args.cmd[:1] == ["--"] else list(args.cmd)
    if not cmd:
        print("crane run: no command given (crane run -- PROGRAM ARGS...)", file=sys.stderr)
        return 2
    problem = _require_library()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    env = guest_environment(getattr(args, "run_daemon", None) or args.daemon, None)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        print(f"crane run: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


def cmd_guest_lib(args: argparse.Namespace) -> int:
    problem = _require_library()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    print(library_path().parent if args.dir else library_path())
    return 0
