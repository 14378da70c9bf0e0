"""A CUDA graph instantiated before its session moves (parked to a file and restored on another
daemon, or migrated live) is launched again after the move, with correct results.

Graphs need no worker state (docs/design.md, state record): the guest keeps them and replays a
launch through ordinary session calls, whose objects (module, function, stream, memory, the
event ordering launches) are all in the state record."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("how", ["park-restore", "migrate"])
def test_graph_instantiated_before_a_move_replays_after_it(program, run_moved, how: str) -> None:  # type: ignore[no-untyped-def]
    m = run_moved(program("graph_park.cu"), how)
    assert m.first == "before capture=cudaSuccess inst=cudaSuccess sync=cudaSuccess host_calls=3"
    assert m.returncode == 0, m.stderr
    # ok=1: the program checked every element against its own host computation; the last
    # one, computed here too (7 launches of two steps, mod 2^32), pins the launch count
    want = 7 * 999
    for _ in range(7):
        want = (want * 3 + 1 + 999) * 3 + 2 + 999 & 0xFFFFFFFF
    assert m.stdout.splitlines() == [f"after launch=cudaSuccess ok=1 host_calls=7 out[999]={want}"]
    assert f"session {m.session}" in m.destination.log_text()  # the second half ran on b
