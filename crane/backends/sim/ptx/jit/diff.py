"""``CRANE_PTX_JIT=diff``: run a launch both ways from the same memory and compare.

Every allocation's bytes are saved, the interpreter runs, its results are kept, the bytes are
put back and the compiled kernel runs; then every allocation must hold the same bytes (bit for
bit), both runs must print the same, and both must succeed, or fail with the same CUresult.
The compiled run's state, output and fault are what the caller sees, so the suite's own
checks (results, fault messages) apply to the compiled path too.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import KernelFault

__all__ = ["differential"]


def differential(
    memory,
    interpret: Callable[[], None],
    compiled: Callable[[], None],
    name: str,
    printed: tuple[list[str], list[str]] = ([], []),
):
    """``printed``: the lines each run printed (filled as they run). A run that succeeds
    must print the lines the interpreter printed (threads' lines interleave in no set
    order)."""
    from . import JitMismatch

    allocs = memory.allocations()
    before = [memory.read(a.addr, a.size) for a in allocs]
    fi = _outcome(interpret)
    after_i = [memory.read(a.addr, a.size) for a in allocs]
    for a, data in zip(allocs, before, strict=True):
        memory.write(a.addr, data)
    fj = _outcome(compiled)
    if (fi is None) != (fj is None) or (fi is not None and fj is not None and fi.code != fj.code):
        raise JitMismatch(f"kernel {name}: interpreted {fi or 'ok'} but compiled {fj or 'ok'}")
    heard, said = printed
    if fj is not None:
        # the state after a fault is unspecified: not compared, nor what was printed (which
        # thread fails an assert first depends on the schedule: lanes in lockstep there, one
        # after another here)
        raise fj
    if sorted(said) != sorted(heard):  # (lines of different threads: in no set order)
        raise JitMismatch(f"kernel {name}: compiled printed {said}, interpreted {heard}")
    for a, want in zip(allocs, after_i, strict=True):
        got = memory.read(a.addr, a.size)
        if got != want:
            at = next(i for i in range(len(got)) if got[i] != want[i])
            raise JitMismatch(
                f"kernel {name}: allocation {a.addr:#x}+{a.size:#x} differs at byte {at} "
                f"(interpreted {want[at]:#04x}, compiled {got[at]:#04x})"
            )


def _outcome(run: Callable[[], None]) -> KernelFault | None:
    try:
        run()
    except KernelFault as e:
        return e
    return None
