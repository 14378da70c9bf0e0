"""Function addresses and indirect calls (function pointers, virtual functions).

Why: C++ virtual functions and function-pointer tables compile to PTX that takes a function's
address (``mov.u64 %rd, f`` or a ``.global`` initializer ``{f, g}``, which is how vtables
look) and calls through a register (``call (r), %rd, (a), prototype;``). A function's address
here is a value in a code window of its own, above the generic shared/local/param windows, so
a data access through it faults as an illegal address, and a call through any value that is
not a function's address faults as CUDA_ERROR_INVALID_PC, as a jump to a bad address does on
a GPU. The address is ``CODE_WINDOW + 16 * fid``: fids are assigned in declaration order, so a
module decodes to the same addresses every time it is loaded (a restore or a migration).

Lanes of one call site may hold different targets (virtual calls over a mixed array): the
lanes of the first target call it now and the others stay at the call site, each target's
lanes then calling in turn, so every callee runs with exactly its lanes.
"""

from __future__ import annotations

import numpy as np

from .errors import KernelFault

__all__ = [
    "CODE_WINDOW",
    "fid_of_address",
    "function_address",
    "indirect_copies",
    "resolve_indirect",
]

CODE_WINDOW = 0x7F30_0000_0000
_INVALID_PC = 718  # CUDA_ERROR_INVALID_PC


def function_address(fid: int) -> int:
    return CODE_WINDOW + 16 * fid


def fid_of_address(addr: int) -> int | None:
    off = addr - CODE_WINDOW
    if off < 0 or off % 16:
        return None
    return off // 16


def resolve_indirect(st, ins, idx, funcs_by_fid: dict):
    """The callee of the lanes ``idx`` at indirect call ``ins``: returns (callee FuncInfo,
    the lanes that call it now, the lanes that stay at the call site or None)."""
    target = ins.x[1]
    vals = np.asarray(target.get(st, idx), dtype=np.uint64).reshape(-1)
    if vals.size == 1 and idx is None and st.n > 1:
        vals = np.full(st.n, vals[0], np.uint64)
    first = int(vals[0])
    fid = fid_of_address(first)
    fi = funcs_by_fid.get(fid) if fid is not None else None
    if fi is None or fi.fn.is_entry or fi.fn.body is None:
        what = "a kernel" if fi is not None and fi.fn.is_entry else "no device function"
        raise KernelFault(
            _INVALID_PC,
            f"indirect call to {first:#x}, which is {what}, at `{ins.text}` (PTX line {ins.line})",
        )
    same = vals == np.uint64(first)
    if same.all():
        return fi, idx, None
    lanes = np.arange(st.n) if idx is None else idx
    return fi, lanes[same], lanes[~same]


def indirect_copies(ins, callee) -> tuple[list, list]:
    """(argument copies, return copies) between call site ``ins`` and ``callee``, as a direct
    call decodes them, computed once per (call site, callee)."""
    cache: dict = ins.x[4]
    hit = cache.get(callee.fid)
    if hit is not None:
        return hit
    _, _target, arg_offs, ret_offs, _ = ins.x
    params, rets = callee.fn.params, callee.fn.rets
    if len(params) != len(arg_offs) or len(rets) != len(ret_offs):
        raise KernelFault(
            _INVALID_PC,
            f"indirect call to {callee.fn.name} with {len(arg_offs)} argument(s) and "
            f"{len(ret_offs)} result(s); it takes {len(params)} and returns {len(rets)} "
            f"(`{ins.text}`, PTX line {ins.line})",
        )
    args = [
        (off, callee.pm[id(p)], min(var.size, p.size))
        for (off, var), p in zip(arg_offs, params, strict=True)
    ]
    outs = [
        (callee.pm[id(r)], off, min(var.size, r.size))
        for (off, var), r in zip(ret_offs, rets, strict=True)
    ]
    cache[callee.fid] = (args, outs)
    return args, outs
