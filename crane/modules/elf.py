"""Minimal, bounds-checked ELF64 little-endian reader: sections, symbols and notes.

Why our own: cubins are ordinary ELF64 files with NVIDIA-specific section types and
symbol bits that general ELF libraries either reject or hide, and a daemon must survive
hostile input — every offset here is checked against the buffer and every failure is an
:class:`ElfError` naming the offset, never an IndexError or struct.error. The same reader
serves host executables (to pull out ``.nv_fatbin``) and cubins (see ``cubin.py``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from crane.modules.errors import ImageError

__all__ = [
    "SHN_UNDEF",
    "SHN_XINDEX",
    "SHT_NOBITS",
    "SHT_NOTE",
    "SHT_SYMTAB",
    "ElfError",
    "ElfFile",
    "ElfNote",
    "ElfSection",
    "ElfSymbol",
    "is_elf",
    "parse_elf",
]

ELF_MAGIC = b"\x7fELF"
SHT_SYMTAB = 2
SHT_NOTE = 7
SHT_NOBITS = 8
SHT_SYMTAB_SHNDX = 18
SHN_UNDEF = 0
SHN_LORESERVE = 0xFF00
SHN_XINDEX = 0xFFFF

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")


class ElfError(ImageError):
    """An ELF file is malformed (offsets out of range, bad magic, unsupported class)."""


@dataclass(frozen=True, slots=True)
class ElfSection:
    index: int
    name: str
    type: int
    flags: int
    #: Load address (``sh_addr``): where a host program's section lives in memory.
    addr: int
    offset: int
    size: int
    link: int
    info: int
    addralign: int
    entsize: int

    @property
    def has_file_data(self) -> bool:
        return self.type != SHT_NOBITS


@dataclass(frozen=True, slots=True)
class ElfSymbol:
    index: int
    name: str
    value: int
    size: int
    #: ``st_info & 0xf`` (1 OBJECT, 2 FUNC, 3 SECTION; CUDA uses 13 for data in -rdc objects).
    type: int
    #: ``st_info >> 4`` (0 LOCAL, 1 GLOBAL, 2 WEAK).
    bind: int
    other: int
    #: Section index, with SHN_XINDEX already resolved through ``.symtab_shndx``.
    shndx: int


@dataclass(frozen=True, slots=True)
class ElfNote:
    name: str
    type: int
    desc: bytes


def is_elf(data: bytes) -> bool:
    return data[:4] == ELF_MAGIC


def _cstr(blob: bytes, off: int, what: str) -> str:
    if not 0 <= off < len(blob):
        if off == 0 and not blob:
            return ""
        raise ElfError(f"{what}: string offset {off:#x} outside a {len(blob)}-byte string table")
    end = blob.find(b"\0", off)
    if end < 0:
        end = len(blob)
    return blob[off:end].decode("utf-8", "replace")


class ElfFile:
    """A parsed ELF64 LE file. Construct with :func:`parse_elf`."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        if len(data) < _EHDR.size:
            raise ElfError(f"ELF header needs {_EHDR.size} bytes, got {len(data)}")
        (
            ident,
            self.e_type,
            self.e_machine,
            self.e_version,
            self.e_entry,
            self.e_phoff,
            e_shoff,
            self.e_flags,
            _ehsize,
            _phentsize,
            _phnum,
            shentsize,
            shnum,
            shstrndx,
        ) = _EHDR.unpack_from(data, 0)
        if ident[:4] != ELF_MAGIC:
            raise ElfError(f"bad ELF magic {ident[:4]!r} at offset 0")
        if ident[4] != 2:
            raise ElfError(f"ELF class {ident[4]} at offset 0x4 is not ELFCLASS64 (2)")
        if ident[5] != 1:
            raise ElfError(f"ELF data encoding {ident[5]} at offset 0x5 is not little-endian")
        self.osabi = ident[7]
        self.abi_version = ident[8]
        self.sections = self._read_sections(e_shoff, shentsize, shnum, shstrndx)
        self._by_name: dict[str, ElfSection] = {}
        for sec in self.sections:
            self._by_name.setdefault(sec.name, sec)
        self._symbols: list[ElfSymbol] | None = None

    # -- sections -------------------------------------------------------------------------

    def _read_sections(
        self, shoff: int, shentsize: int, shnum: int, shstrndx: int
    ) -> list[ElfSection]:
        data = self.data
        if shoff == 0:
            return []
        if shentsize != _SHDR.size:
            raise ElfError(f"e_shentsize {shentsize} at offset 0x3a is not {_SHDR.size}")
        if shoff + _SHDR.size > len(data):
            raise ElfError(f"section header table at {shoff:#x} lies past the end ({len(data)})")
        first = _SHDR.unpack_from(data, shoff)
        if shnum == 0:  # extended numbering: the count lives in section 0's sh_size
            shnum = first[5]
        if shstrndx == SHN_XINDEX:
            shstrndx = first[6]
        if shoff + shnum * _SHDR.size > len(data):
            raise ElfError(
                f"{shnum} section headers at {shoff:#x} run past the end of the {len(data)}-byte "
                "file"
            )
        raw = [_SHDR.unpack_from(data, shoff + i * _SHDR.size) for i in range(shnum)]
        names = b""
        if 0 < shstrndx < shnum:
            _n, stype, _f, _a, off, size, *_rest = raw[shstrndx]
            if stype != SHT_NOBITS:
                names = self._slice(off, size, f"section-name table (section {shstrndx})")
        elif shstrndx != 0:
            raise ElfError(f"e_shstrndx {shstrndx} is not below the section count {shnum}")
        out: list[ElfSection] = []
        for i, (name, stype, flags, addr, off, size, link, info, align, entsize) in enumerate(raw):
            sname = _cstr(names, name, f"section {i} name") if names else ""
            out.append(
                ElfSection(i, sname, stype, flags, addr, off, size, link, info, align, entsize)
            )
        return out

    def _slice(self, off: int, size: int, what: str) -> bytes:
        if off + size > len(self.data):
            raise ElfError(
                f"{what}: {size} bytes at offset {off:#x} run past the end of the "
                f"{len(self.data)}-byte file"
            )
        return self.data[off : off + size]

    def section(self, name: str) -> ElfSection | None:
        """First section called ``name``."""
        return self._by_name.get(name)

    def section_at(self, index: int) -> ElfSection | None:
        return self.sections[index] if 0 <= index < len(self.sections) else None

    def section_data(self, sec: ElfSection) -> bytes:
        """File bytes of ``sec`` (empty for NOBITS); raises if they lie outside the file."""
        if not sec.has_file_data:
            return b""
        return self._slice(sec.offset, sec.size, f"section {sec.index} ({sec.name})")

    # -- symbols --------------------------------------------------------------------------

    @property
    def symbols(self) -> list[ElfSymbol]:
        """Entries of the first SHT_SYMTAB section, index 0 included."""
        if self._symbols is None:
            self._symbols = self._read_symbols()
        return self._symbols

    def _read_symbols(self) -> list[ElfSymbol]:
        symtab = next((s for s in self.sections if s.type == SHT_SYMTAB), None)
        if symtab is None:
            return []
        if symtab.entsize not in (0, _SYM.size):
            raise ElfError(f"symbol table entry size {symtab.entsize} is not {_SYM.size}")
        blob = self.section_data(symtab)
        strsec = self.section_at(symtab.link)
        if strsec is None:
            raise ElfError(f"symbol table links to missing string table {symtab.link}")
        strings = self.section_data(strsec)
        shndx_tab = next(
            (s for s in self.sections if s.type == SHT_SYMTAB_SHNDX and s.link == symtab.index),
            None,
        )
        xindex = self.section_data(shndx_tab) if shndx_tab is not None else b""
        out: list[ElfSymbol] = []
        for i in range(len(blob) // _SYM.size):
            name, info, other, shndx, value, size = _SYM.unpack_from(blob, i * _SYM.size)
            if shndx == SHN_XINDEX:
                if 4 * i + 4 > len(xindex):
                    raise ElfError(f"symbol {i} uses SHN_XINDEX but .symtab_shndx has no entry")
                (shndx,) = struct.unpack_from("<I", xindex, 4 * i)
            sname = _cstr(strings, name, f"symbol {i} name")
            out.append(ElfSymbol(i, sname, value, size, info & 0xF, info >> 4, other, shndx))
        return out

    # -- notes ----------------------------------------------------------------------------

    def notes(self, sec: ElfSection) -> list[ElfNote]:
        """Notes in a SHT_NOTE section (4-byte aligned name and descriptor)."""
        blob = self.section_data(sec)
        out: list[ElfNote] = []
        off = 0
        while off + 12 <= len(blob):
            namesz, descsz, ntype = struct.unpack_from("<III", blob, off)
            name_off = off + 12
            desc_off = name_off + ((namesz + 3) & ~3)
            end = desc_off + ((descsz + 3) & ~3)
            if desc_off + descsz > len(blob):
                raise ElfError(
                    f"note at offset {sec.offset + off:#x} in {sec.name} runs past its section"
                )
            name = blob[name_off : name_off + namesz].rstrip(b"\0").decode("utf-8", "replace")
            out.append(ElfNote(name, ntype, blob[desc_off : desc_off + descsz]))
            off = end
        return out


def parse_elf(data: bytes) -> ElfFile:
    """Parse the ELF64 LE header and section table of ``data``."""
    return ElfFile(data)
