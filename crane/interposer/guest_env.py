"""Crane's guest side entering an interpreter it does not own.

The guest library (``libcuda.so.1``) runs its Python side in the process's interpreter. In a C
program that interpreter is Crane's alone; in a Python application (torch, CuPy) it is the
application's, and one process has one module namespace: whatever the application imported
(or will import from its own paths first) is what Crane's guest side gets. So before Crane
imports anything, :func:`enter` (called from the library's start-up in interposer/src/pygate.c,
before cffi's own start-up) looks at each of Crane's guest dependencies as the application
would find it, and refuses to start, with one line per conflict saying what to do, when a
version is outside Crane's requirement. The library then answers CUDA_ERROR_NOT_INITIALIZED
instead of crashing later inside an incompatible module.

Only the standard library is imported here: this runs before any dependency is known to fit.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "GUEST_DISTRIBUTIONS",
    "Conflict",
    "Requirement",
    "conflicts",
    "enter",
    "find_version",
    "installed",
    "parse_requirement",
    "satisfies",
    "version_key",
]

#: The third-party distributions the guest side imports at run time (``python -X importtime``
#: of ``crane.interposer.bind``; tests/unit/interposer/test_guest_env.py keeps this honest),
#: each with the modules that identify it in ``sys.modules``. Their own dependencies
#: (pycparser, typing-extensions) are pip's to resolve.
GUEST_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "cffi": ("_cffi_backend", "cffi"),
    "grpcio": ("grpc",),
    "protobuf": ("google.protobuf",),
    "numpy": ("numpy",),
    "zstandard": ("zstandard",),
    "lz4": ("lz4",),
}

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*?)\s*(;.*)?$")
_CLAUSE = re.compile(r"^\s*(===|==|!=|~=|<=|>=|<|>)\s*([A-Za-z0-9][A-Za-z0-9.*+!_-]*)\s*$")
_RELEASE = re.compile(r"^[vV]?(\d+(?:\.\d+)*)(.*)$")


@dataclass(frozen=True)
class Requirement:
    """``name`` and its version clauses (operator, version), as in ``protobuf>=5.26,<8``."""

    name: str
    clauses: tuple[tuple[str, str], ...]

    def __str__(self) -> str:
        return self.name + ",".join(op + v for op, v in self.clauses)


def parse_requirement(text: str) -> Requirement:
    """A PEP 508 requirement without extras or URLs (all Crane's runtime dependencies are
    ``name>=version``); an environment marker is dropped (the caller filters those)."""
    m = _REQ.match(text)
    if not m or "[" in text or "@" in text:
        raise ValueError(f"unsupported requirement: {text!r}")
    clauses = []
    for part in filter(None, (p.strip() for p in m.group(2).split(","))):
        c = _CLAUSE.match(part)
        if not c:
            raise ValueError(f"unsupported version clause {part!r} in {text!r}")
        clauses.append((c.group(1), c.group(2)))
    return Requirement(m.group(1), tuple(clauses))


def version_key(version: str) -> tuple[tuple[int, ...], int]:
    """An ordering key for a PEP 440 version: its release numbers (trailing zeros dropped, so
    5.26 == 5.26.0) and whether it is final; a pre-release or dev release (``5.26.0rc1``) sorts
    before its final release, a post release or local version (``2.4.1+cpu``) with it."""
    m = _RELEASE.match(version.strip())
    if not m:
        raise ValueError(f"not a version: {version!r}")
    release = tuple(int(x) for x in m.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    rest = m.group(2).lower().lstrip(".-_")
    final = 0 if re.match(r"(a|b|c|rc|alpha|beta|pre|preview|dev)\d*", rest) else 1
    return release, final


def _release(text: str) -> tuple[int, ...]:
    """The release numbers as written (``2.0`` stays two numbers: ``~=`` and ``.*`` count
    them)."""
    m = _RELEASE.match(text.strip())
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(x) for x in m.group(1).split("."))


def _prefix_match(version: str, prefix: tuple[int, ...]) -> bool:
    have = _release(version) + (0,) * len(prefix)
    return have[: len(prefix)] == prefix


def satisfies(version: str, req: Requirement) -> bool:
    """Whether ``version`` meets every clause of ``req``."""
    have = version_key(version)
    for op, want_text in req.clauses:
        if want_text.endswith(".*"):  # ==1.2.* / !=1.2.*: a release prefix
            if (op == "==") != _prefix_match(version, _release(want_text[:-2])):
                return False
            continue
        want = version_key(want_text)
        if op == "~=":  # ~=1.4.5: >=1.4.5 and ==1.4.*
            ok = have >= want and _prefix_match(version, _release(want_text)[:-1])
        else:
            ok = {
                "==": have == want,
                "===": version.strip() == want_text,
                "!=": have != want,
                ">=": have >= want,
                "<=": have <= want,
                ">": have > want,
                "<": have < want,
            }[op]
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class Found:
    """A distribution's version as the process sees it, and where it comes from."""

    version: str
    where: str
    imported: bool


def find_version(
    dist: str, paths: list[str], modules: Mapping[str, object] | None = None
) -> Found | None:
    """``dist`` as this process would use it: the module already imported (in ``modules``,
    default ``sys.modules``; its ``__version__``), else the first installation on ``paths``
    (its metadata); None if neither."""
    modules = sys.modules if modules is None else modules
    for name in GUEST_DISTRIBUTIONS.get(dist, ()):
        mod = modules.get(name)
        version = getattr(mod, "__version__", None)
        if mod is not None and isinstance(version, str):
            return Found(version, str(getattr(mod, "__file__", None) or name), True)
    return installed(dist, paths)


def installed(dist: str, paths: list[str]) -> Found | None:
    """The first installation of ``dist`` on ``paths`` (its metadata), or None."""
    from importlib import metadata

    for d in metadata.distributions(name=dist, path=paths):
        version = d.metadata["Version"]
        if version:
            return Found(version, str(d.locate_file("")), False)
    return None


@dataclass(frozen=True)
class Conflict:
    """A guest dependency whose version in the application does not fit Crane."""

    requirement: Requirement
    app: Found
    crane: Found | None

    def report(self, python: str) -> str:
        """One line: the package, both versions, and what to do."""
        req, app = self.requirement, self.app
        how = "already imported from" if app.imported else "installed at"
        ours = f" (Crane ships {self.crane.version})" if self.crane else ""
        return (
            f"crane: the application's {req.name} {app.version} ({how} {app.where}) does not "
            f"satisfy Crane's guest requirement {req}{ours}; one process holds one copy, so "
            f"Crane's guest side does not start and driver calls answer "
            f"CUDA_ERROR_NOT_INITIALIZED. Fix: install a fitting version into the "
            f"application's environment ({python} -m pip install '{req}'), or run the "
            f"application from an environment without {req.name} {app.version}"
        )


def conflicts(
    requirements: list[str],
    app_paths: list[str],
    crane_paths: list[str],
    modules: Mapping[str, object] | None = None,
) -> list[Conflict]:
    """Each requirement the application's copy (already imported, or first on ``app_paths``)
    does not satisfy; ``crane_paths``: where Crane's own copies are, to name their version;
    ``modules``: what is imported (``sys.modules`` by default)."""
    found = []
    for text in requirements:
        req = parse_requirement(text)
        app = find_version(req.name, app_paths, modules)
        if app is None:
            continue
        try:
            fits = satisfies(app.version, req)
        except ValueError:
            fits = False  # a version we cannot read cannot be shown to fit
        if not fits:
            found.append(Conflict(req, app, installed(req.name, crane_paths)))
    return found


def enter(
    owner: bool, app_paths: list[str], crane_paths: list[str], requirements: list[str]
) -> str | None:
    """Check the process and import the guest side; the problem to report, or None.

    ``owner``: the library started this interpreter (a C program), so nothing of the
    application's is in it and Crane's paths come first. Otherwise the application's paths come
    first and each guest dependency it has must fit ``requirements``. Any import failure of
    the guest side is reported here too: cffi's own start-up would otherwise print a traceback
    and let every driver call return 0."""
    python = sys.executable or "python"
    if not owner:
        found = conflicts(requirements, app_paths, crane_paths)
        if found:
            return "\n".join(c.report(python) for c in found)
    try:
        import _cffi_backend  # noqa: F401 - cffi's start-up needs it next

        import crane.interposer.bind  # noqa: F401 - the whole guest side, imported once here
    except Exception as e:
        v = sys.version_info
        return (
            f"crane: the guest side cannot start in Python {v.major}.{v.minor} ({python}): "
            f"{type(e).__name__}: {e}. Run the program with `crane run`, which prepares a guest "
            f"library for its interpreter, or preload the one `crane guest-lib --python "
            f"{python}` prints; driver calls answer CUDA_ERROR_NOT_INITIALIZED"
        )
    return None
