"""Generate ``crane/api/generated/cuda_enums.py`` from the CUDA driver header ``cuda.h``.

Why a generator: the guest shim and the host daemon must agree with the real driver on every
number they exchange (result codes, attribute numbers, flag bits), and the header is the only
authoritative source.  Hand-copied tables rot silently when the toolkit moves on; a generated
file with a ``--check`` mode turns that drift into a failing CI step instead.

Only a handful of enums are mirrored (see ``ENUMS``); extend the tuple to mirror more.  The
doxygen text of each ``CUresult`` becomes ``RESULT_DESCRIPTIONS`` so cuGetErrorString /
cuGetErrorName can be answered locally without a round trip.

Usage::

    python -m crane.codegen.gen_cuda_enums [--header cuda.h] [--output path] [--check]
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DEFAULT_HEADER",
    "DEFAULT_OUTPUT",
    "ENUMS",
    "CEnum",
    "EnumSpec",
    "Enumerator",
    "HeaderParseError",
    "clean_doc",
    "main",
    "parse_enum",
    "read_cuda_version",
    "render",
]

DEFAULT_HEADER = Path("/usr/local/cuda/include/cuda.h")
_REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = _REPO_ROOT / "crane" / "api" / "generated" / "cuda_enums.py"
_GENERATOR_PATH = "crane/codegen/gen_cuda_enums.py"
_LINE_LENGTH = 100


@dataclass(frozen=True, slots=True)
class EnumSpec:
    """One C enum to mirror: its typedef name (also the Python class name) and base class."""

    name: str
    base: str  # "IntEnum" for discrete values, "IntFlag" for OR-able bit sets


ENUMS: tuple[EnumSpec, ...] = (
    EnumSpec("CUresult", "IntEnum"),
    EnumSpec("CUdevice_attribute", "IntEnum"),
    EnumSpec("CUfunction_attribute", "IntEnum"),
    EnumSpec("CUpointer_attribute", "IntEnum"),
    EnumSpec("CUstream_flags", "IntFlag"),
    EnumSpec("CUevent_flags", "IntFlag"),
    EnumSpec("CUlimit", "IntEnum"),
    EnumSpec("CUctx_flags", "IntFlag"),
    EnumSpec("CUmemorytype", "IntEnum"),
    EnumSpec("CUjit_option", "IntEnum"),
    EnumSpec("CUlibraryOption", "IntEnum"),
)


class HeaderParseError(ValueError):
    """cuda.h did not have the shape this generator understands."""


@dataclass(frozen=True, slots=True)
class Enumerator:
    """One ``NAME = value`` line of a C enum, with its cleaned doxygen text."""

    name: str
    value: int
    doc: str
    alias_of: str | None = None


@dataclass(frozen=True, slots=True)
class CEnum:
    """A parsed C enum: typedef name, the comment above the typedef, and its enumerators."""

    name: str
    doc: str
    members: tuple[Enumerator, ...]


@dataclass(slots=True)
class _RawEntry:
    code: str
    docs: list[str] = field(default_factory=list)


_COMMENT_OR_STRING = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"', re.DOTALL)
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_INT_SUFFIX = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b")


def _mask_comments(text: str) -> str:
    """Blank out comments (keeping offsets) so code-level regexes cannot match inside them."""

    def blank(match: re.Match[str]) -> str:
        token = match.group(0)
        if token.startswith('"'):
            return token
        return re.sub(r"[^\n]", " ", token)

    return _COMMENT_OR_STRING.sub(blank, text)


def read_cuda_version(header_text: str) -> int:
    """Return the header's ``CUDA_VERSION`` (e.g. 13000)."""
    match = re.search(r"^\s*#\s*define\s+CUDA_VERSION\s+(\d+)\s*$", header_text, re.MULTILINE)
    if match is None:
        raise HeaderParseError("no '#define CUDA_VERSION' found")
    return int(match.group(1))


def _version_string(cuda_version: int) -> str:
    return f"{cuda_version // 1000}.{cuda_version % 1000 // 10}"


def clean_doc(raw: str) -> str:
    """Turn a doxygen comment into one line of plain text."""
    text = re.sub(r"^/\*[*!]?<?|\*/$", "", raw.strip())
    if text.startswith("//"):
        text = re.sub(r"^//[/!]?<?", "", text)
    lines = [re.sub(r"^\s*\*+ ?", "", line) for line in text.splitlines()]
    text = " ".join(lines)
    text = text.replace("\\deprecated", "Deprecated.")
    text = re.sub(r"\s*\\n\b", ";", text)  # doxygen explicit line breaks
    text = re.sub(r"([.:;]);", r"\1", text)
    text = re.sub(r"\\(?:p|c|ref|a|e|b)\s+", "", text)
    text = re.sub(r"::(?=[A-Za-z_])", "", text)
    text = re.sub(r"\*+$", "", text)
    return " ".join(text.split())


def _evaluate(expr: str, known: dict[str, int]) -> int:
    """Evaluate a C integer constant expression over literals and earlier enumerators."""
    source = _INT_SUFFIX.sub(r"\1", expr.strip())
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise HeaderParseError(f"cannot parse enumerator value {expr!r}") from exc

    binary = {
        ast.BitOr: lambda a, b: a | b,
        ast.BitAnd: lambda a, b: a & b,
        ast.BitXor: lambda a, b: a ^ b,
        ast.LShift: lambda a, b: a << b,
        ast.RShift: lambda a, b: a >> b,
        ast.Add: lambda a, b: a + b,
        ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b,
    }

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in known:
                raise HeaderParseError(f"unknown name {node.id!r} in {expr!r}")
            return known[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd | ast.Invert):
            operand = walk(node.operand)
            if isinstance(node.op, ast.USub):
                return -operand
            return ~operand if isinstance(node.op, ast.Invert) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in binary:
            return binary[type(node.op)](walk(node.left), walk(node.right))
        raise HeaderParseError(f"unsupported construct in enumerator value {expr!r}")

    return walk(tree)


def _split_entries(body: str) -> list[_RawEntry]:
    """Split an enum body into entries, attaching leading ``/** */`` and trailing
    ``/**< */`` doxygen comments to the entry they document."""
    entries: list[_RawEntry] = []
    pending_docs: list[str] = []
    current: _RawEntry | None = None
    position = 0

    def take_code(code: str) -> None:
        nonlocal current, pending_docs
        if re.search(r"^\s*#", code, re.MULTILINE):
            raise HeaderParseError("preprocessor directive inside an enum body")
        for index, part in enumerate(code.split(",")):
            if index > 0:
                current = None
            stripped = part.strip()
            if not stripped:
                continue
            if current is None:
                current = _RawEntry(stripped, pending_docs)
                pending_docs = []
                entries.append(current)
            else:
                current.code += " " + stripped

    for match in _COMMENT.finditer(body):
        take_code(body[position : match.start()])
        position = match.end()
        comment = match.group(0)
        if re.match(r"/\*[*!]<|//[/!]<", comment):
            if not entries:
                raise HeaderParseError("trailing doc comment before any enumerator")
            entries[-1].docs.append(comment)
        elif re.match(r"/\*[*!]|//[/!]", comment):
            pending_docs.append(comment)
    take_code(body[position:])
    return entries


def parse_enum(header_text: str, typedef_name: str) -> CEnum:
    """Find ``typedef enum ... { ... } typedef_name;`` (outside comments) and parse it."""
    masked = _mask_comments(header_text)
    pattern = re.compile(
        r"typedef\s+enum\s*\w*\s*\{(?P<body>[^{}]*)\}\s*" + re.escape(typedef_name) + r"\s*;"
    )
    match = pattern.search(masked)
    if match is None:
        raise HeaderParseError(f"typedef enum {typedef_name} not found")
    body = header_text[match.start("body") : match.end("body")]

    preceding = header_text[: match.start()]
    enum_doc = ""
    doc_match = re.search(r"(/\*\*(?:(?!\*/).)*\*/)\s*$", preceding[-4000:], re.DOTALL)
    if doc_match is not None:
        enum_doc = clean_doc(doc_match.group(1))

    members: list[Enumerator] = []
    known: dict[str, int] = {}
    first_with_value: dict[int, str] = {}
    next_value = 0
    for entry in _split_entries(body):
        name, _, expr = entry.code.partition("=")
        name = name.strip()
        if not _IDENT.fullmatch(name):
            raise HeaderParseError(f"bad enumerator {entry.code!r} in {typedef_name}")
        value = _evaluate(expr, known) if expr.strip() else next_value
        next_value = value + 1
        known[name] = value
        doc = " ".join(clean_doc(d) for d in entry.docs).strip()
        alias_of = first_with_value.get(value)
        first_with_value.setdefault(value, name)
        members.append(Enumerator(name, value, doc, alias_of))
    if not members:
        raise HeaderParseError(f"enum {typedef_name} has no enumerators")
    return CEnum(typedef_name, enum_doc, tuple(members))


def _string_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _wrapped_literal(text: str, indent: int) -> list[str]:
    """Split ``text`` into implicitly concatenated literals that fit the line length."""
    budget = _LINE_LENGTH - indent - 2
    chunks: list[str] = []
    current = ""
    for word in text.split(" "):
        candidate = f"{current} {word}" if current else word
        if current and len(_string_literal(candidate + " ")) - 2 > budget:
            chunks.append(current + " ")
            current = word
        else:
            current = candidate
    chunks.append(current)
    return [" " * indent + _string_literal(chunk) for chunk in chunks]


def _comment_lines(text: str, indent: int, prefix: str = "#: ") -> list[str]:
    width = _LINE_LENGTH - indent - len(prefix)
    lines = textwrap.wrap(text, width=width, break_long_words=False, break_on_hyphens=False)
    return [" " * indent + prefix + line for line in lines]


def _render_value(value: int, base: str) -> str:
    if base == "IntFlag" and value >= 0:
        return f"0x{value:X}"
    return str(value)


def _render_enum(spec: EnumSpec, parsed: CEnum) -> list[str]:
    summary = parsed.doc.rstrip(".") if parsed.doc else "Mirrored"
    summary = f"{summary} (``{spec.name}`` in cuda.h)."
    lines = [f"class {spec.name}({spec.base}):"]
    doc_line = f'    """{summary}"""'
    if len(doc_line) <= _LINE_LENGTH:
        lines.append(doc_line)
    else:
        wrapped = textwrap.wrap(summary, width=_LINE_LENGTH - 7, break_long_words=False)
        lines += [f'    """{wrapped[0]}', *(f"    {line}" for line in wrapped[1:]), '    """']
    lines.append("")
    for member in parsed.members:
        doc = member.doc
        if member.alias_of is not None:
            doc = f"Alias of {member.alias_of}. {doc}".strip()
        lines += _comment_lines(doc, 4) if doc else []
        lines.append(f"    {member.name} = {_render_value(member.value, spec.base)}")
    return lines


def _render_descriptions(parsed: CEnum) -> list[str]:
    lines = ["RESULT_DESCRIPTIONS: dict[int, str] = {"]
    for member in parsed.members:
        if member.alias_of is not None:
            continue
        key = f"    CUresult.{member.name}: "
        text = member.doc or member.name
        single = key + _string_literal(text) + ","
        if len(single) <= _LINE_LENGTH:
            lines.append(single)
        else:
            lines.append(key + "(")
            lines += _wrapped_literal(text, 8)
            lines.append("    ),")
    lines.append("}")
    return lines


def _isort_key(name: str) -> tuple[int, str]:
    """Order ``__all__`` like ruff's RUF022: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def render(header_text: str) -> str:
    """Return the text of ``cuda_enums.py`` for the given cuda.h contents."""
    cuda_version = read_cuda_version(header_text)
    version = _version_string(cuda_version)
    parsed = {spec.name: parse_enum(header_text, spec.name) for spec in ENUMS}
    bases = sorted({spec.base for spec in ENUMS})
    exported = ["CUDA_VERSION", "RESULT_DESCRIPTIONS", *(spec.name for spec in ENUMS)]

    out = [
        f"# generated by {_GENERATOR_PATH} from cuda.h of CUDA {version} — do not edit",
        f'"""CUDA driver API enumerations mirrored from cuda.h of CUDA {version}.',
        "",
        "Values and aliases are exactly those of the header; each member's comment is its",
        "doxygen text.  ``RESULT_DESCRIPTIONS`` maps every CUresult value to its description.",
        "Regenerate with ``python -m crane.codegen.gen_cuda_enums``; ``--check`` verifies it.",
        '"""',
        "",
        f"from enum import {', '.join(bases)}",
        "",
        "__all__ = [",
        *(f'    "{name}",' for name in sorted(exported, key=_isort_key)),
        "]",
        "",
        f"CUDA_VERSION = {cuda_version}",
        '"""``CUDA_VERSION`` of the cuda.h this module was generated from."""',
    ]
    for spec in ENUMS:
        out += ["", "", *_render_enum(spec, parsed[spec.name])]
    out += ["", "", *_render_descriptions(parsed["CUresult"])]
    return "\n".join(out) + "\n"


_PACKAGE_INIT = (
    f"# generated by {_GENERATOR_PATH} — do not edit\n"
    '"""Modules generated from NVIDIA headers; regenerate them, never edit by hand."""\n'
)


def _outputs(header_text: str, output: Path) -> dict[Path, str]:
    return {output: render(header_text), output.parent / "__init__.py": _PACKAGE_INIT}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description="Generate cuda_enums.py from cuda.h.")
    parser.add_argument("--header", type=Path, default=DEFAULT_HEADER, help="path to cuda.h")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="module to write")
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate in memory and exit 1 if the files on disk differ",
    )
    args = parser.parse_args(argv)

    header_text = args.header.read_text(encoding="utf-8")
    outputs = _outputs(header_text, args.output)
    stale: list[Path] = []
    for path, text in outputs.items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if args.check:
            diff = difflib.unified_diff(
                (current or "").splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"{path} (on disk)",
                tofile=f"{path} (regenerated)",
                n=1,
            )
            sys.stdout.writelines(list(diff)[:60])
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if args.check and stale:
        print(
            f"{len(stale)} generated file(s) out of date; "
            "run: python -m crane.codegen.gen_cuda_enums",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
