"""A tenant's kernel time limit on the simulated GPU: a launch running past it fails with
CUDA_ERROR_LAUNCH_TIMEOUT soon after the limit; launches within it are untouched."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import STICKY, CudaError
from crane.backends.factory import make_backend
from crane.device.layout import CHUNK_GRANULARITY, WINDOW_SIZE, window_base
from crane.modules.image import inspect_image

# counts to n in a loop, then stores the count: n = 2**31 runs for hours in the interpreter
COUNT_PTX = b"""
.version 7.0
.target sm_80
.address_size 64

.visible .entry count(.param .u64 out, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r2, [n];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 0;
LOOP:
    add.u32 %r1, %r1, 1;
    setp.lt.u32 %p1, %r1, %r2;
    @%p1 bra LOOP;
    st.global.u32 [%rd2], %r1;
    ret;
}
\0"""


def _session(tmp_path: Path, limit: float):
    window = (window_base(3), WINDOW_SIZE)
    b = make_backend(
        "sim", "l4", window, b"seed", str(tmp_path / "ledger"), 3, kernel_time_limit_s=limit
    )
    out = window[0]
    b.map_chunk(out, CHUNK_GRANULARITY)
    b.mem_alloc(out, 4)
    mod = b.module_load(inspect_image(COUNT_PTX, b.snapshot.cc), lambda n: 0, data=COUNT_PTX)
    return b, mod, out


def test_a_launch_past_the_limit_fails_with_launch_timeout(tmp_path: Path) -> None:
    b, mod, out = _session(tmp_path, 0.5)
    stream = b.stream_create(0, 0)
    t0 = time.monotonic()
    with pytest.raises(CudaError) as e:
        b.launch(mod, "count", (1, 1, 1), (32, 1, 1), 0, stream, struct.pack("<QI", out, 2**31))
    took = time.monotonic() - t0
    assert e.value.code == CUresult.CUDA_ERROR_LAUNCH_TIMEOUT
    assert "kernel count ran past the kernel time limit of 0.5 s" in str(e.value)
    assert 0.5 <= took < 2.5
    assert CUresult.CUDA_ERROR_LAUNCH_TIMEOUT in STICKY  # as a display watchdog's: sticky
    b.close()


def test_launches_within_the_limit_are_untouched(tmp_path: Path) -> None:
    b, mod, out = _session(tmp_path, 30.0)
    stream = b.stream_create(0, 0)
    b.launch(mod, "count", (1, 1, 1), (32, 1, 1), 0, stream, struct.pack("<QI", out, 100))
    assert bytes(b.memcpy_dtoh(out, 4, stream)) == struct.pack("<I", 100)
    b.close()
