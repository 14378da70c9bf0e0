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
