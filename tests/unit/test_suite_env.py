"""The test suite's own hygiene: what one test package sets must not reach the others."""

from __future__ import annotations

import os


def test_no_test_package_changes_the_ptx_mode_for_the_others(ptx_jit_at_start: str | None) -> None:
    """tests/ptx runs the PTX compiler in diff mode. Set at its conftest's import, that mode
    reached every daemon the rest of the suite started, whose workers then compared all of a
    session's memory after every launch: a migration test's 256 MiB guest took minutes, and
    the test failed in CI."""
    assert os.environ.get("CRANE_PTX_JIT") == ptx_jit_at_start
