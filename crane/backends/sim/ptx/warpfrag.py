"""Matrix fragments spread over a warp's lanes: the shared machinery of ``mma``, ``wmma`` and
``ldmatrix``/``stmatrix``/``movmatrix``.

A fragment is a list of registers in every lane; each register packs one or more elements
(two ``.f16``/``.bf16`` in a ``.b32``, four ``.s8``/``.u8``/``.e4m3``/``.e5m2``, one
``.f32``/``.tf32``/``.s32``, one ``.f64``). A *layout* says, for each lane (0-31) and each
element *slot* of the lane (register-major, then the element's position inside the register
from the low bits up), the (row, column) of the matrix element held there; several slots may
hold the same element (the WMMA ``.f16`` A/B fragments hold each element two or four times).
:func:`gather` assembles each warp's whole matrix from its lanes' registers; :func:`scatter`
writes a per-warp matrix back to the lanes being executed, each taking its own slots.
"""

from __future__ import annotations

import numpy as np

from .errors import KernelFault
from .narrowfp import NARROW, decode_to_f16
from .ptxtypes import TYPES

__all__ = [
    "ELEMENTS",
    "STORAGE",
    "Layout",
    "decode",
    "encode",
    "frag_regs",
    "gather",
    "layout",
    "pack_bits",
    "reg_type",
    "require_full",
    "scatter",
    "unpack_bits",
    "warps",
]

#: element type -> (elements per register, register bits)
ELEMENTS = {
    "f16": (2, 32),
    "bf16": (2, 32),
    "s8": (4, 32),
    "u8": (4, 32),
    "e4m3": (4, 32),
    "e5m2": (4, 32),
    "tf32": (1, 32),
    "f32": (1, 32),
    "s32": (1, 32),
    "f64": (1, 64),
    "b16": (2, 32),
}


class Layout:
    """Where each (lane, slot) element sits in a ``rows x cols`` matrix."""

    __slots__ = ("cols", "ety", "nregs", "pos_c", "pos_r", "rows")

    def __init__(self, ety: str, rows: int, cols: int, pos: np.ndarray) -> None:
        self.ety, self.rows, self.cols = ety, rows, cols
        self.pos_r = np.ascontiguousarray(pos[..., 0], np.int64)  # (32, slots)
        self.pos_c = np.ascontiguousarray(pos[..., 1], np.int64)
        self.nregs = pos.shape[1] // ELEMENTS[ety][0]


def layout(ety: str, rows: int, cols: int, fn) -> Layout:
    """A layout from ``fn(group, tig, i) -> (row, col)`` over lanes (``groupID = lane >> 2``,
    ``threadID_in_group = lane % 4``) and the slot ``i``; ``fn.slots`` is the slot count."""
    lane = np.arange(32)[:, None]
    i = np.arange(fn.slots)[None, :]
    r, c = fn(lane >> 2, lane & 3, i)
    pos = np.stack(np.broadcast_arrays(r, c), axis=-1)
    return Layout(ety, rows, cols, pos)


def reg_type(ety: str):
    """The raw register type a fragment of ``ety`` is read and written through."""
    return TYPES["b64"] if ELEMENTS[ety][1] == 64 else TYPES["b32"]


#: element type -> the NumPy type of one element's bits in memory
STORAGE = {
    "f16": np.uint16,
    "bf16": np.uint16,
    "b16": np.uint16,
    "s8": np.uint8,
    "u8": np.uint8,
    "e4m3": np.uint8,
    "e5m2": np.uint8,
    "tf32": np.uint32,
    "f32": np.uint32,
    "s32": np.uint32,
    "f64": np.uint64,
}


def frag_regs(ctx, op, n: int, ety: str, dst: bool) -> list:
    """A fragment operand's ``n`` registers (a ``{...}`` vector, or one register when
    ``n`` is 1) decoded for element type ``ety``, as destinations or as sources."""
    items = op[1] if op[0] == "vec" else [op]
    if len(items) != n:
        raise ctx.error(f"expected a vector of {n} registers")
    ty = reg_type(ety)
    return [ctx.dst(x, ty) if dst else ctx.src(x, ty) for x in items]


def pack_bits(ety: str, bits: np.ndarray) -> np.ndarray:
    """Elements' raw bits (..., slots) -> register bits (..., nregs), low element first."""
    per = ELEMENTS[ety][0]
    if per == 1:
        return bits.astype(np.uint64 if ety == "f64" else np.uint32)
    b = bits.astype(np.uint32).reshape(*bits.shape[:-1], -1, per)
    w = 32 // per
    out = b[..., 0]
    for k in range(1, per):
        out = out | (b[..., k] << (w * k))
    return out


def unpack_bits(ety: str, raw: np.ndarray) -> np.ndarray:
    """Register bits (..., nregs) -> elements' raw bits (..., slots); the inverse of
    :func:`pack_bits`."""
    per = ELEMENTS[ety][0]
    st = STORAGE[ety]
    if per == 1:
        return raw.astype(st)
    w = 32 // per
    raw = raw.astype(np.uint32)
    parts = [(raw >> (w * k)) & ((1 << w) - 1) for k in range(per)]
    return np.stack(parts, axis=-1).reshape(*raw.shape[:-1], -1).astype(st)


def decode(ety: str, raw: np.ndarray) -> np.ndarray:
    """Raw register bits (..., nregs) -> element values (..., nregs * per): floats as
    float32/float64 (f16, bf16 and tf32 widened exactly), integers as int64."""
    per = ELEMENTS[ety][0]
    if ety == "f64":
        return raw.astype(np.uint64).view(np.float64)
    raw = raw.astype(np.uint32)
    if per == 2:
        h = np.stack([raw & 0xFFFF, raw >> 16], axis=-1).reshape(*raw.shape[:-1], -1)
        h = h.astype(np.uint16)
        if ety == "f16":
            return h.view(np.float16).astype(np.float32)
        if ety == "bf16":
            return (h.astype(np.uint32) << 16).view(np.float32)
        return h
    if per == 4:
        b = np.stack([(raw >> (8 * k)) & 0xFF for k in range(4)], axis=-1)
        b = b.reshape(*raw.shape[:-1], -1).astype(np.uint8)
        if ety in NARROW:  # FP8: exact in f16, so in f32
            return decode_to_f16(b, NARROW[ety]).view(np.float16).astype(np.float32)
        return (b.view(np.int8) if ety == "s8" else b).astype(np.int64)
    if ety == "tf32":  # the low 13 mantissa bits are not part of a .tf32 operand
        return (raw & np.uint32(0xFFFFE000)).view(np.float32)
    if ety == "f32":
        return raw.view(np.float32)
    return raw.view(np.int32).astype(np.int64)


def encode(ety: str, vals: np.ndarray) -> np.ndarray:
    """Element values (..., slots) -> raw register bits (..., nregs); the inverse of
    :func:`decode` (f16 rounds to nearest even, integers wrap to their width)."""
    per = ELEMENTS[ety][0]
    if ety == "f64":
        return np.asarray(vals, np.float64).view(np.uint64)
    if per == 2:
        if ety == "f16":
            h = np.asarray(vals, np.float32).astype(np.float16).view(np.uint16)
        elif ety == "b16":
            h = np.asarray(vals, np.uint16)
        else:
            raise AssertionError("bf16 results are not produced")
        h = h.astype(np.uint32).reshape(*h.shape[:-1], -1, 2)
        return h[..., 0] | (h[..., 1] << 16)
    if per == 4:
        b = (np.asarray(vals, np.int64) & 0xFF).astype(np.uint32)
        b = b.reshape(*b.shape[:-1], -1, 4)
        return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    if ety in ("f32", "tf32"):
        return np.asarray(vals, np.float32).view(np.uint32)
    return (np.asarray(vals, np.int64) & 0xFFFFFFFF).astype(np.uint32)


def warps(st, idx) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(lanes, warp_of_lane, members, valid)`` for the lanes ``idx``: the distinct warps
    they belong to, each lane's warp index, each warp's 32 state lanes (``members``,
    clamped) and which of those exist (a warp of a block whose size is not a multiple of 32
    is partial)."""
    lanes = np.arange(st.n) if idx is None else np.asarray(idx)
    base = st.warp_base[lanes].astype(np.int64)
    wb, which = np.unique(base, return_inverse=True)
    members = wb[:, None] + np.arange(32)[None, :]
    end = st.block_end[wb].astype(np.int64)[:, None]  # a warp's first lane always exists
    valid = members < end
    return lanes, which, np.where(valid, members, wb[:, None]), valid


def require_full(valid: np.ndarray, what: str) -> None:
    """Warp-collective matrix instructions need all 32 lanes (``.aligned``)."""
    if not valid.all():
        raise KernelFault(
            715,
            f"{what} executed by a partial warp (the block's size is not a "
            "multiple of 32): the instruction needs all 32 lanes",
        )


def gather(st, regs: list, lay: Layout, members: np.ndarray) -> np.ndarray:
    """Each warp's matrix (nw, rows, cols) assembled from its lanes' fragment registers."""
    raw = np.stack([np.broadcast_to(r.get(st, None), (st.n,)) for r in regs], axis=-1)  # (n, nregs)
    el = decode(lay.ety, raw[members])  # (nw, 32, slots)
    dt = np.float64 if lay.ety == "f64" else (np.int64 if el.dtype.kind in "iu" else np.float32)
    if lay.ety == "b16":
        dt = np.uint16
    mat = np.zeros((members.shape[0], lay.rows, lay.cols), dt)
    mat[:, lay.pos_r, lay.pos_c] = el
    return mat


def scatter(st, regs: list, lay: Layout, mat: np.ndarray, lanes, which, idx) -> None:
    """Write each executing lane's slots of its warp's matrix ``mat`` into its registers."""
    lid = st.special["%laneid"][lanes].astype(np.int64)
    vals = mat[which[:, None], lay.pos_r[lid], lay.pos_c[lid]]  # (nl, slots)
    raw = encode(lay.ety, vals)
    for j, r in enumerate(regs):
        r.put(st, idx, raw[:, j])
