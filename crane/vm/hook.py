"""``crane libvirt-hook``: libvirt's qemu hook, so that a plain ``virsh migrate --live`` of a Crane
guest moves its GPU state too.

libvirt runs ``/etc/libvirt/hooks/qemu.d/*`` as ``HOOK DOMAIN OPERATION SUB-OP EXTRA`` with the
domain XML on stdin, synchronously; a hook must never call back into libvirt (that deadlocks the
daemon that is waiting for it). What this one does, per call:

* ``migrate begin`` (on the destination, before the incoming QEMU exists; a filter: what it prints
  replaces the XML, nothing keeps it; a non-zero exit vetoes the migration with its stderr):
  read the Crane metadata from the XML (the source daemon); have this host's daemon attach the
  domain (its socket must exist before QEMU's guest forward dials it); start a held, gated
  migration of each of the domain's sessions from the source daemon to this one, and wait until
  each passed its pre-flight and pre-copied (the VM migration waits for it, so the GPU state's
  bulk moves before the VM's). Any refusal: veto, with one line naming the reason. Then print the
  XML retargeted at this daemon's socket, if that differs.
* ``release end`` (the domain's QEMU is gone from this host, moved or shut down): this host's
  daemon detaches the domain (no new connection from it can come).

What needs libvirt (the VM pausing for its switchover, arriving, failing) is followed by
``crane libvirt-watch`` (:mod:`crane.vm.watch`), which gives the held migrations their Stop,
Commit or Abort.
"""

from __future__ import annotations

import contextlib
import shlex
import stat
import sys
import time
from pathlib import Path
from typing import TextIO

import grpc

from crane.vm.domain import crane_meta, retarget
from crane.vm.gpu import GpuMove, domain_sessions
from crane.vm.migrate import attach_domain, detach_domain

__all__ = ["HookConfig", "hook_script", "install", "run_hook"]

#: Longest the destination's ``migrate begin`` waits for the sessions' pre-flight and pre-copy.
PRECOPY_WAIT_S = 120.0
#: How long a held migration started by the hook waits for its decisions.
HOLD_TIMEOUT_S = 120.0


class HookConfig:
    """This host's daemon: ``daemon`` (control address, operator access) and ``peer`` (the
    address other daemons reach it at for migrations; default ``daemon``)."""

    def __init__(self, daemon: str, peer: str = "", hold_timeout_s: float = HOLD_TIMEOUT_S):
        self.daemon = daemon
        self.peer = peer or daemon
        self.hold_timeout_s = hold_timeout_s


def hook_script(cfg: HookConfig, python: str = sys.executable) -> str:
    args = [python, "-m", "crane.cli.main", "libvirt-hook", "--daemon", cfg.daemon]
    if cfg.peer != cfg.daemon:
        args += ["--peer-address", cfg.peer]
    return (
        "#!/bin/sh\n# Crane: moves a Crane guest's GPU state with its VM (crane libvirt-hook)\n"
        f'exec {" ".join(shlex.quote(a) for a in args)} "$@"\n'
    )


def install(cfg: HookConfig, hooks_dir: Path) -> Path:
    """Write ``hooks_dir/qemu.d/crane`` (libvirtd picks it up at its next start)."""
    path = hooks_dir / "qemu.d" / "crane"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".crane.tmp")
    tmp.write_text(hook_script(cfg))
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    tmp.replace(path)
    return path


def run_hook(
    cfg: HookConfig, argv: list[str], stdin: TextIO, stdout: TextIO, stderr: TextIO
) -> int:
    if len(argv) < 3:
        print("crane libvirt-hook: expected DOMAIN OPERATION SUB-OP [EXTRA]", file=stderr)
        return 2
    domain, op, sub = argv[0], argv[1], argv[2]
    if op == "migrate" and sub == "begin":
        return _migrate_begin(cfg, domain, stdin.read(), stdout, stderr)
    if op == "release" and sub == "end":
        stdin.read()
        # not a Crane guest here, or the daemon is down: nothing to stop accepting then
        with contextlib.suppress(grpc.RpcError):
            detach_domain(cfg.daemon, domain)
    return 0


def _migrate_begin(cfg: HookConfig, domain: str, xml: str, stdout: TextIO, stderr: TextIO) -> int:
    meta = crane_meta(xml)
    if meta is None:
        return 0  # not a Crane guest: nothing to do, the XML stays
    try:
        path, already = attach_domain(cfg.daemon, domain)
    except grpc.RpcError as e:
        print(
            f"crane: this host's daemon {cfg.daemon} cannot take domain {domain}: "
            f"{e.code().name}: {e.details()}",
            file=stderr,
        )
        return 1
    try:
        why = _precopy(cfg, domain, meta.daemon)
    except grpc.RpcError as e:
        why = f"the source daemon {meta.daemon} did not answer: {e.code().name}: {e.details()}"
    if why:
        if not already:
            with contextlib.suppress(grpc.RpcError):
                detach_domain(cfg.daemon, domain)
        print(f"crane: domain {domain} cannot move its GPU state here: {why}", file=stderr)
        return 1
    if path != meta.socket or meta.daemon != cfg.peer:
        stdout.write(retarget(xml, path, cfg.peer))
    return 0


def _precopy(cfg: HookConfig, domain: str, source: str) -> str:
    """Start a held, gated migration of each session of ``domain`` not already moving (``crane
    migrate DOMAIN`` starts its own); "" once all pre-copied, else every reason."""
    moves = [
        GpuMove(source, s.id, cfg.peer, cfg.hold_timeout_s)
        for s in domain_sessions(source, domain)
        if s.state != "migrating"
    ]
    deadline = time.monotonic() + PRECOPY_WAIT_S
    for m in moves:
        m.ready(max(deadline - time.monotonic(), 0.0))
    bad = [m for m in moves if m.phase != "precopy"]
    if not bad:
        return ""
    for m in moves:
        if not m.over:
            m.decide("Abort")
    return "; ".join(f"session {m.sid}: {m.error or 'pre-copy did not converge'}" for m in bad)
