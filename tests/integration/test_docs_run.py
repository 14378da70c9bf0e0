"""Docs that run: every code block of README.md and the operator docs (docs/operators-*.md)
is exercised against real daemons, so an example that stops working fails CI. What each kind
of block gets, the substitution table for host-specific values and the lines not run (each
with its reason) are in tests/integration/docs_blocks.py; README's Python blocks run in
test_readme.py.

Levels, as of this writing: README's shell blocks run (but ``make demo``/``make test``, CI
itself, and the GPU suite's commands); its TOML block loads with craned's config loader;
its output example is shown only. docs/operators-vm.md: the craned line and ``crane
libvirt-hook install`` run, the Python block runs against a daemon (attach_domain, the domain
XML), the qemu.conf setting is checked against the vm lab's; ``crane libvirt-watch`` and
``crane migrate DOMAIN`` are parsed only (they need libvirt hosts; the vm lab runs them),
``systemctl`` and ``virsh migrate`` are not run (reasons in NOT_RUN).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from crane.cli.main import build_parser
from crane.craned.config import load_config
from crane.craned.launcher import DaemonProcess
from crane.craned.main import parse_args as craned_args
from tests.integration import docs_blocks as db
from tests.integration.pki import Pki
from tests.vm.libvirt_lab import QEMU_CONF

BLOCKS = db.all_blocks()
SHELL_BLOCKS = [b for b in BLOCKS if b.lang in db.SHELL]
PROGRAMS = db.ROOT / "tests" / "interposer" / "programs"
BIN = Path(sys.executable).parent  # crane and craned of this environment
_SOCK = re.compile(r"unix:/*(\{run\}/[\w.-]+\.sock)")


# ---- every block has a handler, and the tables are all used ----------------------------------
def test_every_block_has_a_handler() -> None:
    assert SHELL_BLOCKS and any(b.doc.startswith("docs/") for b in BLOCKS)
    unknown = [f"{b.name}: ```{b.lang}" for b in BLOCKS if b.lang not in db.LANGUAGES]
    assert not unknown, f"blocks no test exercises (give them a known language): {unknown}"
    for doc in db.docs():
        lines = db.indented_code(doc)
        assert not lines, f"{doc.name}: indented code at lines {lines}; fence it (```sh ...)"


def test_the_tables_name_only_what_the_docs_say() -> None:
    """An allowlist entry or substitution no doc uses any more is dropped, not kept."""
    text = "\n".join(b.text for b in BLOCKS)
    words = [db.normalized(c) for b in SHELL_BLOCKS for c in db.commands(b)]
    for table in (db.NOT_RUN, db.PARSE_ONLY):
        for key in table:
            assert any(w == key or w.startswith(key + " ") for w in words), key
    for written, _, _ in db.SUBSTITUTIONS:
        assert written in text, written
    for name in db.FILES:
        assert name in text, name


def test_the_extraction_and_the_levels() -> None:
    b = db.Block("x.md", 1, "sh", "make demo   # c\ncrane ps \\\n  --json\n# note\ncraned -h\n")
    assert db.commands(b) == ["make demo   # c", "crane ps    --json", "craned -h"]
    assert [s.kind for s in db.plan(b)] == ["skip", "run", "daemon"]
    c = db.Block("x.md", 1, "console", "$ crane ps\nSESSION TENANT\n")
    assert db.commands(c) == ["crane ps"]
    assert db.substitute("unix:///run/crane/x.sock") == "unix://{run}/x.sock"


# ---- TOML, qemu.conf ---------------------------------------------------------------------------
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "toml"], ids=lambda b: b.name)
def test_toml_block_loads(block: db.Block, tmp_path: Path) -> None:
    f = tmp_path / "craned.toml"
    f.write_text(block.text)
    cfg = load_config(f, {})
    assert cfg is not None


def test_the_config_file_readme_points_to_loads() -> None:
    """README sends operators to packaging/craned.toml for the tenants' tables."""
    assert "packaging/craned.toml" in (db.ROOT / "README.md").read_text()
    cfg = load_config(db.ROOT / "packaging" / "craned.toml", {})
    assert cfg.log_format in ("text", "json")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "conf"], ids=lambda b: b.name)
def test_qemu_conf_block_is_what_the_vm_lab_runs(block: db.Block) -> None:
    lab = {x.strip() for x in QEMU_CONF.splitlines()}
    for line in block.text.splitlines():
        if line.strip() and not line.startswith("#"):
            assert line.strip() in lab, f"{block.name}: {line!r} is not in the lab's qemu.conf"


# ---- the running ones --------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stage:
    """What a block runs against: a short work folder (unix socket paths are limited), its run
    directory, certificates, the daemons the block's commands name but do not start, and a
    live session when the block names one."""

    def __init__(self, cuda_build: Callable[[], Callable[..., Path]]) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="crdoc", dir="/tmp"))
        self.run = self.work / "run"
        self.run.mkdir()
        pki = Pki(self.work)  # ca.pem; craned.pem/.key, host-a.pem/.key, alice.pem/.key
        pki.issue("craned", "127.0.0.1", "localhost")
        pki.issue("host-a", "127.0.0.1", "localhost")
        pki.issue("alice")
        self.values = {
            "{run}": str(self.run),
            "{work}": str(self.work),
            "{port}": str(_free_port()),
            "{python}": sys.executable,
            "{session}": "$CRANE_DOC_SESSION",
        }
        self._cuda_build = cuda_build
        for name, text in db.FILES.items():
            (self.work / name).write_text(self.fill(text))
        self.daemons: list[DaemonProcess] = []

    def fill(self, text: str) -> str:
        if "{exe}" in text and "{exe}" not in self.values:
            build = self._cuda_build()
            exe = build(
                (PROGRAMS / "vadd.cu").read_text(),
                "-gencode",
                "arch=compute_80,code=compute_80",
                suffix=".exe",
            )
            self.values["{exe}"] = str(exe)
        for k, v in self.values.items():
            text = text.replace(k, v)
        return text

    @property
    def address(self) -> str:
        """$CRANE_DAEMON: the host's daemon (/run/crane/crane.sock, substituted)."""
        return f"unix://{self.run}/crane.sock"

    def serve(self, sock: str) -> None:
        """A daemon listening on ``sock`` ({run}/NAME.sock), a simulated A100 for names that
        say a100 and an H100 otherwise; all share one checkpoint directory."""
        name = Path(sock).stem
        backend = "sim:a100-40gb" if "a100" in name else "sim:h100-80gb"
        self.daemons.append(
            DaemonProcess(
                self.work / f"d-{name}",
                [backend],
                extra_listen=[f"unix://{self.fill(sock)}"],
                checkpoint_dir=self.work / "checkpoints",
                prespawn=0,
            )
        )

    def session_lines(self) -> list[str]:
        """Shell lines that open a session on $CRANE_DAEMON (some memory in it), held by a
        background guest until the stage ends it, its id in $CRANE_DOC_SESSION. Opened where
        the block first names it, so a daemon the block itself starts there serves it."""
        code = (
            "import time\nfrom crane.guest import GuestSession\n"
            f"s = GuestSession({self.address!r}, client='docs')\n"
            "x = s.mem_alloc(1 << 20)\ns.memcpy_htod(x, b'\\x01' * 4096)\n"
            "print(s.session_id, flush=True)\ntime.sleep(3600)\n"
        )
        out = self.work / "guest.out"
        return [
            f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} >{out} 2>{out}.err &",
            f"echo $! >>{self.work}/pids",
            f"for _ in $(seq 600); do [[ -s {out} ]] && break; sleep 0.1; done",
            f"CRANE_DOC_SESSION=$(head -n1 {out})",
            '[[ $CRANE_DOC_SESSION =~ ^[0-9a-z]{12}$ ]] || { echo "no session" >&2; exit 1; }',
        ]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "CRANE_TRACE"}
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        env["CRANE_DAEMON"] = self.address
        return env

    def close(self) -> None:
        for pid in _pids(self.work / "pids"):
            _end(pid)
        for d in self.daemons:
            d.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _end(pid: int) -> None:
    """End a craned the block started (in the background of its shell, so not our child)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or "zombie" in _state(pid):
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return ""


@pytest.fixture
def stage(request: pytest.FixtureRequest) -> Iterator[Stage]:
    s = Stage(lambda: request.getfixturevalue("cuda_build"))
    try:
        yield s
    finally:
        s.close()


_WAIT = (
    "import sys, time, grpc\n"
    "from crane.v1 import control_pb2, control_pb2_grpc\n"
    "from crane.wire.channel import open_channel\n"
    "end = time.monotonic() + 60\n"
    "with open_channel(sys.argv[1]) as ch:\n"
    "    while True:\n"
    "        try:\n"
    "            control_pb2_grpc.ControlStub(ch).ListDevices(\n"
    "                control_pb2.ListDevicesRequest(), timeout=1)\n"
    "            break\n"
    "        except grpc.RpcError:\n"
    "            if time.monotonic() > end: sys.exit('craned did not serve in 60 s')\n"
    "            time.sleep(0.1)\n"
)


def _daemon_lines(stage: Stage, command: str, n: int, served: set[str]) -> tuple[list[str], str]:
    """A documented ``craned`` line started in the background, and a line waiting until it
    serves. The host defaults it relies on (run directory, socket) point into the stage: the
    first such daemon listens where craned's default socket stands ($CRANE_DAEMON), so the
    ``crane`` lines after it talk to it as they would on a host."""
    argv = shlex.split(command, comments=True)[1:]
    args = craned_args(argv)  # the documented flags parse
    extra = []
    if not args.run_dir:
        extra += ["--run-dir", str(stage.work / f"craned-{n}")]
    listen = [a for a in args.listen if a.startswith("unix:")]
    if not listen:
        default = stage.address
        listen = [default if default not in served else f"unix://{stage.work}/craned-{n}.sock"]
        extra += ["--listen", listen[0]]
    line = (
        f"{command.split('#')[0].strip()} {shlex.join(extra)} "
        f">>{stage.work}/craned-{n}.log 2>&1 & echo $! >>{stage.work}/pids"
    )
    wait = f"{shlex.quote(sys.executable)} -c {shlex.quote(_WAIT)} {shlex.quote(listen[0])}"
    return [line, wait], listen[0]


_EXPORT_SUB = re.compile(r"^export (\w+)=(\$\(.*\))\s*$")


def _run_line(command: str) -> str:
    """``export X=$(cmd)`` hides a failing cmd from ``set -e``; assigning first does not."""
    if m := _EXPORT_SUB.match(command.split(" #")[0].strip()):
        return f"{m.group(1)}={m.group(2)}; export {m.group(1)}"
    return command


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.name)
def test_shell_block(block: db.Block, stage: Stage) -> None:
    steps = db.plan(block)
    for s in steps:
        if s.kind == "parse":
            argv = shlex.split(re.sub(r"\[([^\]]*)\]", r"\1", stage.fill(s.command)), comments=True)
            assert argv[0] == "crane", s.written
            try:
                build_parser().parse_args(argv[1:])
            except SystemExit as e:
                pytest.fail(f"{block.name}: {s.written!r} does not parse ({e})")
    runnable = [s for s in steps if s.kind in ("run", "daemon")]
    if not runnable:
        assert all(s.reason for s in steps if s.kind != "parse")
        return
    script = ["set -euo pipefail"]
    served: set[str] = set()
    opened = False
    for n, s in enumerate(runnable):
        if s.kind == "daemon":
            lines, address = _daemon_lines(stage, stage.fill(s.command), n, served)
            script += lines
            served.add(address)
        else:
            if "{session}" in s.command and not opened:
                script += stage.session_lines()
                opened = True
            script.append(_run_line(s.command))
    named = {m.group(1) for s in runnable if s.kind == "run" for m in _SOCK.finditer(s.command)}
    named.add("{run}/crane.sock")  # $CRANE_DAEMON
    for sock in sorted(named):
        if f"unix://{stage.fill(sock)}" not in served:
            stage.serve(sock)
    body = stage.fill("\n".join(script))
    r = subprocess.run(
        ["bash", "-c", body],
        cwd=stage.work,
        env=stage.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    logs = "".join(p.read_text()[-1500:] for p in sorted(stage.work.glob("craned-*.log")))
    logs += "".join(d.log_text()[-1500:] for d in stage.daemons)
    assert r.returncode == 0, (
        f"{block.name} failed:\n{block.text}\nas run:\n{body}\n"
        f"stdout:\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-3000:]}\ncraned:\n{logs}"
    )


@pytest.mark.parametrize(
    "block",
    [b for b in BLOCKS if b.lang == "python" and b.doc != "README.md"],
    ids=lambda b: b.name,
)
def test_operator_python_block_runs(block: db.Block, stage: Stage) -> None:
    stage.serve("{run}/crane.sock")
    script = stage.work / "block.py"
    script.write_text(stage.fill(db.substitute(block.text)))
    r = subprocess.run(
        [sys.executable, str(script)],
        cwd=stage.work,
        env=stage.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"{block.name} failed:\n{block.text}\n{r.stderr[-3000:]}"
