"""Texture and surface instructions in hand-written PTX, against references written from the
CUDA programming guide's texture-fetching rules (not from the interpreter's code).

Each case places a :class:`~crane.api.texdesc.TexDesc` in device memory, as the guest does for
cuTexObjectCreate, and passes its address to the kernel as the texture object."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ptxdev import Ptr

from crane.api.texdesc import (
    ARRAY3D_CUBEMAP,
    ARRAY3D_LAYERED,
    MAGIC_SURF,
    MAGIC_TEX,
    RES_ARRAY,
    RES_MIPMAPPED,
    TRSF_NORMALIZED_COORDINATES,
    TRSF_READ_AS_INTEGER,
    TRSF_SRGB,
    Level,
    TexDesc,
)
from crane.backends.sim.ptx import KernelFault, PtxUnsupported, load_ptx

_F32, _U8, _S8 = 0x20, 0x01, 0x08
WRAP, CLAMP, MIRROR, BORDER = range(4)

HEAD = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 tex, .param .u64 pin, .param .u64 pout)
{
    .reg .pred %p<4>;
    .reg .b16 %rs<8>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<16>;
    .reg .f32 %f<16>;
    ld.param.u64 %rd1, [tex];
    ld.param.u64 %rd2, [pin];
    ld.param.u64 %rd3, [pout];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd4, %r1, 16;
    add.s64 %rd5, %rd2, %rd4;
    add.s64 %rd6, %rd3, %rd4;
    ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd5];
    ld.global.v4.u32 {%r2, %r3, %r4, %r5}, [%rd5];
"""
TAIL = """
    st.global.v4.f32 [%rd6], {%f10, %f11, %f12, %f13};
    ret;
}
"""


def texture(dev, data: np.ndarray, fmt: int, channels: int = 1, **kw) -> Ptr:
    return place(dev, data, fmt, channels, **kw)[0]


def place(dev, data: np.ndarray, fmt: int, channels: int = 1, **kw) -> tuple[Ptr, Ptr]:
    """A texture (or, with magic=MAGIC_SURF, a surface) over ``data`` laid out as an array:
    shape (depth, height, width*channels) or less. Returns (object, texel data)."""
    d = np.ascontiguousarray(data)
    shape = (1,) * (3 - d.ndim) + d.shape
    depth, height, row = shape
    base = dev.upload(d)
    pitch = row * d.itemsize
    lv = Level(base, pitch, pitch * height, row // channels, height, depth)
    desc = TexDesc(
        magic=kw.pop("magic", MAGIC_TEX),
        res_type=RES_ARRAY,
        format=fmt,
        channels=channels,
        flags=kw.pop("flags", 0),
        levels=(lv,),
        **kw,
    )
    return dev.upload(np.frombuffer(desc.pack(), np.uint8)), base


def run(dev, body: str, tex: Ptr, inputs: np.ndarray) -> np.ndarray:
    """Run ``body`` for one thread per input row (four f32/u32 words); returns (n, 4) f32."""
    prog = load_ptx(HEAD + body + TAIL)
    n = len(inputs)
    pin = dev.upload(np.ascontiguousarray(inputs, np.float32))
    pout = dev.zeros(n * 4, np.float32)
    dev.launch(prog, "k", 1, n, [tex, pin, pout])
    return dev.download(pout, n * 4, np.float32).reshape(n, 4)


TEX1D = "    tex.1d.v4.f32.f32 {%f10, %f11, %f12, %f13}, [%rd1, {%f1}];\n"


def _addressed(i: int, n: int, mode: int) -> int | None:
    if mode == WRAP:
        return i % n
    if mode == MIRROR:
        m = i % (2 * n)
        return m if m < n else 2 * n - 1 - m
    if mode == BORDER:
        return i if 0 <= i < n else None
    return min(max(i, 0), n - 1)


@pytest.mark.parametrize("mode", [WRAP, CLAMP, MIRROR, BORDER])
def test_addressing_modes_normalized_point(dev, mode: int) -> None:
    texels = np.array([10, 20, 30, 40, 50], np.float32)
    border = (7.0, 0.0, 0.0, 0.0)
    t = texture(
        dev, texels, _F32, address=(mode, mode, mode), tex_flags=TRSF_NORMALIZED_COORDINATES,
        border=border,
    )  # fmt: skip
    xs = np.array([-1.3, -0.5, -0.05, 0.0, 0.15, 0.5, 0.99, 1.0, 1.25, 1.9, 2.3, -2.7])
    got = run(dev, TEX1D, t, np.stack([xs, xs, xs, xs], 1))
    for x, g in zip(xs, got, strict=True):
        i = _addressed(math.floor(np.float32(x) * 5), 5, mode)
        assert g[0] == (border[0] if i is None else texels[i]), (mode, x)
        assert (g[1], g[2], g[3]) == ((0, 0, 0) if i is None else (0, 0, 1))


def test_unnormalized_wrap_and_mirror_clamp(dev) -> None:
    texels = np.array([1, 2, 3, 4], np.float32)
    for mode in (WRAP, MIRROR):
        t = texture(dev, texels, _F32, address=(mode,) * 3)
        xs = np.array([-3.0, 0.5, 3.5, 9.0], np.float32)
        got = run(dev, TEX1D, t, np.stack([xs] * 4, 1))
        assert list(got[:, 0]) == [1, 1, 4, 4]


def test_linear_filter_uses_nine_bit_weights(dev) -> None:
    texels = np.array([0, 100, 300, 600], np.float32)
    t = texture(dev, texels, _F32, address=(CLAMP,) * 3, filter=1)
    xs = np.array([1.3, 2.0, 2.77, 0.2, 3.9], np.float32)
    got = run(dev, TEX1D, t, np.stack([xs] * 4, 1))[:, 0]
    for x, g in zip(xs, got, strict=True):
        b = float(x) - 0.5
        i = math.floor(b)
        a = round((b - i) * 256) / 256  # 8 fraction bits
        v0, v1 = (texels[min(max(j, 0), 3)] for j in (i, i + 1))
        assert g == pytest.approx((1 - a) * v0 + a * v1, abs=1e-4), x
    # x=1.3: unquantized weight 0.8 would give 80, the 9-bit one 205/256
    assert got[0] == pytest.approx(100 * 205 / 256, abs=1e-4)


def test_normalized_reads_and_srgb(dev) -> None:
    u = np.array([0, 64, 128, 255], np.uint8)
    t = texture(dev, u.reshape(1, 4), _U8, channels=4, tex_flags=TRSF_SRGB)
    got = run(dev, TEX1D, t, np.full((1, 4), 0.5, np.float32))[0]

    def srgb(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    want = [srgb(0 / 255), srgb(64 / 255), srgb(128 / 255), 1.0]  # alpha stays linear
    assert got == pytest.approx(want, abs=1e-6)
    s = np.array([-128, -127, -1, 127], np.int8)
    t = texture(dev, s, _S8)
    xs = np.array([0.5, 1.5, 2.5, 3.5], np.float32)
    got = run(dev, TEX1D, t, np.stack([xs] * 4, 1))[:, 0]
    assert list(got) == pytest.approx([-1.0, -1.0, -1 / 127, 1.0])


def test_read_as_integer_sign_extends(dev) -> None:
    s = np.array([-5, 7, -128, 127], np.int8)
    t = texture(dev, s, _S8, tex_flags=TRSF_READ_AS_INTEGER)
    body = (
        "    tex.1d.v4.s32.s32 {%r10, %r11, %r12, %r13}, [%rd1, {%r2}];\n"
        "    mov.b32 %f10, %r10; mov.b32 %f11, %r11; mov.b32 %f12, %r12; mov.b32 %f13, %r13;\n"
    )
    idx = np.array([0, 1, 2, 3, 9, -1], np.int32).view(np.float32)
    got = run(dev, body, t, np.stack([idx] * 4, 1)).view(np.int32)
    assert list(got[:, 0]) == [-5, 7, -128, 127, 127, -5]  # clamped indices
    assert list(got[0, 1:]) == [0, 0, 1]
    t = texture(dev, s, _S8, tex_flags=TRSF_READ_AS_INTEGER, address=(BORDER,) * 3,
                border=(2.0, 0.0, 0.0, 0.0))  # fmt: skip
    got = run(dev, body, t, np.stack([idx] * 4, 1)).view(np.int32)
    assert list(got[:, 0]) == [-5, 7, -128, 127, 0x40000000, 0x40000000]  # 2.0f's bits


def _face(x: float, y: float, z: float) -> tuple[int, float, float]:
    """The cube-map face table (OpenGL 4.6 section 8.13, the one CUDA documents)."""
    ax, ay, az = abs(x), abs(y), abs(z)
    if ax >= ay and ax >= az:
        return (0, -z, -y, ax) if x >= 0 else (1, z, -y, ax)  # type: ignore[return-value]
    if ay >= az:
        return (2, x, z, ay) if y >= 0 else (3, x, -z, ay)  # type: ignore[return-value]
    return (4, x, -y, az) if z >= 0 else (5, -x, -y, az)  # type: ignore[return-value]


def test_cubemap_face_selection(dev) -> None:
    w = 4
    faces = np.arange(6 * w * w, dtype=np.float32).reshape(6, w, w)
    t = texture(dev, faces, _F32, flags=ARRAY3D_CUBEMAP, address=(CLAMP,) * 3)
    body = "    tex.cube.v4.f32.f32 {%f10, %f11, %f12, %f13}, [%rd1, {%f1, %f2, %f3, %f3}];\n"
    dirs = np.array(
        [[1, 0.2, -0.3], [-1, 0.4, 0.1], [0.3, 1, -0.6], [0.2, -1, 0.7], [-0.5, 0.1, 1],
         [0.6, -0.2, -1], [2, 1.5, 0.5], [0.1, 0.2, -0.3]], np.float32,
    )  # fmt: skip
    got = run(dev, body, t, np.concatenate([dirs, np.zeros((len(dirs), 1), np.float32)], 1))
    for d, g in zip(dirs, got, strict=True):
        f, sc, tc, ma = _face(*map(float, d))  # type: ignore[misc]
        s, tt = (sc / ma + 1) / 2, (tc / ma + 1) / 2
        i, j = min(int(s * w), w - 1), min(int(tt * w), w - 1)
        assert g[0] == faces[f, j, i], d


SURF = """
    suld.b.2d.b32.{mode} {{%r10}}, [%rd1, {{%r2, %r3}}];
    sust.b.2d.b32.{mode} [%rd1, {{%r2, %r3}}], %r4;
    mov.b32 %f10, %r10; mov.b32 %f11, %r10; mov.b32 %f12, %r10; mov.b32 %f13, %r10;
"""


def _surface(dev) -> tuple[Ptr, Ptr]:
    return place(dev, np.arange(12, dtype=np.uint32).reshape(3, 4), 0x03, magic=MAGIC_SURF)


def test_surface_clamp_zero_trap(dev) -> None:
    coords = np.array([[0, 0, 100, 0], [4, 1, 101, 0], [-4, 0, 102, 0], [12, 2, 103, 0],
                       [16, 2, 104, 0], [8, 5, 105, 0]], np.int32)  # fmt: skip
    t, base = _surface(dev)
    got = run(dev, SURF.format(mode="zero"), t, coords.view(np.float32)).view(np.int32)[:, 0]
    assert list(got) == [0, 5, 0, 11, 0, 0]
    after = dev.download(base, 12, np.uint32)
    assert after[0] == 100 and after[5] == 101 and after[11] == 103  # out-of-range dropped
    t, base = _surface(dev)
    got = run(dev, SURF.format(mode="clamp"), t, coords.view(np.float32)).view(np.int32)[:, 0]
    assert list(got[[2, 4, 5]]) == [0, 11, 10]  # clamped to the nearest texel
    t, _ = _surface(dev)
    with pytest.raises(KernelFault) as e:
        run(dev, SURF.format(mode="trap"), t, coords.view(np.float32))
    assert "outside" in str(e.value)


def test_a_pointer_that_is_no_texture_faults(dev) -> None:
    junk = dev.upload(np.arange(200, dtype=np.uint32))
    with pytest.raises(KernelFault):
        run(dev, TEX1D, junk, np.zeros((1, 4), np.float32))


def test_gradient_sampling_is_refused_at_load() -> None:
    body = "    tex.grad.1d.v4.f32.f32 {%f10, %f11, %f12, %f13}, [%rd1, {%f1}], {%f2}, {%f3};\n"
    with pytest.raises(PtxUnsupported, match=r"tex\.grad"):
        load_ptx(HEAD + body + TAIL)


QUERY = """
    txq.width.b32 %r10, [%rd1];
    txq.height.b32 %r11, [%rd1];
    txq.array_size.b32 %r12, [%rd1];
    txq.level.width.b32 %r13, [%rd1], %r2;
    mov.b32 %f10, %r10; mov.b32 %f11, %r11; mov.b32 %f12, %r12; mov.b32 %f13, %r13;
"""


def test_txq_and_suq(dev) -> None:
    data = np.zeros((3, 4, 6), np.float32)
    t = texture(dev, data, _F32, flags=ARRAY3D_LAYERED)
    lod = np.zeros((2, 4), np.int32)
    lod[1, 0] = 3
    got = run(dev, QUERY, t, lod.view(np.float32)).view(np.int32)
    assert list(got[0]) == [6, 4, 3, 6]  # one level: any lod answers level 0
    s = texture(dev, data, _F32, flags=ARRAY3D_LAYERED, magic=MAGIC_SURF)
    body = (
        "    suq.width.b32 %r10, [%rd1]; suq.depth.b32 %r11, [%rd1];\n"
        "    suq.array_size.b32 %r12, [%rd1]; mov.u32 %r13, 0;\n"
        "    mov.b32 %f10, %r10; mov.b32 %f11, %r11; mov.b32 %f12, %r12; mov.b32 %f13, %r13;\n"
    )
    got = run(dev, body, s, np.zeros((1, 4), np.float32)).view(np.int32)
    assert list(got[0, :3]) == [6, 1, 3]
    with pytest.raises(KernelFault):  # a texture queried as a surface
        run(dev, body, t, np.zeros((1, 4), np.float32))
    with pytest.raises(PtxUnsupported, match="channel_order"):
        load_ptx(HEAD + "    txq.channel_order.b32 %r10, [%rd1];\n" + TAIL)


def test_mip_level_selection_clamp_and_linear_blend(dev) -> None:
    levels = []
    for i, w in enumerate((8, 4, 2, 1)):
        base = dev.upload(np.full(w, 10.0 * (i + 1), np.float32))
        levels.append(Level(base, w * 4, w * 4, w, 1, 1))

    def mip(mip_filter: int, mip_max: float) -> Ptr:
        d = TexDesc(MAGIC_TEX, RES_MIPMAPPED, _F32, 1, 0, tuple(levels), address=(CLAMP,) * 3,
                    tex_flags=TRSF_NORMALIZED_COORDINATES, mip_filter=mip_filter,
                    mip_max=mip_max)  # fmt: skip
        return dev.upload(np.frombuffer(d.pack(), np.uint8))

    body = "    tex.level.1d.v4.f32.f32 {%f10, %f11, %f12, %f13}, [%rd1, {%f1}], %f2;\n"
    lods = np.array([0.0, 0.4, 0.6, 1.25, 2.0, 7.0, -1.0], np.float32)
    rows = np.stack([np.full_like(lods, 0.5), lods, lods, lods], 1)
    got = run(dev, body, mip(0, 3.0), rows)[:, 0]
    assert list(got) == [10, 10, 20, 20, 30, 40, 10]  # nearest level
    got = run(dev, body, mip(0, 1.0), rows)[:, 0]
    assert list(got) == [10, 10, 20, 20, 20, 20, 10]  # maxMipmapLevelClamp
    got = run(dev, body, mip(1, 3.0), rows)[:, 0]
    # between levels: weights in the same 9-bit fixed point as texel filtering
    want = [10, 10 + 10 * round(0.4 * 256) / 256, 10 + 10 * round(0.6 * 256) / 256, 22.5, 30,
            40, 10]  # fmt: skip
    assert got == pytest.approx(want, abs=1e-5)


def test_non_finite_coordinates_and_lod_sample_finite_texels(dev) -> None:
    t = texture(dev, np.arange(4, dtype=np.float32), _F32, filter=1, tex_flags=2)
    bad = np.array([np.nan, np.inf, -np.inf, 1e30], np.float32)
    got = run(dev, TEX1D, t, np.stack([bad] * 4, 1))
    assert np.isfinite(got).all() and (got[:, 0] >= 0).all() and (got[:, 0] <= 3).all()
    body = "    tex.level.1d.v4.f32.f32 {%f10, %f11, %f12, %f13}, [%rd1, {%f1}], %f2;\n"
    got = run(dev, body, t, np.stack([np.full(4, 0.5, np.float32), bad, bad, bad], 1))
    assert np.isfinite(got).all()
