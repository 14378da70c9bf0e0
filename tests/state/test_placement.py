"""The cuda backend's reloaded module variables against the addresses the guest was told: any
that moved refuses the restore (the comparison is pure, so it is tested here without a GPU)."""

from __future__ import annotations

from crane.backends.base import GlobalVar
from crane.state.placement import Moved, moved_globals, placement_refusal

RECORDED = [["counter", 0x7F0000001000, 16], ["table", 0x7F0000002000, 64]]


def test_same_addresses_are_fine() -> None:
    placed = {n: GlobalVar(n, a, s) for n, a, s in RECORDED}
    assert moved_globals(RECORDED, placed) == []


def test_each_moved_variable_is_named_with_both_addresses() -> None:
    placed = {
        "counter": GlobalVar("counter", 0x7F0000001000, 16),
        "table": GlobalVar("table", 0x7F0000009000, 64),
    }
    moved = moved_globals(RECORDED, placed)
    assert moved == [Moved("table", 0x7F0000002000, 0x7F0000009000)]
    why = placement_refusal("0123456789abcdef", moved)
    assert why.startswith("module 0123456789abcdef: the driver placed module variables")
    assert "table (told 0x7f0000002000, placed at 0x7f0000009000)" in why
    assert "stale" in why and "counter" not in why


def test_every_moved_variable_is_listed() -> None:
    placed = {n: GlobalVar(n, a + 0x100000, s) for n, a, s in RECORDED}
    assert [m.name for m in moved_globals(RECORDED, placed)] == ["counter", "table"]
