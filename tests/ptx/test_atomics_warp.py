"""Atomics (global and shared, heavy collisions), barrier reductions, warp-level primitives."""

from __future__ import annotations

import numpy as np
import pytest
from ptxdev import blocks, i32


def _inc_seq(init: int, bound: int, k: int) -> int:
    v = init
    for _ in range(k):
        v = 0 if v >= bound else v + 1
    return v


def _dec_seq(init: int, bound: int, k: int) -> int:
    v = init
    for _ in range(k):
        v = bound if (v == 0 or v > bound) else v - 1
    return v


@pytest.mark.parametrize(("n", "bs"), [(1, 32), (333, 64), (5000, 256)])
def test_atomics_global(program, arch, dev, rng, n, bs):
    prog = program("atomics", arch)
    vals = rng.integers(-(2**20), 2**20, n, dtype=np.int32)
    ints = np.array([5, 7, 2**30, -(2**30)], np.int32)
    uints = np.zeros(8 + n, np.uint32)
    uints[:8] = [0xFFFFFFFF, 0, 0x1234, 3, 10, 0xFFFFFFFF, 0, 0]
    f = np.zeros(5, np.float32)
    d = np.zeros(1, np.float64)
    u64 = np.array([0, 0, 2**62], np.uint64)
    pv = dev.upload(vals)
    pi, pu, pf, pd, p64 = (dev.upload(x) for x in (ints, uints, f, d, u64))
    dev.launch(prog, "atomics_global", blocks(n, bs), bs, [pv, pi, pu, pf, pd, p64, i32(n)])
    gi = dev.download(pi, 4, np.int32)
    gu = dev.download(pu, 8 + n, np.uint32)
    gf = dev.download(pf, 5, np.float32)
    gd = dev.download(pd, 1, np.float64)
    g64 = dev.download(p64, 3, np.uint64)
    v64 = vals.astype(np.int64)
    with np.errstate(over="ignore"):
        assert gi[0] == np.int32(5 + v64.sum())
        assert gi[1] == np.int32(7 - v64.sum())
    assert gi[2] == min(2**30, vals.min())
    assert gi[3] == max(-(2**30), vals.max())
    uv = vals.view(np.uint32)
    assert gu[0] == np.bitwise_and.reduce(uv | np.uint32(0xF0000000)) & 0xFFFFFFFF
    assert gu[1] == np.bitwise_or.reduce(np.uint32(1) << (uv & np.uint32(31)))
    assert gu[2] == 0x1234 ^ np.bitwise_xor.reduce(uv)
    assert gu[3] == _inc_seq(3, 100, n)
    assert gu[4] == _dec_seq(10, 50, n)
    assert gu[5] == uv.min() and gu[6] == uv.max()
    # tickets: a permutation of 0..n-1
    assert np.array_equal(np.sort(gu[8:]), np.arange(n))
    assert gu[7] == n
    assert gf[0] == np.float32(0.5 * n)  # exact in any order for these sizes
    for j in range(4):
        assert gf[1 + j] == pytest.approx(float((vals[j::4] & 255).sum()), rel=1e-6)
    assert gd[0] == pytest.approx(float(v64.sum()) * 0.25, rel=1e-12)
    assert g64[0] == (uv.astype(np.uint64) * 3).sum()
    assert g64[1] == (uv.astype(np.uint64) << np.uint64(20)).max()
    assert g64[2].view(np.int64) == min(2**62, (v64 * -7).min())


@pytest.mark.parametrize(("n", "bs"), [(1, 32), (100, 32), (1000, 128)])
def test_atomic_cas_loop_and_exch(program, arch, dev, n, bs):
    prog = program("atomics", arch)
    pc, pl, po = (
        dev.upload(np.array([10], np.int32)),
        dev.zeros(1, np.int32),
        dev.zeros(n, np.int32),
    )
    dev.launch(prog, "atomics_cas", blocks(n, bs), bs, [pc, pl, po, i32(n)])
    assert dev.download(pc, 1, np.int32)[0] == 10 + 2 * n
    order = dev.download(po, n, np.int32)
    assert np.array_equal(np.sort(order), 10 + 2 * np.arange(n))
    assert 0 <= dev.download(pl, 1, np.int32)[0] < n


@pytest.mark.parametrize(("n", "bs"), [(64, 64), (1000, 128), (777, 256)])
def test_atomics_shared_and_barrier_reductions(program, arch, dev, rng, n, bs):
    prog = program("atomics", arch)
    vals = rng.integers(-1000, 1000, n, dtype=np.int32)
    if n > 100:
        vals[57] = 12345
    nb = blocks(n, bs)
    pv, po = dev.upload(vals), dev.zeros(8 * nb, np.int32)
    dev.launch(prog, "atomics_shared", nb, bs, [pv, po, i32(n)])
    out = dev.download(po, 8 * nb, np.int32).reshape(nb, 8)
    pad = np.zeros(nb * bs, np.int32)
    pad[:n] = vals
    for b in range(nb):
        v = pad[b * bs : (b + 1) * bs]
        assert out[b, 0] == v.sum()
        assert out[b, 1] == max(0, v.max())
        assert out[b, 2] == min(0x7FFFFFFF, v.min())
        assert out[b, 3] == np.bitwise_xor.reduce(v)
        assert out[b, 4] == (v & 0xFFFF).astype(np.int64).sum()
        assert out[b, 5] == (v > 0).sum()
        assert out[b, 6] == int((v > -1000).all())
        assert out[b, 7] == int((v == 12345).any())


@pytest.mark.parametrize(("n", "bs"), [(32, 32), (1000, 128), (4096, 256)])
def test_warp_shuffle_reduce(program, arch, dev, rng, n, bs):
    prog = program("warp", arch)
    x = rng.integers(-(10**6), 10**6, n, dtype=np.int32)
    nw = blocks(n, bs) * bs // 32
    px, po = dev.upload(x), dev.zeros(nw, np.int32)
    dev.launch(prog, "warp_reduce", blocks(n, bs), bs, [px, po, i32(n)])
    pad = np.zeros(nw * 32, np.int32)
    pad[:n] = x
    assert np.array_equal(dev.download(po, nw, np.int32), pad.reshape(nw, 32).sum(axis=1))


def _warp_ops_ref(v: np.ndarray, arch: str) -> np.ndarray:
    out = np.zeros((32, 12), np.int64)
    lane = np.arange(32)
    out[:, 0] = v.sum()
    out[:, 1] = np.cumsum(v)
    out[:, 2] = v[7]
    out[:, 3] = v[(lane + 3) & 31]
    src = lane + 5
    seg_end = (lane // 8) * 8 + 7
    out[:, 4] = np.where(src <= seg_end, v[np.minimum(src, 31)], v)
    ballot = int(sum(1 << i for i in range(32) if v[i] & 1))
    out[:, 5] = np.int32(np.uint32(ballot).view(np.int32))
    out[:, 6] = int((v == 77).any())
    out[:, 7] = int((v >= 0).all())
    act = int(sum(1 << i for i in range(32) if v[i] & 2))
    out[:, 8] = np.where(v & 2, np.uint32(act).view(np.int32), 0)
    out[:, 9] = (v > 50).sum()
    out[:, 10] = v[lane ^ 4]
    out[:, 11] = (v.max() + (v & 15).sum()) if arch >= "compute_80" else -1
    return out


def test_warp_ops(program, arch, dev, rng):
    prog = program("warp", arch)
    nblocks, bs = 3, 64
    x = rng.integers(0, 100, nblocks * bs, dtype=np.int32)
    x[5] = 77
    px, po = dev.upload(x), dev.zeros(12 * x.size, np.int32)
    dev.launch(prog, "warp_ops", nblocks, bs, [px, po])
    out = dev.download(po, 12 * x.size, np.int32).reshape(-1, 32, 12)
    for w in range(out.shape[0]):
        ref = _warp_ops_ref(x[w * 32 : (w + 1) * 32], arch)
        assert np.array_equal(out[w], ref.astype(np.int32)), f"warp {w}"


def test_warp_partial_mask(program, arch, dev, rng):
    prog = program("warp", arch)
    x = rng.integers(0, 20, 64, dtype=np.int32)
    px, po = dev.upload(x), dev.zeros(64, np.int32)
    dev.launch(prog, "warp_partial", 1, 64, [px, po])
    out = dev.download(po, 64, np.int32)
    for w in range(2):
        v = x[w * 32 : (w + 1) * 32]
        ballot = sum(1 << i for i in range(0, 32, 2) if v[i] > 10)
        for lane in range(32):
            if lane & 1:
                assert out[w * 32 + lane] == -1
            else:
                assert out[w * 32 + lane] == v[(lane + 2) & 31] + ballot


@pytest.mark.parametrize("bs", [32, 64])
def test_each_lane_reduces_over_its_own_member_mask(program, arch, dev, rng, bs):
    """Two half-warps converged at one redux/vote/match, each with its own mask: the bug was a
    reduction over the whole warp, ignoring the lane's membermask."""
    prog = program("warp_groups", arch)
    n = 2 * bs
    vals = rng.integers(0, 40, n, dtype=np.int32)
    vals[3] = 5  # something for __any_sync to find in one half only
    pin, pout = dev.upload(vals), dev.upload(np.zeros(10 * n, np.int32))
    dev.launch(prog, "half_masks", 2, bs, [pin, pout])
    got = dev.download(pout, 10 * n, np.int32).reshape(n, 10)
    for t in range(n):
        base = t // 16 * 16  # the lane's half-warp: its member mask
        members, lane0 = vals[base : base + 16], base % 32
        if arch >= "compute_80":
            assert got[t, 0] == members.sum(), t
            assert got[t, 1] == members.min() and got[t, 2] == members.max(), t
            assert got[t, 3] == np.bitwise_or.reduce(members), t
        ballot = sum(1 << (lane0 + k) for k in range(16) if members[k] & 1)
        assert np.uint32(got[t, 4]) == np.uint32(ballot), t
        assert got[t, 5] == 1
        assert got[t, 6] == int((members == 5).any()), t
        mine = vals[t] & 3
        want = sum(1 << (lane0 + k) for k in range(16) if members[k] & 3 == mine)
        assert np.uint32(got[t, 7]) == np.uint32(want), t
        assert np.uint32(got[t, 8]) == np.uint32(0xFFFF << lane0) and got[t, 9] == 1, t


def test_cooperative_groups_partitions_reduce_their_own_members(program, arch, dev, rng):
    prog = program("warp_groups", arch)
    n = 64
    vals = rng.integers(0, 1000, n, dtype=np.int32)
    pin, pout = dev.upload(vals), dev.upload(np.zeros(3 * n, np.int32))
    dev.launch(prog, "cg_partitions", 1, n, [pin, pout])
    got = dev.download(pout, 3 * n, np.int32).reshape(n, 3)
    for t in range(n):
        warp = vals[(t // 32) * 32 :][:32]
        label = warp[warp % 3 == vals[t] % 3]
        tile = vals[(t // 8) * 8 :][:8]
        assert got[t, 0] == label.sum(), t
        assert got[t, 1] == tile.sum(), t
        assert got[t, 2] == label.max(), t


def test_syncwarp_waits_for_lanes_at_another_call_site(program, arch, dev):
    """bar.warp.sync is a barrier for the lanes of its mask wherever each of them calls it: a
    half-warp must not read what the other half writes before that half reached its
    __syncwarp (it was a no-op, and min-PC scheduling ran the first branch to its end)."""
    prog = program("warp_groups", arch)
    pout = dev.upload(np.zeros(64, np.int32))
    dev.launch(prog, "syncwarp_divergent", 1, 64, [pout])
    got = dev.download(pout, 64, np.int32)
    t = np.arange(64)
    lane = t & 31
    want = np.where(lane < 16, (t + 16) * 7 + 1, (t - 16) * 10 + 1000)
    assert np.array_equal(got, want), (got, want)
