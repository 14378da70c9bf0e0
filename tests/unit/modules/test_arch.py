"""Architecture names and the which-code-runs-where rules."""

from __future__ import annotations

import pytest

from crane.modules.arch import Arch, cc_to_sm, format_cc, parse_arch


def test_names() -> None:
    assert parse_arch("sm_90a") == Arch(90, "a")
    assert parse_arch("compute_100f") == Arch(100, "f")
    assert (Arch(86).cubin_name(), Arch(90, "a").ptx_name()) == ("sm_86", "compute_90a")
    assert (cc_to_sm((12, 1)), format_cc((8, 9))) == (121, "sm_89")
    with pytest.raises(ValueError, match="not an architecture name"):
        parse_arch("gfx90a")
    with pytest.raises(ValueError, match="compute capability"):
        cc_to_sm((8, 10))


@pytest.mark.parametrize(
    ("arch", "cc", "cubin", "ptx"),
    [
        (Arch(80), (8, 0), True, True),
        (Arch(80), (8, 6), True, True),
        (Arch(86), (8, 0), False, False),
        (Arch(80), (9, 0), False, True),
        (Arch(90, "a"), (9, 0), True, True),
        (Arch(90, "a"), (10, 0), False, False),
        (Arch(100, "f"), (10, 3), True, True),
        (Arch(100, "f"), (12, 0), False, False),
        (Arch(103, "f"), (10, 0), False, False),
    ],
)
def test_compatibility(arch: Arch, cc: tuple[int, int], cubin: bool, ptx: bool) -> None:
    assert arch.cubin_runs_on(cc) is cubin
    assert arch.ptx_runs_on(cc) is ptx
