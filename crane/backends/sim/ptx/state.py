"""The machine state of one batch of lanes (threads) while a kernel runs.

A *lane* is one thread. A launch runs its blocks in batches; all lanes of a batch execute in
lockstep, one NumPy operation per instruction over the lanes at that instruction. Lanes are
ordered block by block, and within a block by linear thread id (x fastest), so a warp is 32
consecutive lanes of one block and "lane order" is the order serialized atomics use.

Registers: each function has its own register files, one 2-D array per storage width
(16-bit — which also holds 8-bit registers —, 32, 64 bits, and predicates), shaped
``(registers, lanes)``. :attr:`State.fv` holds, per function, the typed views of those files
that instructions read and write (see :data:`VIEW_IDS`), so a bit-cast ``mov`` costs nothing.

Memory spaces (see :mod:`.memspace` for the address windows): global and const through
:class:`~crane.backends.sim.memory.SimMemory`; shared as one flat buffer with a stride per
block; local as one flat buffer with a stride per lane; function parameters (``.param`` of
``.func`` and of call sites) as a ``(lanes, bytes)`` array; kernel parameters as the packed
parameter bytes, which every lane shares.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["VIEW_IDS", "LaunchGeometry", "State", "storage_width", "view_id"]

# Typed views of the register files, by id. An operand names (function, view, row).
VIEW_IDS = {
    (16, "u"): 0,
    (16, "s"): 1,
    (32, "u"): 2,
    (32, "s"): 3,
    (32, "f"): 4,
    (64, "u"): 5,
    (64, "s"): 6,
    (64, "f"): 7,
    (1, "pred"): 8,
}
_VIEW_DTYPES = [
    np.uint16,
    np.int16,
    np.uint32,
    np.int32,
    np.float32,
    np.uint64,
    np.int64,
    np.float64,
    np.bool_,
]


def storage_width(bits: int) -> int:
    """Registers of ``bits`` are stored in files of this width (8-bit registers use 16)."""
    return 1 if bits == 1 else max(bits, 16)


def view_id(bits: int, kind: str) -> int:
    """The view of a ``bits``-wide register file that a value of ``kind`` is read through."""
    if kind == "pred":
        return 8
    w = storage_width(bits)
    k = {"u": "u", "b": "u", "h": "u", "bh": "u", "h2": "u", "bh2": "u", "s": "s", "f": "f"}[kind]
    if k == "f" and w == 16:
        k = "u"
    return VIEW_IDS[(w, k)]


@dataclass
class LaunchGeometry:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


#: Special registers whose value never changes, built once (a launch copies the dict, which is
#: much cheaper than making ~60 NumPy scalars per launch): no performance-monitor events are
#: counted (pmevent does nothing); the simulated CTA's shared window holds no region reserved
#: for system software (empty, at offset 0); kernels never run as a node of a device-side graph
#: launch; the launch environment registers are 0 unless set per launch (%envreg1/2).
_CONSTANT_UNIFORM: dict[str, object] = {
    **{f"%pm{i}": np.uint32(0) for i in range(8)},
    **{f"%pm{i}_64": np.uint64(0) for i in range(8)},
    **{f"%envreg{i}": np.uint32(0) for i in range(32)},
    **{f"%reserved_smem_offset_{k}": np.uint32(0) for k in ("begin", "end", "cap", "0", "1")},
    "%current_graph_exec": np.uint64(0),
}


class State:
    """Registers, special registers and memory of one batch of blocks."""

    def __init__(
        self,
        *,
        geometry: LaunchGeometry,
        first_block: int,
        nblocks: int,
        reg_counts: dict[int, tuple[int, int, int, int]],
        shared_stride: int,
        local_stride: int,
        pm_sizes: dict[int, int],
        memory,
        kparams: np.ndarray,
        symvals: np.ndarray,
        printf,
        shared_bytes: int,
        nsm: int,
        grid_workspace: int = 0,
        dynamic_shared: int = 0,
        clock_khz: int = 1980000,
        nwarps_per_sm: int = 64,
        gridid: int = 1,
        cluster: tuple[int, int, int] | None = None,
        cluster_barrier: bool = False,
    ) -> None:
        t = geometry.threads
        n = t * nblocks
        self.n = n
        self.geometry = geometry
        self.first_block = first_block
        self.nblocks = nblocks
        self.threads = t
        # ---- registers, per function id ---------------------------------------------------
        self.fv: dict[int, list[np.ndarray]] = {}
        for fid, (n16, n32, n64, npred) in reg_counts.items():
            r16 = np.zeros((n16, n), np.uint16)
            r32 = np.zeros((n32, n), np.uint32)
            r64 = np.zeros((n64, n), np.uint64)
            p = np.zeros((npred, n), np.bool_)
            self.fv[fid] = [
                r16,
                r16.view(np.int16),
                r32,
                r32.view(np.int32),
                r32.view(np.float32),
                r64,
                r64.view(np.int64),
                r64.view(np.float64),
                p,
            ]
        # ---- lane geometry ------------------------------------------------------------------
        lane = np.arange(n, dtype=np.int64)
        blk_in_batch = lane // t
        tlin = lane - blk_in_batch * t
        bx, by, _ = geometry.block
        gx, gy, _ = geometry.grid
        self.block_of_lane = blk_in_batch
        self.tid_linear = tlin
        gblk = blk_in_batch + first_block
        self.special: dict[str, np.ndarray] = {
            "%tid.x": (tlin % bx).astype(np.uint32),
            "%tid.y": ((tlin // bx) % by).astype(np.uint32),
            "%tid.z": (tlin // (bx * by)).astype(np.uint32),
            "%laneid": (tlin % 32).astype(np.uint32),
            "%warpid": (tlin // 32).astype(np.uint32),
            "%smid": (gblk % max(nsm, 1)).astype(np.uint32),
        }
        #: CTAs per cluster (1: no cluster launch); the batch holds whole clusters
        self.csize = 1
        #: per lane: whether it has exited (tracked only in cluster launches, for
        #: barrier.cluster, where exited threads count as arrived as at bar.sync)
        self.exited: np.ndarray | None = None
        if cluster is None:
            self.special["%ctaid.x"] = (gblk % gx).astype(np.uint32)
            self.special["%ctaid.y"] = ((gblk // gx) % gy).astype(np.uint32)
            self.special["%ctaid.z"] = (gblk // (gx * gy)).astype(np.uint32)
            # no cluster launch: each CTA is its own 1x1x1 cluster
            zero = np.zeros(n, np.uint32)
            for ax in "xyz":
                self.special[f"%clusterid.{ax}"] = self.special[f"%ctaid.{ax}"]
                self.special[f"%cluster_ctaid.{ax}"] = zero
            self.special["%cluster_ctarank"] = zero
            if cluster_barrier:  # barrier.cluster in a CTA that is its own cluster
                self.exited = np.zeros(n, np.bool_)
                self.carrive = np.zeros(n, np.uint32)
        else:
            self._cluster_geometry(cluster, gblk, blk_in_batch, n)
        lid = self.special["%laneid"].astype(np.uint64)
        one = np.uint64(1)
        eq = (one << lid).astype(np.uint32)
        self.special["%lanemask_eq"] = eq
        self.special["%lanemask_lt"] = (eq - np.uint32(1)).astype(np.uint32)
        self.special["%lanemask_le"] = (self.special["%lanemask_lt"] | eq).astype(np.uint32)
        self.special["%lanemask_ge"] = (~self.special["%lanemask_lt"]).astype(np.uint32)
        self.special["%lanemask_gt"] = (~self.special["%lanemask_le"]).astype(np.uint32)
        #: index of the first lane of each lane's warp, and one past the block's last lane
        self.warp_base = lane - (tlin % 32)
        self.block_end = (blk_in_batch + 1) * t
        self.uniform = dict(_CONSTANT_UNIFORM)
        self.uniform |= {
            "%ntid.x": np.uint32(bx),
            "%ntid.y": np.uint32(by),
            "%ntid.z": np.uint32(geometry.block[2]),
            "%nctaid.x": np.uint32(gx),
            "%nctaid.y": np.uint32(gy),
            "%nctaid.z": np.uint32(geometry.grid[2]),
            "%nwarpid": np.uint32(nwarps_per_sm),
            "%nsmid": np.uint32(max(nsm, 1)),
            "%gridid": np.uint64(gridid),
            "%dynamic_smem_size": np.uint32(dynamic_shared),
            "%total_smem_size": np.uint32(shared_bytes),
            # the reserved region is empty (see _CONSTANT_UNIFORM): the aggregate is the CTA's
            "%aggr_smem_size": np.uint32(shared_bytes),
        }
        cdim = cluster or (1, 1, 1)
        for i, ax in enumerate("xyz"):
            self.uniform[f"%nclusterid.{ax}"] = np.uint32(geometry.grid[i] // cdim[i])
            self.uniform[f"%cluster_nctaid.{ax}"] = np.uint32(cdim[i])
        self.uniform["%cluster_nctarank"] = np.uint32(self.csize)
        self.uniform["%is_explicit_cluster"] = np.bool_(cluster is not None)
        # %envreg0..31: what the driver puts in the launch environment. Only the grid-sync
        # workspace is ever set: its address split as %envreg1 (high) : %envreg2 (low), 0 outside
        # cooperative launches, which is what cooperative_groups' grid.is_valid() tests.
        self.uniform["%envreg1"] = np.uint32(grid_workspace >> 32)
        self.uniform["%envreg2"] = np.uint32(grid_workspace & 0xFFFFFFFF)
        #: True in a cooperative launch: blocks may wait on each other (see executor.run_batch)
        self.cooperative = grid_workspace != 0 or self.csize > 1
        # ---- memory -------------------------------------------------------------------------
        self.mem = memory
        self.kparams = kparams
        self.symvals = symvals
        self.shared_stride = shared_stride
        self.shared = np.zeros(max(nblocks * shared_stride, 16), np.uint8)
        self.shbase = blk_in_batch * shared_stride
        self.local_stride = local_stride
        self.local = np.zeros(max(n * local_stride, 16), np.uint8)
        self.lobase = lane * local_stride
        #: per function id: the lanes' parameter areas, shape (lanes, bytes)
        self.pm = {fid: np.zeros((n, max(sz, 8)), np.uint8) for fid, sz in pm_sizes.items()}
        self.printf = printf
        #: SM clock in cycles per nanosecond of wall time: %clock/%clock64 advance with it
        self.cycles_per_ns = clock_khz / 1e6
        #: bumped by every change to an mbarrier: lets the executor tell waits that can
        #: still complete from a deadlock
        self.mbar_epoch = 0
        #: last %clock64 value read, so successive reads strictly increase
        self.clock_last = 0
        #: fid -> (start, end) of the function's local frame in a lane's local memory
        self.local_frames: dict[int, tuple[int, int]] = {}
        #: the context's device heap (heap.DeviceHeap) for malloc/free, if the launch has one
        self.heap = None
        #: what the grid's threads launched (device_launch.DeviceLaunches), if it can launch
        self.device_launches = None
        #: time.monotonic() past which the launch fails with CUDA_ERROR_LAUNCH_TIMEOUT (None:
        #: no limit); checked at each backward branch and before each batch
        self.deadline: float | None = None
        self._views: dict[tuple[int, np.dtype], np.ndarray] = {}
        #: the carry flag of add.cc / addc, per lane
        self.cc = np.zeros(n, np.uint64)
        #: per-lane scratch for barrier reductions (bar.red)
        self.barpred = np.zeros(n, np.bool_)

    def _cluster_geometry(self, cluster, gblk, blk_in_batch, n: int) -> None:
        """Cluster launch: batch block ``i`` is rank ``i % csize`` of cluster ``i // csize``
        (clusters numbered x-fastest over %nclusterid, ranks x-fastest over the cluster), so the
        CTAs of a cluster are adjacent in the batch and run together."""
        cx, cy, cz = cluster
        gx, gy, _ = self.geometry.grid
        csize = cx * cy * cz
        ncx, ncy = gx // cx, gy // cy
        c = gblk // csize
        r = gblk % csize
        cid = (c % ncx, (c // ncx) % ncy, c // (ncx * ncy))
        rid = (r % cx, (r // cx) % cy, r // (cx * cy))
        for i, ax in enumerate("xyz"):
            self.special[f"%clusterid.{ax}"] = cid[i].astype(np.uint32)
            self.special[f"%cluster_ctaid.{ax}"] = rid[i].astype(np.uint32)
            self.special[f"%ctaid.{ax}"] = (cid[i] * cluster[i] + rid[i]).astype(np.uint32)
        self.special["%cluster_ctarank"] = r.astype(np.uint32)
        self.csize = csize
        #: per lane: the batch index of its cluster's rank-0 CTA (distributed shared memory)
        self.cluster_first = blk_in_batch - blk_in_batch % csize
        self.exited = np.zeros(n, np.bool_)
        #: per lane: how many times it executed barrier.cluster.arrive
        self.carrive = np.zeros(n, np.uint32)

    def view(self, buf: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """``buf`` (a flat uint8 buffer) viewed as ``dtype``, cached."""
        key = (id(buf), dtype)
        v = self._views.get(key)
        if v is None:
            v = buf.view(dtype)
            self._views[key] = v
        return v
