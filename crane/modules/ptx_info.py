"""Declaration-level PTX scanner: module header, kernels, functions and variables.

Why: when a module carries only PTX (or the daemon runs it on the simulated GPU) the
parameter layout, launch bounds, globals and static shared memory must come from the PTX
text itself. This is deliberately *not* an instruction parser: function bodies are
located (line and character spans, so the PTX interpreter can parse them), scanned only
for ``.shared`` declarations and for names they mention, and otherwise skipped.

Layout rules (PTX ISA, and what nvcc/ptxas do; they match cubin KPARAM_INFO exactly):
parameter size = element size x vector length x array elements, alignment = the explicit
``.align`` or else the element (vector) size, offset = running offset rounded up to the
alignment. In ``.param .u64 .ptr .global .align 1 p`` the ``.align`` describes the pointee,
so the parameter is still 8 bytes aligned to 8.

Static shared memory of a kernel is laid out here as ptxas does for user variables: every
non-extern ``.shared`` variable the kernel (or a ``.func`` it names, transitively)
mentions, module-scope ones first, then function-scope ones, in declaration order, each
aligned. ``.extern .shared`` arrays are dynamic shared memory and are not counted.
"""

from __future__ import annotations

import bisect
import math
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from crane.modules.arch import Arch
from crane.modules.errors import PtxImageError

__all__ = [
    "PtxFunction",
    "PtxImageError",
    "PtxModule",
    "PtxParam",
    "PtxReloc",
    "PtxVariable",
    "is_ptx",
    "layout_params",
    "scan_ptx",
]

TYPE_SIZES: dict[str, int] = {
    ".b8": 1, ".u8": 1, ".s8": 1,
    ".b16": 2, ".u16": 2, ".s16": 2, ".f16": 2, ".bf16": 2, ".e4m3x2": 2, ".e5m2x2": 2,
    ".b32": 4, ".u32": 4, ".s32": 4, ".f32": 4, ".f16x2": 4, ".bf16x2": 4, ".tf32": 4,
    ".b64": 8, ".u64": 8, ".s64": 8, ".f64": 8,
    ".b128": 16,
    ".texref": 8, ".samplerref": 8, ".surfref": 8,
}  # fmt: skip
_VECTORS = {".v2": 2, ".v4": 4, ".v8": 8}
_SPACES = (".global", ".const", ".shared", ".local", ".tex", ".param")
_LINKAGE = (".visible", ".extern", ".weak", ".common")
_OPAQUE = (".texref", ".samplerref", ".surfref")
#: Largest initialized variable we build bytes for, and deepest brace nesting we accept.
MAX_INIT_BYTES = 1 << 28
_MAX_INIT_DEPTH = 32
_MODULE_SPACES = (".global", ".const", ".shared", ".local", ".tex", *_OPAQUE)

_CLEAN_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/|/\*', re.S)
_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\r\n\f\v]+)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<num>0[fF][0-9a-fA-F]{8}(?![\w$])|0[dD][0-9a-fA-F]{16}(?![\w$])
           |0[xX][0-9a-fA-F]+U?|0[bB][01]+U?
           |(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+U?)
  | (?P<word>[.%]?[A-Za-z_$][\w$.]*)
  | (?P<punct>[{}()\[\];,=<>+\-*/:!|&^~?@])
    """,
    re.X,
)
_IDENT_RE = re.compile(r"[A-Za-z_$%][\w$]*")
_SHARED_DECL_RE = re.compile(r"(?<![\w$.%])\.shared(?![\w$])")
_BRACE_RE = re.compile(r'[{}]|"(?:[^"\\\n]|\\.)*"')


@dataclass(frozen=True, slots=True)
class PtxParam:
    """One ``.param`` of an entry or function, with its place in the parameter buffer."""

    name: str
    type: str
    size: int
    align: int
    offset: int
    vector: int = 1
    array: tuple[int, ...] = ()
    #: ``.ptr`` annotation: state space of the pointee (``""`` = generic) and its alignment.
    is_pointer: bool = False
    pointee_space: str | None = None
    pointee_align: int | None = None


@dataclass(frozen=True, slots=True)
class PtxReloc:
    """An address initializer: ``size`` bytes at ``offset`` hold ``&symbol + addend``."""

    offset: int
    size: int
    symbol: str
    addend: int
    generic: bool


@dataclass(frozen=True, slots=True)
class PtxVariable:
    """A ``.global`` / ``.const`` / ``.shared`` / ``.local`` / ``.tex`` variable."""

    name: str
    space: str
    linkage: tuple[str, ...]
    type: str
    align: int
    vector: int
    #: Array dimensions; ``None`` for an unsized ``[]`` (e.g. ``.extern .shared .b8 s[]``).
    dims: tuple[int | None, ...]
    #: Total bytes, ``None`` when unsized.
    size: int | None
    #: Initial bytes (addresses zero-filled, see ``relocs``), ``None`` without initializer.
    init: bytes | None
    relocs: tuple[PtxReloc, ...]
    line: int
    attributes: tuple[str, ...] = ()
    #: Name of the function whose body declares it, ``None`` at module scope.
    scope: str | None = None

    @property
    def is_extern(self) -> bool:
        return ".extern" in self.linkage


@dataclass(frozen=True, slots=True)
class PtxFunction:
    """An ``.entry`` (kernel) or ``.func`` (device function) declaration."""

    name: str
    kind: str  # "entry" or "func"
    linkage: tuple[str, ...]
    params: tuple[PtxParam, ...]
    param_bytes: int
    returns: tuple[PtxParam, ...]
    #: Performance-tuning directives after the parameter list, e.g. ``{".maxntid": (128, 1, 1)}``.
    directives: dict[str, tuple[int, ...]]
    decl_line: int
    #: Lines of the opening and closing brace (1-based, inclusive); ``None`` for prototypes.
    body_lines: tuple[int, int] | None
    #: Character offsets of the body in the text: ``text[start:end]`` is ``{ ... }``.
    body_span: tuple[int, int] | None
    #: ``.shared`` variables declared inside the body.
    shared_vars: tuple[PtxVariable, ...] = ()
    #: Names of functions and module variables the body mentions.
    references: frozenset[str] = frozenset()
    #: (name, offset, size) of every static shared variable this kernel uses.
    shared_layout: tuple[tuple[str, int, int], ...] = ()
    static_shared_bytes: int = 0

    @property
    def layout(self) -> tuple[tuple[int, int], ...]:
        return tuple((p.offset, p.size) for p in self.params)

    @property
    def maxntid(self) -> tuple[int, ...] | None:
        return self.directives.get(".maxntid")

    @property
    def reqntid(self) -> tuple[int, ...] | None:
        return self.directives.get(".reqntid")

    @property
    def minnctapersm(self) -> int | None:
        v = self.directives.get(".minnctapersm")
        return v[0] if v else None

    @property
    def maxnreg(self) -> int | None:
        v = self.directives.get(".maxnreg")
        return v[0] if v else None

    @property
    def max_threads_per_block(self) -> int | None:
        dims = self.reqntid or self.maxntid
        return math.prod(dims) if dims else None

    @property
    def cluster_dims(self) -> tuple[int, int, int] | None:
        """``.reqnctapercluster`` (nvcc's ``__cluster_dims__``), padded to three."""
        dims = self.directives.get(".reqnctapercluster")
        return ((*dims, 1, 1))[:3] if dims else None  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class PtxModule:
    version: tuple[int, int]
    target: str
    arch: Arch
    target_flags: tuple[str, ...]
    address_size: int
    entries: dict[str, PtxFunction]
    functions: dict[str, PtxFunction]
    variables: dict[str, PtxVariable]
    text: str = field(repr=False)


# name, type, size, align, vector, array dims, is_pointer, pointee space, pointee align
_RawParam = tuple[str, str, int, int, int, tuple[int, ...], bool, str | None, int | None]


@dataclass(slots=True)
class _Tok:
    kind: str
    text: str
    pos: int


def is_ptx(text: str) -> bool:
    """Cheap check: does the text (after comments) start with a ``.version`` directive?"""
    head = _CLEAN_RE.sub(lambda m: m.group(0) if m.group(0).startswith('"') else " ", text[:4096])
    return head.lstrip().startswith(".version")


def layout_params(params: Iterable[tuple[int, int]]) -> tuple[list[int], int]:
    """Offsets for (size, align) pairs laid out in order, and the total size."""
    offsets: list[int] = []
    cur = 0
    for size, align in params:
        align = max(align, 1)
        cur = (cur + align - 1) // align * align
        offsets.append(cur)
        cur += size
    return offsets, cur


def scan_ptx(text: str) -> PtxModule:
    """Scan PTX source; raises :class:`PtxImageError` with a line number on anything unexpected."""
    return _Scanner(text).run()


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self._newlines = [m.start() for m in re.finditer("\n", text)]
        self.clean = self._strip_comments(text)
        self.pos = 0
        self._peeked: _Tok | None = None

    # -- lexing ---------------------------------------------------------------------------

    def line_of(self, pos: int) -> int:
        return bisect.bisect_right(self._newlines, pos - 1) + 1

    def error(self, msg: str, pos: int | None = None) -> PtxImageError:
        return PtxImageError(f"PTX line {self.line_of(self.pos if pos is None else pos)}: {msg}")

    def _strip_comments(self, text: str) -> str:
        def repl(m: re.Match[str]) -> str:
            s = m.group(0)
            if s.startswith('"'):
                return s
            if s == "/*":
                raise self.error("unterminated /* comment", m.start())
            return re.sub(r"[^\n]", " ", s)

        return _CLEAN_RE.sub(repl, text)

    def _lex(self) -> _Tok | None:
        clean = self.clean
        while self.pos < len(clean):
            m = _TOKEN_RE.match(clean, self.pos)
            if m is None:
                raise self.error(f"unexpected character {clean[self.pos]!r}")
            self.pos = m.end()
            kind = m.lastgroup or ""
            if kind == "ws":
                continue
            return _Tok(kind, m.group(0), m.start())
        return None

    def peek(self) -> _Tok | None:
        if self._peeked is None:
            self._peeked = self._lex()
        return self._peeked

    def next(self, what: str = "a token") -> _Tok:
        tok = self.peek()
        if tok is None:
            raise self.error(f"unexpected end of text, expected {what}", len(self.clean))
        self._peeked = None
        return tok

    def expect(self, text: str) -> _Tok:
        tok = self.next(repr(text))
        if tok.text != text:
            raise self.error(f"expected {text!r}, found {tok.text!r}", tok.pos)
        return tok

    def peek_is(self, text: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.text == text

    def accept(self, text: str) -> bool:
        tok = self.peek()
        if tok is not None and tok.text == text:
            self._peeked = None
            return True
        return False

    def seek(self, pos: int) -> None:
        self.pos = pos
        self._peeked = None

    def rest_of_line(self, tok: _Tok) -> list[_Tok]:
        line = self.line_of(tok.pos)
        out: list[_Tok] = []
        while (nxt := self.peek()) is not None and self.line_of(nxt.pos) == line:
            out.append(self.next())
        return out

    def int_value(self, tok: _Tok) -> int:
        if tok.kind != "num":
            raise self.error(f"expected an integer, found {tok.text!r}", tok.pos)
        value = _parse_int(tok.text)
        if value is None:
            raise self.error(f"expected an integer, found {tok.text!r}", tok.pos)
        return value

    def split_words(self, tok: _Tok) -> list[str]:
        """``.v4.f32`` -> [".v4", ".f32"]; other words unchanged."""
        if tok.text.startswith(".") and "." in tok.text[1:]:
            return ["." + p for p in tok.text[1:].split(".")]
        return [tok.text]

    # -- module scope ---------------------------------------------------------------------

    def run(self) -> PtxModule:
        version: tuple[int, int] | None = None
        target: list[str] = []
        address_size = 32
        entries: dict[str, PtxFunction] = {}
        functions: dict[str, PtxFunction] = {}
        variables: dict[str, PtxVariable] = {}
        linkage: list[str] = []
        while (tok := self.peek()) is not None:
            word = tok.text
            if version is None and word != ".version":
                raise self.error(f"PTX must start with .version, found {word!r}", tok.pos)
            if word in _LINKAGE:
                self.next()
                linkage.append(word)
                continue
            if word == ".version":
                self.next()
                args = self.rest_of_line(tok)
                version = self._version(args, tok)
            elif word == ".target":
                self.next()
                target = [t.text for t in self.rest_of_line(tok) if t.text != ","]
                if not target:
                    raise self.error(".target without an architecture", tok.pos)
            elif word == ".address_size":
                self.next()
                address_size = self.int_value(self.next("an address size"))
                if address_size not in (32, 64):
                    raise self.error(f".address_size {address_size} is not 32 or 64", tok.pos)
            elif word in (".file", ".loc"):
                self.next()
                self.rest_of_line(tok)
            elif word == ".section":
                self.next()
                self.next("a section name")
                self._skip_braced()
            elif word in (".pragma", ".alias"):
                self.next()
                self._skip_to_semicolon()
            elif word in (".entry", ".func"):
                fn = self._function(tuple(linkage))
                table = entries if fn.kind == "entry" else functions
                prev = table.get(fn.name)
                if prev is None or (prev.body_span is None and fn.body_span is not None):
                    table[fn.name] = fn
            elif self.split_words(tok)[0] in _MODULE_SPACES:
                for var in self._declaration(tuple(linkage), None):
                    prev_var = variables.get(var.name)
                    if prev_var is None or (prev_var.is_extern and not var.is_extern):
                        variables[var.name] = var
            else:
                raise self.error(f"unexpected {word!r} at module scope", tok.pos)
            linkage = []
        if version is None:
            raise PtxImageError("PTX line 1: no .version directive (not PTX text?)")
        if not target:
            raise PtxImageError("PTX: no .target directive")
        arch = _target_arch(target[0])
        if arch is None:
            raise PtxImageError(f"PTX: .target {target[0]!r} is not an sm_XX architecture")
        module_shared = {
            v.name: v
            for v in variables.values()
            if v.space == "shared" and not v.is_extern and v.size is not None
        }
        entries = {name: _with_shared(fn, functions, module_shared) for name, fn in entries.items()}
        return PtxModule(
            version=version,
            target=target[0],
            arch=arch,
            target_flags=tuple(target[1:]),
            address_size=address_size,
            entries=entries,
            functions=functions,
            variables=variables,
            text=self.text,
        )

    def _version(self, args: list[_Tok], tok: _Tok) -> tuple[int, int]:
        if len(args) != 1 or not re.fullmatch(r"\d+\.\d+", args[0].text):
            raise self.error(".version needs MAJOR.MINOR", tok.pos)
        major, minor = args[0].text.split(".")
        return int(major), int(minor)

    def _skip_to_semicolon(self) -> None:
        while self.next("';'").text != ";":
            pass

    def _skip_braced(self) -> tuple[int, int]:
        """Skip a ``{ ... }`` group starting at the next token; returns its span."""
        open_tok = self.expect("{")
        end = self._match_brace(open_tok.pos)
        self.seek(end)
        return open_tok.pos, end

    def _match_brace(self, start: int) -> int:
        depth = 0
        for m in _BRACE_RE.finditer(self.clean, start):
            s = m.group(0)
            if s == "{":
                depth += 1
            elif s == "}":
                depth -= 1
                if depth == 0:
                    return m.end()
        raise self.error("unbalanced '{': no matching '}'", start)

    # -- functions ------------------------------------------------------------------------

    def _function(self, linkage: tuple[str, ...]) -> PtxFunction:
        head = self.next()
        kind = head.text[1:]
        returns: tuple[PtxParam, ...] = ()
        if kind == "func" and self.peek_is("("):
            returns, _ = self._param_list()
        name_tok = self.next("a function name")
        if name_tok.kind != "word" or name_tok.text.startswith("."):
            raise self.error(f"expected a function name, found {name_tok.text!r}", name_tok.pos)
        params: tuple[PtxParam, ...] = ()
        param_bytes = 0
        if self.peek_is("("):
            params, param_bytes = self._param_list()
        directives: dict[str, tuple[int, ...]] = {}
        while True:
            tok = self.next("'{' or ';'")
            if tok.text in ("{", ";"):
                break
            if tok.kind != "word" or not tok.text.startswith("."):
                raise self.error(
                    f"unexpected {tok.text!r} after the parameters of {name_tok.text}", tok.pos
                )
            if tok.text == ".pragma":
                self._skip_to_semicolon()
                continue
            values: list[int] = []
            while (nxt := self.peek()) is not None and nxt.kind == "num":
                values.append(self.int_value(self.next()))
                if not self.accept(","):
                    break
            directives[tok.text] = tuple(values)
        body_lines = body_span = None
        shared: tuple[PtxVariable, ...] = ()
        refs: frozenset[str] = frozenset()
        if tok.text == "{":
            end = self._match_brace(tok.pos)
            body_span = (tok.pos, end)
            body_lines = (self.line_of(tok.pos), self.line_of(end - 1))
            shared = self._body_shared(tok.pos, end, name_tok.text)
            refs = frozenset(_IDENT_RE.findall(self.clean, tok.pos, end))
            self.seek(end)
        return PtxFunction(
            name=name_tok.text,
            kind=kind,
            linkage=linkage,
            params=params,
            param_bytes=param_bytes,
            returns=returns,
            directives=directives,
            decl_line=self.line_of(head.pos),
            body_lines=body_lines,
            body_span=body_span,
            shared_vars=shared,
            references=refs,
        )

    def _param_list(self) -> tuple[tuple[PtxParam, ...], int]:
        self.expect("(")
        raw: list[_RawParam] = []
        if not self.accept(")"):
            while True:
                raw.append(self._param())
                if self.accept(")"):
                    break
                self.expect(",")
        offsets, total = layout_params((r[2], r[3]) for r in raw)
        params = tuple(
            PtxParam(
                name=r[0],
                type=r[1],
                size=r[2],
                align=r[3],
                offset=off,
                vector=r[4],
                array=r[5],
                is_pointer=r[6],
                pointee_space=r[7],
                pointee_align=r[8],
            )
            for r, off in zip(raw, offsets, strict=True)
        )
        return params, total

    def _param(self) -> _RawParam:
        first = self.next("'.param'")
        if first.text not in (".param", ".reg"):
            raise self.error(f"expected '.param', found {first.text!r}", first.pos)
        align: int | None = None
        vector = 1
        ptype: str | None = None
        is_ptr = False
        pointee_space: str | None = None
        pointee_align: int | None = None
        while True:
            tok = self.next("a parameter name")
            words = self.split_words(tok) if tok.kind == "word" else [tok.text]
            if tok.kind == "word" and not tok.text.startswith("."):
                name = tok.text
                break
            for w in words:
                if w == ".align":
                    value = self.int_value(self.next("an alignment"))
                    if is_ptr:
                        pointee_align = value
                    else:
                        align = value
                elif w in _VECTORS:
                    vector = _VECTORS[w]
                elif w in TYPE_SIZES:
                    ptype = w
                elif w == ".ptr":
                    is_ptr = True
                    pointee_space = ""
                elif is_ptr and w in (".global", ".const", ".shared", ".local"):
                    pointee_space = w[1:]
                elif w in (".pred",):
                    raise self.error("predicate parameters have no memory layout", tok.pos)
                else:
                    raise self.error(f"unexpected {w!r} in a parameter declaration", tok.pos)
        if ptype is None:
            raise self.error(f"parameter {name!r} has no type", tok.pos)
        dims = self._dims(allow_unsized=False)
        elem = TYPE_SIZES[ptype] * vector
        count = math.prod(d for d in dims if d is not None)
        size = elem * count
        natural = elem if vector > 1 else TYPE_SIZES[ptype]
        final_align = align if align is not None else natural
        if final_align <= 0 or final_align & (final_align - 1):
            raise self.error(f"parameter {name!r}: alignment {final_align} is not a power of 2")
        return (
            name,
            ptype,
            size,
            final_align,
            vector,
            tuple(d for d in dims if d is not None),
            is_ptr,
            pointee_space,
            pointee_align,
        )

    def _dims(self, *, allow_unsized: bool) -> list[int | None]:
        dims: list[int | None] = []
        while self.accept("["):
            if self.accept("]"):
                if not allow_unsized:
                    raise self.error("unsized array is not allowed here")
                dims.append(None)
                continue
            dims.append(self.int_value(self.next("an array size")))
            self.expect("]")
        return dims

    def _body_shared(self, start: int, end: int, fname: str) -> tuple[PtxVariable, ...]:
        out: list[PtxVariable] = []
        saved = self.pos
        for m in _SHARED_DECL_RE.finditer(self.clean, start + 1, end - 1):
            line_start = self.clean.rfind("\n", start, m.start()) + 1
            before = self.clean[max(line_start, start + 1) : m.start()].rstrip()
            if before and before[-1] not in ";{}:":
                continue  # e.g. ".extern .shared" (dynamic) or a ".ptr .shared" annotation
            self.seek(m.start())
            out.extend(self._declaration((), fname))
        self.seek(saved)
        return tuple(out)

    # -- variables ------------------------------------------------------------------------

    def _declaration(self, linkage: tuple[str, ...], scope: str | None) -> list[PtxVariable]:
        start = self.next()
        line = self.line_of(start.pos)
        space = ""
        align: int | None = None
        vector = 1
        vtype: str | None = None
        attributes: list[str] = []
        pending = self.split_words(start)
        while True:
            for w in pending:
                if w in _SPACES and not space:
                    space = w[1:]
                    if w == ".const" and self.peek_is("["):
                        self._dims(allow_unsized=False)  # legacy constant bank number
                elif w == ".align":
                    align = self.int_value(self.next("an alignment"))
                elif w in _VECTORS:
                    vector = _VECTORS[w]
                elif w in TYPE_SIZES:
                    vtype = w
                elif w == ".attribute":
                    attributes.extend(self._attribute())
                elif w in _OPAQUE:
                    vtype = w
                else:
                    raise self.error(f"unexpected {w!r} in a variable declaration", start.pos)
            tok = self.peek()
            if tok is None or tok.kind != "word" or not tok.text.startswith("."):
                break
            pending = self.split_words(self.next())
        if vtype is None:
            raise self.error("variable declaration without a type", start.pos)
        if not space:
            space = "global" if vtype in _OPAQUE else ""
        if not space:
            raise self.error("variable declaration without a state space", start.pos)
        elem = TYPE_SIZES[vtype]
        natural = elem * vector
        out: list[PtxVariable] = []
        while True:
            name_tok = self.next("a variable name")
            if name_tok.kind != "word" or name_tok.text.startswith("."):
                raise self.error(f"expected a variable name, found {name_tok.text!r}")
            dims = self._dims(allow_unsized=True)
            init = relocs = None
            if self.accept("="):
                init_tree = self._init_value()
                init, relocs, dims = self._encode_init(init_tree, vtype, vector, dims, name_tok)
            size: int | None = None
            if all(d is not None for d in dims):
                size = natural * math.prod(d for d in dims if d is not None)
            out.append(
                PtxVariable(
                    name=name_tok.text,
                    space=space,
                    linkage=linkage,
                    type=vtype,
                    align=align if align is not None else natural,
                    vector=vector,
                    dims=tuple(dims),
                    size=size,
                    init=init,
                    relocs=tuple(relocs or ()),
                    line=line,
                    attributes=tuple(attributes),
                    scope=scope,
                )
            )
            if self.accept(";"):
                return out
            self.expect(",")

    def _attribute(self) -> list[str]:
        self.expect("(")
        words: list[str] = []
        depth = 1
        while depth:
            tok = self.next("')'")
            if tok.text == "(":
                depth += 1
            elif tok.text == ")":
                depth -= 1
            elif tok.kind == "word":
                words.append(tok.text)
        return words

    def _init_value(self, depth: int = 0) -> object:
        """Parse an initializer into nested lists of numbers / ("sym", name, addend, generic)."""
        if self.accept("{"):
            if depth >= _MAX_INIT_DEPTH:
                raise self.error(f"initializer nested deeper than {_MAX_INIT_DEPTH} braces")
            items: list[object] = []
            if self.accept("}"):
                return items
            while True:
                items.append(self._init_value(depth + 1))
                if self.accept("}"):
                    return items
                self.expect(",")
        sign = 1
        while (tok := self.peek()) is not None and tok.text in ("-", "+"):
            self.next()
            sign = -sign if tok.text == "-" else sign
        tok = self.next("an initializer value")
        if tok.kind == "num":
            return ("num", tok.text, sign)
        if tok.kind == "word" and not tok.text.startswith("."):
            generic = False
            name = tok.text
            if name == "generic" and self.accept("("):
                generic = True
                inner = self.next("a symbol")
                if inner.kind != "word" or inner.text.startswith("."):
                    raise self.error("generic() needs a symbol name", inner.pos)
                name = inner.text
                self.expect(")")
            addend = 0
            while (op := self.peek()) is not None and op.text in ("+", "-"):
                self.next()
                value = self.int_value(self.next("an address offset"))
                addend += value if op.text == "+" else -value
            if sign < 0:
                raise self.error(f"cannot negate the address of {name!r}", tok.pos)
            return ("sym", name, addend, generic)
        raise self.error(f"unsupported initializer {tok.text!r}", tok.pos)

    def _encode_init(
        self,
        tree: object,
        vtype: str,
        vector: int,
        dims: list[int | None],
        name_tok: _Tok,
    ) -> tuple[bytes, list[PtxReloc], list[int | None]]:
        where = f"initializer of {name_tok.text!r}"
        shape = list(dims) + ([vector] if vector > 1 else [])
        if shape and shape[0] is None:
            if not isinstance(tree, list):
                raise self.error(f"{where}: an unsized array needs a {{...}} list", name_tok.pos)
            inner = math.prod(d or 1 for d in shape[1:])
            flat_scalars = all(not isinstance(x, list) for x in tree)
            shape[0] = -(-len(tree) // inner) if flat_scalars else len(tree)
            dims = [shape[0], *dims[1:]] if dims else dims
        if any(d is None for d in shape):
            raise self.error(f"{where}: only the first array dimension may be unsized")
        fixed = [int(d) for d in shape if d is not None]
        elem = TYPE_SIZES[vtype]
        total = math.prod(fixed) if fixed else 1
        if total * elem > MAX_INIT_BYTES:
            raise self.error(f"{where}: {total * elem} bytes is too large to initialize")
        out = bytearray(total * elem)
        relocs: list[PtxReloc] = []
        for index, leaf in _flatten(tree, fixed, 0, self, where):
            at = index * elem
            if leaf[0] == "sym":
                _k, sym, addend, generic = leaf
                if elem not in (4, 8) or vtype.startswith(".f"):
                    raise self.error(f"{where}: address of {sym!r} in a {vtype} element")
                relocs.append(PtxReloc(at, elem, sym, addend, generic))
            else:
                out[at : at + elem] = _encode_number(leaf[1], leaf[2], vtype, self, where)
        return bytes(out), relocs, dims


def _flatten(
    node: object, shape: list[int], base: int, sc: _Scanner, where: str
) -> list[tuple[int, tuple]]:  # type: ignore[type-arg]
    """(element index, leaf) for every value the initializer gives, in row-major order.

    Elements the initializer leaves out are zero; a scalar for an aggregate sets its first
    element; a flat list may initialize a multi-dimensional array in row-major order.
    """
    total = math.prod(shape) if shape else 1
    if not isinstance(node, list):
        return [(base, node)]  # type: ignore[list-item]
    if not shape:
        if len(node) == 1 and not isinstance(node[0], list):
            return [(base, node[0])]
        raise sc.error(f"{where}: braces around a scalar")
    if all(not isinstance(x, list) for x in node):
        if len(node) > total:
            raise sc.error(f"{where}: {len(node)} values for {total} elements")
        return [(base + i, leaf) for i, leaf in enumerate(node)]
    if len(node) > shape[0]:
        raise sc.error(f"{where}: {len(node)} rows for a dimension of {shape[0]}")
    sub = math.prod(shape[1:]) if len(shape) > 1 else 1
    out: list[tuple[int, tuple]] = []  # type: ignore[type-arg]
    for i, item in enumerate(node):
        out.extend(_flatten(item, shape[1:], base + i * sub, sc, where))
    return out


def _parse_int(text: str) -> int | None:
    t = text.rstrip("U")
    try:
        if t[:2] in ("0x", "0X"):
            return int(t[2:], 16)
        if t[:2] in ("0b", "0B"):
            return int(t[2:], 2)
        if len(t) > 1 and t[0] == "0" and t.isdigit():
            return int(t, 8)
        if t.isdigit():
            return int(t)
    except ValueError:
        return None
    return None


def _encode_number(text: str, sign: int, vtype: str, sc: _Scanner, where: str) -> bytes:
    size = TYPE_SIZES[vtype]
    raw_bits: int | None = None
    fvalue: float | None = None
    if text[:2] in ("0f", "0F"):
        (fvalue,) = struct.unpack("<f", int(text[2:], 16).to_bytes(4, "little"))
        raw_bits = int(text[2:], 16) if size == 4 else None
    elif text[:2] in ("0d", "0D"):
        (fvalue,) = struct.unpack("<d", int(text[2:], 16).to_bytes(8, "little"))
        raw_bits = int(text[2:], 16) if size == 8 else None
    else:
        ivalue = _parse_int(text)
        if ivalue is None:
            fvalue = float(text)
        elif vtype.startswith((".f", ".bf")) and vtype not in (".f16", ".bf16"):
            fvalue = float(ivalue)
        else:
            raw_bits = ivalue
    if vtype in (".f32", ".f64") or (vtype in (".f16", ".bf16") and fvalue is not None):
        if fvalue is None:
            raise sc.error(f"{where}: {text!r} is not a floating-point value")
        if raw_bits is not None and sign > 0:
            return raw_bits.to_bytes(size, "little")
        value = sign * fvalue
        try:
            if vtype == ".f32":
                return struct.pack("<f", value)
            if vtype == ".f64":
                return struct.pack("<d", value)
            if vtype == ".f16":
                return struct.pack("<e", value)
            return struct.pack("<f", value)[2:]  # .bf16: upper half of the f32 bits
        except (OverflowError, struct.error):
            raise sc.error(f"{where}: {text!r} does not fit a {vtype} value") from None
    if raw_bits is None:
        if fvalue is not None and vtype in (".b32", ".b64"):
            fmt = "<f" if size == 4 else "<d"
            return struct.pack(fmt, sign * fvalue)
        raise sc.error(f"{where}: {text!r} is not an integer for a {vtype} variable")
    mask = (1 << (8 * size)) - 1
    return ((sign * raw_bits) & mask).to_bytes(size, "little")


def _target_arch(name: str) -> Arch | None:
    m = re.fullmatch(r"sm_(\d+)([af]?)", name)
    return Arch(int(m.group(1)), m.group(2)) if m else None


def _with_shared(
    fn: PtxFunction,
    functions: dict[str, PtxFunction],
    module_shared: dict[str, PtxVariable],
) -> PtxFunction:
    """Compute the static shared layout of an entry from what it (transitively) names."""
    seen: set[str] = set()
    stack = [fn]
    local_vars: list[PtxVariable] = []
    names: set[str] = set()
    while stack:
        cur = stack.pop()
        local_vars.extend(cur.shared_vars)
        names |= cur.references
        for ref in cur.references:
            callee = functions.get(ref)
            if callee is not None and ref not in seen:
                seen.add(ref)
                stack.append(callee)
    used = [v for name, v in module_shared.items() if name in names]
    local_sized = [v for v in local_vars if v.size is not None and not v.is_extern]
    ordered = used + sorted(local_sized, key=lambda v: v.line)
    offsets, total = layout_params((v.size or 0, v.align) for v in ordered)
    layout = tuple((v.name, off, v.size or 0) for v, off in zip(ordered, offsets, strict=True))
    return PtxFunction(
        name=fn.name,
        kind=fn.kind,
        linkage=fn.linkage,
        params=fn.params,
        param_bytes=fn.param_bytes,
        returns=fn.returns,
        directives=fn.directives,
        decl_line=fn.decl_line,
        body_lines=fn.body_lines,
        body_span=fn.body_span,
        shared_vars=fn.shared_vars,
        references=fn.references,
        shared_layout=layout,
        static_shared_bytes=total,
    )
