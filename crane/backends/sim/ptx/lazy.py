"""Lazy loading of large PTX modules: each kernel is parsed and decoded on its first launch.

Why: the PTX that libraries ship for their newest target is huge (CuPy's prebuilt Thrust
module: 27 MB, 800k lines, 463 kernels; cuBLAS's: hundreds of modules). Decoding all of it
at load took 23 s for a sort that runs five kernels. CUDA itself loads functions lazily by
default (``CUDA_MODULE_LOADING=LAZY`` since CUDA 12.2; the guest answers
``cuModuleGetLoadingMode`` so): a module is checked at load, and each function is made
ready the first time it is needed. :func:`load_program` does the same for modules larger
than :data:`LAZY_BYTES`; smaller ones (every hand-built program) are still decoded whole at
load, so their unsupported instructions are refused by the load.

How: the declaration scan (:func:`crane.modules.ptx_info.scan_ptx`, which locates every
function body) runs at load, and so does a quick pass over every body that refuses, as an
eager load does, an instruction the simulator does not know at all (naming it and its line):
libraries load a module and fall back to another kernel when the load fails, which they could
not do if the refusal came at launch. A kernel's first launch takes its *closure* (the kernel, every
function and kernel its body names, transitively, and the functions named by the
initializers of variables it names; every function of the module if the closure calls
through a pointer) and decodes the module's text with every other body replaced by ``;``
and as many newlines as it spanned, so function order (which fixes function addresses) and
line numbers (which error messages name) are those of the whole module. A closure that
fails to decode fails the launch with ``CUDA_ERROR_INVALID_PTX`` naming the instruction and
its line, and fails the same way on every later launch.
"""

from __future__ import annotations

import re
from typing import Any

from crane.api.generated.cuda_enums import CUresult

from .calls import function_address
from .device_launch import BUILTINS as DEVICE_RUNTIME
from .errors import KernelFault, PtxError, PtxUnsupported
from .lexer import split_statements
from .opcodes import OPCODES
from .parser import parse_module
from .program import PtxProgram, load_ptx, module_variables, scan_module

__all__ = ["LAZY_BYTES", "LazyPtxProgram", "load_program"]

#: Modules with more PTX text than this are decoded per kernel, on first launch.
LAZY_BYTES = 4 << 20

#: An instruction's mnemonic at the start of a line, after a guard: the quick pass over a body
#: (a body where it finds a word that is no opcode gets a real look: it may be a call's
#: argument on a line of its own).
_MNEMONIC = re.compile(r"^[ \t]*(?:@!?%?[\w$]+[ \t]+)?([a-z]\w*)", re.M)
_GUARD = re.compile(r"^@!?\s*%?[\w$]+\s+")
#: ``call`` through a register: ``call{.uni} {(ret),} %rd, ...`` (any function may be reached).
_INDIRECT_CALL = re.compile(r"\bcall(?:\.uni)?\s+(?:\([^()]*\)\s*,\s*)?%")


def load_program(text: str, info: Any = None) -> Any:
    """A module's program: decoded now (:func:`.load_ptx`, refusing unsupported instructions
    here) or, above :data:`LAZY_BYTES`, a :class:`LazyPtxProgram`. ``info``: the module's
    declaration scan when the caller has it (the module image's)."""
    if len(text) <= LAZY_BYTES:
        return load_ptx(text, info)
    return LazyPtxProgram(text, info)


class LazyPtxProgram:
    """A module whose kernels are decoded on first launch (see the module docstring). Offers
    what the backend uses of :class:`.PtxProgram`: ``launch``, ``function_addresses``,
    ``uses_heap``, ``variables``."""

    def __init__(self, text: str, info: Any = None) -> None:
        self._info = scan_module(text) if info is None else info
        self._text = text
        self._bodies = self._bodies_of(self._info)
        _refuse_unknown_instructions(text, self._bodies)
        self.variables = module_variables(self._info)
        # the module with no body at all: checks the declarations now and numbers the
        # functions exactly as every closure's program will
        skeleton = parse_module(self._strip(frozenset()))
        if skeleton.address_size != 64:
            raise PtxError(f".address_size {skeleton.address_size} (only 64-bit addressing)")
        self._addresses = {name: function_address(i) for i, name in enumerate(skeleton.functions)}
        declared_only = set(skeleton.functions) - set(self._bodies)
        self.uses_heap = bool(declared_only & ({"malloc", "free"} | set(DEVICE_RUNTIME)))
        self._programs: dict[frozenset[str], PtxProgram | PtxError] = {}
        self._closures: dict[str, frozenset[str]] = {}

    @staticmethod
    def _bodies_of(info: Any) -> dict[str, Any]:
        """Every function and kernel with a body, by name."""
        return {
            name: fn
            for table in (info.functions, info.entries)
            for name, fn in table.items()
            if fn.body_span is not None
        }

    def function_addresses(self) -> dict[str, int]:
        return dict(self._addresses)

    def launch(self, name: str, *args: Any, **kwargs: Any) -> None:
        if name not in self._info.entries or name not in self._bodies:
            raise KernelFault(
                int(CUresult.CUDA_ERROR_NOT_FOUND), f"no kernel named {name!r} in this module"
            )
        prog = self.program_for(name)
        if isinstance(prog, PtxError):
            raise KernelFault(
                int(CUresult.CUDA_ERROR_INVALID_PTX), f"kernel {name} could not be loaded: {prog}"
            )
        prog.launch(name, *args, **kwargs)

    def program_for(self, kernel: str) -> PtxProgram | PtxError:
        """The decoded program of ``kernel``'s closure (or why it cannot be decoded)."""
        closure = self._closures.get(kernel)
        if closure is None:
            closure = self._closures[kernel] = self._closure(kernel)
        prog = self._programs.get(closure)
        if prog is None:
            try:
                prog = load_ptx(self._strip(closure), self._info)  # the same declarations
            except PtxError as e:
                prog = e
            self._programs[closure] = prog
        return prog

    def _closure(self, kernel: str) -> frozenset[str]:
        variables = self._info.variables
        seen = {kernel}
        work = [kernel]
        while work:
            fn = self._bodies[work.pop()]
            start, end = fn.body_span  # type: ignore[misc]
            if _INDIRECT_CALL.search(self._text, start, end):
                return frozenset(self._bodies)
            names = set(fn.references)
            for v in fn.references & variables.keys():
                names |= {r.symbol for r in variables[v].relocs}
            for n in names:
                if n in self._bodies and n not in seen:
                    seen.add(n)
                    work.append(n)
        return frozenset(seen)

    def _strip(self, keep: frozenset[str]) -> str:
        """The module's text with the body of every function outside ``keep`` replaced by
        ``;`` and the newlines it spanned."""
        cut = sorted(fn.body_span for n, fn in self._bodies.items() if n not in keep)  # type: ignore[type-var]
        parts, pos = [], 0
        for start, end in cut:
            parts.append(self._text[pos:start])
            parts.append(";" + "\n" * self._text.count("\n", start, end))
            pos = end
        parts.append(self._text[pos:])
        return "".join(parts)


def _refuse_unknown_instructions(text: str, bodies: dict[str, Any]) -> None:
    """Raise :class:`.PtxUnsupported` for the first instruction whose mnemonic the simulator
    does not know, as decoding the module would (modifiers it refuses are found when the kernel
    is decoded)."""
    for fn in bodies.values():
        start, end = fn.body_span
        if all(m.group(1) in OPCODES for m in _MNEMONIC.finditer(text, start, end)):
            continue
        for st in split_statements(text[start:end], fn.body_lines[0]):
            if st.kind != "stmt" or st.text.startswith("."):
                continue
            opcode = _GUARD.sub("", st.text).split(None, 1)[0]
            if opcode.split(".", 1)[0] not in OPCODES:
                raise PtxUnsupported(f"instruction `{opcode}` is not supported", st.line)
