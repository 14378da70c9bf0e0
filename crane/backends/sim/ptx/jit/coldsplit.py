"""A kernel module's IR text split in two: the functions that rarely run, and the rest.

Why: a kernel whose every region runs in a vector form (:mod:`.lower`) still carries its scalar
lane function, for the lanes a vector round could not finish (a failed check) and the rounds no
vector form takes. It is a third of the module and took about a third of LLVM's -O2 time in
the tiled matmul's compile, for code that in the benchmark never runs. :mod:`.engine`
optimizes such cold functions apart with a short function pipeline (scalar replacement of the
registers' allocas, instruction combining, CFG simplification) and links them back before
code generation, so they stay correct and reasonably fast, and the hot functions get -O2 as
before.

The split works on the text llvmlite prints (one ``define ... {`` header line, the body, a
``}`` line): each part keeps every declaration, global and metadata node, and the other part's
functions become declarations; the functions one part defines and the other calls lose their
``internal`` linkage until the two are linked again (:func:`linked_names` says which).
"""

from __future__ import annotations

import re

__all__ = ["split"]

_DEFINE = re.compile(r'(?ms)^define [^\n]*?@"?([\w.$-]+)"?\([^\n]*\n\{\n.*?^\}\n')


def split(text: str, cold: tuple[str, ...]) -> tuple[str, str, list[str]]:
    """``(hot text, cold text, names)``: ``text`` with the functions named in ``cold``
    declared only; the same with every other function declared only; and the functions made
    external for the link (the cold ones, and the hot ones they call), whose linkage the
    linked module must set back to internal."""
    found = list(_DEFINE.finditer(text))
    calls = "".join(m.group(0) for m in found if m.group(1) in cold)
    hot, cold_text = [], []
    names: list[str] = []
    pos = 0
    for m in found:
        between = text[pos : m.start()]
        hot.append(between)
        cold_text.append(between)
        pos = m.end()
        name, whole = m.group(1), m.group(0)
        header = whole.split("\n", 1)[0]
        internal = header.startswith("define internal ")
        external = whole.replace("define internal ", "define ", 1)
        if name in cold:
            hot.append(_declare(header) + "\n")
            cold_text.append(external)
            names += [name] if internal else []
        else:
            called = f'@"{name}"(' in calls or f"@{name}(" in calls
            hot.append(external if called and internal else whole)
            names += [name] if called and internal else []
            cold_text.append(_declare(header) + "\n")
    hot.append(text[pos:])
    cold_text.append(text[pos:])
    return "".join(hot), "".join(cold_text), names


def _declare(header: str) -> str:
    return re.sub(r"^define (internal )?", "declare ", header)
