"""PTX statements → a module: variables, functions, and per-function instruction lists.

This is the *body* parser: it keeps the scoping PTX gives names (``.reg``/``.param`` declared
inside ``{ }`` blocks, as nvcc's call sequences and inline-asm blocks do) and attaches each
instruction to the scope it must resolve names in. Decoding the instructions into executable
objects is :mod:`.decode`'s job.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from .errors import PtxError, PtxUnsupported
from .lexer import Stmt, parse_int, parse_operands, split_statements
from .ptxtypes import TYPES, PtxType

__all__ = [
    "SUPPORTED_VERSION",
    "Function",
    "Instr",
    "Label",
    "Module",
    "RegDecl",
    "Scope",
    "VarDecl",
    "parse_module",
]

#: The newest PTX ISA version this interpreter was written against (CUDA 13.0 emits 9.0).
SUPPORTED_VERSION = (9, 0)

_STATE_SPACES = ("global", "const", "shared", "local", "param")


@dataclass(slots=True)
class RegDecl:
    name: str
    type: PtxType
    uid: int  # unique within the function


@dataclass(slots=True)
class VarDecl:
    name: str
    space: str
    type: PtxType
    align: int
    size: int  # bytes; 0 for an unsized extern array
    init: bytes | None = None
    extern: bool = False
    line: int = 0
    array: bool = False


class Scope:
    __slots__ = ("parent", "regs", "vars")

    def __init__(self, parent: Scope | None) -> None:
        self.parent = parent
        self.regs: dict[str, RegDecl] = {}
        self.vars: dict[str, VarDecl] = {}

    def reg(self, name: str) -> RegDecl | None:
        s: Scope | None = self
        while s is not None:
            r = s.regs.get(name)
            if r is not None:
                return r
            s = s.parent
        return None

    def var(self, name: str) -> VarDecl | None:
        s: Scope | None = self
        while s is not None:
            v = s.vars.get(name)
            if v is not None:
                return v
            s = s.parent
        return None


@dataclass(slots=True)
class Instr:
    line: int
    guard: tuple[str, bool] | None  # (predicate register, negated)
    opcode: str  # the full mnemonic, e.g. "ld.global.v4.f32"
    operands: list
    scope: Scope
    text: str


@dataclass(slots=True)
class Label:
    name: str
    line: int


@dataclass
class Function:
    name: str
    is_entry: bool
    params: list[VarDecl]
    rets: list[VarDecl]
    line: int
    body: list[Instr | Label] | None = None  # None: an extern declaration
    scope: Scope | None = None
    directives: dict[str, tuple[int, ...]] = field(default_factory=dict)
    regs: list[RegDecl] = field(default_factory=list)
    locals: list[VarDecl] = field(default_factory=list)  # .local declared in the body
    shared: list[VarDecl] = field(default_factory=list)  # .shared declared in the body


@dataclass
class Module:
    version: tuple[int, int]
    target: list[str]
    address_size: int
    variables: list[VarDecl]
    functions: dict[str, Function]
    scope: Scope


_DECL_RE = re.compile(r"^([A-Za-z_$%][\w$]*)\s*(?:\[\s*([^\]]*)\s*\])?\s*(?:<\s*(\d+)\s*>)?$")


def _directive(text: str) -> str:
    """The directive a statement starts with: ``.reg`` of ``.reg .b32 f;`` and also of
    ``.reg.b32 f;``, which ptxas takes and cuda_fp16.h's inline assembly writes (``hsqrt``)."""
    word = text.split(None, 1)[0]
    cut = word.find(".", 1) if word.startswith(".") else -1
    return word[:cut] if cut > 0 else word


def _parse_decl(text: str, line: int) -> tuple[dict, list[tuple[str, int | None, int | None]], str]:
    """Parse ``.space [.align n] .type name[n] <n>, name2 = init`` → (attrs, names, init text)."""
    init = ""
    if "=" in text:
        text, init = text.split("=", 1)
    # Split directives (".x") from the names.
    toks = re.findall(r"\.\w+(?:::\w+)*|[^\s,]+(?:\s*\[[^\]]*\])?(?:\s*<\s*\d+\s*>)?", text)
    attrs: dict = {"align": None, "type": None, "space": None, "flags": set(), "vector": 1}
    names: list[tuple[str, int | None, int | None]] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.startswith("."):
            key = t[1:]
            if key == "align":
                i += 1
                attrs["align"] = parse_int(toks[i])
            elif key in _STATE_SPACES or key == "reg":
                attrs["space"] = key
            elif key in TYPES:
                attrs["type"] = TYPES[key]
            elif key in ("texref", "samplerref", "surfref"):
                attrs["type"] = TYPES["b64"]  # opaque handles: declarable, never executable
                attrs["flags"].add(key)
            elif key in ("v2", "v4", "v8"):
                attrs["vector"] = int(key[1:])
            else:
                attrs["flags"].add(key)
        else:
            m = _DECL_RE.match(t.strip())
            if not m:
                raise PtxError(f"cannot parse declaration of {t!r}", line)
            name, dim, count = m.groups()
            n: int | None = None
            if dim is not None:
                n = parse_int(dim) if dim.strip() else 0
            names.append((name, n, int(count) if count else None))
        i += 1
    return attrs, names, init.strip()


def _init_bytes(init: str, ty: PtxType, size: int, line: int) -> bytes | None:
    """Encode an initializer (scalar or ``{..}`` list, possibly nested) as little-endian bytes."""
    if not init:
        return None
    flat = re.sub(r"[{}]", " ", init).replace(",", " ").split()
    out = bytearray()
    fmt = {8: "B", 16: "H", 32: "I", 64: "Q"}
    for tok in flat:
        bits = 8 if ty.bits == 8 else ty.bits
        if re.match(r"^[A-Za-z_$]", tok) or tok.startswith("generic("):
            # a variable's or a function's address: zero here; crane.modules.ptx_info lists
            # it as a relocation, which the backend patches once everything is placed
            out += bytes(bits // 8)
            continue
        op = parse_operands(tok, line)[0]
        if op[0] == "int":
            v = op[1]
            if ty.kind == "f":
                v = _float_bits(float(v), ty.bits)
            out += struct.pack("<" + fmt[bits], v & ((1 << bits) - 1))
        elif op[0] in ("f32", "f64"):
            if ty.kind == "f" and ty.bits == 32:
                v = op[1] if op[0] == "f32" else _float_bits(_bits_float(op[1], 64), 32)
            elif ty.kind == "f":
                v = op[1] if op[0] == "f64" else _float_bits(_bits_float(op[1], 32), 64)
            else:
                v = op[1]
            out += struct.pack("<" + fmt[bits], v & ((1 << bits) - 1))
        else:
            raise PtxError(f"bad initializer element {tok!r}", line)
    if len(out) > size:
        raise PtxError("initializer larger than the variable", line)
    return bytes(out) + bytes(size - len(out))


def _float_bits(v: float, bits: int) -> int:
    if bits == 32:
        return struct.unpack("<I", struct.pack("<f", v))[0]
    return struct.unpack("<Q", struct.pack("<d", v))[0]


def _bits_float(v: int, bits: int) -> float:
    if bits == 32:
        return struct.unpack("<f", struct.pack("<I", v))[0]
    return struct.unpack("<d", struct.pack("<Q", v))[0]


def _var_from_decl(text: str, line: int) -> list[VarDecl]:
    attrs, names, init = _parse_decl(text, line)
    ty: PtxType | None = attrs["type"]
    if ty is None:
        raise PtxError(f"declaration without a type: {text!r}", line)
    if attrs["vector"] != 1:
        raise PtxUnsupported("vector-typed variable declarations", line)
    out = []
    for name, n, count in names:
        if count is not None:
            raise PtxError(f"parameterized names are only allowed for .reg: {name}", line)
        elem = ty.size
        size = elem * (n if n is not None else 1)
        align = attrs["align"] or elem
        out.append(
            VarDecl(
                name=name,
                space=attrs["space"],
                type=ty,
                align=align,
                size=size,
                init=_init_bytes(init, ty, size, line) if init else None,
                extern="extern" in attrs["flags"],
                line=line,
                array=n is not None,
            )
        )
    return out


def _parse_params(text: str, line: int) -> list[VarDecl]:
    inner = text.strip()
    if not inner:
        return []
    params = []
    for part in _split_commas(inner):
        part = part.strip()
        if not part.startswith(".param") and not part.startswith(".reg"):
            raise PtxError(f"bad parameter {part!r}", line)
        if part.startswith(".reg"):
            raise PtxUnsupported(".reg parameters (ABI-less functions)", line)
        # drop pointer attributes: .ptr .global .align N
        attrs, names, _ = _parse_decl(part, line)
        ty = attrs["type"]
        if ty is None or len(names) != 1:
            raise PtxError(f"bad parameter {part!r}", line)
        name, n, _ = names[0]
        size = ty.size * (n if n is not None else 1)
        align = attrs["align"] if (attrs["align"] and n is not None) else ty.size
        params.append(
            VarDecl(name, "param", ty, max(align, 1), size, line=line, array=n is not None)
        )
    return params


def _split_commas(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [x for x in out if x.strip()]


_HEADER_RE = re.compile(
    r"^(?P<pre>(?:\.\w+\s+)*)\.(?P<kind>entry|func)\s*"
    r"(?:\((?P<rets>[^()]*)\)\s*)?(?P<name>[A-Za-z_$][\w$]*)\s*"
    r"(?:\((?P<params>[^()]*)\))?\s*(?P<post>.*)$",
    re.S,
)


def _parse_header(text: str, line: int) -> Function:
    m = _HEADER_RE.match(text.strip())
    if not m:
        raise PtxError(f"cannot parse function header {text[:80]!r}", line)
    fn = Function(
        name=m.group("name"),
        is_entry=m.group("kind") == "entry",
        params=_parse_params(m.group("params") or "", line),
        rets=_parse_params(m.group("rets") or "", line),
        line=line,
    )
    for d in re.finditer(r"\.(\w+)\s*([\d,\s]*)", m.group("post") or ""):
        vals = tuple(int(x) for x in re.findall(r"\d+", d.group(2)))
        fn.directives[d.group(1)] = vals
    if "extern" in (m.group("pre") or ""):
        fn.directives["extern"] = ()
    return fn


def parse_module(text: str) -> Module:
    """Parse a whole PTX module."""
    stmts = split_statements(text)
    version: tuple[int, int] | None = None
    target: list[str] = []
    address_size = 64
    variables: list[VarDecl] = []
    functions: dict[str, Function] = {}
    mscope = Scope(None)
    i = 0
    n = len(stmts)
    while i < n:
        st = stmts[i]
        if st.kind == "stmt":
            t = st.text
            word = _directive(t)
            if word == ".version":
                mm = re.match(r"\.version\s+(\d+)\.(\d+)$", t)
                if not mm:
                    raise PtxError(f"bad .version {t!r}", st.line)
                version = (int(mm.group(1)), int(mm.group(2)))
            elif word == ".target":
                target = [x.strip() for x in t.split(None, 1)[1].split(",")]
            elif word == ".address_size":
                address_size = int(t.split()[1])
            elif re.search(r"\.(entry|func)\b", t.split("(")[0]):
                fn = _parse_header(t, st.line)  # a declaration (prototype / extern)
                if fn.name not in functions:
                    functions[fn.name] = fn
            elif word in (".file", ".loc", ".pragma", ".weak") and ".global" not in t:
                pass
            elif any(f".{sp}" in t.split("=")[0].split() for sp in ("global", "const", "shared")):
                for v in _var_from_decl(t, st.line):
                    variables.append(v)
                    mscope.vars[v.name] = v
            elif ".callprototype" in t or word == ".alias":
                pass
            else:
                raise PtxUnsupported(f"module-level directive {word}", st.line)
            i += 1
        elif st.kind == "open":
            if st.text.startswith(".section"):
                i = _skip_block(stmts, i)
                continue
            fn = _parse_header(st.text, st.line)
            i = _parse_body(fn, stmts, i + 1, mscope)
            functions[fn.name] = fn
        elif st.kind == "label":
            i += 1  # e.g. "prototype_0 : .callprototype ..."
        else:
            raise PtxError("unbalanced '}'", st.line)
    if version is None:
        raise PtxError("missing .version directive")
    if address_size != 64:
        raise PtxUnsupported(f".address_size {address_size} (only 64-bit addressing)")
    return Module(version, target, address_size, variables, functions, mscope)


def _skip_block(stmts: list[Stmt], i: int) -> int:
    depth = 0
    while i < len(stmts):
        if stmts[i].kind == "open":
            depth += 1
        elif stmts[i].kind == "close":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise PtxError("unterminated block")


def _parse_body(fn: Function, stmts: list[Stmt], i: int, mscope: Scope) -> int:
    fscope = Scope(mscope)
    for p in fn.params + fn.rets:
        fscope.vars[p.name] = p
    fn.scope = fscope
    body: list[Instr | Label] = []
    scope = fscope
    depth = 1
    while i < len(stmts):
        st = stmts[i]
        i += 1
        if st.kind == "open":
            scope = Scope(scope)
            depth += 1
            continue
        if st.kind == "close":
            depth -= 1
            if depth == 0:
                fn.body = body
                return i
            assert scope.parent is not None
            scope = scope.parent
            continue
        if st.kind == "label":
            body.append(Label(st.text, st.line))
            continue
        t = st.text
        if t.startswith("."):
            word = _directive(t)
            if word == ".reg":
                _declare_regs(fn, scope, t, st.line)
            elif word in (".local", ".shared", ".param", ".global", ".const"):
                for v in _var_from_decl(t, st.line):
                    if v.space == "local":
                        fn.locals.append(v)
                    elif v.space == "shared":
                        fn.shared.append(v)
                    elif v.space == "param":
                        pass
                    else:
                        raise PtxUnsupported(f"function-scope .{v.space} variable", st.line)
                    scope.vars[v.name] = v
            elif (
                word in (".pragma", ".loc", ".file", ".maxnreg", ".section")
                or word == ".callprototype"
            ):
                pass
            else:
                raise PtxUnsupported(f"directive {word} in a function body", st.line)
            continue
        body.append(_parse_instr(t, st.line, scope))
    raise PtxError(f"function {fn.name} has no closing '}}'", fn.line)


def _declare_regs(fn: Function, scope: Scope, text: str, line: int) -> None:
    attrs, names, _ = _parse_decl(text, line)
    ty = attrs["type"]
    if ty is None:
        raise PtxError(f"register declaration without a type: {text!r}", line)
    if attrs["vector"] != 1:
        raise PtxUnsupported("vector registers", line)
    for name, dim, count in names:
        if dim is not None:
            raise PtxUnsupported("register arrays", line)
        expanded = [f"{name}{k}" for k in range(count)] if count is not None else [name]
        for nm in expanded:
            r = RegDecl(nm, ty, len(fn.regs))
            fn.regs.append(r)
            scope.regs[nm] = r


_GUARD_RE = re.compile(r"^@(!?)\s*(%?[\w$]+)\s+")


def _parse_instr(text: str, line: int, scope: Scope) -> Instr:
    guard = None
    m = _GUARD_RE.match(text)
    if m:
        guard = (m.group(2), m.group(1) == "!")
        text = text[m.end() :]
    parts = text.split(None, 1)
    opcode = parts[0]
    try:
        operands = parse_operands(parts[1], line) if len(parts) > 1 else []
    except PtxError as e:
        # reported when decoding, after an unknown mnemonic has had the chance to be named
        operands = e  # type: ignore[assignment]
    return Instr(line, guard, opcode, operands, scope, text)
