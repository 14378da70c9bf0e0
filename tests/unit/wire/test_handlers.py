"""gRPC status is made in one place: every service registers its methods through
crane.wire.handlers (whose boundary turns exceptions into status), and nothing else aborts."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
_RAW = re.compile(r"\b(context\.abort|grpc\.\w+_rpc_method_handler)\(")


def test_only_the_boundary_makes_status_or_registers_methods() -> None:
    offenders = []
    for f in sorted((ROOT / "crane").rglob("*.py")):
        if "v1" in f.parts or (f.name == "handlers.py" and f.parent.name == "wire"):
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if _RAW.search(line):
                offenders.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
