"""Surface instructions: suld.b, sust.b (1d/2d/3d/a1d/a2d; .trap, .clamp, .zero) and suq.

A surface object is a descriptor in device memory over a CUDA array created with
CUDA_ARRAY3D_SURFACE_LDST (:mod:`crane.api.texdesc`). The x coordinate counts bytes, y and z
texels (z: slices, or the layer of a layered array, whose index comes first). Out-of-range
accesses trap (an illegal address, as on hardware), clamp to the nearest texel, or read zero
and store nothing, as the instruction's mode says.
"""

from __future__ import annotations

import numpy as np

from crane.api.texdesc import MAGIC_SURF, TexDesc
from crane.backends.sim.memory import MemoryFault

from .ops_common import Mods
from .ptxtypes import TYPES
from .texobj import GEOM, dec_query, lane_count, lane_groups, object_operand, pick, read_desc

__all__ = ["dec_suld", "dec_suq", "dec_sust"]

_SURF_GEOM = ("1d", "2d", "3d", "a1d", "a2d")


def _surface_addresses(st, ins, idx, sel, desc: TexDesc, nbytes: int):
    """Per lane (byte address, outside) of the access, after the clamp mode if any."""
    geom, mode = ins.x[0], ins.x[1]
    ndim, layered, _ = GEOM[geom]
    lv = desc.levels[0]
    vals = [pick(c.get(st, idx), sel) for c in ins.b]
    m = lane_count(st, idx) if sel is None else int(np.count_nonzero(sel))
    vals = [np.broadcast_to(np.asarray(v).view(np.int32).astype(np.int64), (m,)) for v in vals]
    layer = None
    if layered:
        layer, vals = vals[0], vals[1:]
    x = vals[0]
    y = vals[1] if ndim > 1 else np.zeros(m, np.int64)
    z = vals[2] if ndim > 2 else (layer if layer is not None else np.zeros(m, np.int64))
    row = lv.width * desc.elem_bytes
    limits = (row - nbytes, lv.height - 1, lv.depth - 1)
    outside = (x < 0) | (x > limits[0]) | (y < 0) | (y > limits[1]) | (z < 0) | (z > limits[2])
    if mode == "clamp":
        x = np.clip(x, 0, limits[0]) // nbytes * nbytes
        y, z = np.clip(y, 0, limits[1]), np.clip(z, 0, limits[2])
        outside = np.zeros(m, bool)
    elif mode == "trap" and outside.any():
        k = int(np.argmax(outside))
        raise MemoryFault(
            f"surface access at ({int(x[k])} bytes, {int(y[k])}, {int(z[k])}) is outside the "
            f"{lv.width}x{lv.height}x{lv.depth} surface (.trap)",
            lv.base,
            "illegal",
        )
    addr = np.where(outside, lv.base, lv.base + z * lv.slice + y * lv.pitch + x)
    addr = addr.astype(np.uint64)  # lanes outside (.zero) read nothing and store nothing
    if (x % nbytes).any():
        k = int(np.argmax(x % nbytes != 0))
        raise MemoryFault(
            f"misaligned {nbytes}-byte surface access at x={int(x[k])}", int(addr[k]),
            "misaligned",
        )  # fmt: skip
    return addr, outside


def _h_suld(st, ins, idx) -> None:
    _geom, _mode, dtype = ins.x
    nvec = len(ins.d)
    nbytes = dtype.itemsize * nvec
    n = lane_count(st, idx)
    result = np.zeros((n, nvec), dtype)
    for sel, handle in lane_groups(st, ins, idx):
        desc = read_desc(st, handle, MAGIC_SURF)
        addr, outside = _surface_addresses(st, ins, idx, sel, desc, nbytes)
        off = st.mem.offsets(addr, nbytes)
        raw = st.mem.buf[off[:, None] + np.arange(nbytes)].copy().view(dtype)
        raw[outside] = 0
        if sel is None:
            result = raw.reshape(-1, nvec)
        else:
            result[sel] = raw.reshape(-1, nvec)
    for k, d in enumerate(ins.d):
        d.put(st, idx, result[:, k])


def _h_sust(st, ins, idx) -> None:
    _geom, _mode, dtype = ins.x
    nvec = len(ins.c)
    nbytes = dtype.itemsize * nvec
    n = lane_count(st, idx)
    vals = np.stack(
        [np.broadcast_to(np.asarray(s.get(st, idx)).astype(dtype), (n,)) for s in ins.c], 1
    )
    for sel, handle in lane_groups(st, ins, idx):
        desc = read_desc(st, handle, MAGIC_SURF)
        addr, outside = _surface_addresses(st, ins, idx, sel, desc, nbytes)
        v = vals if sel is None else vals[sel]
        keep = ~outside
        addr, v = addr[keep], v[keep]
        if not addr.size:
            continue
        off = st.mem.offsets(addr, nbytes)
        st.mem.buf[off[:, None] + np.arange(nbytes)] = np.ascontiguousarray(v).view(np.uint8)


def _dec_surface(ctx, mods, load: bool) -> None:
    m = Mods(ctx, mods)
    if m.take("p"):
        raise ctx.unsupported("formatted surface access (.p)")
    if not m.take("b"):
        raise ctx.error("surface access needs .b")
    g = m.take(*_SURF_GEOM)
    if g is None:
        raise ctx.unsupported("surface geometry other than 1d/2d/3d/a1d/a2d")
    v = m.take("v2", "v4")
    nvec = int(v[1:]) if v else 1
    mode = m.take("trap", "clamp", "zero", default="trap")
    m.take("ca", "cg", "cs", "cv", "wb", "wt")
    ts = m.types()
    m.done()
    if len(ts) != 1 or ts[0].name not in ("b8", "b16", "b32", "b64"):
        raise ctx.error("surface access type must be .b8/.b16/.b32/.b64")
    ty = ts[0]
    ctx.nops(2)
    ins = ctx.ins
    ref = ctx.ops[1] if load else ctx.ops[0]
    ins.a, coords = object_operand(ctx, ref)
    items = coords[1] if coords[0] == "vec" else [coords]
    ndim, layered, _ = GEOM[g]
    need = ndim + (1 if layered else 0)
    if len(items) < need:
        raise ctx.error(f"{g} takes {need} coordinates")
    ins.b = [ctx.src(it, TYPES["b32"]) for it in items[:need]]
    vec = ctx.ops[0] if load else ctx.ops[1]
    ops = vec[1] if vec[0] == "vec" else [vec]
    if len(ops) != nvec:
        raise ctx.error(f"expected {nvec} {'destinations' if load else 'sources'}")
    uty = TYPES[{8: "u8", 16: "u16", 32: "u32", 64: "u64"}[ty.bits]]
    if load:
        ins.d = [ctx.dst(o, uty) for o in ops]
        ins.fn = _h_suld
    else:
        ins.c = [ctx.src(o, uty) for o in ops]
        ins.fn = _h_sust
    ins.x = (g, mode, uty.dtype)


def dec_suld(ctx, mods) -> None:
    _dec_surface(ctx, mods, load=True)


def dec_sust(ctx, mods) -> None:
    _dec_surface(ctx, mods, load=False)


def dec_suq(ctx, mods) -> None:
    dec_query(ctx, mods, surface=True)
