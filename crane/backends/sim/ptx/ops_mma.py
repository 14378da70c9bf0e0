"""Warp-level matrix multiply-accumulate, ``mma.sync.aligned`` (warp class).

The 32 lanes of a warp together hold fragments of the matrices A, B and C; each lane's D
elements depend on other lanes' registers, so an execution reads whole register rows and picks,
for each lane, the lanes holding the row of A and the column of B it needs (the PTX ISA's
fragment layouts; ``groupID = %laneid >> 2``, ``threadID_in_group = %laneid % 4``).

Served: ``.m8n8k4.row.col`` with ``.f64`` throughout (double-precision MMA; cuSOLVER's LU
factorization of CuPy's ``linalg.solve``/``inv`` uses it): A, 8x4 row-major, one element per
lane at (groupID, threadID_in_group); B, 4x8 column-major, one element at
(threadID_in_group, groupID); C and D, 8x8, two elements at (groupID, 2 x threadID_in_group +
i). Each D element is C's plus the four products accumulated in k order, each step a fused
multiply-add rounded to nearest (``.rn``, the default and only rounding served). Every other
shape, layout and type is refused at load, naming it.
"""

from __future__ import annotations

import numpy as np

from .fp import fma_f64
from .ptxtypes import TYPES

__all__ = ["dec_mma"]

_F64_M8N8K4 = ("sync", "aligned", "m8n8k4", "row", "col", "f64", "f64", "f64", "f64")


def _whole(op, st):
    """An operand's value in every lane of the state (a scalar for an immediate)."""
    return op.get(st, None)


def _at(values, lanes: np.ndarray):
    return values[lanes] if np.ndim(values) else values


def _h_mma_m8n8k4_f64(st, ins, idx) -> None:
    lanes = np.arange(st.n) if idx is None else idx
    lid = st.special["%laneid"][lanes].astype(np.int64)
    base = st.warp_base[lanes].astype(np.int64)
    end = st.block_end[lanes]
    group, tig = lid >> 2, lid & 3
    a, b = _whole(ins.a[0], st), _whole(ins.b[0], st)

    def holder(rel: np.ndarray) -> np.ndarray:
        """The lane at warp position ``rel`` (a lane past the block's end reads itself)."""
        src = base + rel
        return np.where(src < end, src, lanes)

    out = []
    for i, c in enumerate(ins.c):
        d = np.asarray(c.get(st, idx), np.float64)
        col = 2 * tig + i
        for k in range(4):
            d = fma_f64(_at(a, holder(4 * group + k)), _at(b, holder(4 * col + k)), d)
        out.append(d)
    for reg, v in zip(ins.d, out, strict=True):  # after every read: D may be C, A or B
        reg.put(st, idx, v)


def _regs(ctx, op, n: int, dst: bool) -> list:
    items = op[1] if op[0] == "vec" else [op]
    if len(items) != n:
        raise ctx.error(f"expected a vector of {n} registers")
    ty = TYPES["f64"]
    return [ctx.dst(x, ty) if dst else ctx.src(x, ty) for x in items]


def dec_mma(ctx, mods) -> None:
    form = tuple(m for m in mods if m != "rn")
    if form != _F64_M8N8K4:
        raise ctx.unsupported(f"mma form .{'.'.join(mods)} (served: .m8n8k4.row.col with .f64)")
    ctx.nops(4)
    ins = ctx.ins
    ins.d = _regs(ctx, ctx.ops[0], 2, True)
    ins.a = _regs(ctx, ctx.ops[1], 1, False)
    ins.b = _regs(ctx, ctx.ops[2], 1, False)
    ins.c = _regs(ctx, ctx.ops[3], 2, False)
    ins.fn = _h_mma_m8n8k4_f64
