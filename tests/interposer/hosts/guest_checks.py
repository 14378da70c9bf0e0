"""Named checks for the framework scripts run as guests (cupy_guest.py, torch_guest.py), run by
the application's own Python (the client venv: no Crane, no pytest). Each check prints one line,
``ok NAME SECONDS`` or ``FAIL NAME: why``, which the tests read; the process exits 1 if any
check failed, so a check that raises does not stop the others."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable

failed: list[str] = []


def check(name: str) -> Callable[[Callable[[], object]], None]:
    """Decorator: run the function now as the check ``name``."""

    def run(fn: Callable[[], object]) -> None:
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:  # every failure is reported, then the next check runs
            failed.append(name)
            why = f"{type(e).__name__}: {e}".replace("\n", " ")[:400]
            print(f"FAIL {name}: {why}", flush=True)
            traceback.print_exc()
            return
        print(f"ok {name} {time.perf_counter() - t:.3f}", flush=True)

    return run


def close(got, want, rtol: float, atol: float) -> None:
    """Assert ``got`` (host array) equals ``want`` within tolerance, saying where it does not."""
    import numpy as np

    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape}, expected {want.shape}")
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol)
    if bad.any():
        i = np.flatnonzero(bad.reshape(-1))[0]
        raise AssertionError(
            f"{int(bad.sum())} of {bad.size} differ; first at {i}: "
            f"{got.reshape(-1)[i]!r} != {want.reshape(-1)[i]!r}"
        )


def finish() -> None:
    print(f"checks failed: {failed}" if failed else "all checks passed", flush=True)
    sys.exit(1 if failed else 0)
