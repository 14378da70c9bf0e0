"""Dirty tracking: which allocations a copy, memset or kernel may have written since a mark."""

from __future__ import annotations

import struct

from crane.state.dirty import DirtyTracker


def test_new_allocations_are_dirty_and_mark_starts_anew() -> None:
    d = DirtyTracker()
    d.add(0x1000, 0x100)
    d.add(0x3000, 0x100)
    assert d.mark() == ({0x1000, 0x3000}, False)
    assert d.mark() == (set(), False)


def test_writes_inside_an_allocation_mark_it_and_outside_do_not() -> None:
    d = DirtyTracker()
    d.add(0x1000, 0x100)
    d.add(0x3000, 0x100)
    d.mark()
    d.write(0x10FF)
    d.write(0x1100)  # one past the end
    d.write(0x2000)
    assert d.mark()[0] == {0x1000}
    d.remove(0x1000)
    d.write(0x1000)
    assert d.mark()[0] == set()


def test_kernel_parameters_pointing_into_allocations_mark_them() -> None:
    d = DirtyTracker()
    for a in (0x10_0000, 0x20_0000, 0x30_0000):
        d.add(a, 0x1000)
    d.mark()
    params = struct.pack("<iiQ", 5, 7, 0x20_0010)  # an int pair, then a pointer at offset 8
    d.launch(params)
    assert d.mark() == ({0x20_0000}, True)
    d.launch(struct.pack("<iQ", 1, 0x30_0800)[:12])  # a pointer at offset 4 (packed struct)
    assert d.mark()[0] == {0x30_0000}
    d.launch(struct.pack("<f", 1.0))
    assert d.mark() == (set(), True)
