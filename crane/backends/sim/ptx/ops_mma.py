"""Warp-level matrix multiply-accumulate, ``mma.sync.aligned`` (warp class).

The 32 lanes of a warp together hold fragments of the matrices A (MxK), B (KxN) and C, D (MxN);
each lane's D elements depend on other lanes' registers, so an execution assembles each warp's
whole matrices from its lanes (:mod:`.warpfrag`), multiplies, and hands every executing lane
its own D elements. The fragment layouts are the PTX ISA's, written as functions of
``groupID = %laneid >> 2``, ``threadID_in_group = %laneid % 4`` (``g``, ``t`` below) and the
element index ``i`` in the fragment (registers in order, packed elements low bits first).

Served (``.row.col`` only, as the ISA requires for these shapes):

* ``.m16n8k8`` and ``.m16n8k16`` with ``.f16``/``.bf16`` A and B, ``.f32`` C/D (and ``.f16``
  C and/or D for ``.f16`` inputs);
* ``.m16n8k4`` and ``.m16n8k8`` with ``.tf32`` A and B, ``.f32`` C/D;
* ``.m8n8k16``, ``.m16n8k16``, ``.m16n8k32`` with ``.s8``/``.u8`` A and B (mixed signedness
  allowed), ``.s32`` C/D, with or without ``.satfinite``;
* ``.m16n8k16`` and ``.m16n8k32`` with ``.e4m3``/``.e5m2`` A and B (FP8, sm_89; mixed
  allowed), ``.f32`` C/D — the int8 forms' layouts;
* ``.m8n8k4``, ``.m16n8k4``, ``.m16n8k8``, ``.m16n8k16`` with ``.f64`` throughout.

Numerics (the order is this module's choice; hardware's intermediate rounding is unspecified):
a product of two f16, bf16, tf32 or FP8 values is exact in f32, so each D element starts from C
(in f32) and adds the K products one at a time in k order, each addition rounded to nearest
f32; an ``.f16`` D is that f32 result rounded once to f16. ``.tf32`` operands drop the low 13
mantissa bits of their ``.b32`` register. ``.f64``: C plus the K products in k order, each
step a fused multiply-add (``.rn``). Integers: exact sum of the products and C, wrapping to
32 bits, or clamped to the s32 range with ``.satfinite``.
Every other shape, layout and type is refused at load, naming it.
"""

from __future__ import annotations

import numpy as np

from .fp import fma_f64
from .warpfrag import frag_regs, gather, layout, require_full, scatter, warps

__all__ = ["dec_mma", "matmul_acc"]


def _fn(slots: int, f):
    f.slots = slots
    return f


# C/D fragments of the m16n8 shapes (4 elements: two rows eight apart, two adjacent columns)
# and of m8n8 (2 elements); the same for every type
_C16 = _fn(4, lambda g, t, i: (g + 8 * (i >> 1), 2 * t + (i & 1)))
_C8 = _fn(2, lambda g, t, i: (g + 0 * i, 2 * t + i))

# (shape, input class) -> (A layout function, B layout function)
_AB = {
    ("m16n8k8", "h"): (
        _fn(4, lambda g, t, i: (g + 8 * (i >> 1), 2 * t + (i & 1))),
        _fn(2, lambda g, t, i: (2 * t + i, g + 0 * i)),
    ),
    ("m16n8k16", "h"): (
        _fn(8, lambda g, t, i: (g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2))),
        _fn(4, lambda g, t, i: (2 * t + (i & 1) + 8 * (i >> 1), g + 0 * i)),
    ),
    ("m16n8k4", "tf32"): (
        _fn(2, lambda g, t, i: (g + 8 * i, t + 0 * i)),
        _fn(1, lambda g, t, i: (t + 0 * i, g + 0 * i)),
    ),
    ("m16n8k8", "tf32"): (
        _fn(4, lambda g, t, i: (g + 8 * (i & 1), t + 4 * (i >> 1))),
        _fn(2, lambda g, t, i: (t + 4 * i, g + 0 * i)),
    ),
    ("m8n8k16", "i8"): (
        _fn(4, lambda g, t, i: (g + 0 * i, 4 * t + i)),
        _fn(4, lambda g, t, i: (4 * t + i, g + 0 * i)),
    ),
    ("m16n8k16", "i8"): (
        _fn(8, lambda g, t, i: (g + 8 * (i >> 2), 4 * t + (i & 3))),
        _fn(4, lambda g, t, i: (4 * t + i, g + 0 * i)),
    ),
    ("m16n8k32", "i8"): (
        _fn(16, lambda g, t, i: (g + 8 * ((i >> 2) & 1), 4 * t + (i & 3) + 16 * (i >> 3))),
        _fn(8, lambda g, t, i: (4 * t + (i & 3) + 16 * (i >> 2), g + 0 * i)),
    ),
    # FP8 (sm_89): the int8 forms' layouts
    ("m16n8k16", "f8"): (
        _fn(8, lambda g, t, i: (g + 8 * (i >> 2), 4 * t + (i & 3))),
        _fn(4, lambda g, t, i: (4 * t + i, g + 0 * i)),
    ),
    ("m16n8k32", "f8"): (
        _fn(16, lambda g, t, i: (g + 8 * ((i >> 2) & 1), 4 * t + (i & 3) + 16 * (i >> 3))),
        _fn(8, lambda g, t, i: (4 * t + (i & 3) + 16 * (i >> 2), g + 0 * i)),
    ),
    ("m8n8k4", "f64"): (
        _fn(1, lambda g, t, i: (g + 0 * i, t + 0 * i)),
        _fn(1, lambda g, t, i: (t + 0 * i, g + 0 * i)),
    ),
    ("m16n8k4", "f64"): (
        _fn(2, lambda g, t, i: (g + 8 * i, t + 0 * i)),
        _fn(1, lambda g, t, i: (t + 0 * i, g + 0 * i)),
    ),
    ("m16n8k8", "f64"): (
        _fn(4, lambda g, t, i: (g + 8 * (i & 1), t + 4 * (i >> 1))),
        _fn(2, lambda g, t, i: (t + 4 * i, g + 0 * i)),
    ),
    ("m16n8k16", "f64"): (
        _fn(8, lambda g, t, i: (g + 8 * (i & 1), t + 4 * (i >> 1))),
        _fn(4, lambda g, t, i: (t + 4 * i, g + 0 * i)),
    ),
}

#: input element type -> class in :data:`_AB`
_CLASS = {
    "f16": "h",
    "bf16": "h",
    "tf32": "tf32",
    "s8": "i8",
    "u8": "i8",
    "e4m3": "f8",
    "e5m2": "f8",
    "f64": "f64",
}
#: input class -> accepted (D type, C type) pairs
_ACC = {
    "h": {("f32", "f32"), ("f16", "f16"), ("f32", "f16"), ("f16", "f32")},
    "tf32": {("f32", "f32")},
    "f8": {("f32", "f32")},
    "i8": {("s32", "s32")},
    "f64": {("f64", "f64")},
}


def _dims(shape: str) -> tuple[int, int, int]:
    m, rest = shape[1:].split("n")
    n, k = rest.split("k")
    return int(m), int(n), int(k)


def matmul_acc(a: np.ndarray, b: np.ndarray, c: np.ndarray, kind: str, sat: bool) -> np.ndarray:
    """``D = A B + C`` for stacks of matrices in the documented order (see the module doc):
    ``kind`` "f" (f32 accumulate of exact products), "f64" (k-ordered fmas), "i" (integers)."""
    if kind == "i":
        d = np.einsum("wmk,wkn->wmn", a, b) + c
        if sat:
            return np.clip(d, -(2**31), 2**31 - 1)
        return ((d + 2**31) % 2**32) - 2**31
    if kind == "f64":
        d = np.asarray(c, np.float64)
        for k in range(a.shape[2]):
            d = fma_f64(a[:, :, k, None], b[:, None, k, :], d)
        return d
    d = np.asarray(c, np.float32).copy()
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    for k in range(a.shape[2]):
        d += a32[:, :, k, None] * b32[:, None, k, :]  # exact product, one f32 rounding
    return d


def _h_mma(st, ins, idx) -> None:
    la, lb, lc, ld, kind, sat = ins.x
    lanes, which, members, valid = warps(st, idx)
    require_full(valid, "mma.sync")
    a = gather(st, ins.a, la, members)
    b = gather(st, ins.b, lb, members)
    c = gather(st, ins.c, lc, members)
    d = matmul_acc(a, b, c, kind, sat)
    scatter(st, ins.d, ld, d, lanes, which, idx)  # after every read: D may be C, A or B


def dec_mma(ctx, mods) -> None:
    rest = [m for m in mods if m not in ("sync", "aligned")]
    sat = "satfinite" in rest
    rn = "rn" in rest
    rest = [m for m in rest if m not in ("satfinite", "rn")]
    form = f"mma form .{'.'.join(mods)}"
    if "sync" not in mods or "aligned" not in mods or len(rest) != 7:
        raise ctx.unsupported(form)
    shape, al, bl, dty, aty, bty, cty = rest
    cls = _CLASS.get(aty)
    key = (shape, cls)
    ok = (
        key in _AB
        and (al, bl) == ("row", "col")
        and _CLASS.get(bty) == cls
        and (aty == bty or cls in ("i8", "f8"))
        and (dty, cty) in _ACC[cls]
        and (not sat or cls == "i8")
        and (not rn or cls == "f64")
        and not (cls == "h" and "f16" in (dty, cty) and aty != "f16")
    )
    if not ok:
        raise ctx.unsupported(
            f"{form} (served: .row.col m16n8k8/m16n8k16 f16/bf16, m16n8k4/m16n8k8 tf32, "
            "m8n8k16/m16n8k16/m16n8k32 s8/u8, m16n8k16/m16n8k32 e4m3/e5m2, "
            "m8n8k4/m16n8k4/m16n8k8/m16n8k16 f64)"
        )
    m, n, k = _dims(shape)
    fa, fb = _AB[key]
    lc = layout(cty, m, n, _C8 if m == 8 else _C16)
    ld = layout(dty, m, n, _C8 if m == 8 else _C16)
    la, lb = layout(aty, m, k, fa), layout(bty, k, n, fb)
    ctx.nops(4)
    ins = ctx.ins
    ins.d = frag_regs(ctx, ctx.ops[0], ld.nregs, dty, True)
    ins.a = frag_regs(ctx, ctx.ops[1], la.nregs, aty, False)
    ins.b = frag_regs(ctx, ctx.ops[2], lb.nregs, bty, False)
    ins.c = frag_regs(ctx, ctx.ops[3], lc.nregs, cty, False)
    kind = {"h": "f", "tf32": "f", "f8": "f", "i8": "i", "f64": "f64"}[cls]
    ins.x = (la, lb, lc, ld, kind, sat)
    ins.fn = _h_mma
