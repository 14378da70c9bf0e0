"""craned's logs against a real daemon (crane.host.logs): with ``log_format = "json"`` every
line craned and its workers write is one JSON object, and every line about a session carries
its session id, tenant and (a VM guest's) domain as fields; in text the same context is a
``[s=... t=... d=...]`` prefix. The workload: an nvcc-built CUDA program under ``crane run``
(its own worker) and a domain socket guest that is checkpointed, parked and restored through
the CLI (``crane checkpoint --release``, ``crane restore``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from tests.integration.vmfwd import Forward

PROGRAMS = Path(__file__).resolve().parents[1] / "interposer" / "programs"
PTX_ONLY = ("-gencode", "arch=compute_80,code=compute_80")
_OPENED = re.compile(r"session (\w{12}) opened")


def _crane(d: DaemonProcess, *args: str) -> str:
    cmd = [sys.executable, "-m", "crane.cli.main", *args, "--daemon", d.address]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{args}: {p.stderr}"
    return p.stdout


def _run_vadd(d: DaemonProcess, exe: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CRANE_TRACE"}
    p = subprocess.run(
        [sys.executable, "-m", "crane.cli.main", "run", "--daemon", d.address, "--", str(exe)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert p.returncode == 0 and "sum=1498500.0" in p.stdout, p.stdout + p.stderr


def _vadd(cuda_build: Callable[..., Path]) -> Path:
    return cuda_build((PROGRAMS / "vadd.cu").read_text(), f"-I{PROGRAMS}", *PTX_ONLY, suffix=".exe")


def _about(lines: list[dict[str, Any]], sid: str) -> list[dict[str, Any]]:
    """Lines about session ``sid``: those that name it in their message or in their field."""
    return [x for x in lines if sid in x["msg"] or x.get("session") == sid]


def test_json_lines_carry_session_tenant_and_domain(
    tmp_path: Path, cuda_build: Callable[..., Path]
) -> None:
    exe = _vadd(cuda_build)
    config = tmp_path / "craned.toml"
    config.write_text(
        'log_format = "json"\n'
        f"[tenants.alice]\nuids = [{os.getuid()}]\noperator = true\n"
        '[domains.vm1]\ntenant = "alice"\n'
    )
    d = DaemonProcess(
        tmp_path / "run",
        ["sim:h100-80gb"],
        extra_args=["--config", str(config)],
        checkpoint_dir=tmp_path,
    )
    try:
        _run_vadd(d, exe)  # a host guest: its own worker, tenant alice by its uid
        fwd = Forward(d.run_dir / "domains" / "vm1.sock")
        try:
            with GuestSession(fwd.address, client="vm1-guest") as g:
                vm_sid = g.session_id
                x = g.mem_alloc(1 << 16)
                g.memcpy_htod(x, b"\x05" * 64)
                _crane(d, "checkpoint", "--session", vm_sid, "-o", "vm1.ckpt", "--release")
                _crane(d, "restore", "vm1.ckpt")
                assert g.memcpy_dtoh(x, 64) == b"\x05" * 64  # resumed after the restore
                assert vm_sid in _crane(d, "ps")  # a control call about no one session
            with ControlClient(d.address) as c:  # a call about a domain, not a session
                c.attach_domain("vm2")
        finally:
            fwd.stop()
    finally:
        d.stop()
    text = d.log_text()
    lines = []
    for i, raw in enumerate(text.splitlines()):
        try:
            lines.append(json.loads(raw))
        except ValueError:
            raise AssertionError(f"line {i + 1} of craned's output is not JSON: {raw!r}") from None
    assert lines and all({"ts", "level", "logger", "msg", "proc", "pid"} <= x.keys() for x in lines)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", x["ts"]) for x in lines)
    opened = [m.group(1) for x in lines if (m := _OPENED.search(x["msg"]))]
    assert vm_sid in opened and len(opened) == 2, opened
    (host_sid,) = [s for s in opened if s != vm_sid]

    host = _about(lines, host_sid)
    assert all(x.get("session") == host_sid and x.get("tenant") == "alice" for x in host), host
    assert not any("domain" in x for x in host)
    assert {"craned", "worker"} <= {x["proc"] for x in host}, host  # its worker's lines too
    assert any("closed" in x["msg"] for x in host)

    vm = _about(lines, vm_sid)
    want = {"session": vm_sid, "tenant": "alice", "domain": "vm1"}
    bad = [x for x in vm if {k: x.get(k) for k in want} != want]
    assert not bad, bad
    msgs = " | ".join(x["msg"] for x in vm if x["proc"] == "craned")
    assert "parked to" in msgs and "restored" in msgs, msgs
    workers = {x["pid"] for x in vm if x["proc"] == "worker"}
    assert len(workers) >= 2, vm  # the first worker and the one the restore started
    attached = [x for x in lines if "domain vm2 attached" in x["msg"]]
    assert attached and all(x.get("domain") == "vm2" and "session" not in x for x in attached)
    # nothing else claims to be about these sessions
    others = {x.get("session") for x in lines} - {None, host_sid, vm_sid}
    assert not others, others


def test_text_lines_have_the_context_prefix(
    tmp_path: Path, cuda_build: Callable[..., Path]
) -> None:
    exe = _vadd(cuda_build)
    d = DaemonProcess(tmp_path / "run", ["sim:h100-80gb"], extra_args=["--log-format", "text"])
    try:
        _run_vadd(d, exe)
    finally:
        d.stop()
    text = d.log_text()
    (sid,) = _OPENED.findall(text)
    tenant = f"uid:{os.getuid()}"
    prefix = f"[s={sid} t={tenant}] "
    about = [line for line in text.splitlines() if sid in line]
    assert about and all(prefix in line for line in about), about
    assert any(f" craned INFO {prefix}session {sid} opened" in line for line in about)
    assert any(f" craned[worker] INFO {prefix}" in line for line in about), about
    assert not any(line.lstrip().startswith("{") for line in text.splitlines())


def test_a_migration_is_logged_with_its_session_on_both_daemons(tmp_path: Path) -> None:
    """The source's outcome comes from its migration watcher thread, the destination's from
    the Peer transfer: both name the session and its tenant in the prefix."""
    a = DaemonProcess(tmp_path / "a", ["sim:h100-80gb"], checkpoint_dir=tmp_path / "ck")
    b = DaemonProcess(tmp_path / "b", ["sim:h100-80gb"], checkpoint_dir=tmp_path / "ck")
    try:
        with GuestSession(a.address, client="mover", alternates=[b.address]) as g:
            x = g.mem_alloc(4096)
            g.memcpy_htod(x, b"\x09" * 4096)
            _crane(a, "migrate", "--session", g.session_id, "--to", b.address)
            assert g.memcpy_dtoh(x, 16) == b"\x09" * 16  # the guest followed
            sid = g.session_id
    finally:
        a.stop()
        b.stop()
    prefix = f"[s={sid} t=uid:{os.getuid()}] "
    for d, what in ((a, f"session {sid} migrated to"), (b, f"session {sid} migrated in")):
        lines = [x for x in d.log_text().splitlines() if what in x]
        assert lines and all(prefix in x for x in lines), d.log_text()[-3000:]
    worker = [x for x in a.log_text().splitlines() if "craned[worker]" in x and "migrated" in x]
    assert worker and all(prefix in x for x in worker)
