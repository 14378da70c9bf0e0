"""Guest runtimes: the guest library for an application's own Python interpreter.

When the program ``crane run`` starts is a Python interpreter (or a script whose shebang names
one) other than Crane's own, the guest library runs inside that interpreter, so it must be
built for it (its headers and libpython) and find Crane's guest dependencies built for it,
without putting Crane's whole environment on the application's path. :func:`prepare` makes, once
per interpreter, a cached directory holding

* ``site/``: Crane's guest dependencies (crane/interposer/guest_env.py names them) installed for
  that interpreter by pip (the versions Crane itself runs, from the same index; Crane's ranges
  when those do not install), and a ``crane`` link to this package;
* ``lib/libcuda.so.1``: the library built for that interpreter, whose start-up appends ``site/``
  (after the application's own paths) and checks the application's copies of those
  dependencies against Crane's requirements.

The cache key is the interpreter's base executable, version and ABI plus Crane's build
fingerprint (the library's sources, the requirements, the package's place), so two venvs on one
Python share a runtime and a changed Crane builds a fresh one.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import crane

__all__ = [
    "GuestRuntimeError",
    "Interpreter",
    "build_own",
    "cache_root",
    "describe",
    "is_own",
    "prepare",
    "python_of",
]

PACKAGE = Path(crane.__file__).resolve().parent
#: The guest library's sources and build script: a source checkout's interposer/ (an editable
#: install), else the copy the package build ships in the package (setup.py).
SOURCES = next(
    (d for d in (PACKAGE.parent / "interposer", PACKAGE / "interposer" / "_build")
     if (d / "build_interposer.py").is_file()),
    PACKAGE / "interposer" / "_build",
)  # fmt: skip
_PYTHON_NAME = re.compile(r"^python\d*(\.\d+)?$")
_MIN = (3, 11)


class GuestRuntimeError(Exception):
    """A guest runtime cannot be prepared; the message says why and what to do."""


def _interpreter_in(argv: list[str], path: str | None) -> str | None:
    """The Python interpreter ``argv`` runs directly (``python3 x.py``, ``env python3``), or
    None."""
    while argv and Path(argv[0]).name == "env":
        argv = [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
    if not argv or not _PYTHON_NAME.match(Path(argv[0]).name):
        return None
    return shutil.which(argv[0], path=path)


def python_of(cmd: list[str], path: str | None = None) -> str | None:
    """The Python interpreter the command ``cmd`` runs in: ``cmd[0]`` itself when it is named
    python*, or the one a script's shebang names (console scripts such as ``torchrun``);
    None for anything else (a C program, a shell script). ``path``: the PATH to search."""
    found = _interpreter_in(cmd, path)
    if found or not cmd:
        return found
    exe = shutil.which(cmd[0], path=path)
    if exe is None:
        return None
    try:
        with open(exe, "rb") as f:
            head = f.read(512)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode(errors="replace")
    words = line.split()
    if words and Path(words[0]).name == "env" and words[1:2] == ["-S"]:
        words = [words[0], *words[2:]]
    return _interpreter_in(words, path)


@dataclass(frozen=True)
class Interpreter:
    """A Python interpreter as the cache key and the build see it."""

    executable: str  # as given (a venv's python keeps its venv)
    base: str  # the real file of the interpreter it runs on
    prefix: str
    version: tuple[int, int]
    soabi: str

    @property
    def label(self) -> str:
        return f"Python {self.version[0]}.{self.version[1]} ({self.executable})"


_DESCRIBE = (
    "import json, os, sys, sysconfig; print(json.dumps([os.path.realpath(getattr(sys, "
    "'_base_executable', sys.executable)), sys.prefix, list(sys.version_info[:2]), "
    "sysconfig.get_config_var('SOABI') or '']))"
)


def describe(python: str) -> Interpreter:
    """Ask ``python`` what it is."""
    try:
        r = subprocess.run(
            [python, "-I", "-c", _DESCRIBE], capture_output=True, text=True, timeout=60
        )
        base, prefix, version, soabi = json.loads(r.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        raise GuestRuntimeError(f"crane: cannot ask {python} what it is: {e}") from e
    return Interpreter(python, base, prefix, (version[0], version[1]), soabi)


def is_own(interp: Interpreter) -> bool:
    """Whether ``interp`` is the environment Crane runs in (its default library fits)."""
    return os.path.realpath(interp.prefix) == os.path.realpath(sys.prefix)


def cache_root() -> Path:
    """``CRANE_GUEST_CACHE``, else the user's cache directory (XDG)."""
    if os.environ.get("CRANE_GUEST_CACHE"):
        return Path(os.environ["CRANE_GUEST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "crane" / "guest"


def _builder() -> ModuleType:
    """build_interposer.py, from a source checkout or the copy the package ships."""
    script = SOURCES / "build_interposer.py"
    if not script.exists():
        raise GuestRuntimeError(
            "crane: this installation of Crane has no guest library sources "
            f"({SOURCES}), so it cannot build a guest library. Reinstall Crane from its "
            "wheel or sdist (which ship them), or install it into the application's "
            "environment (PYTHON -m pip install crane) and use that environment's `crane run`"
        )
    spec = importlib.util.spec_from_file_location("crane_build_interposer", script)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def build_own() -> Path:
    """Build Crane's own guest library for this interpreter, into the package (what the
    package build does; for an install whose build had no C compiler)."""
    try:
        return _builder().build()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        raise GuestRuntimeError(f"crane: building the guest library failed: {e}") from e


def _pins(requirements: list[str]) -> list[str]:
    """The exact versions of the guest dependencies Crane itself runs with."""
    from importlib import metadata

    from crane.interposer.guest_env import parse_requirement

    pins = []
    for text in requirements:
        name = parse_requirement(text).name
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pins.append(text)
    return pins


def _fingerprint(builder: ModuleType, requirements: list[str]) -> str:
    h = hashlib.sha256()
    files = [SOURCES / "build_interposer.py", *sorted(SOURCES.glob("src/*"))]
    files += sorted(SOURCES.glob("generated/*"))
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    h.update(json.dumps([requirements, _pins(requirements), str(PACKAGE)]).encode())
    return h.hexdigest()


def _pip_install(interp: Interpreter, target: Path, requirements: list[str]) -> None:
    """Install ``requirements`` for ``interp`` into ``target`` (pip --target), with this
    environment's pip driving the other interpreter (``pip --python``), so the application's
    environment needs no pip of its own and is never written to."""
    base = [sys.executable, "-m", "pip", "--python", interp.executable]
    opts = ["install", "-q", "--disable-pip-version-check", "--no-warn-script-location"]
    opts += ["--root-user-action", "ignore", "--target", str(target)]
    errors = []
    for reqs in (_pins(requirements), requirements):  # Crane's own versions first
        shutil.rmtree(target, ignore_errors=True)
        r = subprocess.run([*base, *opts, *reqs], capture_output=True, text=True)
        if r.returncode == 0:
            return
        errors.append(r.stderr.strip().splitlines()[-1:] or ["pip failed"])
    raise GuestRuntimeError(
        f"crane: installing Crane's guest dependencies for {interp.label} failed "
        f"({'; '.join(e[0] for e in errors)}). Install them into the application's "
        f"environment ({interp.executable} -m pip install {' '.join(requirements)}) "
        "and retry, or check pip's index settings"
    )


def prepare(python: str | Interpreter, log: Callable[[str], None] | None = None) -> Path:
    """The guest library for ``python`` (a path, or what :func:`describe` said of it): built
    (with its dependencies) on first use, cached after. ``log`` hears when a build happens."""
    interp = describe(python) if isinstance(python, str) else python
    if interp.version < _MIN:
        raise GuestRuntimeError(
            f"crane: {interp.label} is older than Python 3.11, which Crane's guest side needs"
        )
    builder = _builder()
    requirements = builder.guest_requirements()
    key = hashlib.sha256(
        json.dumps([interp.base, interp.version, interp.soabi]).encode()
        + _fingerprint(builder, requirements).encode()
    ).hexdigest()[:16]
    home = cache_root() / f"py{interp.version[0]}.{interp.version[1]}-{key}"
    lib = home / "lib" / builder.SONAME
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one preparation per runtime at a time
        if (home / "runtime.json").exists():
            return lib
        t0 = time.monotonic()
        if log:
            log(f"crane: preparing a guest runtime for {interp.label} in {home} (once)")
        shutil.rmtree(home, ignore_errors=True)
        site = home / "site"
        _pip_install(interp, site, requirements)
        (site / "crane").symlink_to(PACKAGE, target_is_directory=True)
        if builder.probe(interp.executable).libpython is None and log:
            log(
                f"crane: {interp.label} has no shared libpython: its guest library works "
                "inside Python processes only, not in programs they start"
            )
        try:
            builder.build(home / "lib", python=interp.executable, private_paths=[str(site)])
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
            raise GuestRuntimeError(
                f"crane: building the guest library for {interp.label} failed: {e}"
            ) from e
        seconds = time.monotonic() - t0
        (home / "runtime.json").write_text(
            json.dumps(
                {
                    "python": interp.executable,
                    "base": interp.base,
                    "version": list(interp.version),
                    "requirements": requirements,
                    "seconds": round(seconds, 2),
                },
                indent=1,
            )
        )
        if log:
            log(f"crane: guest runtime ready in {seconds:.1f} s")
    return lib
