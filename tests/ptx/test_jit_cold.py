"""The scalar lane function of a kernel whose every region has a vector form is compiled with a
short pipeline, apart from the rest (``jit/coldsplit.py``, ``engine.compile_ir``'s ``cold``):
it runs only for lanes a vector round could not finish. What must hold: the split module links
and runs as one (the diff-mode launches of ``test_jit_affine.TILES`` with skewed lanes run
that function for every odd lane, in every round), and kernels whose scalar rounds are their
main path keep -O2."""

from __future__ import annotations

import pytest
from test_jit_affine import TILES
from test_jit_warp import WARPSUM

from crane.backends.sim.ptx.jit import engine
from crane.backends.sim.ptx.jit.coldsplit import split
from crane.backends.sim.ptx.jit.lower import lower_kernel
from crane.backends.sim.ptx.parser import parse_module

MODULE = """
define internal i1 @"helper"(i64 %".1") noinline
{
entry:
  %".2" = icmp eq i64 %".1", 0
  ret i1 %".2"
}

define internal i32 @"slow"(i64 %".1") noinline
{
entry:
  %".2" = call i1 @"helper"(i64 %".1")
  %".3" = zext i1 %".2" to i32
  ret i32 %".3"
}

define i32 @"entry"(i64 %".1")
{
entry:
  %".2" = call i32 @"slow"(i64 %".1")
  ret i32 %".2"
}
"""


pytestmark = pytest.mark.usefixtures("compile_every_launch")


def test_split_declares_each_part_in_the_other():
    hot, cold, names = split(MODULE, ("slow",))
    assert 'declare i32 @"slow"(i64 %".1") noinline' in hot
    assert 'define i1 @"helper"' in hot  # the cold part calls it: external until linked
    assert 'define i32 @"slow"' in cold and 'declare i1 @"helper"' in cold
    assert 'declare i32 @"entry"' in cold
    assert sorted(names) == ["helper", "slow"]


def test_split_module_links_and_runs():
    code = engine.compile_ir(MODULE, "entry", cold=("slow",))
    assert code.fn(0) == 1 and code.fn(5) == 0
    linked = engine.optimize(MODULE, cold=("slow",))
    assert linked.get_function("slow").linkage.name == "internal"


def _lowered(src: str, name: str, offsets, nbytes: int):
    fn = parse_module(src).functions[name]
    return lower_kernel(fn, dict(zip(map(id, fn.params), offsets, strict=True)), _slot, nbytes)


def _slot(var):
    return 0 if var.space == "shared" else None


def test_cold_only_where_every_region_is_vectorized():
    assert _lowered(TILES, "tiles", (0, 8, 16, 20), 24).cold == ("step",)
    assert _lowered(WARPSUM, "warpsum", (0, 8), 16).cold == ()  # warp kernels: scalar rounds
