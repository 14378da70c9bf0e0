"""Indirect calls: function-pointer tables in global initializers, virtual functions through
vtables, lanes of one warp calling different targets, and calls through bad pointers."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import blocks, i32


@pytest.mark.parametrize("n", (1, 300))
def test_function_pointer_table(program, arch, dev, rng, n):
    prog = program("calls", arch)
    a = rng.integers(-1000, 1000, n, dtype=np.int32)
    b = rng.integers(-1000, 1000, n, dtype=np.int32)
    sel = rng.integers(0, 30, n, dtype=np.int32)  # mixed targets inside every warp
    pa, pb, ps, po = dev.upload(a), dev.upload(b), dev.upload(sel), dev.zeros(n, np.int32)
    dev.launch(prog, "apply_table", blocks(n, 64), 64, [pa, pb, ps, po, i32(n)])
    ops = [np.add, np.multiply, np.subtract]
    want = [ops[s % 3](x, y) for x, y, s in zip(a, b, sel, strict=True)]
    assert list(dev.download(po, n, np.int32)) == want


@pytest.mark.parametrize("n", (2, 129))
def test_virtual_functions(program, arch, dev, rng, n):
    prog = program("calls", arch)
    x = rng.uniform(0.5, 4.0, n).astype(np.float32)
    px, pa, ps = dev.upload(x), dev.zeros(n, np.float32), dev.zeros(n, np.int32)
    dev.launch(prog, "virtuals", blocks(n, 64), 64, [px, pa, ps, i32(n)])
    odd = np.arange(n) & 1 == 1
    want_area = np.where(odd, np.float32(3.0) * x * x, x * x).astype(np.float32)
    assert np.allclose(dev.download(pa, n, np.float32), want_area, rtol=1e-6)
    assert list(dev.download(ps, n, np.int32)) == [0 if o else 4 for o in odd]


def test_call_through_a_bad_pointer_faults(program, arch, dev):
    from crane.backends.sim.ptx import KernelFault

    prog = program("calls", arch)
    syms = dev.symbols(prog)
    dev.mem.write(syms["table"], (0x1234).to_bytes(8, "little"))  # table[0] = garbage
    one = dev.upload(np.array([1], np.int32))
    sel = dev.upload(np.array([0], np.int32))
    out = dev.zeros(1, np.int32)
    with pytest.raises(KernelFault, match="indirect call to 0x1234") as e:
        dev.launch(prog, "apply_table", 1, 1, [one, one, sel, out, i32(1)])
    assert e.value.code == 718  # CUDA_ERROR_INVALID_PC
