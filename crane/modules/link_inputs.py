"""Turn the driver's link inputs (``CUjitInputType``) into PTX the linker can use.

Why: cuLinkAddData/cuLinkAddFile and cudart's prelinked fatbins hand the linker cubins,
fatbins, host objects holding fatbins, and archives of such objects. The linker here links
PTX (see :mod:`crane.modules.ptx_link`), so each input yields the PTX a device of compute
capability ``cc`` can JIT, chosen by the driver's rules (the highest compute version not above
the device's), or no PTX and a note saying what it holds instead (SASS for some architecture),
which the linker reports if anything it would define is needed.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from crane.modules.arch import format_cc
from crane.modules.cubin import parse_cubin
from crane.modules.elf import is_elf, parse_elf
from crane.modules.errors import ImageError
from crane.modules.fatbin import (
    describe_entries,
    is_fatbin,
    parse_fatbin,
    select_ptx,
    split_fatbins,
)
from crane.modules.ptx_info import is_ptx
from crane.modules.ptx_link import LinkInput

__all__ = [
    "INPUT_CUBIN",
    "INPUT_FATBINARY",
    "INPUT_LIBRARY",
    "INPUT_NVVM",
    "INPUT_OBJECT",
    "INPUT_PTX",
    "UnsupportedInput",
    "fatbin_inputs",
    "link_inputs",
]

# CUjitInputType (cuda.h)
INPUT_CUBIN, INPUT_PTX, INPUT_FATBINARY, INPUT_OBJECT, INPUT_LIBRARY, INPUT_NVVM = range(6)
_EM_CUDA = 190
_FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")


class UnsupportedInput(ImageError):
    """An input kind this linker cannot take (LTO IR)."""


def link_inputs(
    kind: int, data: bytes, name: str, cc: tuple[int, int], optional: bool = False
) -> list[LinkInput]:
    """The link inputs ``data`` of input type ``kind`` contributes; ImageError if malformed."""
    if kind == INPUT_PTX:
        text = data.split(b"\0", 1)[0].decode("utf-8", "replace")
        if not is_ptx(text):
            raise ImageError(f"'{name}' is not PTX text (no .version directive)")
        return [LinkInput(name, text, optional=optional)]
    if kind == INPUT_CUBIN:
        if not is_elf(data) or _machine(data) != _EM_CUDA:
            raise ImageError(f"'{name}' is not a cubin (no CUDA ELF header)")
        return [LinkInput(name, None, _cubin_note(data, cc), optional)]
    if kind == INPUT_FATBINARY:
        if not is_fatbin(data):
            raise ImageError(f"'{name}' is not a fatbin (bad magic)")
        return fatbin_inputs(data, name, cc, optional)
    if kind == INPUT_OBJECT:
        return _object_inputs(data, name, cc, optional)
    if kind == INPUT_LIBRARY:
        out: list[LinkInput] = []
        for member, blob in _archive_members(data, name):
            out += _object_inputs(blob, f"{name}({member})", cc, optional=True)
        return out
    if kind == INPUT_NVVM:
        raise UnsupportedInput(f"'{name}': LTO IR (CU_JIT_INPUT_NVVM) cannot be linked here")
    raise ImageError(f"'{name}': unknown input type {kind}")


def fatbin_inputs(
    data: bytes, name: str, cc: tuple[int, int], optional: bool = False
) -> list[LinkInput]:
    """One input per fatbin in ``data``: its best PTX for ``cc``, or a note of its contents."""
    out = []
    for k, fb in enumerate(split_fatbins(data)):
        label = name if k == 0 else f"{name}#{k}"
        entries = parse_fatbin(fb)
        if not entries:
            continue
        ptx = select_ptx(entries, cc)
        if ptx is None:
            note = f"holds {describe_entries(entries)}, no PTX a {format_cc(cc)} device can JIT"
            out.append(LinkInput(label, None, note, optional))
        else:
            out.append(LinkInput(label, ptx.ptx_text, optional=optional))
    return out


def _machine(data: bytes) -> int:
    return struct.unpack_from("<H", data, 18)[0] if len(data) >= 20 else 0


def _cubin_note(data: bytes, cc: tuple[int, int]) -> str:
    try:
        arch = parse_cubin(data).arch.cubin_name()
    except ImageError:
        arch = "an unknown architecture"
    return (
        f"holds SASS for {arch} (a cubin), which cannot be linked for a {format_cc(cc)} device here"
    )


def _object_inputs(data: bytes, name: str, cc: tuple[int, int], optional: bool) -> list[LinkInput]:
    if not is_elf(data):
        raise ImageError(f"'{name}' is not an object file (no ELF header)")
    if _machine(data) == _EM_CUDA:
        return [LinkInput(name, None, _cubin_note(data, cc), optional)]
    elf = parse_elf(data)
    out: list[LinkInput] = []
    for sec_name in _FATBIN_SECTIONS:
        sec = elf.section(sec_name)
        if sec is not None and sec.size:
            out += fatbin_inputs(elf.section_data(sec), name, cc, optional)
    if not out and not optional:
        raise ImageError(f"'{name}' holds no device code (no .nv_fatbin or __nv_relfatbin)")
    return out


def _archive_members(data: bytes, name: str) -> Sequence[tuple[str, bytes]]:
    """Members of a System V ``ar`` archive (``nvcc -lib``), symbol tables skipped."""
    if not data.startswith(b"!<arch>\n"):
        raise ImageError(f"'{name}' is not an archive (no !<arch> magic)")
    pos, out, names = 8, [], b""
    while pos + 60 <= len(data):
        hdr = data[pos : pos + 60]
        member = hdr[:16].decode("ascii", "replace").strip()
        try:
            size = int(hdr[48:58].decode("ascii").strip())
        except ValueError:
            raise ImageError(f"'{name}': bad archive member header at {pos}") from None
        body = data[pos + 60 : pos + 60 + size]
        if len(body) < size:
            raise ImageError(f"'{name}': archive member {member!r} is truncated")
        pos += 60 + size + (size & 1)
        if member in ("/", "/SYM64/"):
            continue
        if member == "//":
            names = body
            continue
        if member.startswith("/") and member[1:].isdigit():
            off = int(member[1:])
            member = names[off:].split(b"\n", 1)[0].decode("utf-8", "replace")
        out.append((member.rstrip("/"), body))
    return out
