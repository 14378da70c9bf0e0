"""Device printf, faults (illegal/misaligned address, trap, assert), unsupported instructions
refused at load, and launch-configuration checks."""

from __future__ import annotations

import re

import numpy as np
import pytest
from ptxdev import Ptr, i32, i64

from crane.backends.sim.ptx import KernelFault, PtxError, PtxUnsupported, load_ptx


@pytest.mark.parametrize("mode", ["0", "diff"], ids=["interpreted", "compiled"])
def test_printf_formats(program, arch, dev, monkeypatch, mode):
    """The same lines both ways. Interpreted, a call's lines come for every lane of the
    launch at once; compiled, as a GPU orders them: block by block, a warp's lines a call at
    a time in lane order (tests/ptx/test_jit_calls.py)."""
    monkeypatch.setenv("CRANE_PTX_JIT", mode)
    prog = program("printf", arch)
    label = dev.upload(np.frombuffer(b"lbl\0", np.uint8))
    out = dev.launch(prog, "hello", 2, 3, [i32(42), np.float32(3.5), label])
    first = [[f"thread {t} block {b}: a=42 b=3.500000\n" for t in range(3)] for b in range(2)]
    block0 = [
        "[   42|42   |00042|+42|ff|FF|0xff|10|Z|4294967295]\n",
        "3.500 3.500000e+00 1.23e+04 0.0001 1e+20     3.5000|3.50    |\n",
        "literal and lbl -5 -6 7 8 -9\n",
        "%done     x|ab  |\n",
        "0x1234 2 1E-10 3.000000E+00\n",
        "no args\n",
    ]
    if mode == "0":
        assert out[:6] == first[0] + first[1]
        assert out[6:] == [line for line in block0 for _ in range(2)]
    else:
        assert out == first[0] + block0 + first[1] + block0


def test_out_of_bounds_write_faults(program, arch, dev):
    prog = program("faults", arch)
    p = dev.zeros(64, np.int32)
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "oob_write", 1, 64, [p, i32(64)])
    assert e.value.code == 700
    msg = str(e.value)
    addr = int(re.search(r"access at (0x[0-9a-f]+)", msg).group(1), 16)
    assert addr >= int(p) + 256 and "st.global" in msg and "PTX line" in msg


def test_out_of_bounds_read_faults(program, arch, dev):
    prog = program("faults", arch)
    src, dst = dev.zeros(16, np.float32), dev.zeros(16, np.float32)
    dev.launch(prog, "oob_read", 1, 16, [src, dst, i64(0)])  # in bounds
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "oob_read", 1, 16, [src, dst, i64(1 << 30)])
    assert e.value.code == 700


def test_null_pointer_write_faults(program, arch, dev):
    prog = program("faults", arch)
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "null_write", 1, 8, [dev.zeros(8, np.int32)])
    assert e.value.code == 700 and "0x0" in str(e.value)


def test_misaligned_access_faults(program, arch, dev):
    prog = program("faults", arch)
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "misaligned", 1, 4, [dev.zeros(64, np.uint8), dev.zeros(4, np.int32)])
    assert e.value.code == 716


def test_shared_out_of_range_faults(program, arch, dev):
    prog = program("faults", arch)
    out = dev.zeros(64, np.int32)
    dev.launch(prog, "shared_oob", 1, 64, [out, i32(0)])
    assert np.array_equal(dev.download(out, 64, np.int32), np.arange(64))
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "shared_oob", 1, 64, [out, i32(1000)])
    assert e.value.code == 700


def test_trap(program, arch, dev):
    prog = program("faults", arch)
    p = dev.zeros(32, np.int32)
    dev.launch(prog, "do_trap", 1, 32, [p, i32(99)])  # nobody traps
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "do_trap", 1, 32, [p, i32(5)])
    assert e.value.code == 719 and "trap" in str(e.value)


@pytest.mark.parametrize("mode", ["0", "diff"], ids=["interpreted", "compiled"])
def test_assert(program, arch, dev, monkeypatch, mode):
    """Every failing thread of the step prints its line, interpreted; the compiled kernel
    stops at the first (tests/ptx/test_jit_calls.py), and both fail with CUDA_ERROR_ASSERT."""
    monkeypatch.setenv("CRANE_PTX_JIT", mode)
    prog = program("faults", arch)
    vals = dev.upload(np.array([1, 2, 30, 4, 50, 6], np.int32))
    dev.launch(prog, "do_assert", 1, 6, [vals, i32(100)])
    out: list[str] = []
    with pytest.raises(KernelFault) as e:
        prog.launch(
            "do_assert",
            grid=(1, 1, 1),
            block=(6, 1, 1),
            params=dev.pack(prog, "do_assert", [vals, i32(10)]),
            memory=dev.mem,
            symbols=dev.symbols(prog),
            profile=dev.profile,
            printf=out.append,
        )
    assert e.value.code == 710
    assert len(out) == (2 if mode == "0" else 1)
    # as a GPU prints it: file:line: pretty function: block, thread, message
    assert out[0].endswith(
        ": void do_assert(const int *, int): block [0,0,0], thread [2,0,0] "
        "Assertion `v < limit` failed.\n"
    )
    assert "faults.cu:" in out[0] and (mode != "0" or "thread [4,0,0]" in out[1])


UNSUPPORTED = """
.version 8.0
.target sm_80
.address_size 64
.global .texref tex0;
.visible .entry k(.param .u64 p)
{
    .reg .f32 %f<5>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [p];
    mov.b32 %r1, 0;
    tex.1d.v4.f32.s32 {%f1, %f2, %f3, %f4}, [tex0, {%r1}];
    st.global.f32 [%rd1], %f1;
    ret;
}
"""


def test_unsupported_instruction_refused_at_load():
    with pytest.raises(PtxUnsupported) as e:
        load_ptx(UNSUPPORTED)
    assert "tex.1d.v4.f32.s32" in str(e.value) and "line 13" in str(e.value)
    assert e.value.line == 13


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (
            "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 "
            "{%f1,%f2,%f3,%f4}, {%r1,%r1}, {%r1,%r1}, {%f1,%f2,%f3,%f4};",
            "mma",
        ),
        ("ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8 {%r1, %r2}, [%rd1];", "ldmatrix"),
        ("cvt.rs.satfinite.e4m3x4.f32 %r1, {%f1, %f2, %f3, %f4}, %r2;", "e4m3x4"),
        ("ld.global.foo.f32 %f1, [%rd1];", ".foo"),
        ("add.f32 %f1, %f2, %zz;", "zz"),
    ],
)
def test_more_refusals(body, what):
    text = f"""
.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 p)
{{
    .reg .f32 %f<5>;
    .reg .b32 %r<3>;
    .reg .b16 %rs<3>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [p];
    {body}
    ret;
}}
"""
    with pytest.raises(PtxError) as e:
        load_ptx(text)
    assert what in str(e.value) and "line 12" in str(e.value)


def test_syntax_error_is_ptx_error():
    with pytest.raises(PtxError):
        load_ptx(
            ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() { add.s32 %r1 }"
        )


def test_newer_version_and_unknown_target_load_when_instructions_are_known():
    text = """
.version 9.9
.target sm_120
.address_size 64
.visible .entry k(.param .u64 p)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, 7;
    st.global.u32 [%rd1], %r1;
    ret;
}
"""
    prog = load_ptx(text)
    assert prog.kernels["k"].param_bytes == 8


@pytest.mark.parametrize(
    ("grid", "block", "shared", "code"),
    [
        ((1, 1, 1), (2048, 1, 1), 0, 1),
        ((1, 1, 1), (1, 1, 65), 0, 1),
        ((1, 1, 1), (32, 32, 2), 0, 1),
        ((1, 70000, 1), (32, 1, 1), 0, 1),
        ((0, 1, 1), (32, 1, 1), 0, 1),
        ((1, 1, 1), (32, 1, 1), 49 * 1024, 1),
    ],
)
def test_launch_limits(program, dev, grid, block, shared, code):
    prog = program("vector_add", "compute_80")
    p = dev.zeros(4, np.float32)
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "vadd_f32", grid, block, [p, p, p, i32(0)], shared=shared)
    assert e.value.code == code


def test_launch_bounds_maxntid():
    text = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 p)
.maxntid 128, 1, 1
{
    ret;
}
"""
    from ptxdev import Device

    prog = load_ptx(text)
    assert prog.kernels["k"].maxntid == (128, 1, 1)
    d = Device()
    try:
        d.launch(prog, "k", 1, 128, [Ptr(0)])
        with pytest.raises(KernelFault) as e:
            d.launch(prog, "k", 1, 256, [Ptr(0)])
        assert e.value.code == 701
    finally:
        d.close()


def test_opt_in_dynamic_shared(program, dev):
    prog = program("shared_dyn", "compute_80")
    n = 64
    x = dev.upload(np.arange(n, dtype=np.int32))
    out = dev.zeros(n, np.int32)
    dev.launch(
        prog,
        "reverse_dyn",
        1,
        n,
        [x, out, i32(n)],
        shared=100 * 1024,
        max_dynamic_shared=100 * 1024,
    )
    assert np.array_equal(dev.download(out, n, np.int32), np.arange(n)[::-1])


WILD_POINTER = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry wild(.param .u64 p)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [p];
    ld.global.u32 %r1, [%rd1];
    st.global.u32 [%rd1], %r1;
    ret;
}
"""


@pytest.mark.parametrize("addr", [2**64 - 4, 2**64 - 8])
def test_addresses_near_the_top_of_the_space_are_illegal(dev, addr):
    """An access whose end wraps past 2**64 is an illegal address, not an index error: the
    bounds check must not be fooled by unsigned overflow (an allocation exists to wrap into)."""
    dev.zeros(64, np.int32)
    prog = load_ptx(WILD_POINTER)
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "wild", 1, 32, [np.uint64(addr)])
    assert e.value.code == 700
    assert f"{addr:#x}" in str(e.value)


@pytest.mark.parametrize(
    ("space", "size", "most"),
    [("shared", 1 << 32, 0xC000), ("shared", 0xC004, 0xC000), ("local", 1 << 32, 0x80000)],
)
def test_declarations_no_device_holds_are_refused_at_load(space, size, most):
    """As ptxas refuses them: a 4 GiB .local must not exhaust the worker's memory at launch,
    nor a 4 GiB .shared reach the launch check with a negative limit."""
    text = f"""
.version 8.0
.target sm_80
.address_size 64
.visible .entry k()
{{
    .reg .b32 %r<2>;
    .{space} .align 4 .b8 big[{size}];
    mov.u32 %r1, 1;
    st.{space}.u32 [big], %r1;
    ret;
}}
"""
    with pytest.raises(PtxError) as e:
        load_ptx(text)
    assert f"uses too much {space} data ({size:#x} bytes, {most:#x} max)" in str(e.value)
    load_ptx(text.replace(f"[{size}]", f"[{most}]"))  # the limit itself is fine


def test_a_launch_configuration_checked_once_is_checked_again_when_it_changes(program, dev):
    """Launch configurations the checks accepted are remembered (a loop's launches skip the
    driver's checks); a refused one is refused every time, and one that differs in anything
    the checks read (the opt-in limit, the dynamic shared size, the block) is checked anew."""
    prog = program("shared_dyn", "compute_80")
    n = 64
    x = dev.upload(np.arange(n, dtype=np.int32))
    out = dev.zeros(n, np.int32)
    args = [x, out, i32(n)]
    for _ in range(2):  # refused both times: no plan is kept for it
        with pytest.raises(KernelFault) as e:
            dev.launch(prog, "reverse_dyn", 1, n, args, shared=100 * 1024)
        assert e.value.code == 1  # CUDA_ERROR_INVALID_VALUE
    for _ in range(2):
        dev.launch(prog, "reverse_dyn", 1, n, args, shared=100 << 10, max_dynamic_shared=100 << 10)
    with pytest.raises(KernelFault):  # the same size under a lower opt-in limit
        dev.launch(prog, "reverse_dyn", 1, n, args, shared=100 * 1024, max_dynamic_shared=64 << 10)
    with pytest.raises(KernelFault):  # a block past the device's limit
        dev.launch(prog, "reverse_dyn", 1, 2048, args, shared=1024)
    dev.launch(prog, "reverse_dyn", 1, n, args, shared=n * 4)
    prog.launch(  # dimensions as lists
        "reverse_dyn", [1, 1, 1], [n, 1, 1], n * 4, dev.pack(prog, "reverse_dyn", args),
        dev.mem, dev.symbols(prog), dev.profile,
    )  # fmt: skip
    assert np.array_equal(dev.download(out, n, np.int32), np.arange(n)[::-1])
