"""Element-wise kernels, 2-D/3-D launches, templates and parameters, against NumPy."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from ptxdev import Ptr, blocks, f32, f64, fma32_ref, i32

SIZES = (1, 100, 1000, 4099)


@pytest.mark.parametrize("n", SIZES)
def test_vadd_f32(program, arch, dev, rng, n):
    prog = program("vector_add", arch)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    pa, pb, pc = dev.upload(a), dev.upload(b), dev.zeros(n, np.float32)
    dev.launch(prog, "vadd_f32", blocks(n, 256), 256, [pa, pb, pc, i32(n)])
    assert np.array_equal(dev.download(pc, n, np.float32), a + b)


@pytest.mark.parametrize("n", (7, 513))
def test_vadd_i64_wraps(program, arch, dev, rng, n):
    prog = program("vector_add", arch)
    a = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    b = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    pa, pb, pc = dev.upload(a), dev.upload(b), dev.zeros(n, np.int64)
    dev.launch(prog, "vadd_i64", blocks(n, 128), 128, [pa, pb, pc, i32(n)])
    with np.errstate(over="ignore"):
        assert np.array_equal(dev.download(pc, n, np.int64), a + b)


@pytest.mark.parametrize("n", (33, 1000))
def test_vops_f64(program, arch, dev, rng, n):
    prog = program("vector_add", arch)
    a = rng.standard_normal(n)
    b = rng.standard_normal(n) * 10
    pa, pb, pc = dev.upload(a), dev.upload(b), dev.zeros(n, np.float64)
    dev.launch(prog, "vops_f64", blocks(n, 64), 64, [pa, pb, pc, i32(n)])
    out = dev.download(pc, n, np.float64)
    # mul.f64 then sub.f64 (ptxas may contract them on a GPU; we round each), div.rn.f64
    assert np.array_equal(out, (a * b - a) / (b + 3.0))


@pytest.mark.parametrize("n", SIZES)
def test_saxpy(program, arch, dev, rng, n):
    prog = program("vector_add", arch)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    alpha = np.float32(rng.standard_normal())
    px, py = dev.upload(x), dev.upload(y)
    dev.launch(prog, "saxpy", blocks(n, 128), 128, [i32(n), alpha, px, py])
    ref = fma32_ref(alpha, x, y)
    assert np.array_equal(dev.download(py, n, np.float32), ref)


@pytest.mark.parametrize(
    ("w", "h", "grid", "block"), [(37, 19, (2, 2), (8, 4)), (64, 64, (3, 5), (16, 16))]
)
def test_scale2d_grid_stride(program, arch, dev, rng, w, h, grid, block):
    prog = program("vector_add", arch)
    data = rng.standard_normal((h, w)).astype(np.float32)
    p = dev.upload(data)
    dev.launch(prog, "scale2d", (*grid, 1), (*block, 1), [p, i32(w), i32(h), f32(1.5)])
    xs, ys = np.meshgrid(np.arange(w), np.arange(h))
    ref = (data.astype(np.float64) * 1.5 + (xs - ys)).astype(np.float32)
    assert np.array_equal(dev.download(p, w * h, np.float32).reshape(h, w), ref)


def test_ids3d(program, arch, dev):
    prog = program("vector_add", arch)
    grid, block = (3, 2, 2), (5, 3, 4)
    nthreads = 5 * 3 * 4
    total = 12 * nthreads
    p = dev.zeros(total * 8, np.uint32)
    dev.launch(prog, "ids3d", grid, block, [p])
    out = dev.download(p, total * 8, np.uint32).reshape(12, nthreads, 8)
    for bz in range(2):
        for by in range(2):
            for bx in range(3):
                bid = bx + 3 * (by + 2 * bz)
                for tz in range(4):
                    for ty in range(3):
                        for tx in range(5):
                            t = tx + 5 * (ty + 3 * tz)
                            row = out[bid, t]
                            assert list(row[:6]) == [tx, ty, tz, bx, by, bz]
                            assert row[6] == t % 32
                            assert row[7] == 3 * 1000000 + 2 * 1000 + 2 + 60


@pytest.mark.parametrize("n", (5, 1003))
def test_template_instantiations(program, arch, dev, rng, n):
    prog = program("template", arch)
    names = {k: k for k in prog.kernels}
    kf = next(k for k in names if "IfLi4" in k)
    ki = next(k for k in names if "IiLi2" in k)
    kd = next(k for k in names if "IdLi1" in k)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    px, py = dev.upload(x), dev.upload(y)
    dev.launch(prog, kf, blocks(n, 4 * 64), 64, [f32(2.0), px, f32(-0.5), py, i32(n)])
    ref = fma32_ref(np.float32(2.0), x, np.float32(-0.5) * y)
    assert np.array_equal(dev.download(py, n, np.float32), ref)
    xi = rng.integers(-1000, 1000, n, dtype=np.int32)
    yi = rng.integers(-1000, 1000, n, dtype=np.int32)
    px, py = dev.upload(xi), dev.upload(yi)
    dev.launch(prog, ki, blocks(n, 2 * 32), 32, [i32(3), px, i32(-7), py, i32(n)])
    assert np.array_equal(dev.download(py, n, np.int32), 3 * xi - 7 * yi)
    xd = rng.standard_normal(n)
    yd = rng.standard_normal(n)
    px, py = dev.upload(xd), dev.upload(yd)
    dev.launch(prog, kd, blocks(n, 128), 128, [f64(0.5), px, f64(4.0), py, i32(n)])
    from fractions import Fraction

    ref = [
        float(Fraction(0.5) * Fraction(a) + Fraction(float(4.0 * b)))
        for a, b in zip(xd, yd, strict=False)
    ]
    assert np.array_equal(dev.download(py, n, np.float64), np.array(ref))


def _params_blob(tag, count, scale, small, v4, v2, big) -> bytes:
    # struct Params { char tag; int count; double scale; short small; float4 v4; int2 v2;
    #                 unsigned long long big; }  (float4 is 16-aligned)
    buf = bytearray(64)
    struct.pack_into("<b", buf, 0, tag)
    struct.pack_into("<i", buf, 4, count)
    struct.pack_into("<d", buf, 8, scale)
    struct.pack_into("<h", buf, 16, small)
    struct.pack_into("<4f", buf, 32, *v4)
    struct.pack_into("<2i", buf, 48, *v2)
    struct.pack_into("<Q", buf, 56, big)
    return bytes(buf)


def test_struct_params(program, arch, dev):
    prog = program("params", arch)
    k = prog.kernels["struct_params"]
    assert k.params[0][1] == 64
    out = dev.zeros(13, np.float64)
    blob = _params_blob(-5, 123456, 2.75, -300, (1.5, 2.5, 3.5, 4.5), (7, -8), 2**40 + 3)
    extra = np.array([1.0, 2.0, 3.0, 4.0], np.float32).tobytes()
    dev.launch(prog, "struct_params", 1, 1, [blob, extra, np.int8(65), out])
    got = dev.download(out, 13, np.float64)
    assert list(got) == [-5, 123456, 2.75, -300, 1.5, 2.5, 3.5, 4.5, 7, -8, 2**40 + 3, 30.0, 65]


def test_parameters_beyond_4kb(program, arch, dev, rng):
    prog = program("params", arch)
    assert prog.kernels["big_params"].params[0][1] == 32000
    v = rng.integers(-(2**20), 2**20, 8000, dtype=np.int32)
    out = dev.zeros(8000, np.int64)
    dev.launch(prog, "big_params", blocks(8000, 256), 256, [v.tobytes(), i32(-3), out])
    assert np.array_equal(dev.download(out, 8000, np.int64), v.astype(np.int64) * -3)


@pytest.mark.parametrize("n", (3, 300))
def test_vector_loads_and_struct_arrays(program, arch, dev, rng, n):
    prog = program("params", arch)
    v = rng.standard_normal((n, 4)).astype(np.float32)
    pin, pout, pidx = dev.upload(v), dev.zeros(4 * n, np.float32), dev.zeros(2 * n, np.int32)
    dev.launch(prog, "vec4_copy", blocks(n, 64), 64, [pin, pout, pidx, i32(n)])
    got = dev.download(pout, 4 * n, np.float32).reshape(n, 4)
    assert np.array_equal(got[:, 0], v[:, 3])
    assert np.array_equal(got[:, 1], v[:, 2] * np.float32(2))
    assert np.array_equal(got[:, 2], v[:, 1] + np.float32(1))
    assert np.array_equal(got[:, 3], v[:, 0])
    idx = dev.download(pidx, 2 * n, np.int32).reshape(n, 2)
    assert np.array_equal(idx[:, 0], np.arange(n)) and np.array_equal(idx[:, 1], -np.arange(n))
    ps = np.zeros(n, dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("id", "<i4")])
    ps["x"], ps["y"], ps["id"] = v[:, 0], v[:, 1], np.arange(n) * 3
    p = dev.upload(ps)
    dev.launch(prog, "particles", blocks(n, 32), 32, [p, i32(n), f32(0.25)])
    got = np.frombuffer(dev.mem.read(p, ps.nbytes), ps.dtype)
    x = fma32_ref(np.float32(0.25), ps["id"].astype(np.float32), ps["x"])
    y = ps["y"] - np.float32(0.25)
    assert np.array_equal(got["x"], x)
    assert np.array_equal(got["y"], y)
    assert np.array_equal(got["z"], x * y)
    assert np.array_equal(got["id"], ps["id"] + 1)


def test_pointer_is_ptr(dev):
    assert isinstance(dev.alloc(4), Ptr)
