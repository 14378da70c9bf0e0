"""Declaration-level PTX scanner: nvcc output (checked against the cubin) and hand-written PTX."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crane.modules.cubin import parse_cubin
from crane.modules.ptx_info import PtxImageError, is_ptx, layout_params, scan_ptx

from .conftest import HANDWRITTEN_PTX


def test_header_directives(builds: dict[str, bytes]) -> None:
    m = scan_ptx(builds["ptx80"].decode())
    assert (m.version, m.target, m.address_size, m.target_flags) == ((9, 0), "sm_80", 64, ())
    assert m.arch.sm == 80 and m.arch.suffix == ""


def test_layouts_and_shared_match_the_cubin(builds: dict[str, bytes]) -> None:
    ptx = scan_ptx(builds["ptx80"].decode())
    cubin = parse_cubin(builds["cubin80"])
    assert set(ptx.entries) == set(cubin.kernels)
    for name, k in cubin.kernels.items():
        e = ptx.entries[name]
        assert e.layout == k.layout, name
        assert e.param_bytes == k.param_bytes, name
        assert e.static_shared_bytes == k.static_shared_bytes, name
        assert e.max_threads_per_block == k.max_threads_per_block, name


def test_weird_layout_from_the_facts_file(builds: dict[str, bytes]) -> None:
    weird = scan_ptx(builds["ptx80"].decode()).entries["weird"]
    assert weird.layout == ((0, 1), (8, 24), (32, 2), (40, 8), (48, 16))
    assert weird.param_bytes == 64
    assert [p.align for p in weird.params] == [1, 8, 2, 8, 16]
    assert weird.shared_layout == (("_ZZ5weirdE3buf", 0, 256),)


def test_directives_functions_and_bodies(builds: dict[str, bytes]) -> None:
    text = builds["ptx80"].decode()
    m = scan_ptx(text)
    scalars = m.entries["scalars"]
    assert scalars.maxntid == (128, 1, 1) and scalars.minnctapersm == 2
    assert scalars.reqntid is None and scalars.linkage == (".visible",)
    lines = text.splitlines()
    for fn in (*m.entries.values(), *m.functions.values()):
        assert fn.body_lines is not None and fn.body_span is not None
        start, end = fn.body_lines
        assert lines[start - 1].strip() == "{" and lines[end - 1].strip() == "}"
        assert text[fn.body_span[0]] == "{" and text[fn.body_span[1] - 1] == "}"
        assert fn.name in lines[fn.decl_line - 1]
    helper = m.functions["_Z6helperf"]
    assert helper.kind == "func" and [p.size for p in helper.returns] == [4]
    assert "_Z6helperf" in m.entries["uses_modshared"].references


def test_module_variables(builds: dict[str, bytes]) -> None:
    text = builds["ptx80"].decode()
    v = scan_ptx(text).variables
    assert v["table"].init == struct.pack("<16i", *range(1, 17))
    assert (v["table"].space, v["table"].size, v["table"].align) == ("global", 64, 4)
    assert v["coeffs"].space == "const" and v["coeffs"].init is None and v["coeffs"].size == 16
    assert v["cinit"].init == struct.pack("<2d", 1.5, -2.25)
    # nvcc demotes a module-scope __shared__ used by one kernel into that kernel's body
    assert "modshared" not in v
    m = scan_ptx(text)
    assert m.entries["uses_modshared"].shared_layout == (("modshared", 0, 128),)
    dyn = v["dyn"]
    assert dyn.is_extern and dyn.size is None and dyn.dims == (None,)
    for var in v.values():
        assert var.name in text.splitlines()[var.line - 1]


def test_pointer_annotated_params_match_ptxas(builds: dict[str, bytes]) -> None:
    e = scan_ptx(HANDWRITTEN_PTX).entries["annotated"]
    p0, p1, p2, p3 = e.params
    assert (p0.is_pointer, p0.pointee_space, p0.pointee_align, p0.size, p0.align) == (
        True,
        "global",
        16,
        8,
        8,
    )
    assert (p2.is_pointer, p2.pointee_space, p2.pointee_align) == (True, "", 1)
    assert not p1.is_pointer and (p3.size, p3.align) == (12, 4)
    assert e.reqntid == (64, 2, 1) and e.max_threads_per_block == 128
    k = parse_cubin(builds["handwritten_cubin"]).kernels["annotated"]
    assert e.layout == k.layout and e.param_bytes == k.param_bytes == 36


SYNTHETIC = r"""
// leading comment
.version 8.5 /* block comment */
.target sm_90a, texmode_independent
.address_size 64

.extern .func (.param .b32 r) ext_proto(.param .b32 a);
.weak .global .align 8 .u64 ptrs[3] = {generic(words)+4, words, 0};
.global .align 4 .u32 words[6] = {1, -1, 0x10, 010, 0b11};
.global .f32 f[3] = {1.5, 0f3F800000, -2};
.global .f64 d = 0d4000000000000000;
.global .align 2 .b16 grid[2][3] = {{1, 2}, {4, 5, 6}};
.const .b8 bytes[] = {7, 8, 9};
.global .v2 .u16 pairs[2] = {{1, 2}, {3, 4}};
.global .attribute(.managed) .align 4 .s32 counter = 42;
.shared .align 8 .b8 staging[100];
.shared .align 4 .b8 unused_shared[64];
.global .texref legacy_tex;

.func (.param .b32 ret) device_fn(.param .b32 x)
{
    .shared .align 16 .b8 fn_scratch[48];
    mov.u32 %r1, staging;   // touches the module-scope array
    ret;
}

.visible .entry kern(
    .param .u8 k_c,          // 1 byte
    .param .v4 .f32 k_v,     /* 16 bytes, align 16 */
    .param .u32 k_arr[3],
    .param .f64 k_d
)
.maxntid 256
.maxnreg 32
{
    .reg .b32 %r<4>;
    call.uni (%r1), device_fn, (%r2);
    {
        .shared .align 4 .b8 nested[8];
    }
    ret;
}

.section .debug_str
{
    .b8 101, 123, 125
}
"""


def test_synthetic_module() -> None:
    m = scan_ptx(SYNTHETIC)
    assert m.version == (8, 5) and m.target_flags == ("texmode_independent",)
    assert m.arch.sm == 90 and m.arch.suffix == "a"
    assert set(m.entries) == {"kern"} and set(m.functions) == {"ext_proto", "device_fn"}
    assert m.functions["ext_proto"].body_span is None
    assert m.functions["ext_proto"].linkage == (".extern",)
    kern = m.entries["kern"]
    assert kern.layout == ((0, 1), (16, 16), (32, 12), (48, 8)) and kern.param_bytes == 56
    assert kern.maxntid == (256,) and kern.maxnreg == 32 and kern.max_threads_per_block == 256
    # module-scope `staging` via device_fn, then device_fn's and the kernel's own arrays
    assert kern.shared_layout == (("staging", 0, 100), ("fn_scratch", 112, 48), ("nested", 160, 8))
    assert kern.static_shared_bytes == 168


def test_synthetic_initializers() -> None:
    v = scan_ptx(SYNTHETIC).variables
    assert v["words"].init == struct.pack("<6I", 1, 0xFFFFFFFF, 16, 8, 3, 0)
    assert v["f"].init == struct.pack("<3f", 1.5, 1.0, -2.0)
    assert v["d"].init == struct.pack("<d", 2.0)
    assert v["grid"].init == struct.pack("<6H", 1, 2, 0, 4, 5, 6)
    assert v["bytes"].init == b"\x07\x08\x09" and v["bytes"].size == 3
    assert v["bytes"].dims == (3,)
    assert v["pairs"].init == struct.pack("<4H", 1, 2, 3, 4) and v["pairs"].vector == 2
    assert v["counter"].attributes == (".managed",) and v["counter"].init == struct.pack("<i", 42)
    assert v["legacy_tex"].type == ".texref"
    ptrs = v["ptrs"]
    assert ptrs.linkage == (".weak",) and ptrs.init == bytes(24)
    assert [(r.offset, r.size, r.symbol, r.addend, r.generic) for r in ptrs.relocs] == [
        (0, 8, "words", 4, True),
        (8, 8, "words", 0, False),
    ]


def test_is_ptx() -> None:
    assert is_ptx("// hi\n/* x */ .version 7.0\n.target sm_70")
    assert not is_ptx("\x7fELF")
    assert not is_ptx(".target sm_80")


def test_layout_params_helper() -> None:
    assert layout_params([(1, 1), (24, 8), (2, 2), (8, 8), (16, 16)]) == ([0, 8, 32, 40, 48], 64)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "no .version directive"),
        (".target sm_80\n", "PTX line 1: PTX must start with .version"),
        (".version 8.0\n", "no .target directive"),
        (".version 8.0\n.target compute_80\n", "not an sm_XX architecture"),
        (".version 8.0\n.target sm_80\n/* open", "PTX line 3: unterminated /\\* comment"),
        (".version 8.0\n.target sm_80\n.entry k(\n.param .u32 a\n) {\n", "PTX line 5: unbalanced"),
        (".version 8.0\n.target sm_80\n.entry k(.param .u33 a) {}", "unexpected '.u33'"),
        (".version 8.0\n.target sm_80\n.entry k(.param .u32) {}", "unexpected '\\)' in a param"),
        (".version 8.0\n.target sm_80\n.global .u32 x = {1, 2};", "braces around a scalar"),
        (".version 8.0\n.target sm_80\n.global .u8 x[2] = {1, 2, 3};", "3 values for 2"),
        (".version 8.0\n.target sm_80\n.global .f32 x = y;", "address of 'y' in a .f32"),
        (".version 8.0\n.target sm_80\nadd.u32 %r1;", "unexpected 'add.u32' at module scope"),
        (".version 8.0\n.target sm_80\n.global .u32 x = " + "{" * 40, "nested deeper"),
        (".version 8.0\n.target sm_80\n.global .u8 x[1099511627776] = {1};", "too large"),
        (".version 8.0\n.target sm_80\n.global .u32 x ~", "expected ','"),
    ],
)
def test_errors_name_the_line(text: str, needle: str) -> None:
    with pytest.raises(PtxImageError, match=needle):
        scan_ptx(text)


_PTX_ALPHABET = st.sampled_from([*list('{}()[];,.=+-/*"\n 0123456789abcdefxyz_$%<>:'), ".param"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_scan_ptx(builds: dict[str, bytes], data: st.DataObject) -> None:
    source = data.draw(st.sampled_from([builds["ptx80"].decode(), SYNTHETIC, HANDWRITTEN_PTX]))
    chars = list(source)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(chars)))
        op = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            chars.insert(pos, data.draw(_PTX_ALPHABET))
        elif pos < len(chars):
            if op == "delete":
                del chars[pos]
            else:
                chars[pos] = data.draw(_PTX_ALPHABET)
    with contextlib.suppress(PtxImageError):
        scan_ptx("".join(chars))
