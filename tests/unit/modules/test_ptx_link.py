"""The PTX linker: symbol resolution by linkage, renaming of module-local names, archive-style
optional inputs, and the logs it writes."""

from __future__ import annotations

import pytest

from crane.modules.ptx_info import scan_ptx
from crane.modules.ptx_link import LinkError, LinkInput, link_ptx

HEAD = ".version 8.0\n.target sm_80\n.address_size 64\n"

USER = (
    HEAD
    + """
.extern .func (.param .b32 r) f (.param .b32 a);
.extern .global .align 4 .u32 v;
.extern .func (.param .b32 r) vprintf (.param .b64 a, .param .b64 b);
.global .align 1 .b8 $str[2] = {65, 0};
.visible .entry k(.param .u64 p)
{
.reg .b32 %r<3>;
.reg .b64 %rd<2>;
ld.global.u32 %r1, [v];
{
.param .b32 a0;
st.param.b32 [a0], %r1;
.param .b32 r0;
call.uni (r0), f, (a0);
ld.param.b32 %r2, [r0];
}
mov.u64 %rd1, $str;
ret;
}
"""
)


def defs(linkage: str, value: int, var: str = ".visible .global .align 4 .u32 v = 7;") -> str:
    return (
        HEAD
        + f"""
{var}
.global .align 1 .b8 $str[2] = {{66, 0}};
{linkage} .func (.param .b32 r) f (.param .b32 a)
{{
.reg .b32 %r<2>;
mov.u32 %r1, {value};
st.param.b32 [r], %r1;
ret;
}}
"""
    )


def test_links_extern_function_and_variable_with_one_definition_each() -> None:
    out = link_ptx([LinkInput("user", USER), LinkInput("defs", defs(".visible", 1))])
    m = scan_ptx(out.ptx)  # the result is PTX again
    assert set(m.entries) == {"k"} and "f" in m.functions and m.variables["v"].init
    assert out.ptx.count(".visible .global .align 4 .u32 v = 7;") == 1
    # each module keeps its own $str: both are renamed apart, and so are their uses
    assert "$str$link0[2] = {65, 0}" in out.ptx and "$str$link1[2] = {66, 0}" in out.ptx
    assert "mov.u64 %rd1, $str$link0;" in out.ptx
    assert out.ptx.count("vprintf") == 1  # the driver provides it: declared once
    assert "linked 2 PTX module(s) (user, defs)" in out.info_log


def test_weak_definition_yields_to_strong_one() -> None:
    out = link_ptx(
        [
            LinkInput("user", USER),
            LinkInput("weak", defs(".weak", 1)),
            LinkInput("strong", defs(".visible", 2, var="")),
        ]
    )
    body = out.ptx.split("// ---- weak", 1)[1]
    assert "mov.u32 %r1, 2;" in out.ptx and "mov.u32 %r1, 1;" not in body


def test_first_weak_wins_without_strong() -> None:
    out = link_ptx(
        [
            LinkInput("user", USER),
            LinkInput("w1", defs(".weak", 1)),
            LinkInput("w2", defs(".weak", 2, var="")),
        ]
    )
    assert "mov.u32 %r1, 1;" in out.ptx and "mov.u32 %r1, 2;" not in out.ptx


def test_common_variables_merge_to_largest() -> None:
    a = HEAD + ".common .global .align 4 .b8 buf[8];\n"
    b = HEAD + ".common .global .align 4 .b8 buf[32];\n"
    out = link_ptx([LinkInput("a", a), LinkInput("b", b)])
    assert "buf[32]" in out.ptx and "buf[8]" not in out.ptx


def test_unresolved_and_duplicate_symbols_are_named() -> None:
    with pytest.raises(LinkError) as e:
        link_ptx([LinkInput("user", USER)])
    assert "Undefined reference to 'f' in 'user'" in e.value.log
    assert "Undefined reference to 'v' in 'user'" in e.value.log
    with pytest.raises(LinkError) as e:
        link_ptx([LinkInput("user", USER), LinkInput("a", defs(".visible", 1)),
                  LinkInput("b", defs(".visible", 2))])  # fmt: skip
    assert "Multiple definition of 'f' in 'b', first defined in 'a'" in e.value.log
    assert "Multiple definition of 'v' in 'b', first defined in 'a'" in e.value.log


def test_optional_inputs_join_only_when_needed() -> None:
    unused = HEAD + ".visible .func g()\n{\nret;\n}\n"
    out = link_ptx(
        [
            LinkInput("user", USER),
            LinkInput("lib", defs(".visible", 1), optional=True),
            LinkInput("other", unused, optional=True),
            LinkInput("sass", None, "SASS for sm_90 only", optional=True),
        ]
    )
    assert "(user, lib)" in out.info_log and ".func g" not in out.ptx
    assert "'sass' not linked" in out.info_log
    # needed but without PTX: the error names the symbols and what the input holds
    with pytest.raises(LinkError) as e:
        link_ptx([LinkInput("user", USER), LinkInput("sass", None, "SASS only", optional=True)])
    assert "Undefined reference to 'f' in 'user'" in e.value.log and "SASS only" in e.value.log


def test_bad_ptx_input_is_reported_with_its_line() -> None:
    with pytest.raises(LinkError) as e:
        link_ptx([LinkInput("broken", HEAD + ".visible .func f(\n")])
    assert "in 'broken': PTX line" in e.value.log


def test_line_info_file_numbers_are_kept_apart() -> None:
    a = HEAD + '.file 1 "a.cu"\n.visible .func fa()\n{\n.loc 1 3 0\nret;\n}\n'
    b = HEAD + '.file 1 "b.cu"\n.visible .func fb()\n{\n.loc 1 5 0\nret;\n}\n'
    out = link_ptx([LinkInput("a", a), LinkInput("b", b)]).ptx
    assert '.file 1 "a.cu"' in out and '.file 2 "b.cu"' in out
    assert ".loc 1 3 0" in out and ".loc 2 5 0" in out
