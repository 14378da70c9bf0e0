"""The one entry point a daemon or worker uses to understand a module image.

Why: ``cuModuleLoadData`` / ``cuLibraryLoadData`` accept a fatbin, a bare cubin or PTX
text, and the daemon must answer the same questions for all three — which code runs on
this device, what kernels exist and how their arguments are packed, which globals
``cuModuleGetGlobal`` can return, and whether there is PTX a simulated GPU can execute.
:func:`inspect_image` answers them in one call and turns every kind of malformed or
unusable input into an :class:`ImageError` (or its subclass :class:`NoCompatibleCode`)
with a message fit to show a user.

Layouts come from cubin KPARAM_INFO when a cubin is chosen; when the image also carries
PTX for the device, the PTX layouts are computed too and must agree (a disagreement would
mean arguments get packed wrongly on one of the two paths, so it is an error).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from crane.modules.arch import cc_to_sm, format_cc
from crane.modules.cubin import Cubin, is_cubin, parse_cubin
from crane.modules.elf import is_elf
from crane.modules.errors import FatbinError, ImageError, NoCompatibleCode, PtxImageError
from crane.modules.fatbin import (
    WRAPPER_MAGIC,
    FatbinEntry,
    describe_entries,
    is_fatbin,
    no_compatible_code,
    parse_fatbin,
    parse_fatbin_headers,
    select_entry,
    select_ptx,
)
from crane.modules.ptx_info import PtxModule, PtxReloc, is_ptx, scan_ptx

__all__ = [
    "GlobalInfo",
    "ImageError",
    "KernelInfo",
    "ModuleImage",
    "NoCompatibleCode",
    "inspect_image",
    "inspect_images",
]


@dataclass(frozen=True, slots=True)
class KernelInfo:
    name: str
    #: (offset, size) of each parameter in the packed argument buffer, in order.
    params: tuple[tuple[int, int], ...]
    param_bytes: int
    #: Static shared memory the user declared; ``None`` only for relocatable cubins whose
    #: module-scope shared variables are placed at link time and no PTX says otherwise.
    static_shared_bytes: int | None
    #: Launch-bound limit (``__launch_bounds__``, ``.maxntid``, ``.reqntid``), else ``None``.
    max_threads_per_block: int | None
    #: Registers per thread, when a cubin says (PTX does not).
    num_regs: int | None
    #: Where ``params`` came from: ``"cubin"`` (KPARAM_INFO) or ``"ptx"``.
    layout_source: str
    #: Compiled cluster shape (``__cluster_dims__``: PTX ``.reqnctapercluster``), else None.
    cluster_dims: tuple[int, int, int] | None = None


@dataclass(frozen=True, slots=True)
class GlobalInfo:
    """A module-scope ``__device__`` / ``__constant__`` variable."""

    name: str
    size: int
    #: Initial bytes, or ``None`` when the variable starts zero-filled.
    init: bytes | None
    #: ``"global"`` or ``"const"``.
    space: str
    #: Address initializers (PTX only; a cubin's are applied by the real driver).
    relocs: tuple[PtxReloc, ...] = ()


@dataclass(frozen=True, slots=True)
class ModuleImage:
    #: What was chosen for the device: ``"cubin"`` or ``"ptx"``.
    kind: str
    #: The chosen code: cubin bytes or PTX text.
    code: bytes | str
    #: Architecture of the chosen code, e.g. ``"sm_80"`` or ``"compute_75"``.
    arch: str
    #: PTX the device can run, when the image has any (even if a cubin was chosen).
    ptx: str | None
    kernels: dict[str, KernelInfo]
    globals: dict[str, GlobalInfo]
    sha256: str
    description: str
    #: What the input was: ``"fatbin"``, ``"cubin"`` or ``"ptx"``.
    container: str
    #: The chosen cubin is relocatable (-rdc): it needs linking before a driver loads it.
    relocatable: bool = False
    #: cuFuncGetAttribute's PTX_VERSION for its kernels: the virtual architecture (compute_XY,
    #: as XY) the code running on the device was compiled from; BINARY_VERSION: the
    #: architecture of that code (a cubin's sm_XY, or the device's own when PTX is JIT-ed).
    ptx_version: int = 0
    binary_version: int = 0
    cubin_info: Cubin | None = field(default=None, repr=False, compare=False)
    ptx_info: PtxModule | None = field(default=None, repr=False, compare=False)


def inspect_image(data: bytes, cc: tuple[int, int]) -> ModuleImage:
    """Identify ``data`` (fatbin, cubin or PTX), pick the code for a ``cc`` device, describe it.

    A blob of several concatenated fatbins (a program's ``.nv_fatbin`` section) is accepted
    when exactly one of them defines kernels or globals (the others are nvlink stubs); if
    several do, they are separate modules: use :func:`inspect_images`.
    """
    data = bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    if is_fatbin(data):
        images = _fatbin_images(data, cc, digest)
        if len(images) > 1:
            names = "; ".join(
                f"{img.description.split(':', 1)[0]} defines "
                f"{', '.join(sorted(img.kernels)) or 'globals only'}"
                for img in images
            )
            raise ImageError(
                f"the blob holds {len(images)} fatbins with code, each a separate module: "
                f"{names}; load them one at a time (inspect_images / split_fatbins)"
            )
        return images[0]
    return _single_image(data, cc, digest)


def inspect_images(data: bytes, cc: tuple[int, int]) -> list[ModuleImage]:
    """One :class:`ModuleImage` per fatbin in ``data`` that defines kernels or globals."""
    data = bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    if is_fatbin(data):
        return _fatbin_images(data, cc, digest)
    return [_single_image(data, cc, digest)]


# -- dispatch ---------------------------------------------------------------------------------


def _single_image(data: bytes, cc: tuple[int, int], digest: str) -> ModuleImage:
    if len(data) >= 4 and struct.unpack_from("<I", data, 0)[0] == WRAPPER_MAGIC:
        raise ImageError(
            "input is a __fatBinC_Wrapper_t (magic 0x466243b1), which only holds pointers; "
            "copy the fatbin its data pointer names (fatbin_total_size gives the length)"
        )
    if is_elf(data):
        if not is_cubin(data):
            parse_cubin(data)  # raises a CubinError naming the machine / problem
        return _cubin_image(data, cc, digest)
    text = _as_text(data)
    if text is not None and is_ptx(text):
        return _ptx_image(text, cc, digest)
    head = data[:8].hex(" ")
    raise ImageError(
        f"unrecognised module image ({len(data)} bytes, starts {head or 'empty'}): not a fatbin "
        "(magic 50 ed 55 ba), a CUDA ELF (7f 45 4c 46, e_machine 190) or PTX text "
        "(starting with .version)"
    )


def _as_text(data: bytes) -> str | None:
    try:
        return data.rstrip(b"\0").decode("utf-8")
    except UnicodeDecodeError:
        return None


def _cubin_image(data: bytes, cc: tuple[int, int], digest: str) -> ModuleImage:
    cubin = parse_cubin(data)
    label = f"{cubin.arch.cubin_name()} cubin"
    if not cubin.arch.cubin_runs_on(cc):
        raise no_compatible_code(label, cc)
    kernels = _cubin_kernels(cubin, None)
    globals_ = _cubin_globals(cubin)
    desc = (
        f"cubin: {label}{' (relocatable)' if cubin.relocatable else ''}, {len(data)} B; "
        f"{_counts(kernels, globals_)}"
    )
    return ModuleImage(
        kind="cubin",
        code=data,
        arch=cubin.arch.cubin_name(),
        ptx=None,
        kernels=kernels,
        globals=globals_,
        sha256=digest,
        description=desc,
        container="cubin",
        relocatable=cubin.relocatable,
        cubin_info=cubin,
        ptx_version=cubin.virtual_sm or cubin.sm,
        binary_version=cubin.sm,
    )


def _ptx_image(text: str, cc: tuple[int, int], digest: str) -> ModuleImage:
    module = scan_ptx(text)
    label = f"{module.arch.ptx_name()} PTX"
    if not module.arch.ptx_runs_on(cc):
        raise no_compatible_code(label, cc)
    kernels = _ptx_kernels(module)
    globals_ = _ptx_globals(module)
    desc = (
        f"ptx: {label} (ISA {module.version[0]}.{module.version[1]}), {len(text)} chars; "
        f"{_counts(kernels, globals_)}"
    )
    return ModuleImage(
        kind="ptx",
        code=text,
        arch=module.arch.ptx_name(),
        ptx=text,
        kernels=kernels,
        globals=globals_,
        sha256=digest,
        description=desc,
        container="ptx",
        ptx_info=module,
        ptx_version=module.arch.sm,
        binary_version=cc_to_sm(cc),  # JIT-compiled for the device
    )


# -- fatbins ----------------------------------------------------------------------------------


def _fatbin_images(data: bytes, cc: tuple[int, int], digest: str) -> list[ModuleImage]:
    headers = parse_fatbin_headers(data)
    entries = parse_fatbin(data)
    groups: list[list[FatbinEntry]] = [[] for _ in headers]
    for e in entries:
        groups[e.fatbin_index].append(e)
    if len(groups) == 1:
        return [_fatbin_image(groups[0], cc, digest, f"fatbin at {headers[0].offset:#x}")]
    images: list[ModuleImage] = []
    skipped: list[str] = []
    for hdr, group in zip(headers, groups, strict=True):
        where = f"fatbin at {hdr.offset:#x}"
        if not _defines_anything(group):
            skipped.append(f"{where} ({describe_entries(group)}) defines nothing")
            continue
        images.append(_fatbin_image(group, cc, digest, where))
    if not images:
        raise ImageError(
            f"none of the {len(headers)} fatbins in the blob defines a kernel or global: "
            + "; ".join(skipped)
        )
    if skipped:
        note = f" [{len(headers)} fatbins in blob; skipped: " + "; ".join(skipped) + "]"
        images = [_with_description(img, img.description + note) for img in images]
    return images


def _defines_anything(group: Sequence[FatbinEntry]) -> bool:
    for e in group:
        if e.is_elf:
            cubin = parse_cubin(e.data)
            if cubin.kernels or cubin.globals:
                return True
        elif e.is_ptx:
            module = scan_ptx(e.ptx_text)
            if module.entries or _ptx_globals(module):
                return True
    return False


def _fatbin_image(
    group: Sequence[FatbinEntry], cc: tuple[int, int], digest: str, where: str
) -> ModuleImage:
    chosen = select_entry(group, cc)
    ptx_entry = select_ptx(group, cc)
    ptx_text = ptx_entry.ptx_text if ptx_entry is not None else None
    ptx_module = _scan_entry_ptx(ptx_entry) if ptx_entry is not None else None
    contents = ", ".join(_entry_summary(e) for e in group)
    if chosen.is_elf:
        cubin = _parse_entry_cubin(chosen)
        kernels = _cubin_kernels(cubin, ptx_module)
        globals_ = _cubin_globals(cubin)
        code: bytes | str = chosen.data
        kind, relocatable = "cubin", cubin.relocatable
        ptx_version, binary_version = cubin.virtual_sm or cubin.sm, cubin.sm
    else:
        assert ptx_module is not None and ptx_text is not None
        cubin = None
        kernels = _ptx_kernels(ptx_module)
        globals_ = _ptx_globals(ptx_module)
        code, kind, relocatable = ptx_text, "ptx", False
        ptx_version, binary_version = ptx_module.arch.sm, cc_to_sm(cc)
    desc = (
        f"{where}: {contents}; chose {chosen.label} for {format_cc(cc)} device; "
        f"{_counts(kernels, globals_)}"
    )
    return ModuleImage(
        kind=kind,
        code=code,
        arch=chosen.arch.cubin_name() if chosen.is_elf else chosen.arch.ptx_name(),
        ptx=ptx_text,
        kernels=kernels,
        globals=globals_,
        sha256=digest,
        description=desc,
        container="fatbin",
        relocatable=relocatable,
        cubin_info=cubin,
        ptx_info=ptx_module,
        ptx_version=ptx_version,
        binary_version=binary_version,
    )


def _parse_entry_cubin(entry: FatbinEntry) -> Cubin:
    try:
        return parse_cubin(entry.data)
    except ImageError as exc:
        raise type(exc)(f"{entry.label} entry at offset {entry.offset:#x}: {exc}") from None


def _scan_entry_ptx(entry: FatbinEntry) -> PtxModule:
    try:
        return scan_ptx(entry.ptx_text)
    except PtxImageError as exc:
        raise PtxImageError(f"{entry.label} entry at offset {entry.offset:#x}: {exc}") from None
    except FatbinError:
        raise


def _entry_summary(e: FatbinEntry) -> str:
    extra = []
    if e.is_ptx and e.ptx_version is not None:
        extra.append(f"ISA {e.ptx_version[0]}.{e.ptx_version[1]}")
    if e.compression:
        extra.append(e.compression)
    extra.append(f"{len(e.data)} B")
    return f"{e.label} ({', '.join(extra)})"


def _counts(kernels: dict[str, KernelInfo], globals_: dict[str, GlobalInfo]) -> str:
    return f"{len(kernels)} kernel(s), {len(globals_)} global(s)"


def _with_description(img: ModuleImage, desc: str) -> ModuleImage:
    return ModuleImage(
        kind=img.kind,
        code=img.code,
        arch=img.arch,
        ptx=img.ptx,
        kernels=img.kernels,
        globals=img.globals,
        sha256=img.sha256,
        description=desc,
        container=img.container,
        relocatable=img.relocatable,
        cubin_info=img.cubin_info,
        ptx_info=img.ptx_info,
    )


# -- kernels and globals ---------------------------------------------------------------------


def _cubin_kernels(cubin: Cubin, ptx: PtxModule | None) -> dict[str, KernelInfo]:
    out: dict[str, KernelInfo] = {}
    for name, k in cubin.kernels.items():
        pk = ptx.entries.get(name) if ptx is not None else None
        layout = k.layout
        source = "cubin"
        param_bytes = k.param_bytes
        if (
            layout is not None
            and pk is not None
            and (layout != pk.layout or k.param_bytes != pk.param_bytes)
        ):
            raise ImageError(
                f"kernel {name!r}: cubin KPARAM_INFO layout {list(layout)} "
                f"({k.param_bytes} B) disagrees with the PTX layout {list(pk.layout)} "
                f"({pk.param_bytes} B)"
            )
        if layout is None:
            if pk is None:
                raise ImageError(
                    f"kernel {name!r}: the cubin has {k.param_bytes} parameter bytes but no "
                    "KPARAM_INFO records, and the image has no PTX to lay them out"
                )
            layout, source, param_bytes = pk.layout, "ptx", pk.param_bytes
        shared = k.static_shared_bytes
        if shared is None and pk is not None:
            shared = pk.static_shared_bytes
        max_threads = k.max_threads_per_block
        if max_threads is None and pk is not None:
            max_threads = pk.max_threads_per_block
        out[name] = KernelInfo(
            name=name,
            params=layout,
            param_bytes=param_bytes,
            static_shared_bytes=shared,
            max_threads_per_block=max_threads,
            num_regs=k.num_regs,
            layout_source=source,
            cluster_dims=pk.cluster_dims if pk is not None else None,
        )
    return out


def _ptx_kernels(module: PtxModule) -> dict[str, KernelInfo]:
    return {
        name: KernelInfo(
            name=name,
            params=fn.layout,
            param_bytes=fn.param_bytes,
            static_shared_bytes=fn.static_shared_bytes,
            max_threads_per_block=fn.max_threads_per_block,
            num_regs=None,
            layout_source="ptx",
            cluster_dims=fn.cluster_dims,
        )
        for name, fn in module.entries.items()
        if fn.body_span is not None
    }


def _cubin_globals(cubin: Cubin) -> dict[str, GlobalInfo]:
    return {
        name: GlobalInfo(name=name, size=g.size, init=g.init, space=g.space)
        for name, g in cubin.globals.items()
    }


def _ptx_globals(module: PtxModule) -> dict[str, GlobalInfo]:
    out: dict[str, GlobalInfo] = {}
    for name, v in module.variables.items():
        if v.space not in ("global", "const") or v.is_extern or v.size is None:
            continue
        if v.type in (".texref", ".samplerref", ".surfref"):
            continue
        init = v.init if v.init is not None and (any(v.init) or v.relocs) else None
        out[name] = GlobalInfo(name=name, size=v.size, init=init, space=v.space, relocs=v.relocs)
    return out
