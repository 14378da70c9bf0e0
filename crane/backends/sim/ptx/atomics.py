"""Atomic read-modify-write (``atom``, ``red``) with many lanes on one address.

Semantics: the lanes of one instruction are serialized in lane order. Every lane gets the value
its address held just before its own update, so the returned old values and the final memory
contents are those of one sequential execution — the guarantee CUDA gives (in some order).

Vectorized by cases (``ei`` are element indices into a typed view of the memory):

* all addresses distinct: one gather, one operation, one scatter;
* integer ``add``: old values are a segmented exclusive prefix sum (wrapping);
* ``and/or/xor/min/max``: a segmented Hillis–Steele scan (log2 of the longest run passes);
* ``exch``: the previous lane's value;
* ``inc``/``dec`` with one bound per address: closed form;
* float ``add``: each long run accumulates sequentially with float rounding (``np.add.accumulate``
  rounds after every step; ``.f16``/``.f16x2`` runs of finite halves as float16 accumulations,
  each half apart); short runs go in rounds;
* ``cas``: per address, jump from one successful compare to the next.
"""

from __future__ import annotations

import numpy as np

from . import fp

__all__ = ["apply_atomic", "combine"]

_ROUNDS_MAX = 16  # runs up to this length are done in vectorized rounds


def combine(op: str, kind: str, old, b, c=None):
    """The new value for one update (vectorized over distinct addresses)."""
    if op == "add":
        if kind == "f32":
            return fp.ftz(np.add(fp.ftz(old), fp.ftz(b)))
        if kind in ("f16", "bf16", "f16x2", "bf16x2"):
            from .ops_float import half_pack, half_unpack

            k = {"f16": "h", "bf16": "bh", "f16x2": "h2", "bf16x2": "bh2"}[kind]
            return half_pack(
                [x + y for x, y in zip(half_unpack(old, k), half_unpack(b, k), strict=True)], k
            )
        return old + b
    if op == "and":
        return old & b
    if op == "or":
        return old | b
    if op == "xor":
        return old ^ b
    if op == "min":
        return np.minimum(old, b)
    if op == "max":
        return np.maximum(old, b)
    if op == "exch":
        return np.broadcast_to(b, np.shape(old)).copy() if np.ndim(old) else b
    if op == "inc":
        return np.where(old >= b, old.dtype.type(0), old + old.dtype.type(1))
    if op == "dec":
        return np.where((old == 0) | (old > b), b, old - old.dtype.type(1))
    if op == "cas":
        return np.where(old == b, c, old)
    raise AssertionError(op)


def apply_atomic(view: np.ndarray, ei: np.ndarray, op: str, kind: str, b, c=None) -> np.ndarray:
    """Apply the updates of all lanes (in lane order); return each lane's old value."""
    n = ei.size
    dt = view.dtype
    b = np.broadcast_to(np.asarray(b, dt), (n,))
    if c is not None:
        c = np.broadcast_to(np.asarray(c, dt), (n,))
    if n == 0:
        return np.empty(0, dt)
    order = np.argsort(ei, kind="stable")
    se = ei[order]
    if n == 1 or bool(np.all(se[1:] != se[:-1])):
        old = view[ei]
        view[ei] = combine(op, kind, old, b, c)
        return old
    start = np.empty(n, np.bool_)
    start[0] = True
    np.not_equal(se[1:], se[:-1], out=start[1:])
    seg = np.cumsum(start) - 1
    seg_first = np.flatnonzero(start)
    seg_len = np.diff(np.append(seg_first, n))
    rank = np.arange(n) - seg_first[seg]
    addrs = se[seg_first]
    init = view[addrs].copy()
    bs = b[order]
    cs = c[order] if c is not None else None
    old_sorted = np.empty(n, dt)
    is_float = dt.kind == "f" or kind in ("f16", "bf16", "f16x2", "bf16x2")

    if op == "add" and not is_float:
        cs_ = np.cumsum(bs, dtype=dt)
        excl = cs_ - bs
        base = excl[seg_first]
        old_sorted = init[seg] + (excl - base[seg])
        final = init + (cs_[seg_first + seg_len - 1] - base)
        view[addrs] = final
    elif op in ("and", "or", "xor", "min", "max"):
        incl = _seg_scan(bs, seg, op, int(seg_len.max()))
        excl_has = rank > 0
        prev = np.empty_like(incl)
        prev[1:] = incl[:-1]
        prev[0] = incl[0]
        ini = init[seg]
        old_sorted = np.where(excl_has, combine(op, kind, ini, prev), ini)
        view[addrs] = combine(op, kind, init, incl[seg_first + seg_len - 1])
    elif op == "exch":
        prev = np.empty_like(bs)
        prev[1:] = bs[:-1]
        prev[0] = bs[0]
        old_sorted = np.where(rank > 0, prev, init[seg])
        view[addrs] = bs[seg_first + seg_len - 1]
    elif op in ("inc", "dec") and _uniform_per_segment(bs, seg, seg_first):
        bound = bs[seg_first].astype(np.int64)
        ini = init.astype(np.int64)
        m = bound + 1
        k = rank.astype(np.int64)
        i_s, b_s, m_s = ini[seg], bound[seg], m[seg]
        if op == "inc":
            in_range = i_s <= b_s
            seq = np.where(in_range, (i_s + k) % m_s, np.where(k == 0, i_s, (k - 1) % m_s))
            last_k = seg_len.astype(np.int64)
            fin = np.where(ini <= bound, (ini + last_k) % m, (last_k - 1) % m)
        else:
            in_range = (i_s <= b_s) & (i_s >= 0)
            seq = np.where(in_range, (i_s - k) % m_s, np.where(k == 0, i_s, (b_s - (k - 1)) % m_s))
            last_k = seg_len.astype(np.int64)
            fin = np.where(
                (ini <= bound) & (ini >= 0), (ini - last_k) % m, (bound - (last_k - 1)) % m
            )
        old_sorted = seq.astype(dt)
        view[addrs] = fin.astype(dt)
    elif op == "cas":
        _cas(view, addrs, init, bs, cs, seg_first, seg_len, old_sorted)
    else:
        _sequential(view, op, kind, bs, cs, rank, seg, addrs, seg_first, seg_len, old_sorted, init)
    old = np.empty(n, dt)
    old[order] = old_sorted
    return old


def _uniform_per_segment(bs, seg, seg_first) -> bool:
    return bool(np.all(bs == bs[seg_first][seg]))


def _seg_scan(v: np.ndarray, seg: np.ndarray, op: str, maxlen: int) -> np.ndarray:
    """Inclusive scan of ``op`` within each run of equal ``seg`` (Hillis–Steele)."""
    out = v.copy()
    d = 1
    while d < maxlen:
        same = np.zeros(out.size, np.bool_)
        same[d:] = seg[d:] == seg[:-d]
        shifted = np.empty_like(out)
        shifted[d:] = out[:-d]
        shifted[:d] = out[:d]
        out = np.where(same, combine(op, "", shifted, out), out)
        d *= 2
    return out


def _sequential(view, op, kind, bs, cs, rank, seg, addrs, seg_first, seg_len, old_sorted, init):
    """Float add (and inc/dec with mixed bounds): long runs one by one, short ones in rounds."""
    long_runs = np.flatnonzero(seg_len > _ROUNDS_MAX)
    short = ~np.isin(seg, long_runs)
    if op == "add" and view.dtype.kind == "f":
        for s in long_runs:
            a, n = seg_first[s], seg_len[s]
            vals = bs[a : a + n]
            if kind == "f32":
                vals = fp.ftz(vals)
            acc = np.empty(n + 1, view.dtype)
            acc[0] = init[s]
            acc[1:] = vals
            run = np.add.accumulate(acc, dtype=view.dtype)
            if kind == "f32":
                run = fp.ftz(run)
            old_sorted[a : a + n] = run[:-1]
            view[addrs[s]] = run[-1]
    else:
        for s in long_runs:
            a, n = seg_first[s], seg_len[s]
            if (
                op == "add"
                and kind in ("f16", "f16x2")
                and _f16_run(view, bs, addrs[s], a, n, old_sorted)
            ):
                continue
            cur = view[addrs[s] : addrs[s] + 1].copy()
            for j in range(a, a + n):
                old_sorted[j] = cur[0]
                cur = combine(op, kind, cur, bs[j : j + 1], None if cs is None else cs[j : j + 1])
            view[addrs[s]] = cur[0]
    if short.any():
        sel = np.flatnonzero(short)
        for r in range(int(rank[sel].max()) + 1):
            lanes = sel[rank[sel] == r]
            a = addrs[seg[lanes]]
            old = view[a]
            old_sorted[lanes] = old
            view[a] = combine(op, kind, old, bs[lanes], None if cs is None else cs[lanes])


def _f16_run(view, bs, addr, a: int, n: int, old_sorted) -> bool:
    """One long run of ``.f16``/``.f16x2`` adds on word ``addr`` as NumPy float16
    accumulations (each half apart): every step a float16 add, which rounds the float32 sum
    of two halves to half, the once-rounded exact sum :func:`combine` computes (float32's 24
    bits are at least 2 x 11 + 2). Only for finite halves (False: left to the caller's loop,
    so NaN bits stay :func:`combine`'s); old values into ``old_sorted[a:a+n]``."""
    words = np.concatenate([view[addr : addr + 1], bs[a : a + n]])
    pairs = view.dtype == np.uint32
    parts = (
        [(words & 0xFFFF).astype(np.uint16), (words >> 16).astype(np.uint16)] if pairs else [words]
    )
    halves = [p.view(np.float16) for p in parts]
    if not all(np.isfinite(h).all() for h in halves):
        return False
    with np.errstate(over="ignore"):
        runs = [np.add.accumulate(h, dtype=np.float16).view(np.uint16) for h in halves]
    if pairs:
        out = runs[0].astype(np.uint32) | (runs[1].astype(np.uint32) << np.uint32(16))
    else:
        out = runs[0]
    old_sorted[a : a + n] = out[:-1]
    view[addr] = out[-1]
    return True


def _cas(view, addrs, init, bs, cs, seg_first, seg_len, old_sorted) -> None:
    """Compare-and-swap runs: jump from each successful compare to the next."""
    short = seg_len <= _ROUNDS_MAX
    if short.all() and seg_len.max() <= _ROUNDS_MAX:
        # rounds over ranks; addresses are distinct within a round
        n = bs.size
        seg = np.repeat(np.arange(seg_first.size), seg_len)
        rank = np.arange(n) - seg_first[seg]
        for r in range(int(seg_len.max())):
            lanes = np.flatnonzero(rank == r)
            a = addrs[seg[lanes]]
            old = view[a]
            old_sorted[lanes] = old
            view[a] = np.where(old == bs[lanes], cs[lanes], old)
        return
    for s in range(seg_first.size):
        a, n = int(seg_first[s]), int(seg_len[s])
        cur = init[s]
        j = a
        end = a + n
        while j < end:
            hit = np.flatnonzero(bs[j:end] == cur)
            if hit.size == 0:
                old_sorted[j:end] = cur
                break
            k = j + int(hit[0])
            old_sorted[j : k + 1] = cur
            cur = cs[k]
            j = k + 1
        view[addrs[s]] = cur
