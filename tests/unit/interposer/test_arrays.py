"""CUDA array records: cuArray3DCreate's validation rules, level layout, handle kinds."""

from __future__ import annotations

import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.api.texdesc import ARRAY3D_CUBEMAP, ARRAY3D_LAYERED, ARRAY3D_SURFACE_LDST
from crane.interposer.arrays import ArrayTable, Extent, plan_levels

F32, U8 = 0x20, 0x01


@pytest.mark.parametrize(
    ("dims", "flags", "code"),
    [
        ((0, 4, 0), 0, CUresult.CUDA_ERROR_INVALID_VALUE),  # no width
        ((4, 0, 3), 0, CUresult.CUDA_ERROR_INVALID_VALUE),  # 1D with a depth, not layered
        ((4, 4, 0), ARRAY3D_LAYERED, CUresult.CUDA_ERROR_INVALID_VALUE),  # layered, 0 layers
        ((4, 5, 6), ARRAY3D_CUBEMAP, CUresult.CUDA_ERROR_INVALID_VALUE),  # not square
        ((4, 4, 5), ARRAY3D_CUBEMAP, CUresult.CUDA_ERROR_INVALID_VALUE),  # not 6 faces
        ((4, 4, 9), ARRAY3D_CUBEMAP | ARRAY3D_LAYERED, CUresult.CUDA_ERROR_INVALID_VALUE),
        ((4, 4, 0), 0x40, CUresult.CUDA_ERROR_NOT_SUPPORTED),  # sparse
    ],
)
def test_invalid_extents_are_refused(dims, flags: int, code: CUresult) -> None:
    with pytest.raises(CudaError) as e:
        Extent.checked(*dims, F32, 1, flags)
    assert e.value.code == code


def test_bad_format_and_channels() -> None:
    with pytest.raises(CudaError):
        Extent.checked(4, 4, 0, 0x07, 1, 0)
    with pytest.raises(CudaError):
        Extent.checked(4, 4, 0, F32, 3, 0)


def test_valid_kinds() -> None:
    for dims, flags in [
        ((8, 0, 0), 0),
        ((8, 0, 3), ARRAY3D_LAYERED),
        ((8, 8, 0), ARRAY3D_SURFACE_LDST),
        ((8, 8, 4), 0),
        ((8, 8, 6), ARRAY3D_CUBEMAP),
        ((8, 8, 12), ARRAY3D_CUBEMAP | ARRAY3D_LAYERED),
    ]:
        Extent.checked(*dims, U8, 4, flags)


def test_levels_halve_but_layers_stay() -> None:
    e = Extent.checked(16, 8, 3, F32, 2, ARRAY3D_LAYERED)
    assert [e.level(i) for i in range(5)] == [(16, 8, 3), (8, 4, 3), (4, 2, 3), (2, 1, 3),
                                              (1, 1, 3)]  # fmt: skip
    v = Extent.checked(16, 8, 4, F32, 1, 0)
    assert v.level(2) == (4, 2, 1)
    plan, total = plan_levels(e, 2)
    assert plan[0] == (0, 16 * 8, 16 * 8 * 8, 8, 3)
    assert plan[1][0] == 3072 and plan[1][0] % 512 == 0  # level 1 after level 0, aligned
    assert total == 3072 + 1024  # 8*8 bytes x 4 rows x 3 layers, rounded up to 512


def test_table_handles_and_mipmap_levels() -> None:
    t = ArrayTable()
    a = t.add_array(Extent.checked(4, 4, 0, F32, 1, 0), 0x1000)
    m = t.add_mipmap(Extent.checked(8, 8, 0, F32, 1, 0), 0x8000, 3)
    assert a.handle >> 56 != m.handle >> 56
    assert t.array(m.levels[2].handle).level_extent == (2, 2, 0)
    with pytest.raises(CudaError):
        t.mipmap(a.handle)
    with pytest.raises(CudaError):
        t.drop_array(m.levels[0].handle)  # a level goes with its mipmapped array
    t.drop_mipmap(m.handle)
    with pytest.raises(CudaError):
        t.array(m.levels[0].handle)
