"""Warp-level matrix operations of the WMMA API: ``wmma.load``, ``wmma.store``, ``wmma.mma``
(warp class).

Served:

* ``wmma.load.{a,b,c}.sync.aligned.{row,col}.<shape>{.global,.shared{::cta},}.<type> r, [p]
  {, stride}`` and ``wmma.store.d...`` for the shapes ``m16n16k16``, ``m32n8k16``, ``m8n32k16``
  (A/B ``.f16``, ``.bf16``, ``.s8``, ``.u8``; C/D ``.f16``, ``.f32``, ``.s32``), ``m16n16k8``
  (A/B ``.tf32``, C/D ``.f32``) and ``m8n8k4`` (``.f64``);
* ``wmma.mma.sync.aligned.{row,col}.{row,col}.<shape>.<dtype>.<ctype>`` (``.f16`` inputs:
  D and C each ``.f16`` or ``.f32``) and ``...<shape>.<dtype>.<atype>.<btype>.<ctype>``
  (``.f32.bf16.bf16.f32``, ``.f32.tf32.tf32.f32``, ``.s32.{s8,u8}.{s8,u8}.s32{.satfinite}``,
  ``.f64.f64.f64.f64{.rn}``), with the numerics of :mod:`.ops_mma`.

Fragment layout. CUDA leaves WMMA fragments opaque, so this one is this interpreter's choice,
with the per-thread register and element counts the PTX ISA specifies (programs iterate over
``frag.x[i]``): a fragment of a ``R x C`` matrix holds ``u = R C / 32`` distinct elements per
lane, lane ``L``'s slot ``s`` being the element at row-major position ``L u + (s mod u)`` of
the matrix; ``.f16`` A and B fragments have 16 slots whatever the shape, so there each element
is held ``16 / u`` times (slot ``s`` and ``s + u`` ...). A load fills every copy; a store or an
``mma`` reads the first. The fragment holds the logical matrix whatever the memory layout (the
load's ``.row``/``.col`` and stride decide where each element is read from), so the ``mma``
layout qualifiers need not be consulted.

Memory: element (r, c) of a ``.row`` matrix is at ``p + (r * stride + c) * size`` (``.col``:
``c * stride + r``); the stride is in elements and defaults to the matrix's columns (``.row``)
or rows (``.col``). As CUDA requires, ``p`` must be 256-bit aligned and the stride a multiple
of 16 bytes (else a misaligned-address fault), and ``p`` and the stride the same in every lane
of the warp (else an illegal-instruction fault); element addresses are validated like
``ld``/``st``'s.
"""

from __future__ import annotations

import numpy as np

from ..memory import MemoryFault
from .errors import KernelFault
from .memspace import resolve
from .ops_common import Mods
from .ops_mem import decode_space, lane_addresses
from .ops_mma import matmul_acc
from .ptxtypes import TYPES
from .warpfrag import (
    STORAGE,
    Layout,
    frag_regs,
    gather,
    pack_bits,
    require_full,
    scatter,
    unpack_bits,
    warps,
)

__all__ = ["dec_wmma", "wmma_layout"]

#: shape -> (M, N, K)
_SHAPES = {
    "m16n16k16": (16, 16, 16),
    "m32n8k16": (32, 8, 16),
    "m8n32k16": (8, 32, 16),
    "m16n16k8": (16, 16, 8),
    "m8n8k4": (8, 8, 4),
}
#: shape -> the A/B and C/D element types it serves
_TYPES_AB = {
    "m16n16k16": {"f16", "bf16", "s8", "u8"},
    "m32n8k16": {"f16", "bf16", "s8", "u8"},
    "m8n32k16": {"f16", "bf16", "s8", "u8"},
    "m16n16k8": {"tf32"},
    "m8n8k4": {"f64"},
}
_TYPES_CD = {
    "m16n16k16": {"f16", "f32", "s32"},
    "m32n8k16": {"f16", "f32", "s32"},
    "m8n32k16": {"f16", "f32", "s32"},
    "m16n16k8": {"f32"},
    "m8n8k4": {"f64"},
}


def _dims(shape: str, frag: str) -> tuple[int, int]:
    m, n, k = _SHAPES[shape]
    return {"a": (m, k), "b": (k, n)}.get(frag, (m, n))


def wmma_layout(shape: str, frag: str, ety: str) -> Layout:
    """The fragment layout (see the module doc) of matrix ``frag`` ("a", "b", "c"/"d")."""
    rows, cols = _dims(shape, frag)
    u = rows * cols // 32
    slots = 16 if ety == "f16" and frag in "ab" else u
    lane = np.arange(32)[:, None]
    lin = lane * u + np.arange(slots)[None, :] % u
    pos = np.stack([lin // cols, lin % cols], axis=-1)
    return Layout(ety, rows, cols, pos)


def _uniform(v, which: np.ndarray, nw: int, what: str) -> None:
    if not np.ndim(v):
        return
    ref = np.empty(nw, np.asarray(v).dtype)
    ref[which] = v
    if (ref[which] != v).any():
        raise KernelFault(715, f"{what} differs between the lanes of a warp")


def _elements(st, ins, idx):
    """Per executing lane and distinct slot: the memory locations of the fragment's elements,
    as ``(lanes, which, u, [(slot, sel, buf, element offsets)])``."""
    lay, space, row, ld_default, esize = ins.x[:5]
    lanes, which, members, valid = warps(st, idx)
    require_full(valid, ins.x[5])
    nw = members.shape[0]
    base = lane_addresses(st, ins.a, lanes)
    stride = ld_default if ins.c is None else ins.c.get(st, lanes)
    _uniform(base, which, nw, "the matrix address")
    _uniform(stride, which, nw, "the stride")
    b = np.broadcast_to(np.asarray(base).astype(np.uint64), lanes.shape)
    s = np.broadcast_to(np.asarray(stride).astype(np.int64), lanes.shape)
    if b.size and ((b & np.uint64(31)).any() or ((s * esize) % 16).any()):
        bad = int(b[np.argmax(((b & np.uint64(31)) != 0) | ((s * esize) % 16 != 0))])
        raise MemoryFault(
            f"{ins.x[5]} at {bad:#x} with stride {int(s[0])}: the matrix address must be "
            "256-bit aligned and the stride a multiple of 16 bytes",
            bad,
            "misaligned",
        )
    lid = st.special["%laneid"][lanes].astype(np.int64)
    u = lay.rows * lay.cols // 32
    out = []
    for slot in range(u):
        r, c = lay.pos_r[lid, slot], lay.pos_c[lid, slot]
        off = (r * s + c) if row else (c * s + r)
        addr = b + (off * esize).astype(np.uint64)
        for sel, buf, boff in resolve(st, space, addr, esize, lanes, write=ins.x[6]):
            out.append((slot, sel, buf, np.asarray(boff, np.int64) // esize))
    return lanes, which, u, out


def _h_load(st, ins, idx) -> None:
    lay = ins.x[0]
    lanes, _which, u, parts = _elements(st, ins, idx)
    dt = STORAGE[lay.ety]
    bits = np.zeros((lanes.size, lay.pos_r.shape[1]), dt)
    for slot, sel, buf, eoff in parts:
        v = st.view(buf, dt)[eoff]
        if sel is None:
            bits[:, slot] = v
        else:
            bits[sel, slot] = v
    for copy in range(u, bits.shape[1], u):
        bits[:, copy : copy + u] = bits[:, :u]
    raw = pack_bits(lay.ety, bits)
    for j, r in enumerate(ins.d):
        r.put(st, idx, raw[:, j])


def _h_store(st, ins, idx) -> None:
    lay = ins.x[0]
    raw = np.stack(
        [np.broadcast_to(r.get(st, idx), (st.n if idx is None else len(idx),)) for r in ins.b],
        axis=-1,
    )
    bits = unpack_bits(lay.ety, raw)
    _lanes, _which, _u, parts = _elements(st, ins, idx)
    dt = STORAGE[lay.ety]
    for slot, sel, buf, eoff in parts:
        v = bits[:, slot] if sel is None else bits[sel, slot]
        st.view(buf, dt)[eoff] = v


def _dec_access(ctx, m: Mods, frag: str, mods) -> None:
    store = frag == "d"
    for q in ("sync", "aligned"):
        if not m.has(q):
            raise ctx.unsupported(f"wmma.{'store' if store else 'load'} without .{q}")
    row = m.take("row", "col")
    shape = m.take(*_SHAPES)
    space = decode_space(ctx, m)
    ety = m.take("f16", "bf16", "s8", "u8", "tf32", "f32", "s32", "f64")
    served = _TYPES_AB if frag in "ab" else _TYPES_CD
    what = f"wmma form .{'.'.join(mods)}"
    if row is None or shape is None or ety is None or ety not in served[shape]:
        raise ctx.unsupported(what)
    m.done()
    if space not in ("global", "shared", "generic"):
        raise ctx.unsupported(f"{what}: .{space} state space")
    lay = wmma_layout(shape, frag, ety)
    ctx.nops(2, 3)
    ins = ctx.ins
    regs_op, addr_op = (ctx.ops[1], ctx.ops[0]) if store else (ctx.ops[0], ctx.ops[1])
    if store:
        ins.b = frag_regs(ctx, regs_op, lay.nregs, ety, False)
    else:
        ins.d = frag_regs(ctx, regs_op, lay.nregs, ety, True)
    ins.a = ctx.address(addr_op)
    if ins.a[0] == "param":
        raise ctx.error("a .param address")
    ins.c = ctx.src(ctx.ops[2], TYPES["u32"]) if len(ctx.ops) == 3 else None
    esize = np.dtype(STORAGE[ety]).itemsize
    default = lay.cols if row == "row" else lay.rows
    name = f"wmma.{'store' if store else 'load'}"
    ins.x = (lay, space, row == "row", default, esize, name, store)
    ins.fn = _h_store if store else _h_load


def _h_mma(st, ins, idx) -> None:
    la, lb, lc, ld, kind, sat = ins.x
    lanes, which, members, valid = warps(st, idx)
    require_full(valid, "wmma.mma")
    d = matmul_acc(
        gather(st, ins.a, la, members),
        gather(st, ins.b, lb, members),
        gather(st, ins.c, lc, members),
        kind,
        sat,
    )
    scatter(st, ins.d, ld, d, lanes, which, idx)


def _dec_mma(ctx, mods) -> None:
    what = f"wmma form .{'.'.join(mods)}"
    rest = [x for x in mods if x not in ("sync", "aligned")]
    sat, rn = "satfinite" in rest, "rn" in rest
    rest = [x for x in rest if x not in ("satfinite", "rn")]
    if "sync" not in mods or "aligned" not in mods or len(rest) not in (5, 7):
        raise ctx.unsupported(what)
    al, bl, shape, *types = rest
    if al not in ("row", "col") or bl not in ("row", "col") or shape not in _SHAPES:
        raise ctx.unsupported(what)
    if len(types) == 2:  # .f16 inputs: .dtype.ctype
        dty, cty = types
        aty = bty = "f16"
    else:
        dty, aty, bty, cty = types
    ok = {
        "f16": dty in ("f16", "f32") and cty in ("f16", "f32") and len(types) == 2,
        "bf16": (dty, bty, cty) == ("f32", "bf16", "f32"),
        "tf32": (dty, bty, cty) == ("f32", "tf32", "f32"),
        "s8": dty == cty == "s32" and bty in ("s8", "u8"),
        "u8": dty == cty == "s32" and bty in ("s8", "u8"),
        "f64": (dty, bty, cty) == ("f64", "f64", "f64"),
    }.get(aty, False)
    ok = ok and aty in _TYPES_AB[shape] and (not sat or aty in ("s8", "u8"))
    ok = ok and (not rn or aty == "f64")
    if not ok:
        raise ctx.unsupported(what)
    la, lb = wmma_layout(shape, "a", aty), wmma_layout(shape, "b", bty)
    lc, ld = wmma_layout(shape, "c", cty), wmma_layout(shape, "d", dty)
    ctx.nops(4)
    ins = ctx.ins
    ins.d = frag_regs(ctx, ctx.ops[0], ld.nregs, dty, True)
    ins.a = frag_regs(ctx, ctx.ops[1], la.nregs, aty, False)
    ins.b = frag_regs(ctx, ctx.ops[2], lb.nregs, bty, False)
    ins.c = frag_regs(ctx, ctx.ops[3], lc.nregs, cty, False)
    kind = "i" if aty in ("s8", "u8") else ("f64" if aty == "f64" else "f")
    ins.x = (la, lb, lc, ld, kind, sat)
    ins.fn = _h_mma


def dec_wmma(ctx, mods) -> None:
    """``wmma.load.{a,b,c}``, ``wmma.store.d``, ``wmma.mma`` (the first modifier says which)."""
    m = Mods(ctx, mods)
    op = m.take("load", "store", "mma")
    if op == "mma":
        _dec_mma(ctx, m.rest)
        return
    frag = m.take("a", "b", "c") if op == "load" else m.take("d")
    if op is None or frag is None:
        raise ctx.unsupported(f"wmma form .{'.'.join(mods)}")
    _dec_access(ctx, m, frag, mods)
