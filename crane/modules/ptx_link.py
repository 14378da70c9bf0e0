"""Link relocatable PTX modules into one PTX module, as the driver's JIT linker does.

Why: programs built with ``nvcc -rdc=true`` for PTX only, and programs that call
``cuLink*`` themselves, hand the driver several PTX modules that reference each other's
``.extern`` functions and variables. The simulated GPU runs PTX, and a real driver JIT-compiles
it, so the linked result is itself one valid PTX module (the ``cubin`` cuLinkComplete returns
here is PTX text): every module's statements in input order, the header once, each global
symbol defined exactly once, forward declarations (prototypes) for the functions so that a
use before the definition stays valid PTX.

Symbol rules (PTX ISA, "Linking directives"): ``.visible`` definitions are strong (two are a
multiple-definition error), ``.weak`` ones yield to a strong definition (else the first
wins), ``.common`` variables merge (the largest wins, a strong definition beats them),
``.extern`` declarations must be resolved by a definition in some input or by a function the
driver provides (``vprintf``, ``malloc``, ...). Symbols without a linkage directive are local
to their module: two modules' locals of the same name (cicc's ``$str`` printf strings) are
renamed apart. Inputs marked ``optional`` behave like archive members: they join the link only
when they define a symbol something else still needs (libcudadevrt, static libraries).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from crane.modules.errors import ImageError
from crane.modules.ptx_info import PtxModule, scan_ptx

__all__ = ["DRIVER_FUNCTIONS", "LinkError", "LinkInput", "LinkResult", "link_ptx"]

#: Device functions the driver provides to every module (resolved without a definition), and
#: the device runtime's dynamic-parallelism entry points, which the simulated GPU serves itself
#: (libcudadevrt ships no PTX a pre-Blackwell device can JIT).
DRIVER_FUNCTIONS = frozenset(
    {
        "vprintf",
        "__assertfail",
        "malloc",
        "free",
        "__cudaCDP2GetParameterBufferV2",
        "__cudaCDP2LaunchDeviceV2",
        "__cudaCDP2GetLastError",
        "__cudaCDP2PeekAtLastError",
        "__cudaCDP2StreamCreateWithFlags",
        "__cudaCDP2StreamDestroy",
        "__cudaCDP2EventCreateWithFlags",
        "__cudaCDP2EventRecord",
        "__cudaCDP2EventDestroy",
        "__cudaCDP2StreamWaitEvent",
        "cudaGraphSetConditional",
    }
)

_COMMENT_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', re.S)
_LINE_DIRECTIVES = (".version", ".target", ".address_size", ".file", ".loc")
_LINKAGE = (".visible", ".extern", ".weak", ".common")
_FUNC_NAME_RE = re.compile(r"\.(?:func|entry)\s*(?:\([^()]*\)\s*)?([A-Za-z_$%][\w$]*)")
_VAR_NAME_RE = re.compile(r"(?<![\w$.%])([A-Za-z_$][\w$]*)\s*(?=[\[;=,<]|$)")
_LOC_RE = re.compile(r"(?<![\w$.%])(\.loc|\.file)(\s+)(\d+)")


class LinkError(ImageError):
    """A link that cannot complete; ``log`` is the error log the driver would write."""

    def __init__(self, log: str) -> None:
        super().__init__(log)
        self.log = log


@dataclass(frozen=True)
class LinkInput:
    """One input: a name for the logs, its PTX (``None``: no PTX this device can use, with
    ``note`` saying what it holds instead), and whether it joins only when needed."""

    name: str
    ptx: str | None
    note: str = ""
    optional: bool = False


@dataclass(frozen=True)
class LinkResult:
    ptx: str
    info_log: str


@dataclass
class _Stmt:
    text: str
    kind: str  # "line" (header/.file), "func", "var", "other"
    name: str | None = None
    linkage: tuple[str, ...] = ()
    has_body: bool = False
    space: str | None = None

    @property
    def is_decl(self) -> bool:
        """A reference to a symbol defined elsewhere (extern, or a function prototype)."""
        if self.kind == "func":
            return not self.has_body
        return ".extern" in self.linkage

    @property
    def is_global(self) -> bool:
        return any(k in self.linkage for k in _LINKAGE)


@dataclass
class _Unit:
    index: int
    name: str
    text: str
    module: PtxModule
    stmts: list[_Stmt] = field(default_factory=list)


@dataclass
class _Def:
    unit: _Unit
    stmt: _Stmt
    strength: int  # 2 strong, 1 common, 0 weak
    size: int = 0


def _strip_comments(text: str) -> str:
    return _COMMENT_RE.sub(lambda m: m.group(0) if m.group(0)[0] == '"' else " ", text)


def _segment(text: str) -> list[_Stmt]:
    """Module-scope statements of comment-free PTX: line directives, declarations ending in
    ``;`` and functions ending at their closing brace."""
    out: list[_Stmt] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            return out
        start = pos
        word = re.match(r"[^\s;({]*", text[pos:]).group(0)  # type: ignore[union-attr]
        if word in _LINE_DIRECTIVES:
            end = text.find("\n", pos)
            pos = n if end < 0 else end
            out.append(_Stmt(text[start:pos].strip(), "line"))
            continue
        head = re.match(r"[^;{=]*", text[pos:]).group(0)  # type: ignore[union-attr]
        is_block = bool(re.search(r"\.(?:func|entry)\b", head)) or word == ".section"
        depth = 0
        while pos < n:
            ch = text[pos]
            if ch == '"':
                m = re.compile(r'"(?:[^"\\\n]|\\.)*"').match(text, pos)
                pos = m.end() if m else pos + 1
                continue
            pos += 1
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and is_block:
                    break
            elif ch == ";" and depth == 0:
                break
        out.append(_classify(text[start:pos].strip()))


def _classify(text: str) -> _Stmt:
    words = text.split()
    linkage = tuple(w for w in words[:3] if w in _LINKAGE)
    head = re.split(r"[{=]", text, maxsplit=1)[0]
    fm = _FUNC_NAME_RE.search(head)
    if fm and re.search(r"\.(?:func|entry)\b", head):
        return _Stmt(text, "func", fm.group(1), linkage, has_body="{" in text)
    rest = [w for w in words if w not in _LINKAGE]
    space = rest[0].split(".")[1] if rest and rest[0].startswith(".") else None
    if space in ("global", "const", "shared", "local", "tex"):
        vm = _VAR_NAME_RE.search(head.replace(";", " ;"))
        return _Stmt(text, "var", vm.group(1) if vm else None, linkage, space=space)
    return _Stmt(text, "other")


def _rename(text: str, names: dict[str, str]) -> str:
    if not names:
        return text
    pat = re.compile(
        r"(?<![\w$.%])("
        + "|".join(re.escape(k) for k in sorted(names, key=len, reverse=True))
        + r")(?![\w$])"
    )
    return pat.sub(lambda m: names[m.group(1)], text)


def _prototype(stmt: _Stmt) -> str:
    """A definition's header as a forward declaration."""
    head = stmt.text.split("{", 1)[0].rstrip()
    return head + ";"


def link_ptx(
    inputs: Sequence[LinkInput], providers: frozenset[str] = DRIVER_FUNCTIONS
) -> LinkResult:
    """Link ``inputs`` into one PTX module; raises :class:`LinkError` with an nvlink-style
    error log naming every unresolved or multiply-defined symbol."""
    errors: list[str] = []
    units: list[_Unit] = []
    missing: dict[str, LinkInput] = {}
    for i, inp in enumerate(inputs):
        if inp.ptx is None:
            missing[inp.name] = inp
            continue
        try:
            module = scan_ptx(inp.ptx)
        except ImageError as e:
            errors.append(f"error   : in '{inp.name}': {e}")
            continue
        unit = _Unit(i, inp.name, _strip_comments(inp.ptx), module)
        unit.stmts = _segment(unit.text)
        units.append(unit)
    if errors:
        raise LinkError("\n".join(errors))
    optional = {u.index for u in units if inputs[u.index].optional}
    chosen = _choose_units(units, optional, providers)
    used = [u for u in units if u.index in chosen]
    if not any(not inputs[u.index].optional for u in used) and not used:
        raise LinkError("error   : no input to link")
    defs = _definitions(used, errors)
    _check_references(used, defs, providers, missing, errors)
    if errors:
        raise LinkError("\n".join(errors))
    text = _emit(used, defs)
    skipped = [inp.name for j, inp in enumerate(inputs) if j not in chosen and inp.optional]
    info = [
        f"info    : linked {len(used)} PTX module(s) ({', '.join(u.name for u in used)})",
    ]
    for name in skipped:
        why = (
            inputs[[x.name for x in inputs].index(name)].note or "nothing it defines is referenced"
        )
        info.append(f"info    : '{name}' not linked: no symbol it defines is referenced ({why})")
    kernels = sorted(n for u in used for n in u.module.entries)
    info.append(f"info    : {len(kernels)} kernel(s): {', '.join(kernels)}")
    return LinkResult(text, "\n".join(info))


def _global_defs(unit: _Unit) -> set[str]:
    return {
        s.name
        for s in unit.stmts
        if s.name and s.is_global and not s.is_decl and s.kind in ("func", "var")
    }


def _global_refs(unit: _Unit) -> set[str]:
    return {
        s.name
        for s in unit.stmts
        if s.name and s.is_decl and s.kind in ("func", "var") and s.space != "shared"
    }


def _choose_units(units: list[_Unit], optional: set[int], providers: frozenset[str]) -> set[int]:
    """The required inputs plus, archive-style, each optional one that defines a symbol the
    chosen ones still lack (repeated until nothing more is pulled in)."""
    chosen = {u.index for u in units if u.index not in optional}
    while True:
        defined = set().union(*(_global_defs(u) for u in units if u.index in chosen))
        needed = set().union(*(_global_refs(u) for u in units if u.index in chosen))
        needed -= defined | providers
        pulled = {u.index for u in units if u.index not in chosen and _global_defs(u) & needed}
        if not pulled:
            return chosen
        chosen |= pulled


def _definitions(units: list[_Unit], errors: list[str]) -> dict[str, _Def]:
    defs: dict[str, _Def] = {}
    for u in units:
        for s in u.stmts:
            if not s.name or s.is_decl or not s.is_global or s.kind not in ("func", "var"):
                continue
            strength = 0 if ".weak" in s.linkage else 1 if ".common" in s.linkage else 2
            size = 0
            if s.kind == "var":
                var = u.module.variables.get(s.name)
                size = (var.size or 0) if var else 0
            new = _Def(u, s, strength, size)
            prev = defs.get(s.name)
            if prev is None:
                defs[s.name] = new
            elif prev.strength == 2 and strength == 2:
                errors.append(
                    f"error   : Multiple definition of '{s.name}' in '{u.name}', "
                    f"first defined in '{prev.unit.name}'"
                )
            elif strength > prev.strength or (strength == prev.strength == 1 and size > prev.size):
                defs[s.name] = new
    return defs


def _check_references(
    units: list[_Unit],
    defs: dict[str, _Def],
    providers: frozenset[str],
    missing: dict[str, LinkInput],
    errors: list[str],
) -> None:
    for u in units:
        local_defs = {s.name for s in u.stmts if s.name and not s.is_decl}
        for s in u.stmts:
            if not s.name or not s.is_decl or s.kind not in ("func", "var") or s.space == "shared":
                continue
            if s.name in defs or s.name in providers or s.name in local_defs:
                continue
            hint = ""
            if missing:
                hint = (
                    " (not in any PTX input; inputs without usable PTX: "
                    + "; ".join(f"'{m.name}': {m.note}" for m in missing.values())
                    + ")"
                )
            errors.append(f"error   : Undefined reference to '{s.name}' in '{u.name}'{hint}")


def _emit(units: list[_Unit], defs: dict[str, _Def]) -> str:
    version = max(u.module.version for u in units)
    target = max(units, key=lambda u: (u.module.arch.sm, u.module.arch.specificity())).module
    flags = "".join(f", {f}" for f in target.target_flags)
    out = [
        f".version {version[0]}.{version[1]}",
        f".target {target.target}{flags}",
        ".address_size 64",
        "",
    ]
    # module-local names that more than one module uses are renamed apart
    local_names: dict[str, int] = {}
    for u in units:
        for s in u.stmts:
            if s.name and not s.is_global and s.kind in ("func", "var"):
                local_names[s.name] = local_names.get(s.name, 0) + 1
    all_global = set(defs) | {s.name for u in units for s in u.stmts if s.name and s.is_global}
    protos = [
        _prototype(d.stmt)
        for d in defs.values()
        if d.stmt.kind == "func" and ".entry" not in d.stmt.text.split("(")[0]
    ]
    out += protos
    emitted: set[str] = set()
    shared_externs: set[str] = set()
    for u in units:
        file_base = _file_base(units, u)
        renames = _unit_renames(u, local_names, all_global)
        out.append(f"// ---- {u.name}")
        for s in u.stmts:
            text = s.text
            if s.kind == "line":
                word = text.split(None, 1)[0]
                if word != ".file":
                    continue
            if s.kind == "var" and s.space == "shared" and ".extern" in s.linkage:
                if s.name in shared_externs:
                    continue
                shared_externs.add(s.name or "")
            elif s.name and s.is_global and s.kind in ("func", "var"):
                d = defs.get(s.name)
                if s.kind == "func" and s.is_decl:
                    if d is not None or s.name in emitted:
                        continue  # resolved: the prototypes above declare it
                    emitted.add(s.name)  # provided by the driver (vprintf, malloc): once
                    out.append(s.text)
                    continue
                if d is not None:
                    if s.name in emitted:
                        continue
                    if s.kind == "var":
                        emitted.add(s.name)
                        text = _rename(d.stmt.text, _unit_renames(d.unit, local_names, all_global))
                        text = _renumber_files(text, _file_base(units, d.unit))
                        out.append(text)
                        continue
                    if d.stmt is not s:
                        continue
                    emitted.add(s.name)
            out.append(_renumber_files(_rename(text, renames), file_base))
    return "\n".join(out) + "\n"


def _unit_renames(u: _Unit, local_names: dict[str, int], all_global: set[str]) -> dict[str, str]:
    return {
        s.name: f"{s.name}$link{u.index}"
        for s in u.stmts
        if s.name
        and not s.is_global
        and s.kind in ("func", "var")
        and (local_names.get(s.name, 0) > 1 or s.name in all_global)
    }


def _file_base(units: list[_Unit], target: _Unit) -> int:
    base = 0
    for u in units:
        if u is target:
            return base
        base += max((int(m.group(3)) for m in _LOC_RE.finditer(u.text)), default=0)
    return base


def _renumber_files(text: str, base: int) -> str:
    if base == 0:
        return text
    return _LOC_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{int(m.group(3)) + base}", text)
