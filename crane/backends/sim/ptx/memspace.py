"""Address resolution for every state space, with the checks a GPU's MMU makes.

Generic addressing: global addresses are device addresses (``cvta.global`` is the identity, as
on NVIDIA GPUs). Shared and local memory get their own generic windows, placed far above any
session VA window (the daemon grants windows from 0x2000_0000_0000 upwards), so a generic
pointer can be routed per lane by its value alone:

* shared: ``SHARED_WINDOW + offset`` (the same offset means a different byte in each block);
* local:  ``LOCAL_WINDOW + offset`` (a different byte in each thread);
* param:  ``PARAM_WINDOW + offset`` (the launch's kernel parameter buffer, read-only).

Distributed shared memory (cluster launches): a ``.shared::cluster`` address is a shared
offset with the target CTA's rank + 1 in bits 24 and up (:data:`CLUSTER_RANK_SHIFT`; tag 0 is
the executing CTA, so every ``.shared::cta`` address is also its own ``.shared::cluster``
address, as the ISA requires). ``mapa`` sets the tag; an access routes each lane to that CTA's
shared memory and faults as an illegal address when the rank is outside the cluster or the
offset outside the CTA's shared memory. The generic form is ``SHARED_WINDOW`` + that address.

A kernel parameter's ``.param``-space address (``mov.u64 %rd, kernel_param_0``) is its offset
in the parameter buffer; ``cvta.param`` adds the window (PTX ISA 7.7+). CUB and cuBLASLt take
parameter addresses to index small arrays passed by value. Kernel parameters are read-only, so a
store through such an address faults as an illegal address.

Each access resolves to ``(sel, buf, off)`` parts: ``buf`` a flat uint8 buffer, ``off`` the
validated byte offsets of the lanes ``sel`` (``None`` = all lanes of the access). Faults raise
:class:`~crane.backends.sim.memory.MemoryFault` with kind "illegal" or "misaligned".
"""

from __future__ import annotations

import numpy as np

from crane.backends.sim.memory import MemoryFault

__all__ = [
    "CLUSTER_RANK_SHIFT",
    "LOCAL_WINDOW",
    "PARAM_WINDOW",
    "SHARED_WINDOW",
    "WINDOW_SIZE",
    "cluster_rank",
    "from_generic",
    "in_own_cta",
    "is_space",
    "map_cluster",
    "resolve",
    "to_generic",
]

SHARED_WINDOW = 0x7F00_0000_0000
LOCAL_WINDOW = 0x7F10_0000_0000
PARAM_WINDOW = 0x7F20_0000_0000
WINDOW_SIZE = 1 << 32
_LOW = np.uint64(SHARED_WINDOW)
_SH = np.uint64(SHARED_WINDOW)
_LO = np.uint64(LOCAL_WINDOW)
_PA = np.uint64(PARAM_WINDOW)
_WS = np.uint64(WINDOW_SIZE)
_HIGH = _PA + _WS
# generic windows other than global: (space, numpy base, int base)
_WINDOWS = (
    ("shared", _SH, SHARED_WINDOW),
    ("local", _LO, LOCAL_WINDOW),
    ("param", _PA, PARAM_WINDOW),
)
_BASE = {name: (nb, ib) for name, nb, ib in _WINDOWS}
#: bits of a .shared::cluster address below the CTA tag (rank + 1): shared memory per CTA is
#: far below 16 MiB on every GPU
CLUSTER_RANK_SHIFT = 24
_OFF_MASK = (1 << CLUSTER_RANK_SHIFT) - 1


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
                if which == "shared" and hi >> CLUSTER_RANK_SHIFT and lo >= 0:
                    return _cluster_window(st, a, nbytes, idx, gen_base)
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
        if which == "shared" and v >> CLUSTER_RANK_SHIFT and v > 0:
            return _cluster_window(st, np.asarray(a), nbytes, idx, gen_base)
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


def _cluster_window(st, a: np.ndarray, nbytes: int, idx, gen_base: int):
    """Shared-memory access at ``.shared::cluster`` addresses ``a`` (some naming another CTA
    of the cluster): the byte offsets into the batch's shared memory, checked per lane."""
    av = np.atleast_1d(a)
    tag = av >> CLUSTER_RANK_SHIFT
    off = av & _OFF_MASK
    stride = st.shared_stride
    bad = (tag > st.csize) | (off + nbytes > stride) | (av < 0)
    if bad.any():
        first = _first_bad(av, bad)
        rank = (first >> CLUSTER_RANK_SHIFT) - 1
        raise MemoryFault(
            f"{nbytes}-byte shared::cluster access at {first:#x} (generic {gen_base + first:#x}):"
            f" CTA rank {rank} offset {first & _OFF_MASK:#x} is outside the cluster's "
            f"{st.csize} CTAs of {stride} bytes of shared memory",
            gen_base + first,
            "illegal",
        )
    if nbytes > 1 and ((off & (nbytes - 1)) != 0).any():
        first = _first_bad(av, (off & (nbytes - 1)) != 0)
        raise MemoryFault(
            f"misaligned {nbytes}-byte shared::cluster access at {first:#x}",
            gen_base + first,
            "misaligned",
        )
    own = st.shbase if idx is None else st.shbase[idx]
    # outside cluster launches each CTA is its own cluster: rank 0 is the CTA itself
    first = st.cluster_first if st.csize > 1 else st.block_of_lane
    first_blk = first if idx is None else first[idx]
    base = np.where(tag == 0, own, (first_blk + tag - 1) * stride)
    return st.shared, base + off


def cluster_rank(st, addr, idx) -> np.ndarray:
    """``getctarank``: the cluster rank of the CTA whose shared memory each lane's
    ``.shared::cluster`` address names (untagged: the executing CTA)."""
    a = np.asarray(addr, np.int64)
    tag = a >> CLUSTER_RANK_SHIFT
    own = st.special["%cluster_ctarank"]
    own = own if idx is None else own[idx]
    return np.where(tag == 0, own, tag - 1).astype(np.uint32)


def in_own_cta(st, addr, idx) -> np.ndarray:
    """Whether each generic shared-window address names the executing CTA's own shared memory
    (untagged, or tagged with the CTA's own rank): ``isspacep.shared::cta``."""
    off = (_as_array(addr).astype(np.uint64) - _SH).astype(np.int64)
    tag = off >> CLUSTER_RANK_SHIFT
    own = st.special["%cluster_ctarank"]
    own = (own if idx is None else own[idx]).astype(np.int64)
    return (tag == 0) | (tag == own + 1)


def map_cluster(addr, rank):
    """``mapa``: the ``.shared::cluster`` address of the same variable in CTA ``rank``."""
    a = np.asarray(addr, np.int64) & _OFF_MASK
    return a | ((np.asarray(rank, np.int64) + 1) << CLUSTER_RANK_SHIFT)


def _param(st, addr, nbytes: int, write: bool):
    """Kernel parameter buffer at ``.param`` offsets ``addr`` (uniform over the launch)."""
    kp = st.kparams
    size = len(kp) - 8  # the parameters rounded up to 8 bytes; then 8 bytes of padding
    a = addr.astype(np.int64) if isinstance(addr, np.ndarray) else np.int64(int(addr))
    arr = np.atleast_1d(a)
    if arr.size:
        bad = (arr < 0) | (arr + nbytes > size)
        if write or bad.any():
            first = int(arr[int(np.argmax(bad))]) if bad.any() else int(arr[0])
            why = (
                "kernel parameters are read-only"
                if write and not bad.any()
                else f"outside the {size} bytes of kernel parameters"
            )
            raise MemoryFault(
                f"{nbytes}-byte {'store' if write else 'load'} at .param offset {first:#x} "
                f"(generic {PARAM_WINDOW + first:#x}): {why}",
                PARAM_WINDOW + first,
                "illegal",
            )
        if nbytes > 1 and ((arr & (nbytes - 1)) != 0).any():
            first = int(arr[int(np.argmax((arr & (nbytes - 1)) != 0))])
            raise MemoryFault(
                f"misaligned {nbytes}-byte .param access at offset {first:#x}",
                PARAM_WINDOW + first,
                "misaligned",
            )
    return kp, a


def resolve(st, space: str, addr, nbytes: int, idx, write: bool = False) -> list[tuple]:
    """Validated ``[(sel, buf, byte_offsets)]`` for an access of ``nbytes`` per lane;
    ``write`` marks stores and atomics (which read-only spaces refuse)."""
    if space in ("global", "const"):
        buf, off = _global(st, addr, nbytes)
        return [(None, buf, off)]
    if space in ("shared", "local"):
        buf, off = _window(st, addr, nbytes, idx, space, _BASE[space][1])
        return [(None, buf, off)]
    if space == "param":
        buf, off = _param(st, addr, nbytes, write)
        return [(None, buf, off)]
    # generic: route each lane by the window its address falls in
    a = addr if isinstance(addr, np.ndarray) else None
    if a is None:
        v = int(addr)
        for name, _nb, base in _WINDOWS:
            if base <= v < base + WINDOW_SIZE:
                return resolve(st, name, np.int64(v - base), nbytes, idx, write)
        return resolve(st, "global", addr, nbytes, idx, write)
    a = a.astype(np.uint64, copy=False)
    if a.size == 0:
        return [(None, st.mem.buf, np.empty(0, np.int64))]
    hi = a.max()
    lo = a.min()
    if hi < _LOW or lo >= _HIGH:
        return resolve(st, "global", a, nbytes, idx, write)
    for name, nb, _base in _WINDOWS:
        if lo >= nb and hi < nb + _WS:
            return resolve(st, name, a - nb, nbytes, idx, write)
    parts = []
    rest = np.ones(a.shape, np.bool_)
    for name, nb, _base in _WINDOWS:
        inside = (a >= nb) & (a < nb + _WS)
        rest &= ~inside
        sel = np.flatnonzero(inside)
        if sel.size:
            sub_idx = sel if idx is None else idx[sel]
            ((_, buf, off),) = resolve(st, name, a[sel] - nb, nbytes, sub_idx, write)
            parts.append((sel, buf, off))
    sel = np.flatnonzero(rest)
    if sel.size:
        buf, off = _global(st, a[sel], nbytes)
        parts.append((sel, buf, off))
    return parts


def to_generic(space: str, addr):
    """``cvta.<space>``: a state-space address → a generic address."""
    if space not in _BASE:
        return addr
    nb, ib = _BASE[space]
    if isinstance(addr, np.ndarray):
        return addr.astype(np.uint64) + nb
    return np.uint64(int(addr) + ib)


def from_generic(space: str, addr):
    """``cvta.to.<space>``: a generic address → the state-space address."""
    if space not in _BASE:
        return addr
    nb, ib = _BASE[space]
    return addr - nb if isinstance(addr, np.ndarray) else np.uint64(int(addr) - ib)


def is_space(space: str, addr, st) -> np.ndarray:
    """``isspacep.<space>``: does each generic address point into ``space``?"""
    a = _as_array(addr).astype(np.uint64)
    inside = {name: (a >= nb) & (a < nb + _WS) for name, nb, _ib in _WINDOWS}
    if space in inside:
        return inside[space]
    if space in ("global", "const"):
        return ~(inside["shared"] | inside["local"] | inside["param"])
    return np.zeros(a.shape, np.bool_)
