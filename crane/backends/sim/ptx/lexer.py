"""PTX text → statements (with line numbers) and instruction operands.

The lexer knows only PTX's surface syntax: comments, ``;``-terminated statements, ``{``/``}``
scopes, ``label:`` prefixes and the operand grammar (registers, immediates, ``[addr+off]``,
``{a, b}`` vectors, ``(a, b)`` call lists, ``a|b`` dual destinations, ``!p``). What statements
mean is :mod:`.parser`'s job.
"""

from __future__ import annotations

import bisect
import re
import struct
from dataclasses import dataclass

from .errors import PtxError

#: the predefined identifier WARP_SZ: the warp size, a constant of every PTX target
WARP_SZ = 32
_WARP_SZ = re.compile(r"\bWARP_SZ\b")

__all__ = ["WARP_SZ", "Operand", "Stmt", "parse_int", "parse_operands", "split_statements"]

_COMMENTS = re.compile(r'("(?:[^"\\\n]|\\.)*")|//[^\n]*|/\*[\s\S]*?\*/')
_TOKENS = re.compile(r'[{};]|"(?:[^"\\\n]|\\.)*"|[^{};"]+')
_LABELS = re.compile(r"\s*([A-Za-z_$%][\w$]*)\s*:(?!:)")
# Directives that end at the end of their line rather than at a ';'.
_LINE_DIRECTIVES = re.compile(
    r"^([ \t]*\.(?:version|target|address_size|loc|file)\b[^\n;]*)$", re.M
)


@dataclass(slots=True)
class Stmt:
    """One statement. ``kind``: "stmt" (text ends at ``;``), "open" (a ``{`` scope, with the
    header text for a function body), "close" (``}``) or "label"."""

    kind: str
    text: str
    line: int


def _strip_comments(text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return m.group(1)
        return "\n" * m.group(0).count("\n")

    return _COMMENTS.sub(repl, text)


def split_statements(text: str, first_line: int = 1) -> list[Stmt]:
    """Split PTX source into statements, scope braces and labels, each with its line number."""
    src = _LINE_DIRECTIVES.sub(r"\1;", _strip_comments(text))
    newlines = [m.start() for m in re.finditer("\n", src)]

    def line_of(pos: int) -> int:
        return first_line + bisect.bisect_right(newlines, pos)

    out: list[Stmt] = []
    buf: list[str] = []
    buf_pos = -1
    inner = 0  # braces open inside the current statement (vector operands, initializers)

    def take_labels() -> None:
        # Leading "name:" prefixes of the buffered text become label statements.
        nonlocal buf, buf_pos
        s = "".join(buf)
        pos = 0
        while True:
            m = _LABELS.match(s, pos)
            if not m:
                break
            out.append(Stmt("label", m.group(1), line_of(buf_pos + m.start(1))))
            pos = m.end()
        if pos:
            rest = s[pos:]
            skipped = len(s) - len(rest)
            buf = [rest] if rest.strip() else []
            buf_pos = buf_pos + skipped if buf else -1

    for m in _TOKENS.finditer(src):
        tok = m.group(0)
        if tok == "{":
            if inner == 0:
                take_labels()
                head = "".join(buf).strip()
                if not head or _is_block_header(head):
                    out.append(Stmt("open", head, line_of(buf_pos if head else m.start())))
                    buf, buf_pos = [], -1
                    continue
            inner += 1
            buf.append(tok)
        elif tok == "}":
            if inner == 0:
                take_labels()
                if "".join(buf).strip():
                    raise PtxError(
                        f"missing ';' before '}}': {''.join(buf).strip()!r}", line_of(buf_pos)
                    )
                out.append(Stmt("close", "", line_of(m.start())))
                buf, buf_pos = [], -1
                continue
            inner -= 1
            buf.append(tok)
        elif tok == ";":
            if inner:
                raise PtxError("unbalanced '{' in statement", line_of(buf_pos))
            take_labels()
            s = "".join(buf).strip()
            if s:
                out.append(Stmt("stmt", s, line_of(buf_pos)))
            buf, buf_pos = [], -1
        else:
            if not buf:
                stripped = len(tok) - len(tok.lstrip())
                if stripped == len(tok):
                    continue
                buf_pos = m.start() + stripped
                tok = tok.lstrip()
            buf.append(tok)
    take_labels()
    rest = "".join(buf).strip()
    if rest:
        raise PtxError(f"unterminated statement {rest[:60]!r}", line_of(buf_pos))
    return out


def _is_block_header(head: str) -> bool:
    first = head.split("(")[0]
    return ".entry" in first or ".func" in first or head.startswith(".section")


# ---- operands -------------------------------------------------------------------------------

Operand = tuple  # ("reg", name) | ("name", n) | ("int", v) | ("f32", bits) | ("f64", bits)
# | ("mem", base, offset) | ("vec", [..]) | ("list", [..]) | ("not", op) | ("pair", a, b)
# | ("texref", [handle, coordinates])

_INT = re.compile(r"[-+]?(?:0[xX][0-9a-fA-F]+|0[bB][01]+|0[0-7]+|[1-9][0-9]*|0)[uU]?$")
_F32 = re.compile(r"0[fF]([0-9a-fA-F]{8})$")
_F64 = re.compile(r"0[dD]([0-9a-fA-F]{16})$")
_DEC = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?$")
_NAME = re.compile(r"[A-Za-z_$%][\w$.]*$")


def parse_int(tok: str) -> int:
    t = tok.strip().rstrip("uU")
    sign = -1 if t.startswith("-") else 1
    t = t.lstrip("+-")
    if t[:2] in ("0x", "0X"):
        v = int(t[2:], 16)
    elif t[:2] in ("0b", "0B"):
        v = int(t[2:], 2)
    elif len(t) > 1 and t[0] == "0":
        v = int(t[1:], 8)
    else:
        v = int(t)
    return sign * v


def _split_top(s: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    tail = "".join(cur).strip()
    if tail or parts:
        parts.append(tail)
    return parts


def parse_operand(tok: str, line: int) -> Operand:
    t = tok.strip()
    if not t:
        raise PtxError("empty operand", line)
    if t[0] == "[":
        if t[-1] != "]":
            raise PtxError(f"bad address operand {t!r}", line)
        parts = _split_top(t[1:-1].strip())
        if len(parts) > 1:  # a texture/surface operand: [handle, {coordinates}]
            return ("texref", [parse_operand(p, line) for p in parts])
        return _parse_address(t[1:-1].strip(), line)
    if t[0] == "{":
        if t[-1] != "}":
            raise PtxError(f"bad vector operand {t!r}", line)
        return ("vec", [parse_operand(x, line) for x in _split_top(t[1:-1])])
    if t[0] == "(":
        if t[-1] != ")":
            raise PtxError(f"bad operand list {t!r}", line)
        inner = t[1:-1].strip()
        return ("list", [parse_operand(x, line) for x in _split_top(inner)] if inner else [])
    if t[0] == "!":
        return ("not", parse_operand(t[1:], line))
    if t == "WARP_SZ":  # PTX's predefined constant: an immediate wherever one may stand
        return ("int", WARP_SZ)
    if "|" in t:
        a, b = t.split("|", 1)
        return ("pair", parse_operand(a, line), parse_operand(b, line))
    m = _F32.match(t)
    if m:
        return ("f32", int(m.group(1), 16))
    m = _F64.match(t)
    if m:
        return ("f64", int(m.group(1), 16))
    if _INT.match(t):
        return ("int", parse_int(t))
    if _DEC.match(t):
        return ("f64", struct.unpack("<Q", struct.pack("<d", float(t)))[0])
    if t[0] == "-" and _F32.match(t[1:]):
        return ("f32", int(t[3:], 16) ^ 0x80000000)
    if t[0] == "-" and _F64.match(t[1:]):
        return ("f64", int(t[3:], 16) ^ 0x8000000000000000)
    if _NAME.match(t):
        return ("reg", t) if t[0] == "%" else ("name", t)
    m = re.match(r"([A-Za-z_$][\w$]*)\s*([+-])\s*(.+)$", t)
    if m and _INT.match(m.group(3)):
        off = parse_int(m.group(3)) * (1 if m.group(2) == "+" else -1)
        return ("symoff", m.group(1), off)
    raise PtxError(f"cannot parse operand {t!r}", line)


def _parse_address(s: str, line: int) -> Operand:
    if "WARP_SZ" in s:
        s = _WARP_SZ.sub(str(WARP_SZ), s)
    # base [+ offset]; offsets may be "+4", "+-4", "-4"
    m = re.match(r"^([^+\-]+?)\s*(?:([+-])\s*([-+]?\s*(?:0[xX][0-9a-fA-F]+|\d+)))?$", s)
    if not m:
        if _INT.match(s):
            return ("mem", ("int", parse_int(s)), 0)
        raise PtxError(f"cannot parse address [{s}]", line)
    base_t, sign, off_t = m.groups()
    off = 0
    if off_t is not None:
        off = parse_int(off_t.replace(" ", "")) * (-1 if sign == "-" else 1)
    base = parse_operand(base_t, line)
    if base[0] not in ("reg", "name", "int"):
        raise PtxError(f"cannot parse address [{s}]", line)
    return ("mem", base, off)


def parse_operands(text: str, line: int) -> list[Operand]:
    """Parse the comma-separated operand list of an instruction."""
    text = text.strip()
    if not text:
        return []
    return [parse_operand(p, line) for p in _split_top(text)]
