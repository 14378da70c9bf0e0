"""Lazy loading of large PTX modules (``ptx/lazy.py``): a kernel is decoded with what it
reaches on its first launch; function addresses and the line numbers errors name are the
whole module's; a kernel that calls through a pointer gets every function."""

from __future__ import annotations

import numpy as np
import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.backends.sim.ptx import KernelFault, PtxError, PtxProgram, PtxUnsupported, lazy, load_ptx
from crane.backends.sim.ptx.lazy import LazyPtxProgram, load_program

HEAD = """.version 8.0
.target sm_80
.address_size 64
"""

TWICE = """
.func (.param .b32 r) twice(.param .b32 x)
{
    .reg .b32 %r<3>;
    ld.param.b32 %r1, [x];
    add.s32 %r2, %r1, %r1;
    st.param.b32 [r], %r2;
    ret;
}
"""

GOOD = """
.visible .entry good(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    {
    .param .b32 a;
    .param .b32 r;
    st.param.b32 [a], %r1;
    call.uni (r), twice, (a);
    ld.param.b32 %r2, [r];
    }
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r2;
    ret;
}
"""

BAD = """
.visible .entry bad(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .f32 %f<3>;
    mov.f32 %f1, 0f3F800000;
    mov.u32 %r2, 7;
    cvt.rs.f16x2.f32 %r1, %f1, %f1, %r2;
    ret;
}
"""

# a table of device functions and a kernel calling through it
INDIRECT = """
.func (.param .b32 r) inc(.param .b32 x)
{
    .reg .b32 %r<3>;
    ld.param.b32 %r1, [x];
    add.s32 %r2, %r1, 1;
    st.param.b32 [r], %r2;
    ret;
}
.func (.param .b32 r) dbl(.param .b32 x)
{
    .reg .b32 %r<3>;
    ld.param.b32 %r1, [x];
    shl.b32 %r2, %r1, 1;
    st.param.b32 [r], %r2;
    ret;
}
.global .align 8 .u64 table[2] = {inc, dbl};
.visible .entry pick(.param .u64 out, .param .u64 tab)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd5, [tab];
    mov.u32 %r1, %tid.x;
    and.b32 %r3, %r1, 1;
    mul.wide.u32 %rd2, %r3, 8;
    add.s64 %rd6, %rd5, %rd2;
    ld.global.u64 %rd4, [%rd6];
    {
    .param .b32 a;
    .param .b32 r;
    proto: .callprototype (.param .b32 _) _ (.param .b32 _);
    st.param.b32 [a], %r1;
    call (r), %rd4, (a), proto;
    ld.param.b32 %r2, [r];
    }
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r2;
    ret;
}
"""


def _launch(dev, prog, name: str, threads: int, *pointers: int) -> None:
    """Every kernel here takes only pointers (so the launch needs no parameter layout)."""
    prog.launch(
        name,
        grid=(1, 1, 1),
        block=(threads, 1, 1),
        params=np.array(pointers, np.uint64).tobytes(),
        memory=dev.mem,
        symbols=dev.symbols(prog),
        profile=dev.profile,
    )


def test_each_kernel_is_decoded_on_its_first_launch(dev) -> None:
    text = HEAD + TWICE + BAD + GOOD
    bad_line = text.splitlines().index("    cvt.rs.f16x2.f32 %r1, %f1, %f1, %r2;") + 1
    with pytest.raises(PtxUnsupported, match=f"PTX line {bad_line}:"):
        load_ptx(text)  # decoded whole at load, the module is refused
    prog = LazyPtxProgram(text)  # checked at load, decoded per kernel
    out = dev.zeros(64, np.uint32)
    _launch(dev, prog, "good", 64, out)
    assert dev.download(out, 64, np.uint32).tolist() == [2 * i for i in range(64)]
    for _ in range(2):  # the refusal names the whole module's line, at every launch
        with pytest.raises(
            KernelFault, match=f"kernel bad could not be loaded: PTX line {bad_line}:"
        ) as e:
            _launch(dev, prog, "bad", 1, out)
        assert e.value.code == CUresult.CUDA_ERROR_INVALID_PTX
    with pytest.raises(KernelFault, match="no kernel named 'twice'") as e:
        _launch(dev, prog, "twice", 1, out)
    assert e.value.code == CUresult.CUDA_ERROR_NOT_FOUND
    # function addresses (what function-pointer tables hold) are those of the whole module
    whole = load_ptx(HEAD + TWICE + BAD.replace("cvt.rs.f16x2.f32 %r1, %f1, %f1, %r2;", "") + GOOD)
    assert prog.function_addresses() == whole.function_addresses()


def test_an_unknown_instruction_is_still_refused_at_load() -> None:
    """Libraries fall back to another kernel when a module's load fails; a call's arguments on
    lines of their own are no instructions."""
    unknown = GOOD.replace("    ret;", "    frobnicate.b32 %r3;\n    ret;")
    call_lines = "call.uni (r),\n    twice,\n    (\n    a\n    );"
    text = (
        HEAD
        + TWICE
        + GOOD.replace("call.uni (r), twice, (a);", call_lines)
        + unknown.replace("good", "odd")
    )
    line = text.splitlines().index("    frobnicate.b32 %r3;") + 1
    for load in (load_ptx, LazyPtxProgram):
        with pytest.raises(PtxUnsupported, match=f"PTX line {line}: instruction `frobnicate.b32`"):
            load(text)
    LazyPtxProgram(HEAD + TWICE + GOOD.replace("call.uni (r), twice, (a);", call_lines))


def test_a_call_through_a_pointer_gets_every_function(dev) -> None:
    prog = LazyPtxProgram(HEAD + INDIRECT)
    table = dev.symbols(prog)["table"]
    out = dev.zeros(8, np.uint32)
    _launch(dev, prog, "pick", 8, out, table)
    assert dev.download(out, 8, np.uint32).tolist() == [0 + 1, 2, 2 + 1, 6, 4 + 1, 10, 6 + 1, 14]


def test_only_large_modules_load_lazily(monkeypatch) -> None:
    text = HEAD + TWICE + GOOD
    assert isinstance(load_program(text), PtxProgram)
    monkeypatch.setattr(lazy, "LAZY_BYTES", len(text) - 1)
    assert isinstance(load_program(text), LazyPtxProgram)
    with pytest.raises(PtxUnsupported):  # small modules are still refused at load
        monkeypatch.setattr(lazy, "LAZY_BYTES", 1 << 20)
        load_program(HEAD + BAD)


def test_malformed_ptx_is_a_ptx_error() -> None:
    """The declaration scan's error (it was an AttributeError: the wrong name was caught)."""
    for load in (load_ptx, LazyPtxProgram):
        with pytest.raises(PtxError, match="PTX line 1"):
            load("this is not PTX")
