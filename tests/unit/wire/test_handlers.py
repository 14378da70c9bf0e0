"""gRPC status is made in one place: every service registers its methods through
crane.wire.handlers (whose boundary turns exceptions into status), and nothing else aborts."""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterator
from pathlib import Path

from crane.wire.handlers import boundary

ROOT = Path(__file__).resolve().parents[3]
_RAW = re.compile(r"\b(context\.abort|grpc\.\w+_rpc_method_handler)\(")
#: Files allowed to register methods themselves, and why.
_OWN_HANDLERS = {
    # grpc_health's servicer is the library's, not ours: it raises nothing of Crane's, and
    # its non-blocking Watch needs its method object as it is (gRPC reads the method's
    # experimental_non_blocking attribute and passes a callback a wrapper would not take)
    "crane/craned/health.py",
}


def test_only_the_boundary_makes_status_or_registers_methods() -> None:
    offenders = []
    for f in sorted((ROOT / "crane").rglob("*.py")):
        if "v1" in f.parts or (f.name == "handlers.py" and f.parent.name == "wire"):
            continue
        if str(f.relative_to(ROOT)) in _OWN_HANDLERS:
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if _RAW.search(line):
                offenders.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_handlers_var", default="")


def test_each_call_runs_in_a_context_of_its_own() -> None:
    """What a handler binds (the session its log lines are about) ends with the call; a
    streaming call keeps it across its steps, its close included."""
    seen: list[str] = []

    def Single(request: object, context: object) -> str:
        seen.append(_VAR.get())
        _VAR.set(str(request))
        return _VAR.get()

    def Stream(request: object, context: object) -> Iterator[str]:
        _VAR.set(str(request))
        try:
            while True:
                yield _VAR.get()
        finally:
            seen.append(_VAR.get())

    single = boundary(Single)
    assert single("a", None) == "a" and single("b", None) == "b"
    assert seen == ["", ""] and _VAR.get() == ""
    steps = boundary(Stream)("s", None)
    assert [next(steps), next(steps)] == ["s", "s"]
    assert _VAR.get() == ""
    steps.close()
    assert seen[-1] == "s"
