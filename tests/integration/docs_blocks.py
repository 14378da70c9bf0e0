"""The code blocks of the user and operator docs, and what a test does with each (see
tests/integration/test_docs_run.py, which runs them).

The docs covered: README.md and every ``docs/operators-*.md``. Every fenced block has a
language, and each language a handler:

* ``sh``/``bash``/``console``: each command line gets one of three levels --
  **run** (in bash, against real daemons, after :data:`SUBSTITUTIONS` replaced the values
  that name another host's things; ``craned`` lines start in the background and the next line
  waits until they serve), **parse** (:data:`PARSE_ONLY`: the line is parsed by ``crane``'s own
  argument parser, because what it does needs a libvirt host; the vm lab runs it), or
  **not run** (:data:`NOT_RUN`, each with its reason);
* ``toml``: loaded by craned's :func:`~crane.craned.config.load_config`;
* ``conf`` (libvirt's qemu.conf): every setting is one the vm lab's libvirtd runs with;
* ``python``: run against a real daemon (README's by test_readme.py, the others here);
* ``text``: output shown to the reader, nothing to run.

A block in another language, a command line none of these covers that then fails to run, an
indented (unfenced) code block, or an entry of the tables that no doc uses any more fails the
tests: examples cannot rot silently.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```([\w+-]*)\n(.*?)^```$", re.S | re.M)
SHELL = ("sh", "bash", "console")
LANGUAGES = (*SHELL, "toml", "conf", "python", "text")


def docs() -> list[Path]:
    """The user and operator docs whose blocks are exercised."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("operators-*.md"))]


#: Host-specific values in the docs and what stands for them in the test: (as written, in
#: the test, why). Applied in this order to every command line that runs or is parsed, and
#: to Python blocks; {run}, {work}, {port}, {exe}, {python} and {session} are the test's.
SUBSTITUTIONS: tuple[tuple[str, str, str], ...] = (
    (
        "tcp://a100host:7480",
        "unix:///run/crane/a100.sock",
        "another host's daemon: a daemon of a simulated A100 on this host",
    ),
    ("tcp://gpuhost:7480", "tcp://127.0.0.1:{port}", "a GPU host's TLS listener: a free port"),
    ("tcp://0.0.0.0:7480", "tcp://127.0.0.1:{port}", "listening on every interface: loopback"),
    ("tcp://0.0.0.0:7443", "tcp://127.0.0.1:{port}", "listening on every interface: loopback"),
    ("127.0.0.1:9400", "127.0.0.1:{port}", "the metrics exporter's address: a free port"),
    ("/run/crane", "{run}", "the run directory (sockets): the test's own"),
    ("/etc/crane/", "{work}/", "certificates: made at test time (trustme) in the work folder"),
    (
        "cuda:0",
        "sim:h100-80gb",
        "a real GPU: the simulated H100 (no GPU here; tests/gpu runs --backend cuda:0)",
    ),
    ("./my_cuda_app args...", "{exe} arg1 arg2", "a CUDA program: nvcc-built programs/vadd.cu"),
    ("./my_cuda_app", "{exe}", "a CUDA program: nvcc-built programs/vadd.cu"),
    (
        "/path/to/app-venv/bin/python",
        "{python}",
        "an application's interpreter: Crane's own (preparing another one installs from a "
        "pip index: tests/interposer/test_foreign_python.py covers it with CRANE_CLIENTS)",
    ),
    ("3f2a9c1b7d04", "{session}", "a session id: a live session opened on $CRANE_DAEMON"),
    (
        "libvirt-hook install",
        "libvirt-hook install --hooks-dir {work}/hooks",
        "libvirt's hooks folder (/etc/libvirt/hooks): the test's own",
    ),
)

#: Files a command names that the reader has and the test writes (in the work folder, with
#: the test's values filled in).
FILES = {
    "craned.toml": (
        "# the host's craned configuration (crane doctor --host reads it)\n"
        'listen = ["unix://{run}/crane.sock"]\n'
        'run_dir = "{run}"\n'
        'backend = ["sim:h100-80gb"]\n'
    ),
    "train.py": (
        "import ctypes\n"
        "cuda = ctypes.CDLL('libcuda.so.1')  # Crane's, preloaded by crane run\n"
        "assert cuda.cuInit(0) == 0\n"
        "n = ctypes.c_int()\n"
        "assert cuda.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value >= 1\n"
        "print('devices:', n.value)\n"
    ),
}

#: Command lines not run here (the start of the line as written), and why.
NOT_RUN = {
    "make demo": "CI itself: the demo is CI's first step (.ci/run)",
    "make test": "CI itself: the whole suite, this test included",
    "make gpu-test": "needs a GPU host (the gpu marker's suite and benchmarks)",
    "scripts/gpu_suite.sh --prepare": "downloads wheels from PyPI (needs the network)",
    "scripts/gpu_suite.sh": "the GPU suite, on a GPU machine (up to 10 minutes)",
    "CRANE_GPU_SUITE_BACKEND=sim:h100-80gb scripts/gpu_suite.sh": (
        "the whole GPU suite on the simulator: minutes of CPU, beyond a docs test"
    ),
    "systemctl restart libvirtd": (
        "restarts the host's system libvirtd; the vm lab starts its own libvirtds with the "
        "hook installed (tests/vm/libvirt_lab.py)"
    ),
    "virsh migrate --live": (
        "libvirt's migration between two libvirt hosts: run in the vm lab by tests/vm/"
        "test_libvirt_migrate.py::test_plain_virsh_migrate_moves_the_gpu_state_through_the_hook"
    ),
}

#: Command lines only parsed by crane's argument parser (they need a libvirt host), and why.
PARSE_ONLY = {
    "crane libvirt-watch": (
        "follows a libvirtd's events until stopped: run in the vm lab (tests/vm/"
        "test_libvirt_migrate.py)"
    ),
    "crane migrate vm1": (
        "migrates a libvirt domain between two libvirt hosts: run in the vm lab (tests/vm/"
        "test_libvirt_migrate.py)"
    ),
}


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the repository
    line: int  # of the opening fence
    lang: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file."""
    text = path.read_text()
    rel = str(path.relative_to(ROOT))
    return [
        Block(rel, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2))
        for m in FENCE.finditer(text)
    ]


def all_blocks() -> list[Block]:
    return [b for d in docs() for b in blocks(d)]


def indented_code(path: Path) -> list[int]:
    """Lines that open an indented (unfenced) code block: a paragraph indented by 4 spaces
    after a blank line, outside fences and list items. Their commands would go untested."""
    found, fenced, prev, in_list = [], False, "", False
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            if re.match(r"\s*([*-]|\d+\.)\s", line):
                in_list = True
            elif not line.strip():
                pass
            elif not line.startswith(" "):
                in_list = False
            if line.startswith("    ") and line.strip() and not prev.strip() and not in_list:
                found.append(i)
        prev = line
    return found


@dataclass(frozen=True)
class Step:
    """One command line of a shell block and its level: run, daemon (a craned started in the
    background), parse or skip (with the reason)."""

    written: str  # as the doc has it (continuations joined)
    kind: str
    command: str = ""  # after the substitutions (run, daemon, parse)
    reason: str = ""


def commands(block: Block) -> list[str]:
    """The command lines of a shell block: continuations joined; for ``console``, only the
    ``$ `` lines (the rest is output)."""
    lines = block.text.splitlines()
    if block.lang == "console":
        lines = [x[2:] for x in lines if x.startswith("$ ")]
    out: list[str] = []
    pending = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full and not full.startswith("#"):
            out.append(full)
    return out


def normalized(command: str) -> str:
    """A command without its comment, its words single-spaced (what the tables match)."""
    return " ".join(shlex.split(command, comments=True))


def _match(table: dict[str, str], command: str) -> str | None:
    words = normalized(command)
    keys = [k for k in table if words == k or words.startswith(k + " ")]
    return max(keys, key=len) if keys else None


def substitute(text: str) -> str:
    for written, used, _ in SUBSTITUTIONS:
        text = text.replace(written, used)
    return text


def plan(block: Block) -> list[Step]:
    steps = []
    for cmd in commands(block):
        if (key := _match(NOT_RUN, cmd)) is not None:
            steps.append(Step(cmd, "skip", reason=NOT_RUN[key]))
        elif (key := _match(PARSE_ONLY, cmd)) is not None:
            steps.append(Step(cmd, "parse", substitute(cmd), PARSE_ONLY[key]))
        elif normalized(cmd).startswith("craned "):
            steps.append(Step(cmd, "daemon", substitute(cmd)))
        else:
            steps.append(Step(cmd, "run", substitute(cmd)))
    return steps
