"""Texture and surface objects as the simulated GPU's instructions see them.

What ``tex``/``tld4``/``txq`` (:mod:`.ops_tex`) and ``suld``/``sust``/``suq`` (:mod:`.ops_surf`)
share: the operand ``[handle, {coordinates}]``, reading the descriptor a handle points to
(:mod:`crane.api.texdesc` says why objects are descriptors in device memory), grouping lanes by
the handle they hold, and the attribute queries.
"""

from __future__ import annotations

import numpy as np

from crane.api.texdesc import (
    ARRAY3D_CUBEMAP,
    ARRAY3D_LAYERED,
    DESC_BYTES,
    MAGIC_SURF,
    MAGIC_TEX,
    TRSF_NORMALIZED_COORDINATES,
    TexDesc,
)
from crane.backends.sim.memory import MemoryFault

from .memspace import resolve
from .ops_common import Mods
from .ptxtypes import TYPES

__all__ = ["GEOM", "dec_query", "lane_count", "lane_groups", "object_operand", "pick", "read_desc"]

GEOM = {
    "1d": (1, False, False),
    "2d": (2, False, False),
    "3d": (3, False, False),
    "a1d": (1, True, False),
    "a2d": (2, True, False),
    "cube": (3, False, True),
    "acube": (3, True, True),
}


# ---- descriptors ------------------------------------------------------------------------------
def read_desc(st, handle: int, magic: int) -> TexDesc:
    """The descriptor at ``handle``, validated: a handle that is no object of this kind (a
    stray pointer, a freed or overwritten object) faults as an illegal address, as on a GPU."""
    what = "texture" if magic == MAGIC_TEX else "surface"
    try:
        if handle > (1 << 64) - DESC_BYTES:
            raise ValueError("past the end of the address space")
        # both ends in the session's memory, 8-byte aligned, before a byte is read
        st.mem.offsets(np.array([handle + DESC_BYTES - 8], np.uint64), 8)
        for _sel, buf, off in resolve(st, "global", np.uint64(handle), 8, None):
            raw = bytes(buf[int(off) : int(off) + DESC_BYTES])
        desc = TexDesc.unpack(raw)
    except (MemoryFault, ValueError) as e:
        raise MemoryFault(f"{handle:#x} is not a {what} object ({e})", handle, "illegal") from e
    if desc.magic != magic:
        raise MemoryFault(f"{handle:#x} is not a {what} object", handle, "illegal")
    return desc


def lane_groups(st, ins, idx):
    """(lanes selector or None, handle) per distinct handle the lanes hold."""
    h = ins.a.get(st, idx)
    if not isinstance(h, np.ndarray) or h.size == 0:
        return [(None, int(h))] if not isinstance(h, np.ndarray) else []
    first = h[0]
    if (h == first).all():
        return [(None, int(first))]
    return [(h == u, int(u)) for u in np.unique(h)]


def pick(vals, sel):
    if sel is None or not isinstance(vals, np.ndarray) or vals.ndim == 0:
        return vals
    return vals[sel]


def lane_count(st, idx) -> int:
    return st.n if idx is None else len(idx)


def object_operand(ctx, op):
    if op[0] != "texref" or len(op[1]) != 2:
        raise ctx.unsupported("texture operands other than [handle, {coordinates}]")
    h, coords = op[1]
    if h[0] not in ("reg",):
        raise ctx.unsupported("texture references (.texref variables); use texture objects")
    return ctx.src(h, TYPES["u64"]), coords


# ---- txq / suq --------------------------------------------------------------------------------
_TXQ = (
    "width",
    "height",
    "depth",
    "array_size",
    "num_mipmap_levels",
    "normalized_coords",
    "filter_mode",
    "addr_mode_0",
    "addr_mode_1",
    "addr_mode_2",
    "force_unnormalized_coords",
)
_SUQ = ("width", "height", "depth", "array_size")
_UNKNOWN_ENCODING = ("channel_data_type", "channel_order", "num_samples", "memory_layout")


def _query(desc: TexDesc, what: str, level: int) -> int:
    """One attribute. Layered resources report their layers (cubemaps: cubes) as array_size
    and a depth of 1; 1D resources a height of 1."""
    lv = desc.levels[min(max(level, 0), len(desc.levels) - 1)]
    layered = bool(desc.flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP))
    cube = 6 if desc.flags & ARRAY3D_CUBEMAP else 1
    return {
        "width": lv.width,
        "height": lv.height,
        "depth": 1 if layered else lv.depth,
        "array_size": lv.depth // cube if layered else 1,
        "num_mipmap_levels": len(desc.levels),
        "normalized_coords": int(bool(desc.tex_flags & TRSF_NORMALIZED_COORDINATES)),
        "filter_mode": desc.filter,
        "addr_mode_0": desc.address[0],
        "addr_mode_1": desc.address[1],
        "addr_mode_2": desc.address[2],
        "force_unnormalized_coords": 0,
    }[what]


def _h_query(st, ins, idx) -> None:
    what, magic = ins.x
    n = lane_count(st, idx)
    out = np.zeros(n, np.uint32)
    lod = ins.c.get(st, idx) if ins.c is not None else None
    for sel, handle in lane_groups(st, ins, idx):
        desc = read_desc(st, handle, magic)
        m = n if sel is None else int(np.count_nonzero(sel))
        if lod is None:
            vals = np.full(m, _query(desc, what, 0), np.uint32)
        else:
            lv = np.broadcast_to(np.asarray(pick(lod, sel)).view(np.int32), (m,))
            vals = np.zeros(m, np.uint32)
            for u in np.unique(lv):
                vals[lv == u] = _query(desc, what, int(u))
        if sel is None:
            out = vals
        else:
            out[sel] = vals
    ins.d.put(st, idx, out)


def dec_query(ctx, mods, surface: bool) -> None:
    m = Mods(ctx, mods)
    level = not surface and m.take("level") is not None
    names = _SUQ if surface else _TXQ
    what = m.take(*names, *_UNKNOWN_ENCODING)
    if what is None or (level and what not in ("width", "height", "depth")):
        raise ctx.error("unknown texture/surface query")
    if what in _UNKNOWN_ENCODING or what not in names:
        raise ctx.unsupported(f".{what} queries")
    ts = m.types()
    m.done()
    if [t.name for t in ts] != ["b32"]:
        raise ctx.error("queries return .b32")
    ctx.nops(3 if level else 2)
    ins = ctx.ins
    ref = ctx.ops[1]
    if ref[0] != "mem" or ref[2] or ref[1][0] != "reg":
        raise ctx.unsupported("queries of .texref/.surfref variables; use texture objects")
    ins.a = ctx.src(ref[1], TYPES["u64"])
    ins.d = ctx.dst(ctx.ops[0], TYPES["b32"])
    ins.c = ctx.src(ctx.ops[2], TYPES["b32"]) if level else None
    ins.x = (what, MAGIC_SURF if surface else MAGIC_TEX)
    ins.fn = _h_query
