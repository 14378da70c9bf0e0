"""Texture instructions: tex, tld4, txq (texture class; surfaces are :mod:`.ops_surf`).

A texture operand is ``[handle, {coordinates}]`` (unified mode: the handle is a
``.u64`` register holding a ``CUtexObject``). Crane's handles are the device
address of a :class:`~crane.api.texdesc.TexDesc` (see that module for why), so each execution
reads the descriptor of every distinct handle its lanes hold, validates it, and samples the
array or linear memory it describes, for all lanes at once.

Sampling follows the CUDA programming guide's texture-fetching appendix: texel centres at
``i + 0.5``; nearest-point sampling takes ``floor(x)``; linear filtering blends the 2/4/8
neighbours of ``x - 0.5`` with weights held in 9-bit fixed point (8 fraction bits); normalized
coordinates scale by the extent; wrap and mirror apply to normalized coordinates only (an
unnormalized one clamps), border returns the border colour per tap. Integer formats read as
normalized floats map to [0, 1] (unsigned) or [-1, 1] (signed, the most negative value clamped
to -1); sRGB applies to the colour channels of 8-bit textures. Cubemap directions select a face
by their major axis (the face table of the OpenGL/D3D specifications CUDA follows).
"""

from __future__ import annotations

import numpy as np

from crane.api.texdesc import (
    FORMATS,
    MAGIC_SURF,
    MAGIC_TEX,
    RES_LINEAR,
    RES_MIPMAPPED,
    TRSF_NORMALIZED_COORDINATES,
    TRSF_READ_AS_INTEGER,
    TRSF_SRGB,
    Level,
    TexDesc,
)

from .ops_common import Mods
from .ptxtypes import TYPES
from .texobj import GEOM, dec_query, lane_count, lane_groups, object_operand, pick, read_desc

__all__ = ["dec_tex", "dec_tld4", "dec_txq"]

_WRAP, _CLAMP, _MIRROR, _BORDER = range(4)


def _texels(st, desc: TexDesc, lv: Level) -> np.ndarray:
    """The level's components as one flat array (validated against the session's memory)."""
    dt, csize, _ = FORMATS[desc.format]
    size = lv.slice * lv.depth
    offs = st.mem.offsets(np.array([lv.base, lv.base + size - 1], np.uint64), 1)
    start = int(offs[0])
    return st.mem.buf[start : start + size - size % csize].view(dt)


# ---- texel fetch and conversion ------------------------------------------------------------
def _convert(raw: np.ndarray, desc: TexDesc) -> np.ndarray:
    """Components as returned by the texture unit: float32 (normalized or float formats) or
    int64 (read as integer)."""
    _, csize, kind = FORMATS[desc.format]
    if kind == "f":
        return raw.astype(np.float32)
    if desc.tex_flags & TRSF_READ_AS_INTEGER or desc.magic == MAGIC_SURF:
        return raw.astype(np.int64)
    top = float((1 << (8 * csize - (1 if kind == "s" else 0))) - 1)
    v = raw.astype(np.float32) / np.float32(top)
    return np.maximum(v, np.float32(-1.0)) if kind == "s" else v


def _srgb(v: np.ndarray) -> np.ndarray:
    lin = np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)
    return lin.astype(np.float32)


def _fetch(st, desc: TexDesc, lv: Level, ix, iy, iz, outside) -> np.ndarray:
    """Texels at integer coordinates (already addressed), shape (lanes, 4); lanes in
    ``outside`` get the border colour (zero for linear memory)."""
    data = _texels(st, desc, lv)
    csize = FORMATS[desc.format][1]
    ch = desc.channels
    n = ix.shape[0]
    ok = ~outside
    el = (
        np.where(ok, iz, 0).astype(np.int64) * (lv.slice // csize)
        + np.where(ok, iy, 0).astype(np.int64) * (lv.pitch // csize)
        + np.where(ok, ix, 0).astype(np.int64) * ch
    )
    comps = _convert(data[el[:, None] + np.arange(ch)], desc)
    isf = comps.dtype == np.float32
    out = np.zeros((n, 4), comps.dtype)
    out[:, 3] = 1
    out[:, :ch] = comps
    if isf and desc.tex_flags & TRSF_SRGB and csize == 1:
        out[:, :3] = _srgb(out[:, :3])
    if outside.any():
        linear = desc.res_type == RES_LINEAR
        border = np.zeros(4, np.float32) if linear else np.array(desc.border, np.float32)
        # an integer texture returns the border colour's bits
        out[outside] = border if isf else border.view(np.uint32).astype(np.int64)
    return out


def _address(i: np.ndarray, size: int, mode: int) -> tuple[np.ndarray, np.ndarray]:
    """(index, outside) for integer texel indices under an addressing mode."""
    if mode == _WRAP:
        return np.mod(i, size), np.zeros(i.shape, bool)
    if mode == _MIRROR:
        m = np.mod(i, 2 * size)
        return np.where(m >= size, 2 * size - 1 - m, m), np.zeros(i.shape, bool)
    if mode == _BORDER:
        return i, (i < 0) | (i >= size)
    return np.clip(i, 0, size - 1), np.zeros(i.shape, bool)


# ---- tex --------------------------------------------------------------------------------------
def _cube(x, y, z):
    """Major-axis face selection: (face, s, t) with s, t normalized on the face."""
    ax, ay, az = np.abs(x), np.abs(y), np.abs(z)
    xm = (ax >= ay) & (ax >= az)
    ym = ~xm & (ay >= az)
    face = np.where(xm, np.where(x >= 0, 0, 1), np.where(ym, np.where(y >= 0, 2, 3),
                                                          np.where(z >= 0, 4, 5)))  # fmt: skip
    sc = np.select([xm & (x >= 0), xm, ym, z >= 0], [-z, z, x, x], -x)
    tc = np.select([xm, ym & (y >= 0), ym], [-y, z, -z], -y)
    ma = np.where(xm, ax, np.where(ym, ay, az))
    ma = np.where(ma == 0, np.float32(1), ma)
    return face, (sc / ma + 1) * 0.5, (tc / ma + 1) * 0.5


def _finite(u: np.ndarray) -> np.ndarray:
    """Coordinates as the texture unit's fixed-point conversion sees them: NaN as 0, and
    infinities (and anything huge) saturated far outside every texture."""
    return np.clip(np.nan_to_num(u, nan=0.0), -(2.0**40), 2.0**40)


def _quantize(frac: np.ndarray) -> np.ndarray:
    """Filter weights in 9-bit fixed point with 8 fraction bits, as the texture unit."""
    return (np.round(frac * 256.0) / 256.0).astype(np.float32)


def _sample(st, desc: TexDesc, lv: Level, coords, layer, int_coords: bool, geom) -> np.ndarray:
    """Sample one level for lanes with spatial ``coords`` (list of arrays) and ``layer``."""
    ndim, _layered, cube = geom
    sizes = [lv.width, lv.height, lv.depth][:ndim]
    n = coords[0].shape[0]
    modes = list(desc.address)
    if cube:
        face, s, t = _cube(*coords)
        coords, sizes, ndim = [s, t], sizes[:2], 2
        layer = face if layer is None else layer * 6 + face
        norm = True
    else:
        norm = bool(desc.tex_flags & TRSF_NORMALIZED_COORDINATES)
    if not norm:  # wrap and mirror need normalized coordinates; unnormalized ones clamp
        modes = [_CLAMP if m in (_WRAP, _MIRROR) else m for m in modes]
    linear_mem = desc.res_type == RES_LINEAR
    axes = []
    for k in range(ndim):
        size = sizes[k]
        if int_coords:
            i = coords[k].astype(np.int64)
            axes.append([(i, np.ones(n, np.float32))])
            continue
        u = coords[k].astype(np.float64)
        u = _finite(u)
        if norm:
            u = u * size
        if desc.filter == 0:
            axes.append([(np.floor(u).astype(np.int64), np.ones(n, np.float32))])
        else:
            b = u - 0.5
            i0 = np.floor(b)
            a = _quantize(b - i0)
            i0 = i0.astype(np.int64)
            axes.append([(i0, 1 - a), (i0 + 1, a)])
    zero = np.zeros(n, np.int64)
    acc = None
    for combo in np.ndindex(*[len(ax) for ax in axes]):
        idx, w = [], np.ones(n, np.float32)
        outside = np.zeros(n, bool)
        for k, c in enumerate(combo):
            i, wk = axes[k][c]
            if linear_mem:
                out_k = (i < 0) | (i >= sizes[k])
                i = np.clip(i, 0, sizes[k] - 1)
            else:
                i, out_k = _address(i, sizes[k], modes[k])
            idx.append(i)
            outside |= out_k
            w = w * wk
        ix = idx[0]
        iy = idx[1] if ndim > 1 else zero
        iz = idx[2] if ndim > 2 else (layer if layer is not None else zero)
        v = _fetch(st, desc, lv, ix, iy, iz, outside)
        if len(axes) and all(len(ax) == 1 for ax in axes):
            return v
        v = v.astype(np.float32) * w[:, None]
        acc = v if acc is None else acc + v
    return acc


def _levels_for(desc: TexDesc, lod, n: int):
    """Per lane: (level index array, blend weight toward the next level or None)."""
    count = len(desc.levels)
    if desc.res_type != RES_MIPMAPPED or lod is None or count == 1:
        return np.zeros(n, np.int64), None
    lam = np.nan_to_num(np.asarray(lod, np.float64) + desc.mip_bias, nan=0.0)
    # the descriptor's [minMipmapLevelClamp, maxMipmapLevelClamp], within the levels there are
    hi = min(max(desc.mip_max, 0.0), count - 1)
    lam = np.clip(lam, min(max(desc.mip_min, 0.0), hi), hi)
    lam = np.broadcast_to(lam, (n,))
    if desc.mip_filter == 0:
        return np.floor(lam + 0.5).astype(np.int64), None
    lo = np.floor(lam).astype(np.int64)
    return lo, _quantize(lam - lo)


def _h_tex(st, ins, idx) -> None:
    geom, int_coords, dst_dtype, gather = ins.x
    ndim, layered, _ = geom
    coords_all = [c.get(st, idx) for c in ins.b]
    lod_all = ins.c.get(st, idx) if ins.c is not None else None
    n = lane_count(st, idx)
    result = np.zeros((n, 4), np.float32 if dst_dtype.kind == "f" else np.int64)
    for sel, handle in lane_groups(st, ins, idx):
        desc = read_desc(st, handle, MAGIC_TEX)
        m = n if sel is None else int(np.count_nonzero(sel))
        vals = [np.broadcast_to(pick(v, sel), (m,)) for v in coords_all]
        layer = None
        if layered:
            count = desc.levels[0].depth // (6 if geom[2] else 1)
            layer = np.clip(vals[0].view(np.int32).astype(np.int64), 0, max(count - 1, 0))
            vals = vals[1:]
        spatial = [np.asarray(v) for v in vals[:ndim]]
        if not int_coords:
            spatial = [np.asarray(v).view(np.float32) for v in spatial]
        else:
            spatial = [np.asarray(v).view(np.int32) for v in spatial]
        if gather is not None:
            out = _gather(st, desc, spatial, layer, geom, gather)
        else:
            lod = None if lod_all is None else np.broadcast_to(pick(lod_all, sel), (m,))
            lev, blend = _levels_for(desc, lod, m)
            out = None
            for L in np.unique(lev):
                here = lev == L
                sub = [c[here] for c in spatial]
                lay = None if layer is None else layer[here]
                v = _sample(st, desc, desc.levels[int(L)], sub, lay, int_coords, geom)
                if blend is not None and int(L) + 1 < len(desc.levels):
                    v2 = _sample(st, desc, desc.levels[int(L) + 1], sub, lay, int_coords, geom)
                    b = blend[here][:, None]
                    v = v.astype(np.float32) * (1 - b) + v2.astype(np.float32) * b
                if out is None:
                    out = np.zeros((m, 4), v.dtype)
                out[here] = v
        if sel is None:
            result = _as(out, result.dtype)
        else:
            result[sel] = _as(out, result.dtype)
    for k, d in enumerate(ins.d):
        col = result[:, k]
        if dst_dtype.kind == "f":
            d.put(st, idx, col.astype(np.float32))
        else:
            d.put(st, idx, col.astype(np.int64).astype(dst_dtype.dtype))


def _as(v: np.ndarray, dtype) -> np.ndarray:
    """Reinterpret a texture result for the destination registers' type (the registers hold
    the bits the texture unit returned)."""
    if v.dtype == dtype:
        return v
    if dtype == np.float32:  # integer texels into float registers: their bits
        return v.astype(np.int64).astype(np.uint32).view(np.float32)
    return v.astype(np.float32).view(np.int32).astype(np.int64)


def _gather(st, desc: TexDesc, spatial, layer, geom, comp: int) -> np.ndarray:
    """tld4: component ``comp`` of the four texels bilinear filtering would blend, in the
    order (i0, j1), (i1, j1), (i1, j0), (i0, j0)."""
    lv = desc.levels[0]
    n = spatial[0].shape[0]
    modes = list(desc.address)
    norm = bool(desc.tex_flags & TRSF_NORMALIZED_COORDINATES)
    if not norm:
        modes = [_CLAMP if m in (_WRAP, _MIRROR) else m for m in modes]
    ij = []
    for k, size in enumerate((lv.width, lv.height)):
        u = spatial[k].astype(np.float64)
        u = _finite(u) * (size if norm else 1)
        i0 = np.floor(u - 0.5).astype(np.int64)
        ij.append([_address(i0, size, modes[k]), _address(i0 + 1, size, modes[k])])
    z = layer if layer is not None else np.zeros(n, np.int64)
    out = None
    for slot, (a, b) in enumerate(((0, 1), (1, 1), (1, 0), (0, 0))):
        (ix, ox), (iy, oy) = ij[0][a], ij[1][b]
        v = _fetch(st, desc, lv, ix, iy, z, ox | oy)[:, comp]
        if out is None:
            out = np.zeros((n, 4), v.dtype)
        out[:, slot] = v
    return out


def _dec_texlike(ctx, mods, gather: bool) -> None:
    m = Mods(ctx, mods)
    comp = None
    if gather:
        c = m.take("r", "g", "b", "a")
        if c is None:
            raise ctx.error("tld4 needs a component (.r, .g, .b or .a)")
        comp = "rgba".index(c)
    variant = m.take("level", "grad", "base")
    g = m.take(*GEOM, "2dms", "a2dms")
    if g is None:
        raise ctx.error("missing texture geometry")
    if g in ("2dms", "a2dms"):
        raise ctx.unsupported("multisample textures")
    if variant == "grad":
        raise ctx.unsupported("tex.grad (gradient level-of-detail)")
    if gather and g not in ("2d", "a2d"):
        raise ctx.unsupported(f"tld4.{g}")
    if not m.take("v4"):
        raise ctx.unsupported("texture results other than .v4")
    ts = m.types()
    m.done()
    if len(ts) != 2 or ts[0].name not in ("f32", "s32", "u32") or ts[1].name not in ("f32", "s32"):
        raise ctx.unsupported("texture types other than .v4.{f32,s32,u32}.{f32,s32}")
    dty, cty = ts
    geom = GEOM[g]
    ctx.nops(2, 3)
    ins = ctx.ins
    dsts = ctx.ops[0]
    if dsts[0] != "vec" or len(dsts[1]) != 4:
        raise ctx.unsupported("texture destinations other than four registers")
    ins.d = [ctx.dst(x, dty) for x in dsts[1]]
    ins.a, coords = object_operand(ctx, ctx.ops[1])
    items = coords[1] if coords[0] == "vec" else [coords]
    need = geom[0] + (1 if geom[1] else 0)
    if len(items) < need:
        raise ctx.error(f"{g} takes {need} coordinates")
    srcs = []
    for k, it in enumerate(items[:need]):
        ty = TYPES["s32"] if (geom[1] and k == 0) else cty
        srcs.append(ctx.src(it, TYPES["b32"] if ty.name == "s32" else TYPES["f32"]))
    ins.b = srcs
    ins.c = None
    if variant == "level":
        if len(ctx.ops) != 3:
            raise ctx.error("tex.level needs a level-of-detail operand")
        ins.c = ctx.src(ctx.ops[2], TYPES["f32"])
    elif len(ctx.ops) == 3:
        raise ctx.unsupported("texture offsets / depth compare operands")
    if variant == "base":
        ins.c = None
    int_coords = bool(cty.name == "s32" and not gather)
    ins.x = (geom, int_coords, dty, comp)
    ins.fn = _h_tex


def dec_tex(ctx, mods) -> None:
    _dec_texlike(ctx, mods, gather=False)


def dec_tld4(ctx, mods) -> None:
    _dec_texlike(ctx, mods, gather=True)


def dec_txq(ctx, mods) -> None:
    dec_query(ctx, mods, surface=False)
