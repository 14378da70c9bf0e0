"""CUDA cubin (EM_CUDA ELF) reader: kernels, parameter layouts, resources and globals.

Why: ``cuLaunchKernel`` receives one pointer per argument and nothing else; to forward a
launch the daemon must know each kernel's parameter offsets and sizes, and to serve
``cuModuleGetGlobal`` / ``cuFuncGetAttribute`` without a GPU it must know globals, shared
memory and registers. All of that is in the cubin's ``.nv.info*`` sections (format in
``shared/reference/cuda-driver-shim-facts.md`` section 4). Findings beyond that file,
observed with nvcc 13.0:

* parameters bigger than the KPARAM_INFO size field use EIATTR_KPARAM_INFO_V2 (0x45):
  same 12 bytes, but the last word holds the size in its low 24 bits (flags in the top
  byte, e.g. 0x05 for pointers on sm_100);
* on sm_90 and later every ``.nv.shared.<kernel>`` section includes a reserved prefix of
  1 KiB (the symbol ``.nv.reservedSmem.cap`` holds its size on sm_100+); ptxas -v and the
  user see the size without it, which is what ``static_shared_bytes`` reports;
* from sm_90 on, the ``.text.<kernel>`` sh_info no longer carries the register count in its
  top byte; EIATTR_REGCOUNT in ``.nv.info`` does, on every architecture;
* arch-specific cubins (``sm_90a``) have the same ``e_flags`` as plain ones; the suffix is
  only in the ``.note.nv.tkinfo`` ptxas options (``-arch sm_90a``) and, for ``a``, in
  ``.nv.compat`` attribute 9. A fatbin entry's flags are the better source;
* with ELF ABI 8 ``e_flags`` no longer carry the virtual architecture the SASS was compiled
  from: the ``.note.nv.cuinfo`` note (type 1000) does, as a u16 after a u16 version (2),
  followed by the toolkit version as a u32 (130 for CUDA 13.0). A cubin built with
  ``-gencode arch=compute_80,code=sm_90`` says 80 there; cuFuncGetAttribute's PTX_VERSION
  reports it, and CUB checks it against the architectures it was compiled for.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from crane.modules.arch import Arch
from crane.modules.elf import SHN_LORESERVE, SHN_UNDEF, SHT_NOTE, ElfError, ElfFile, ElfSection
from crane.modules.errors import CubinError

#: ``.note.nv.cuinfo`` note type: toolkit and virtual-architecture record.
_NOTE_CUINFO = 1000

__all__ = [
    "EM_CUDA",
    "Cubin",
    "CubinError",
    "CubinGlobal",
    "CubinKernel",
    "InfoRecord",
    "KernelParam",
    "is_cubin",
    "parse_cubin",
    "parse_nv_info",
]

EM_CUDA = 190
ET_REL = 1
ET_EXEC = 2
STT_OBJECT = 1
STT_FUNC = 2
STT_CUDA_OBJECT = 13  # data symbols in relocatable (-rdc) cubins
STO_CUDA_ENTRY = 0x10
STO_CUDA_MANAGED = 0x04  # observed on __managed__ variables (0x04 exec, 0x24 -rdc)
SHT_CUDA_INFO = 0x70000000

# .nv.info record formats
EIFMT_NVAL = 1
EIFMT_BVAL = 2
EIFMT_HVAL = 3
EIFMT_SVAL = 4

# .nv.info attributes used here
EIATTR_MAX_THREADS = 0x05
EIATTR_PARAM_CBANK = 0x0A
EIATTR_REQNTID = 0x10
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_MAXREG_COUNT = 0x1B
EIATTR_REGCOUNT = 0x2F
EIATTR_KPARAM_INFO_V2 = 0x45
EIATTR_NUM_BARRIERS = 0x4C
COMPAT_ARCH_SPECIFIC = 0x09  # .nv.compat attribute: 1 for sm_XXa cubins

#: Reserved shared memory ptxas puts at the start of each kernel's shared window on sm_90
#: when the cubin has no ``.nv.reservedSmem.cap`` symbol saying otherwise.
_SM90_RESERVED_SMEM = 1024

_CONST_BANK_RE = re.compile(r"^\.nv\.constant(\d+)$")
_TK_ARCH_RE = re.compile(r"-arch[= ]+sm_(\d+)([af]?)\b")


@dataclass(frozen=True, slots=True)
class InfoRecord:
    """One ``.nv.info`` record: format, attribute, and value (int for B/HVAL, bytes for SVAL)."""

    fmt: int
    attr: int
    value: int | bytes


@dataclass(frozen=True, slots=True)
class KernelParam:
    """One kernel parameter from EIATTR_KPARAM_INFO(_V2)."""

    ordinal: int
    offset: int
    size: int
    #: The raw packed word (size, alignment, space, cbank bits) as stored.
    flags: int


@dataclass(frozen=True, slots=True)
class CubinKernel:
    name: str
    symbol_index: int
    section_index: int
    code_size: int
    #: Parameters by ordinal, or ``None`` when the cubin has parameter bytes but no
    #: KPARAM_INFO records to lay them out (then the PTX must be used).
    params: tuple[KernelParam, ...] | None
    #: Total bytes of the parameter buffer (CBANK_PARAM_SIZE).
    param_bytes: int
    #: Where the parameters start in constant bank 0 (0x160 sm_75/80, 0x210 sm_90, ...).
    param_cbank_offset: int | None
    #: User-visible static shared memory (``None`` when it is only known after linking).
    static_shared_bytes: int | None
    #: Size of the ``.nv.shared.<kernel>`` section as stored (reserved prefix included).
    shared_section_bytes: int
    reserved_shared_bytes: int
    num_regs: int | None
    frame_size: int | None
    min_stack_size: int | None
    max_threads: tuple[int, int, int] | None
    req_threads: tuple[int, int, int] | None
    max_reg_count: int | None
    num_barriers: int | None
    records: tuple[InfoRecord, ...] = field(repr=False, default=())

    @property
    def max_threads_per_block(self) -> int | None:
        """Launch-bound limit from ``__launch_bounds__`` / ``.maxntid`` / ``.reqntid``."""
        dims = self.req_threads or self.max_threads
        if dims is None:
            return None
        return dims[0] * dims[1] * dims[2]

    @property
    def layout(self) -> tuple[tuple[int, int], ...] | None:
        if self.params is None:
            return None
        return tuple((p.offset, p.size) for p in self.params)


@dataclass(frozen=True, slots=True)
class CubinGlobal:
    """A module-scope variable, as ``cuModuleGetGlobal`` sees it."""

    name: str
    size: int
    #: ``"global"`` (``.nv.global*``) or ``"const"`` (``.nv.constantN``).
    space: str
    section: str
    offset: int
    #: Initial bytes, or ``None`` when the variable starts zero-filled.
    init: bytes | None
    managed: bool = False


@dataclass(frozen=True, slots=True)
class Cubin:
    elf_type: int
    e_flags: int
    abi_version: int
    sm: int
    arch: Arch
    #: ptxas options recorded in ``.note.nv.tkinfo`` (e.g. ``"-arch sm_90a -m 64 "``).
    tool_options: str | None
    kernels: dict[str, CubinKernel]
    globals: dict[str, CubinGlobal]
    elf: ElfFile = field(repr=False)
    #: The virtual architecture (compute_XY, as XY) the code was compiled from, when recorded.
    virtual_sm: int | None = None

    @property
    def relocatable(self) -> bool:
        return self.elf_type == ET_REL


def is_cubin(data: bytes) -> bool:
    """Whether ``data`` is an ELF64 LE file for EM_CUDA (header check only)."""
    return (
        len(data) >= 20
        and data[:4] == b"\x7fELF"
        and data[4] == 2
        and struct.unpack_from("<H", data, 18)[0] == EM_CUDA
    )


def parse_nv_info(blob: bytes, where: str) -> list[InfoRecord]:
    """Decode a ``.nv.info*`` section into records."""
    out: list[InfoRecord] = []
    off = 0
    while off < len(blob):
        if off + 4 > len(blob):
            raise CubinError(f"{where}: truncated record at offset {off:#x}")
        fmt, attr = blob[off], blob[off + 1]
        if fmt == EIFMT_SVAL:
            (length,) = struct.unpack_from("<H", blob, off + 2)
            if off + 4 + length > len(blob):
                raise CubinError(
                    f"{where}: record {attr:#x} at offset {off:#x} declares {length} bytes, "
                    f"only {len(blob) - off - 4} left"
                )
            value: int | bytes = blob[off + 4 : off + 4 + length]
            off += 4 + length
        elif fmt == EIFMT_HVAL:
            (value,) = struct.unpack_from("<H", blob, off + 2)
            off += 4
        elif fmt == EIFMT_BVAL:
            value = blob[off + 2]
            off += 4
        elif fmt == EIFMT_NVAL:
            value = 0
            off += 4
        else:
            raise CubinError(f"{where}: unknown record format {fmt} at offset {off:#x}")
        out.append(InfoRecord(fmt, attr, value))
    return out


def parse_cubin(data: bytes) -> Cubin:
    """Parse a CUDA ELF (executable or relocatable)."""
    try:
        return _parse(data)
    except CubinError:
        raise
    except ElfError as exc:
        raise CubinError(f"malformed cubin: {exc}") from None


def _parse(data: bytes) -> Cubin:
    elf = ElfFile(data)
    if elf.e_machine != EM_CUDA:
        raise CubinError(
            f"ELF e_machine is {elf.e_machine}, not EM_CUDA ({EM_CUDA}): not a cubin"
            + (
                "; a host program? its GPU code is in the .nv_fatbin section"
                if elf.e_machine == 62
                else ""
            )
        )
    if elf.e_type not in (ET_REL, ET_EXEC):
        raise CubinError(f"cubin e_type {elf.e_type} is neither relocatable (1) nor executable (2)")
    sm = (
        (elf.e_flags >> 8) & 0xFF
        if elf.abi_version >= 8 or elf.osabi == 0x41
        else (elf.e_flags & 0xFF)
    )
    tool_options = _tool_options(elf)
    arch = Arch(sm, _arch_suffix(elf, sm, tool_options))
    per_symbol = _global_info(elf)
    kernels = _kernels(elf, per_symbol)
    return Cubin(
        elf_type=elf.e_type,
        e_flags=elf.e_flags,
        abi_version=elf.abi_version,
        sm=sm,
        arch=arch,
        tool_options=tool_options,
        kernels=kernels,
        globals=_globals(elf),
        elf=elf,
        virtual_sm=_virtual_sm(elf),
    )


def _virtual_sm(elf: ElfFile) -> int | None:
    """The compute_XY the SASS was compiled from: ``.note.nv.cuinfo`` (see the module doc)."""
    sec = elf.section(".note.nv.cuinfo")
    if sec is None or sec.type != SHT_NOTE:
        return None
    for note in elf.notes(sec):
        if note.type == _NOTE_CUINFO and len(note.desc) >= 4:
            version, sm = struct.unpack_from("<HH", note.desc, 0)
            if version >= 2 and sm:
                return sm
    return None


def _tool_options(elf: ElfFile) -> str | None:
    sec = elf.section(".note.nv.tkinfo")
    if sec is None or sec.type != SHT_NOTE:
        return None
    for note in elf.notes(sec):
        desc = note.desc
        if len(desc) < 24:
            continue
        words = struct.unpack_from("<6I", desc, 0)
        strings = desc[24:]
        off = words[5]
        if off >= len(strings):
            continue
        end = strings.find(b"\0", off)
        return strings[off : end if end >= 0 else len(strings)].decode("utf-8", "replace")
    return None


def _arch_suffix(elf: ElfFile, sm: int, tool_options: str | None) -> str:
    if tool_options:
        m = _TK_ARCH_RE.search(tool_options)
        if m and int(m.group(1)) == sm:
            return m.group(2)
    compat = elf.section(".nv.compat")
    if compat is not None:
        for rec in parse_nv_info(elf.section_data(compat), ".nv.compat"):
            if rec.attr == COMPAT_ARCH_SPECIFIC and rec.fmt == EIFMT_BVAL and rec.value == 1:
                return "a"
    return ""


def _u32_pair(rec: InfoRecord) -> tuple[int, int] | None:
    if isinstance(rec.value, bytes) and len(rec.value) >= 8:
        a, b = struct.unpack_from("<II", rec.value, 0)
        return a, b
    return None


def _global_info(elf: ElfFile) -> dict[int, dict[int, int]]:
    """``.nv.info`` records keyed by symbol index: {symbol: {attribute: value}}."""
    sec = elf.section(".nv.info")
    out: dict[int, dict[int, int]] = {}
    if sec is None:
        return out
    for rec in parse_nv_info(elf.section_data(sec), ".nv.info"):
        if rec.attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE):
            pair = _u32_pair(rec)
            if pair is not None:
                out.setdefault(pair[0], {})[rec.attr] = pair[1]
    return out


def _dims(rec: InfoRecord, where: str) -> tuple[int, int, int]:
    if not isinstance(rec.value, bytes) or len(rec.value) < 12:
        raise CubinError(f"{where}: attribute {rec.attr:#x} is not a 12-byte (x, y, z) record")
    x, y, z = struct.unpack_from("<III", rec.value, 0)
    return x, y, z


def _reserved_shared(elf: ElfFile) -> int:
    names = {s.name: s for s in elf.symbols}
    cap = names.get(".nv.reservedSmem.cap")
    if cap is not None:
        return cap.value
    if ".nv.reservedSmem.offset0" in names or elf.section(".nv.shared.reserved.0") is not None:
        return _SM90_RESERVED_SMEM
    return 0


def _module_scope_shared(elf: ElfFile, kernel_sections: set[int]) -> bool:
    """Whether a relocatable cubin defines shared variables outside any kernel's section."""
    for sym in elf.symbols:
        if (
            sym.type in (STT_OBJECT, STT_CUDA_OBJECT)
            and sym.other & 0x40
            and SHN_UNDEF < sym.shndx < SHN_LORESERVE
            and sym.shndx not in kernel_sections
        ):
            return True
    return False


def _kernels(elf: ElfFile, per_symbol: dict[int, dict[int, int]]) -> dict[str, CubinKernel]:
    info_by_text: dict[int, ElfSection] = {}
    shared_by_text: dict[int, ElfSection] = {}
    for sec in elf.sections:
        if sec.name.startswith(".nv.info.") and sec.info:
            info_by_text.setdefault(sec.info, sec)
        elif sec.name.startswith(".nv.shared.") and sec.info:
            shared_by_text.setdefault(sec.info, sec)
    entries = [
        s
        for s in elf.symbols
        if s.type == STT_FUNC and s.other & STO_CUDA_ENTRY and SHN_UNDEF < s.shndx < SHN_LORESERVE
    ]
    reserved = _reserved_shared(elf)
    shared_unknown = elf.e_type == ET_REL and _module_scope_shared(
        elf, {sec.index for sec in shared_by_text.values()}
    )
    kernels: dict[str, CubinKernel] = {}
    for sym in entries:
        text = elf.section_at(sym.shndx)
        if text is None:
            raise CubinError(f"kernel {sym.name!r}: symbol section {sym.shndx} does not exist")
        info_sec = info_by_text.get(text.index) or elf.section(f".nv.info.{sym.name}")
        records: list[InfoRecord] = []
        if info_sec is not None:
            records = parse_nv_info(elf.section_data(info_sec), info_sec.name)
        shared_sec = shared_by_text.get(text.index) or elf.section(f".nv.shared.{sym.name}")
        shared_raw = shared_sec.size if shared_sec is not None else 0
        kreserved = reserved if shared_raw >= reserved else 0
        static_shared: int | None = shared_raw - kreserved
        if shared_unknown:
            static_shared = None
        gl = per_symbol.get(sym.index, {})
        num_regs = gl.get(EIATTR_REGCOUNT)
        if num_regs is None and text.info >> 24:
            num_regs = text.info >> 24
        kernels[sym.name] = _kernel_from_records(
            sym.name,
            records,
            symbol_index=sym.index,
            section_index=text.index,
            code_size=sym.size or text.size,
            static_shared=static_shared,
            shared_raw=shared_raw,
            reserved=kreserved,
            num_regs=num_regs,
            frame_size=gl.get(EIATTR_FRAME_SIZE),
            min_stack=gl.get(EIATTR_MIN_STACK_SIZE),
        )
    return kernels


def _kernel_from_records(
    name: str,
    records: list[InfoRecord],
    *,
    symbol_index: int,
    section_index: int,
    code_size: int,
    static_shared: int | None,
    shared_raw: int,
    reserved: int,
    num_regs: int | None,
    frame_size: int | None,
    min_stack: int | None,
) -> CubinKernel:
    where = f"kernel {name!r} .nv.info"
    params: dict[int, KernelParam] = {}
    cbank_size: int | None = None
    cbank_offset: int | None = None
    cbank_total: int | None = None
    max_threads = req_threads = None
    max_reg = barriers = None
    for rec in records:
        if rec.attr in (EIATTR_KPARAM_INFO, EIATTR_KPARAM_INFO_V2):
            if not isinstance(rec.value, bytes) or len(rec.value) < 12:
                raise CubinError(f"{where}: KPARAM_INFO record is not 12 bytes")
            _index, ordinal, offset, word = struct.unpack_from("<IHHI", rec.value, 0)
            size = word >> 18 if rec.attr == EIATTR_KPARAM_INFO else word & 0xFFFFFF
            if ordinal in params:
                raise CubinError(f"{where}: parameter ordinal {ordinal} described twice")
            params[ordinal] = KernelParam(ordinal, offset, size, word)
        elif rec.attr == EIATTR_CBANK_PARAM_SIZE and rec.fmt == EIFMT_HVAL:
            assert isinstance(rec.value, int)
            cbank_size = rec.value
        elif rec.attr == EIATTR_PARAM_CBANK:
            if isinstance(rec.value, bytes) and len(rec.value) >= 8:
                _sym, cbank_offset, cbank_total = struct.unpack_from("<IHH", rec.value, 0)
        elif rec.attr == EIATTR_MAX_THREADS:
            max_threads = _dims(rec, where)
        elif rec.attr == EIATTR_REQNTID:
            req_threads = _dims(rec, where)
        elif rec.attr == EIATTR_MAXREG_COUNT and isinstance(rec.value, int):
            max_reg = rec.value
        elif rec.attr == EIATTR_NUM_BARRIERS and isinstance(rec.value, int):
            barriers = rec.value
    ordered: tuple[KernelParam, ...] | None = tuple(params[k] for k in sorted(params))
    if params and sorted(params) != list(range(len(params))):
        raise CubinError(
            f"{where}: KPARAM_INFO ordinals {sorted(params)} are not 0..{len(params) - 1}"
        )
    computed = max((p.offset + p.size for p in params.values()), default=0)
    param_bytes = cbank_size if cbank_size is not None else cbank_total
    if param_bytes is None:
        param_bytes = computed
    if computed > param_bytes:
        raise CubinError(
            f"{where}: parameters end at byte {computed} but the parameter buffer is "
            f"{param_bytes} bytes"
        )
    if not params and param_bytes:
        ordered = None  # parameter bytes exist but nothing describes them
    return CubinKernel(
        name=name,
        symbol_index=symbol_index,
        section_index=section_index,
        code_size=code_size,
        params=ordered,
        param_bytes=param_bytes,
        param_cbank_offset=cbank_offset,
        static_shared_bytes=static_shared,
        shared_section_bytes=shared_raw,
        reserved_shared_bytes=reserved,
        num_regs=num_regs,
        frame_size=frame_size,
        min_stack_size=min_stack,
        max_threads=max_threads,
        req_threads=req_threads,
        max_reg_count=max_reg,
        num_barriers=barriers,
        records=tuple(records),
    )


def _globals(elf: ElfFile) -> dict[str, CubinGlobal]:
    out: dict[str, CubinGlobal] = {}
    for sym in elf.symbols:
        if sym.type not in (STT_OBJECT, STT_CUDA_OBJECT) or not sym.name:
            continue
        if not SHN_UNDEF < sym.shndx < SHN_LORESERVE:
            continue
        sec = elf.section_at(sym.shndx)
        if sec is None:
            raise CubinError(f"global {sym.name!r}: section {sym.shndx} does not exist")
        bank = _CONST_BANK_RE.match(sec.name)
        if sec.name in (".nv.global", ".nv.global.init"):
            space = "global"
        elif bank is not None and bank.group(1) != "0":
            space = "const"
        else:
            continue
        if sym.value + sym.size > sec.size:
            raise CubinError(
                f"global {sym.name!r}: {sym.size} bytes at {sym.value:#x} run past section "
                f"{sec.name} ({sec.size} bytes)"
            )
        init: bytes | None = None
        if sec.name != ".nv.global":
            blob = elf.section_data(sec)
            if len(blob) >= sym.value + sym.size:
                init = blob[sym.value : sym.value + sym.size]
                if not any(init):
                    init = None
        out.setdefault(
            sym.name,
            CubinGlobal(
                name=sym.name,
                size=sym.size,
                space=space,
                section=sec.name,
                offset=sym.value,
                init=init,
                managed=bool(sym.other & STO_CUDA_MANAGED),
            ),
        )
    return out
