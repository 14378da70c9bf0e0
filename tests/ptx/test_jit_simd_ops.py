"""Bit instructions (``popc``, ``clz``, ``brev``, ``bfind``, ``bfe``, ``prmt``, ``lop3``,
``shf``) inside loops run in the vector form (``jit/simd.py``: W lanes at once): the region
has the form (a ``simd_0`` function) and the outputs are the interpreter's bit for bit. The
special functions (``ex2``, ``lg2``, ``sin``, ``cos``, ``tanh`` ``.approx``) keep the scalar
rounds (a C library call per lane; the vector form would make it for masked lanes too and
measured 1.6x slower): compiled, they give the interpreter's bits and NumPy's values within
their approximation."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import i32

from crane.backends.sim.ptx import jit
from crane.backends.sim.ptx.jit.lower import lower_kernel
from crane.backends.sim.ptx.parser import parse_module

pytestmark = pytest.mark.usefixtures("compile_every_launch")

N = 3000


def _has_vector_form(ptx: str, name: str) -> bool:
    fn = parse_module(ptx).functions[name]
    offsets, off = {}, 0
    for p in fn.params:
        offsets[id(p)] = off
        off += 8
    low = lower_kernel(fn, offsets, lambda v: None, off)
    return 'call i32 @"simd_0"' in str(low.module)


def _both(dev, prog, kernel, x, out_dtype, monkeypatch):
    got = []
    for mode in ("0", "1"):
        monkeypatch.setenv("CRANE_PTX_JIT", mode)
        px, out = dev.upload(x), dev.zeros(N, out_dtype)
        dev.launch(prog, kernel, (N + 127) // 128, 128, [px, out, i32(N)])
        got.append(dev.download(out, N, out_dtype))
    assert kernel in dict(jit.stats()["compiled"]), jit.stats()["refused"]
    return got


@pytest.mark.parametrize("arch", ["compute_80"])
def test_bit_instructions_in_a_loop_take_the_vector_form(
    ptx_cache, program, dev, rng, monkeypatch, arch
):
    assert _has_vector_form(ptx_cache.get("simd_ops", arch), "bits_loop")
    x = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32)
    x[:5] = [0, 1, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF]
    interpreted, compiled = _both(
        dev, program("simd_ops", arch), "bits_loop", x, np.uint32, monkeypatch
    )
    np.testing.assert_array_equal(compiled, interpreted)


@pytest.mark.parametrize("arch", ["compute_80"])
def test_special_functions_in_a_loop_keep_the_scalar_rounds(
    ptx_cache, program, dev, rng, monkeypatch, arch
):
    assert not _has_vector_form(ptx_cache.get("simd_ops", arch), "sfu_loop")
    x = rng.uniform(-3, 3, N).astype(np.float32)
    interpreted, compiled = _both(
        dev, program("simd_ops", arch), "sfu_loop", x, np.float32, monkeypatch
    )
    np.testing.assert_array_equal(compiled.view(np.uint32), interpreted.view(np.uint32))
    want = np.zeros(N)
    i = np.arange(N)
    for k in range(6):
        y = x.astype(np.float64) * (0.25 + 0.125 * k)
        take = k < (i % 5) + 2
        want += np.where(
            take, np.exp(y) + np.log(np.abs(y) + 1) + np.sin(y) * np.cos(y) + np.tanh(y), 0
        )
    np.testing.assert_allclose(compiled, want, rtol=1e-3, atol=1e-3)
