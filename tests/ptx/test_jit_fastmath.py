"""Kernels with ``expf``/``logf``/``sinf``/``tanhf`` and fast-math builds compile: the special
functions (``ex2``, ``lg2``, ``sin``, ``cos``, ``tanh`` ``.approx``), ``.ftz`` on float32
instructions and float ``.sat`` (jit/ops_sfu.py). Each kernel here is built by nvcc, checked
compiled (not refused), compared byte for byte with the interpreter (``CRANE_PTX_JIT=0``) on
inputs with subnormals, zeros, infinities and NaNs, and checked close to NumPy's float64."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import jit, load_ptx

SOURCE = r"""
extern "C" __global__ void fm(const float* a, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = a[i];
    float* o = out + 10 * i;
    o[0] = expf(x * 0.1f);
    o[1] = logf(fabsf(x));
    o[2] = sinf(x);
    o[3] = cosf(x);
    o[4] = tanhf(x);
    o[5] = powf(fabsf(x), 1.5f);
    o[6] = __saturatef(x);
    o[7] = x * 3.0f + 1e-39f;
    o[8] = fmaf(x, x, -x) / (x + 2.0f);
    o[9] = sqrtf(fabsf(x)) + rsqrtf(fabsf(x) + 1.0f) + fminf(x, 1e-39f);
}
"""

FIELDS = 10


def _inputs(n: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    a = (rng.standard_normal(n) * 8).astype(np.float32)
    special = np.array(
        [0.0, -0.0, 1e-40, -1e-40, 1.1e-38, -3e-39, np.inf, -np.inf, np.nan, 88.0, -104.0,
         1e30, -1e30, 0.5, 1.0, 2.0],
        np.float32,
    )  # fmt: skip
    a[: len(special)] = special
    return a


def _run(dev, prog, a: np.ndarray, mode: str, monkeypatch) -> np.ndarray:
    monkeypatch.setenv("CRANE_PTX_JIT", mode)
    n = len(a)
    pa, po = dev.upload(a), dev.zeros(FIELDS * n, np.float32)
    dev.launch(prog, "fm", (n + 127) // 128, 128, [pa, Ptr(po), np.int32(n)])
    return dev.download(po, FIELDS * n, np.float32).reshape(n, FIELDS)


@pytest.mark.usefixtures("compile_every_launch")
@pytest.mark.parametrize("flags", [(), ("-use_fast_math",)], ids=["ieee", "fast_math"])
def test_math_library_kernels_compile_and_match_the_interpreter(
    cuda_build, dev, monkeypatch, flags
):
    ptx = cuda_build(SOURCE, "-ptx", "-O3", "-arch=compute_80", *flags, suffix=".ptx")
    text = ptx.read_text()
    assert "ex2.approx.ftz.f32" in text  # what this test is about (expf's, in both builds)
    if flags:
        assert "lg2.approx" in text and "tanh.approx" in text and "add.ftz.f32" in text
    prog = load_ptx(text)
    a = _inputs(1000)
    got = _run(dev, prog, a, "1", monkeypatch)
    key = (prog.source_hash, "fm")
    assert isinstance(jit._cache.get(key), jit.CompiledKernel), jit._cache.get(key)
    want = _run(dev, prog, a, "0", monkeypatch)
    assert got.tobytes() == want.tobytes()
    # and the values are the functions' (normal inputs, away from the specials)
    x = a[16:].astype(np.float64)
    close = {
        0: np.exp(x * 0.1),
        1: np.log(np.abs(x)),
        4: np.tanh(x),
        5: np.abs(x) ** 1.5,
        6: np.clip(x, 0, 1),
    }
    small = np.abs(x) < 50  # sinf/cosf: fast-math's are accurate for moderate arguments
    for k, ref in close.items():
        assert np.allclose(got[16:, k], ref, rtol=1e-5, atol=1e-5), k
    assert np.allclose(got[16:, 2][small], np.sin(x[small]), rtol=1e-5, atol=1e-5)
    assert np.allclose(got[16:, 3][small], np.cos(x[small]), rtol=1e-5, atol=1e-5)
    # flushed or not, as the build asked: x * 3 + 1e-39 of x = 0 is subnormal without .ftz
    assert (got[0, 7] == 0.0) == bool(flags)
