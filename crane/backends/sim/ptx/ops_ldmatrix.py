"""Warp-level 8x8 matrix moves: ``ldmatrix``, ``stmatrix`` and ``movmatrix`` (warp class).

``ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}{.shared{::cta}}.b16 d, [p]`` loads one, two or
four 8x8 matrices of 16-bit elements: lane ``8 i + j`` supplies the address of row ``j`` of
matrix ``i`` (16 contiguous bytes, 16-byte aligned; with ``.x1``/``.x2`` the other lanes'
addresses are unused), and register ``d_i`` of lane ``L`` receives the pair of elements (row
``L >> 2``, columns ``2 (L % 4)`` and ``2 (L % 4) + 1``) of matrix ``i`` (low half first) — or,
with ``.trans``, the transposed matrix's pair (rows ``2 (L % 4)``, ``2 (L % 4) + 1`` of column
``L >> 2``), the fragment layout ``mma`` expects for A and B. ``stmatrix`` (same qualifiers,
``[p], {r}``) is the inverse; ``movmatrix.sync.aligned.m8n8.trans.b16 d, a`` transposes one
matrix held in that layout. Row addresses go through the same validation as ``ld``/``st``: an
address outside shared memory or misaligned faults the launch as theirs do. The ``.m16n16``
and ``.b8`` forms (sm_100a) are refused at load.
"""

from __future__ import annotations

import numpy as np

from .memspace import resolve
from .ops_common import Mods
from .ops_mem import decode_space, lane_addresses
from .ptxtypes import TYPES
from .warpfrag import gather, layout, require_full, scatter, warps

__all__ = ["dec_ldmatrix", "dec_movmatrix", "dec_stmatrix"]


def _frag_layout(nmat: int, trans: bool):
    """Element ``2 i + h`` of a lane: matrix ``i`` (stacked as rows ``8 i ..``), half ``h``."""

    def f(g, t, s):
        i, h = s >> 1, s & 1
        if trans:
            return 8 * i + 2 * t + h, g + 0 * s
        return 8 * i + g + 0 * s, 2 * t + h

    f.slots = 2 * nmat
    return layout("b16", 8 * nmat, 8, f)


def _rows(st, ins, members):
    """Per warp, the (nmat*8) row addresses' locations: [(sel, buf, element offsets)]."""
    nmat = ins.x[0]
    prov = members[:, : 8 * nmat].reshape(-1)
    addr = lane_addresses(st, ins.a, prov)
    if not np.ndim(addr):
        addr = np.full(prov.shape, addr)
    return prov, resolve(st, ins.x[2], addr, 16, prov, write=ins.x[3])


def _h_ldmatrix(st, ins, idx) -> None:
    nmat, lay, _space, _w = ins.x
    lanes, which, members, valid = warps(st, idx)
    require_full(valid, "ldmatrix")
    prov, parts = _rows(st, ins, members)
    rows = np.zeros((prov.size, 8), np.uint16)
    for sel, buf, off in parts:
        v = st.view(buf, np.uint16)
        got = v[(np.asarray(off, np.int64) >> 1)[:, None] + np.arange(8)]
        if sel is None:
            rows[...] = got
        else:
            rows[sel] = got
    mat = rows.reshape(members.shape[0], 8 * nmat, 8)
    scatter(st, ins.d, lay, mat, lanes, which, idx)


def _h_stmatrix(st, ins, idx) -> None:
    lay = ins.x[1]
    _lanes, _which, members, valid = warps(st, idx)
    require_full(valid, "stmatrix")
    mat = gather(st, ins.b, lay, members).reshape(-1, 8)
    _prov, parts = _rows(st, ins, members)
    for sel, buf, off in parts:
        v = st.view(buf, np.uint16)
        src = mat if sel is None else mat[sel]
        v[(np.asarray(off, np.int64) >> 1)[:, None] + np.arange(8)] = src


def _dec(ctx, mods, store: bool) -> None:
    m = Mods(ctx, mods)
    for q in ("sync", "aligned", "m8n8"):
        if not m.has(q):
            raise ctx.unsupported(f"{'st' if store else 'ld'}matrix without .{q}")
    num = m.take("x1", "x2", "x4")
    if num is None:
        raise ctx.unsupported("ldmatrix/stmatrix without .x1, .x2 or .x4")
    trans = m.has("trans")
    space = decode_space(ctx, m)
    if space not in ("shared", "generic"):
        raise ctx.unsupported(f".{space} state space (ldmatrix/stmatrix use shared memory)")
    if not m.has("b16"):
        raise ctx.unsupported("element type other than .b16")
    m.done()
    nmat = int(num[1])
    ctx.nops(2)
    ins = ctx.ins
    regs_op = ctx.ops[1] if store else ctx.ops[0]
    items = regs_op[1] if regs_op[0] == "vec" else [regs_op]
    if len(items) != nmat:
        raise ctx.error(f"expected {nmat} registers")
    ty = TYPES["b32"]
    lay = _frag_layout(nmat, trans)
    if store:
        ins.b = [ctx.src(x, ty) for x in items]
        ins.a = ctx.address(ctx.ops[0])
    else:
        ins.d = [ctx.dst(x, ty) for x in items]
        ins.a = ctx.address(ctx.ops[1])
    if ins.a[0] == "param":
        raise ctx.error("a .param address")
    ins.x = (nmat, lay, space, store)
    ins.fn = _h_stmatrix if store else _h_ldmatrix


def dec_ldmatrix(ctx, mods) -> None:
    _dec(ctx, mods, store=False)


def dec_stmatrix(ctx, mods) -> None:
    _dec(ctx, mods, store=True)


def _h_movmatrix(st, ins, idx) -> None:
    src, dst = ins.x
    lanes, which, members, valid = warps(st, idx)
    require_full(valid, "movmatrix")
    mat = gather(st, [ins.a], src, members)
    scatter(st, [ins.d], dst, mat, lanes, which, idx)


def dec_movmatrix(ctx, mods) -> None:
    if [m for m in mods if m != "aligned" and m != "sync"] != ["m8n8", "trans", "b16"]:
        raise ctx.unsupported(f"movmatrix form .{'.'.join(mods)} (served: .m8n8.trans.b16)")
    ctx.nops(2)
    ins = ctx.ins
    ins.d = ctx.dst(ctx.ops[0], TYPES["b32"])
    ins.a = ctx.src(ctx.ops[1], TYPES["b32"])
    # the destination's element (r, c) is the source's (c, r): read the source through the
    # transposed layout
    ins.x = (_frag_layout(1, True), _frag_layout(1, False))
    ins.fn = _h_movmatrix
