"""Address resolution for every state space, with the checks a GPU's MMU makes.

Generic addressing: global addresses are device addresses (``cvta.global`` is the identity, as
on NVIDIA GPUs). Shared and local memory get their own generic windows, placed far above any
session VA window (the daemon grants windows from 0x2000_0000_0000 upwards), so a generic
pointer can be routed per lane by its value alone:

* shared: ``SHARED_WINDOW + offset`` (the same offset means a different byte in each block);
* local:  ``LOCAL_WINDOW + offset`` (a different byte in each thread).

Each access resolves to ``(sel, buf, off)`` parts: ``buf`` a flat uint8 buffer, ``off`` the
validated byte offsets of the lanes ``sel`` (``None`` = all lanes of the access). Faults raise
:class:`~crane.backends.sim.memory.MemoryFault` with kind "illegal" or "misaligned".
"""

from __future__ import annotations

import numpy as np

from crane.backends.sim.memory import MemoryFault

__all__ = [
    "LOCAL_WINDOW",
    "SHARED_WINDOW",
    "WINDOW_SIZE",
    "from_generic",
    "is_space",
    "resolve",
    "to_generic",
]

SHARED_WINDOW = 0x7F00_0000_0000
LOCAL_WINDOW = 0x7F10_0000_0000
WINDOW_SIZE = 1 << 32
_LOW = np.uint64(SHARED_WINDOW)
_SH = np.uint64(SHARED_WINDOW)
_LO = np.uint64(LOCAL_WINDOW)
_WS = np.uint64(WINDOW_SIZE)


def _as_array(addr) -> np.ndarray:
    return addr if isinstance(addr, np.ndarray) else np.array([addr])


def _first_bad(a: np.ndarray, bad: np.ndarray) -> int:
    return int(a[int(np.argmax(bad))])


def _global(st, addr, nbytes: int):
    mem = st.mem
    if isinstance(addr, np.ndarray):
        return mem.buf, mem.offsets(addr.astype(np.uint64, copy=False), nbytes)
    off = mem.offsets(np.array([addr], np.uint64), nbytes)
    return mem.buf, off[0]


def _window(st, addr, nbytes: int, idx, which: str, gen_base: int):
    """Shared (per block) or local (per lane) access at window offsets ``addr``."""
    if which == "shared":
        stride, base, buf = st.shared_stride, st.shbase, st.shared
    else:
        stride, base, buf = st.local_stride, st.lobase, st.local
    a = addr.astype(np.int64) if isinstance(addr, np.ndarray) else np.int64(int(addr))
    if isinstance(a, np.ndarray):
        if a.size:
            hi = int(a.max())
            lo = int(a.min())
            if hi + nbytes > stride or lo < 0:
                bad = (a + nbytes > stride) | (a < 0)
                first = _first_bad(a, bad)
                raise MemoryFault(
                    f"{nbytes}-byte {which} access at {which} offset {first:#x} (generic "
                    f"{gen_base + first:#x}) is outside the {stride} bytes of {which} memory",
                    gen_base + first,
                    "illegal",
                )
            if nbytes > 1:
                bad = (a & (nbytes - 1)) != 0
                if bad.any():
                    first = _first_bad(a, bad)
                    raise MemoryFault(
                        f"misaligned {nbytes}-byte {which} access at offset {first:#x}",
                        gen_base + first,
                        "misaligned",
                    )
    else:
        v = int(a)
        if v < 0 or v + nbytes > stride:
            raise MemoryFault(
                f"{nbytes}-byte {which} access at {which} offset {v:#x} is outside the "
                f"{stride} bytes of {which} memory",
                gen_base + v,
                "illegal",
            )
        if nbytes > 1 and v % nbytes:
            raise MemoryFault(
                f"misaligned {nbytes}-byte {which} access at offset {v:#x}",
                gen_base + v,
                "misaligned",
            )
    lane_base = base if idx is None else base[idx]
    return buf, lane_base + a


def resolve(st, space: str, addr, nbytes: int, idx) -> list[tuple]:
    """Validated ``[(sel, buf, byte_offsets)]`` for an access of ``nbytes`` per lane."""
    if space in ("global", "const"):
        buf, off = _global(st, addr, nbytes)
        return [(None, buf, off)]
    if space == "shared":
        buf, off = _window(st, addr, nbytes, idx, "shared", SHARED_WINDOW)
        return [(None, buf, off)]
    if space == "local":
        buf, off = _window(st, addr, nbytes, idx, "local", LOCAL_WINDOW)
        return [(None, buf, off)]
    # generic: route each lane by the window its address falls in
    a = addr if isinstance(addr, np.ndarray) else None
    if a is None:
        v = int(addr)
        if SHARED_WINDOW <= v < SHARED_WINDOW + WINDOW_SIZE:
            return resolve(st, "shared", np.int64(v - SHARED_WINDOW), nbytes, idx)
        if LOCAL_WINDOW <= v < LOCAL_WINDOW + WINDOW_SIZE:
            return resolve(st, "local", np.int64(v - LOCAL_WINDOW), nbytes, idx)
        return resolve(st, "global", addr, nbytes, idx)
    a = a.astype(np.uint64, copy=False)
    if a.size == 0:
        return [(None, st.mem.buf, np.empty(0, np.int64))]
    hi = a.max()
    lo = a.min()
    if hi < _LOW or lo >= _LO + _WS:
        return resolve(st, "global", a, nbytes, idx)
    if lo >= _SH and hi < _SH + _WS:
        return resolve(st, "shared", a - _SH, nbytes, idx)
    if lo >= _LO and hi < _LO + _WS:
        return resolve(st, "local", a - _LO, nbytes, idx)
    in_sh = (a >= _SH) & (a < _SH + _WS)
    in_lo = (a >= _LO) & (a < _LO + _WS)
    parts = []
    for sel_mask, space2, base in ((in_sh, "shared", _SH), (in_lo, "local", _LO)):
        sel = np.flatnonzero(sel_mask)
        if sel.size:
            sub_idx = sel if idx is None else idx[sel]
            ((_, buf, off),) = resolve(st, space2, a[sel] - base, nbytes, sub_idx)
            parts.append((sel, buf, off))
    sel = np.flatnonzero(~(in_sh | in_lo))
    if sel.size:
        buf, off = _global(st, a[sel], nbytes)
        parts.append((sel, buf, off))
    return parts


def to_generic(space: str, addr):
    """``cvta.<space>``: a state-space address → a generic address."""
    if space == "shared":
        return (
            addr.astype(np.uint64) + _SH
            if isinstance(addr, np.ndarray)
            else np.uint64(int(addr) + SHARED_WINDOW)
        )
    if space == "local":
        return (
            addr.astype(np.uint64) + _LO
            if isinstance(addr, np.ndarray)
            else np.uint64(int(addr) + LOCAL_WINDOW)
        )
    return addr


def from_generic(space: str, addr):
    """``cvta.to.<space>``: a generic address → the state-space address."""
    if space == "shared":
        return addr - _SH if isinstance(addr, np.ndarray) else np.uint64(int(addr) - SHARED_WINDOW)
    if space == "local":
        return addr - _LO if isinstance(addr, np.ndarray) else np.uint64(int(addr) - LOCAL_WINDOW)
    return addr


def is_space(space: str, addr, st) -> np.ndarray:
    """``isspacep.<space>``: does each generic address point into ``space``?"""
    a = _as_array(addr).astype(np.uint64)
    in_sh = (a >= _SH) & (a < _SH + _WS)
    in_lo = (a >= _LO) & (a < _LO + _WS)
    if space == "shared":
        return in_sh
    if space == "local":
        return in_lo
    if space in ("global", "const"):
        return ~(in_sh | in_lo)
    return np.zeros(a.shape, np.bool_)
