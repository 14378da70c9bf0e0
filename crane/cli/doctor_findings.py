"""What ``crane doctor`` reports: one finding per check, and how the findings are printed.

A finding says what was checked, how it stands (``ok``, ``warn``: works but worth a look,
``fail``: something an operator must fix, ``skip``: not relevant on this machine, with why), what
is wrong and how to fix it, as a command where one exists, so an operator can act on each line.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TextIO

__all__ = ["FAIL", "OK", "SKIP", "WARN", "Finding", "print_findings", "worst"]

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"


@dataclass(frozen=True)
class Finding:
    """One check's result. ``fix``: what to do about a warn or fail (a command, or the step)."""

    check: str
    status: str
    message: str
    fix: str = ""

    @property
    def bad(self) -> bool:
        return self.status == FAIL


def worst(findings: list[Finding]) -> str:
    """The worst status among ``findings`` (``ok`` for none)."""
    order = [SKIP, OK, WARN, FAIL]
    return max((f.status for f in findings), key=order.index, default=OK)


def print_findings(findings: list[Finding], out: TextIO, as_json: bool) -> None:
    if as_json:
        json.dump(
            {"status": worst(findings), "findings": [asdict(f) for f in findings]}, out, indent=2
        )
        out.write("\n")
        return
    width = max((len(f.check) for f in findings), default=0)
    for f in findings:
        out.write(f"{f.status.upper():4}  {f.check:{width}}  {f.message}\n")
        if f.fix and f.status in (WARN, FAIL):
            out.write(f"{'':4}  {'':{width}}  fix: {f.fix}\n")
    fails = sum(f.status == FAIL for f in findings)
    warns = sum(f.status == WARN for f in findings)
    out.write(f"{len(findings)} checks: {fails} failed, {warns} warnings\n")
