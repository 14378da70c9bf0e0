"""Regenerate ``crane/api/generated/driver_protos.py`` from the CUDA headers.

Why a generated table: the interposer must export every driver symbol and answer
``cuGetProcAddress`` for every (name, ABI version) pair, with each entry point's exact C
signature. ``cudaTypedefs.h`` declares one ``PFN_<name>_v<version>[_ptds|_ptsz]`` typedef per
ABI variant, which is exactly that list; ``cuda.h`` tells which names are handles, enums, scalars
and structs, so the generator can lower every parameter to a C type cffi parses without the
CUDA headers (handles and struct pointers become ``void *``, enums ``int``). The output is
checked in, so building the interposer needs no CUDA toolkit.

    python -m crane.codegen.gen_driver_protos [--cuda-include DIR] [--check]
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Proto", "lower_type", "main", "parse_headers", "render"]

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crane" / "api" / "generated" / "driver_protos.py"
_BUILTIN = {
    "void", "char", "int", "unsigned int", "unsigned long long", "long long", "size_t",
    "float", "double", "short", "unsigned short", "unsigned char", "unsigned long", "long",
}  # fmt: skip
_TYPEDEF_HEADERS = (
    "cudaTypedefs.h", "cudaGLTypedefs.h", "cudaEGLTypedefs.h", "cudaVDPAUTypedefs.h",
    "cudaProfilerTypedefs.h",
)  # fmt: skip
_PFN = re.compile(
    r"typedef\s+CUresult\s*\(CUDAAPI\s*\*PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)\s*\((.*?)\);", re.S
)


@dataclass(frozen=True)
class Proto:
    base: str
    version: int
    variant: str  # "", "_ptds" or "_ptsz"
    params: tuple[tuple[str, str], ...]  # (lowered C type, name)
    by_value_struct: bool  # a struct passed by value: no generated Python entry possible


class _Types:
    """What each CUDA type name is, from cuda.h."""

    def __init__(self, cuda_h: str) -> None:
        self.handles = set(re.findall(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;", cuda_h))
        self.fnptrs = set(re.findall(r"typedef\s+\w+\s*\(\s*(?:CUDA_CB\s*)?\*\s*(\w+)\)", cuda_h))
        self.enums: set[str] = set()
        for m in re.finditer(r"typedef\s+enum\s+\w*\s*\{.*?\}\s*(\w+)\s*;", cuda_h, re.S):
            self.enums.add(m.group(1))
        self.structs: set[str] = set()
        for m in re.finditer(r"typedef\s+(?:struct|union)\s+\w*\s*\{", cuda_h):
            depth, i = 1, m.end()
            while depth:
                depth += {"{": 1, "}": -1}.get(cuda_h[i], 0)
                i += 1
            name = re.match(r"\s*(\w+)", cuda_h[i:])
            if name:
                self.structs.add(name.group(1))
        self.alias: dict[str, str] = {}
        for a, b in re.findall(r"typedef\s+((?:unsigned\s+)?(?:long\s+)*\w+)\s+(\w+)\s*;", cuda_h):
            if a != "struct":
                self.alias.setdefault(b, a)  # first wins: the 64-bit branch comes first
        self.alias.update(
            {
                "unsigned": "unsigned int",
                "cuuint64_t": "unsigned long long",
                "cuuint32_t": "unsigned int",
            }
        )

    def resolve(self, name: str) -> str:
        seen = 0
        while name in self.alias and seen < 10:
            name, seen = self.alias[name], seen + 1
        return name


def lower_type(ctype: str, types: _Types) -> tuple[str, bool]:
    """Lower a C parameter type to one cffi parses without cuda.h; flags struct-by-value."""
    stars = ctype.count("*")
    const = "const " if ctype.strip().startswith("const") and stars else ""
    base = " ".join(w for w in ctype.replace("*", " ").split() if w not in ("const", "struct"))
    base = types.resolve(base)
    if base in types.handles or base in types.fnptrs:
        return "void *" + "*" * stars, False
    if base in types.enums:
        return ("int" + " " + "*" * stars).strip() if stars else "int", False
    if base in types.structs or base not in _BUILTIN:
        if stars:
            return "void " + "*" * stars, False
        return base, True
    return (const + base + (" " + "*" * stars if stars else "")).strip(), False


def _split_params(text: str) -> list[str]:
    text = " ".join(text.split())
    if text in ("", "void"):
        return []
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        cur += ch
    out.append(cur.strip())
    return out


def parse_headers(include: Path) -> list[Proto]:
    types = _Types((include / "cuda.h").read_text())
    protos: dict[tuple[str, int, str], Proto] = {}
    text = "".join((include / h).read_text() for h in _TYPEDEF_HEADERS if (include / h).exists())
    for m in _PFN.finditer(text):
        base, ver, variant, params = m.group(1), int(m.group(2)), m.group(3) or "", m.group(4)
        lowered, by_value = [], False
        for i, p in enumerate(_split_params(params)):
            pm = re.match(r"(.*?)(\w+)\s*(\[\s*\d*\s*\])?$", p)
            assert pm, p
            ctype, name = pm.group(1).strip(), pm.group(2)
            if pm.group(3):
                ctype += " *"
            if not ctype:  # unnamed parameter
                ctype, name = p, f"a{i}"
            lt, bv = lower_type(ctype, types)
            lowered.append((lt, name))
            by_value |= bv
        protos[(base, ver, variant)] = Proto(base, ver, variant, tuple(lowered), by_value)
    return sorted(protos.values(), key=lambda p: (p.base, p.version, p.variant))


def render(protos: list[Proto], include: Path) -> str:
    lines = [
        f'"""Generated by crane/codegen/gen_driver_protos.py from {include}/cuda*Typedefs.h',
        "and cuda.h — do not edit; regenerate with `python -m crane.codegen.gen_driver_protos`.",
        "",
        "Every ABI variant of every driver entry point: (base name, version, variant suffix,",
        "parameters as (lowered C type, name), whether a struct is passed by value).",
        '"""',
        "",
        "# fmt: off",
        "PROTOS: tuple[tuple[str, int, str, tuple[tuple[str, str], ...], bool], ...] = (",
    ]
    for p in protos:
        lines.append(
            f"    ({p.base!r}, {p.version}, {p.variant!r}, {p.params!r}, {p.by_value_struct}),"
        )
    lines += [")", "# fmt: on", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda-include", type=Path, default=Path("/usr/local/cuda/include"))
    ap.add_argument("--check", action="store_true", help="fail if the checked-in file differs")
    a = ap.parse_args(argv)
    text = render(parse_headers(a.cuda_include), a.cuda_include)
    if a.check:
        if OUT.read_text() != text:
            print(f"{OUT} is stale: run python -m crane.codegen.gen_driver_protos", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
