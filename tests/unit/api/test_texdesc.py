"""The texture/surface descriptor format the guest writes and the simulator reads."""

from __future__ import annotations

import pytest

from crane.api.texdesc import DESC_BYTES, MAGIC_TEX, RES_MIPMAPPED, Level, TexDesc


def test_round_trip() -> None:
    d = TexDesc(
        magic=MAGIC_TEX,
        res_type=RES_MIPMAPPED,
        format=0x09,
        channels=2,
        flags=1,
        levels=(Level(0x1000, 64, 256, 16, 4, 3), Level(0x2000, 32, 64, 8, 2, 3)),
        address=(0, 2, 3),
        filter=1,
        tex_flags=0x12,
        mip_filter=1,
        border=(0.5, 1.0, -2.0, 0.25),
        mip_bias=0.5,
        mip_min=0.0,
        mip_max=1.0,
    )
    raw = d.pack()
    assert len(raw) == DESC_BYTES
    assert TexDesc.unpack(raw) == d


def test_random_bytes_are_no_descriptor() -> None:
    with pytest.raises(ValueError):
        TexDesc.unpack(bytes(range(256)) * 2)
    with pytest.raises(ValueError):
        TexDesc.unpack(b"\0" * 8)


@pytest.mark.parametrize(
    "level",
    [
        Level(0x1000, 64, 256, 16, 4, 0),  # no depth
        Level(0x1000, 32, 256, 16, 4, 1),  # pitch below the row
        Level(0x1000, 64, 128, 16, 4, 1),  # slice below the rows
        Level(0x1000, 65, 260, 16, 4, 1),  # pitch not a whole number of components
        Level((1 << 64) - 64, 64, 256, 16, 4, 1),  # past the address space
    ],
)
def test_inconsistent_levels_are_refused(level: Level) -> None:
    d = TexDesc(MAGIC_TEX, RES_MIPMAPPED, 0x09, 2, 0, (level,))  # 4-byte elements
    with pytest.raises(ValueError):
        TexDesc.unpack(d.pack())


def test_a_cubemap_has_six_faces_per_layer() -> None:
    d = TexDesc(MAGIC_TEX, 0, 0x20, 1, 4, (Level(0x1000, 32, 256, 8, 8, 5),))
    with pytest.raises(ValueError):
        TexDesc.unpack(d.pack())
