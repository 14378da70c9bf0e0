"""Dirty tracking: which allocations a copy, memset or kernel may have written since a mark."""

from __future__ import annotations

import struct

import numpy as np

from crane.engine.dirty import DirtyTracker, pointer_slots


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


def test_a_run_of_writes_marks_what_the_writes_one_by_one_mark() -> None:
    rng = np.random.default_rng(5)
    one, many = DirtyTracker(), DirtyTracker()
    for d in (one, many):
        for a in range(0x1000, 0x20000, 0x1000):
            d.add(a, 0x100 + a // 0x1000)
        d.mark()
    ptrs = rng.integers(0, 0x21000, 300).astype(np.uint64)
    for p in ptrs.tolist():
        one.write(p)
    many.write_many(ptrs)
    marked = one.mark()
    assert many.mark() == marked and 0 < len(marked[0]) < 31
    many.write_many(np.array([0x0FFF, 0x1000 + 0x101], np.uint64))  # before all, one past
    assert many.mark()[0] == set()


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


def test_a_kernel_given_a_pointer_into_a_run_of_mappings_marks_the_whole_run() -> None:
    """Back-to-back VMM mappings are one buffer to the program (expandable segments)."""
    d = DirtyTracker()
    chunk = 2 << 20
    for i in range(3):  # a run of three mappings, then a gap, then a fourth
        d.add(0x1000_0000 + i * chunk, chunk, whole_chunk=True)
    d.add(0x1000_0000 + 4 * chunk, chunk, whole_chunk=True)
    d.add(0x2000_0000, 0x1000)  # an ordinary allocation
    d.add(0x2000_1000, 0x1000)  # and its neighbour, directly after it
    d.mark()
    d.launch(struct.pack("<Q", 0x1000_0000 + chunk + 8))
    assert d.mark()[0] == {0x1000_0000, 0x1000_0000 + chunk, 0x1000_0000 + 2 * chunk}
    d.launch(struct.pack("<Q", 0x2000_0010))
    assert d.mark()[0] == {0x2000_0000}  # ordinary allocations stay precise
    d.write(0x1000_0000 + 8)  # a copy writes exactly where it says
    assert d.mark()[0] == {0x1000_0000}


def test_a_kernel_following_an_uploaded_pointer_table_marks_what_the_table_points_to() -> None:
    d = DirtyTracker()
    table, a, b, c = 0x10_0000, 0x20_0000, 0x30_0000, 0x40_0000
    for x in (table, a, b, c):
        d.add(x, 0x1000)
    d.scan(table, struct.pack("<QQ", a + 0x10, b))  # the host uploads a table of two buffers
    d.mark()
    d.launch(struct.pack("<Qi4x", table, 2))  # the kernel gets only the table
    assert d.mark()[0] == {table, a, b}
    # a device-to-device copy of the table carries its pointers along
    other = 0x50_0000
    d.add(other, 0x1000)
    d.copied(other, table)
    d.mark()
    d.launch(struct.pack("<Q", other))
    assert d.mark()[0] == {other, a, b}
    # chains are followed, cycles end
    d.scan(a, struct.pack("<Q", c))
    d.scan(c, struct.pack("<Q", table))
    d.mark()
    d.launch(struct.pack("<Q", table))
    assert d.mark()[0] == {table, a, b, c}


def test_a_kernel_following_pointers_in_a_module_variable_marks_what_they_point_to() -> None:
    """vm-images/programs/migrate_loop: its kernels take no pointer, they follow a __device__
    struct of buffers uploaded with cudaMemcpyToSymbol (memory outside every allocation)."""
    d = DirtyTracker()
    state, nxt, table, unrelated = 0x10_0000, 0x20_0000, 0x30_0000, 0x40_0000
    for x in (state, nxt, table, unrelated):
        d.add(x, 0x1000)
    d.scan(table, struct.pack("<Q", unrelated))  # pointers inside an allocation stay its own
    variable = 0x7000_0000  # a module variable: no allocation of the session holds it
    d.scan(variable, struct.pack("<QQQ", state, nxt, table))
    d.mark()
    d.launch(struct.pack("<i", 4096))  # step(int n)
    dirty, globals_dirty = d.mark()
    assert dirty == {state, nxt, table, unrelated} and globals_dirty
    # a migration round reading the variable learns pointers a kernel stored in it
    d2 = DirtyTracker()
    for x in (state, nxt):
        d2.add(x, 0x1000)
    d2.contents(variable, struct.pack("<QQ", nxt, 12345))
    d2.mark()
    d2.launch(b"")
    assert d2.mark()[0] == {nxt}
    # a freed allocation is no longer followed
    d2.remove(nxt)
    d2.launch(b"")
    assert d2.mark()[0] == set()


def test_pointer_values_are_aligned_and_inside_the_allocations() -> None:
    d = DirtyTracker()
    d.add(0x10_0000, 0x1000)
    d.add(0x20_0000, 0x1000)
    raw = struct.pack("<4xQQQ", 0x20_0008, 0x9999_0000, 0x10_0010)  # misaligned by 4 at 0x...0
    assert d.pointer_values(0x10_0000, raw, d.bounds()) == []  # not 8-byte aligned there
    assert d.pointer_values(0x10_0004, raw, d.bounds()) == [0x10_0010, 0x20_0008]
    assert DirtyTracker().bounds() == (0, 0)


def test_a_surface_object_launch_marks_the_array_behind_it() -> None:
    """A texture/surface object is a descriptor allocation holding its array's address
    (crane.api.texdesc); uploading it teaches the tracker that pointer, so a kernel given the
    object marks the array a surface store may have written."""
    from crane.api.texdesc import MAGIC_SURF, RES_ARRAY, Level, TexDesc

    d = DirtyTracker()
    array, desc = 0x10_0000, 0x20_0000
    d.add(array, 0x1000)
    d.add(desc, 0x200)
    raw = TexDesc(MAGIC_SURF, RES_ARRAY, 0x20, 1, 2, (Level(array, 64, 1024, 16, 16, 1),)).pack()
    d.scan(desc, raw)
    d.mark()
    d.launch(struct.pack("<Q", desc))
    assert d.mark() == ({array, desc}, True)


def test_the_same_launch_again_marks_what_it_marked_after_every_change() -> None:
    """A launch's marks are remembered per parameter buffer (a loop launches the same one
    thousands of times) only until something they follow changes: a mark, an allocation, a
    pointer learnt or copied."""
    d = DirtyTracker()
    d.add(0x1000, 0x100)
    d.add(0x3000, 0x100)
    d.add(0x5000, 0x100)
    d.mark()
    params = struct.pack("<Q", 0x1010)
    d.launch(params)
    d.launch(params)
    assert d.mark() == ({0x1000}, True)
    d.launch(params)  # after a mark: marked again
    assert d.mark()[0] == {0x1000}
    d.launch(params)
    d.learn(0x1000, [0x3000])  # the buffer now holds a pointer: the launch reaches it too
    d.launch(params)
    assert d.mark()[0] == {0x1000, 0x3000}
    d.launch(params)
    d.copied(0x1000, 0x5000)  # (a copy from an allocation without pointers changes nothing)
    d.remove(0x3000)
    d.add(0x3000, 0x80)
    d.mark()
    d.launch(params)
    d.launch(bytearray(params))  # (any bytes-like buffer)
    assert d.mark()[0] == {0x1000, 0x3000}  # (the new 0x3000 too: a stale pointer over-marks)
    d.remove(0x1000)
    d.launch(params)
    assert d.mark()[0] == set()


def test_a_launch_reads_pointers_only_inside_parameters() -> None:
    """``f(table, 4096)`` packs the high half of ``table`` beside 4096: that word, read
    across the two parameters, is an address inside another allocation. With the kernel's
    layout it is not a slot; the old every-4-bytes scan (no layout) marks it."""
    d = DirtyTracker()
    table = 0x2000_0000_0000
    d.add(table, 0x100)
    d.add(0x1000_0000_0000, 24 << 20)
    assert d.find(struct.unpack_from("<Q", struct.pack("<QI", table, 4096), 4)[0]) is not None
    d.mark()
    params = struct.pack("<QI", table, 4096) + b"\0" * 4
    d.launch(params, ((0, 8), (8, 4)))
    assert d.mark()[0] == {table}
    d.launch(params)
    assert d.mark()[0] == {table, 0x1000_0000_0000}


def test_pointer_slots_follow_the_layout() -> None:
    # an 8-byte scalar or pointer, a 4-byte int, an 8-aligned struct, a 4-aligned packed one
    layout = ((0, 8), (8, 4), (16, 24), (40, 4), (44, 12))
    assert pointer_slots(layout) == (0, 16, 24, 32, 44, 48)
    assert pointer_slots(()) == ()


def test_a_pointer_member_of_a_struct_parameter_marks_its_allocation() -> None:
    d = DirtyTracker()
    d.add(0x7000, 0x100)
    d.mark()
    params = struct.pack("<IIQQ", 3, 0, 7, 0x7040)  # (int, pad) then struct {long n; float* p}
    d.launch(params, ((0, 4), (8, 16)))
    assert d.mark()[0] == {0x7000}
