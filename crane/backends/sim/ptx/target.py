"""Legacy ``.target`` options: what each means for the interpreter.

* ``texmode_unified`` (the default) and ``texmode_independent`` choose how texture and sampler
  state is named by texture instructions; they change nothing for a module without them.
* ``debug`` asks for debug information (``.loc``/``.file``), which the interpreter ignores.
* ``map_f64_to_f32`` (PTX ISA: "all double-precision instructions map to single-precision …
  .f64 storage remains as 64 bits, with only half being used by instructions converted from
  .f64 to .f32"): every instruction's and register's ``.f64`` becomes ``.f32`` before decoding,
  while variables and parameters keep their 64-bit declarations, so a converted load or store
  uses the low half (little-endian) of a 64-bit location.
"""

from __future__ import annotations

import re

from .errors import PtxUnsupported

__all__ = ["KNOWN_OPTIONS", "apply_target_options"]

KNOWN_OPTIONS = frozenset({"texmode_unified", "texmode_independent", "debug", "map_f64_to_f32"})
_F64 = re.compile(r"\.f64\b")
# a statement that is a directive other than .reg (a variable or parameter declaration, a
# function header): its .f64 is storage, which keeps its width
_LEAD = re.compile(r"^\s*(?:[A-Za-z_$%][\w$]*\s*:\s*)?(?:@!?%?[\w$]+\s+)?(\.[A-Za-z_]+)?")
_TEX_OPS = re.compile(r"^\s*(?:@!?%?[\w$]+\s+)?(?:tex|tld4|txq|suq|sust|suld|sured)\.", re.M)


def apply_target_options(text: str, options: list[str]) -> str:
    """``text`` with the ``.target`` options' meaning applied; refuses unknown options and
    ``texmode_independent`` in a module with texture or surface instructions (their separate
    sampler binding is not modelled)."""
    for opt in options:
        if opt.startswith("sm_") or opt.startswith("compute_"):
            continue
        if opt not in KNOWN_OPTIONS:
            raise PtxUnsupported(f".target option {opt}")
        if opt == "texmode_independent" and _TEX_OPS.search(text):
            raise PtxUnsupported(
                ".target texmode_independent with texture/surface instructions (independent "
                "sampler state)"
            )
    if "map_f64_to_f32" in options:
        text = "\n".join(_map_line(line) for line in text.split("\n"))
    return text


def _map_line(line: str) -> str:
    if ".f64" not in line:
        return line
    m = _LEAD.match(line)
    lead = m.group(1) if m else None
    if lead is not None and lead != ".reg":
        return line  # a declaration: storage stays 64-bit
    return _F64.sub(".f32", line)
