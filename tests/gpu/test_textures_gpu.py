"""The texture program's host references hold on a real GPU (tests/interposer/programs/
textures.cu: linear filtering with 9-bit weights, addressing modes, layered and 3D arrays,
surfaces with boundary modes, tld4 order, normalized integer reads, linear and pitch2D memory,
mipmap levels, array copies in graphs). The simulator is checked against the same references
by tests/interposer/test_texture_programs.py, so this pins the simulator to the hardware.
Through Crane on the cuda backend texture objects are refused (docs/design.md), so the
program runs natively only."""

from __future__ import annotations

import pytest

from tests.interposer.conftest import PROGRAMS

pytestmark = pytest.mark.gpu

SECTIONS = ["rotate", "array3d", "layered", "surface", "gather", "normalized", "linear", "mipmap",
            "graph"]  # fmt: skip


def test_texture_references_hold_on_the_gpu(gpu_build, native, target) -> None:  # type: ignore[no-untyped-def]
    if target.simulated:
        pytest.skip("needs a GPU: compares the program's references with the hardware")
    exe = gpu_build.submit(PROGRAMS / "textures.cu").result()
    r = native([exe])
    assert r.returncode == 0, r.describe()
    assert r.stdout.splitlines() == [f"{s} ok" for s in SECTIONS] + ["done cudaSuccess"], (
        r.describe()
    )
