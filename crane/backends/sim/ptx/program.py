"""A loaded PTX module: its kernels, its module variables, and ``launch``.

``load_ptx`` reads the declarations with :mod:`crane.modules.ptx_info` (the same scanner the
rest of Crane uses for parameter layouts, static shared memory and initialized globals, so the
interpreter cannot disagree with what the guest packs) and decodes every function body once
(:mod:`.decode`). ``launch`` checks the configuration like the driver, lays out the per-launch
symbol values, and runs the grid in batches of whole blocks (:mod:`.executor`): blocks are
independent, so any batching is a legal schedule; the batch size bounds memory (registers and
local memory of every lane of a batch are live at once) and keeps arrays cache-friendly.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

import numpy as np

from crane.api.generated.cuda_enums import CUdevice_attribute, CUresult
from crane.backends.sim.memory import MemoryFault

from . import jit
from .calls import function_address
from .decode import Decoded, FuncInfo, decode_module
from .device_launch import BUILTINS as DEVICE_RUNTIME
from .device_launch import MAX_PENDING, DeviceLaunches
from .errors import KernelFault, PtxError
from .executor import check_deadline, run_batch
from .jit import layout as jit_layout
from .jit.diff import differential
from .jit.runner import run_compiled
from .ops_cluster import uses_cluster_barrier
from .parser import SUPPORTED_VERSION, Label, parse_module
from .state import LaunchGeometry, State
from .target import apply_target_options

__all__ = [
    "BATCH_BYTES",
    "GRID_SYNC_BYTES",
    "LANES_PER_BATCH",
    "ModuleVariable",
    "PtxKernel",
    "PtxProgram",
    "load_ptx",
]

#: Most lanes (threads) run in one batch, and the memory a batch's lanes may hold.
LANES_PER_BATCH = 1 << 17
BATCH_BYTES = 1 << 30
#: Size of the grid-sync workspace a cooperative launch needs (zeroed before each launch).
#: cooperative_groups' grid.sync() as nvcc 12/13 emits it keeps its arrival counter at +4.
GRID_SYNC_BYTES = 64


@dataclass(frozen=True)
class ModuleVariable:
    """A module-scope ``.global``/``.const`` variable the backend must place in device memory.

    ``init`` is None for zero-filled variables. ``relocs`` lists ``(offset, size, symbol,
    addend)`` for initializers holding another variable's address (the backend patches them
    after placement; ``init`` holds zeros there).
    """

    name: str
    space: str
    size: int
    align: int
    init: bytes | None
    relocs: tuple[tuple[int, int, str, int], ...] = ()


@dataclass
class PtxKernel:
    name: str
    params: tuple[tuple[int, int], ...]
    param_bytes: int
    static_shared_bytes: int
    local_bytes: int
    maxntid: tuple[int, ...] | None
    reqntid: tuple[int, ...] | None
    # ---- internal layout ----
    fid: int = -1
    entry_pc: int = -1
    reachable: tuple[int, ...] = ()
    slot_values: dict[int, int] = field(default_factory=dict)  # shared/local symbol slots
    global_slots: dict[int, str] = field(default_factory=dict)  # slot -> variable name
    dynamic_shared_offset: int = 0
    lane_bytes: int = 0
    #: reads %envreg1/%envreg2, the grid-sync workspace (cooperative_groups grid_group)
    reads_grid_workspace: bool = False
    #: fid -> (start, end) of its .local variables in a lane's local memory (frames.py)
    local_frames: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: compiled cluster shape: .reqnctapercluster (__cluster_dims__), .explicitcluster,
    #: .maxclusterrank
    cluster_dims: tuple[int, ...] | None = None
    explicit_cluster: bool = False
    max_cluster_rank: int | None = None
    #: the module holds barrier.cluster: launches track exited lanes for it
    cluster_barrier: bool = False

    @property
    def max_threads(self) -> int | None:
        dims = self.reqntid or self.maxntid
        if not dims:
            return None
        p = 1
        for d in dims:
            p *= d
        return p


def _align(x: int, a: int) -> int:
    a = max(a, 1)
    return (x + a - 1) // a * a


class PtxProgram:
    """A decoded module. Build with :func:`load_ptx`."""

    def __init__(self, dec: Decoded, info, kernels: dict[str, PtxKernel], variables) -> None:
        self._dec = dec
        self._info = info
        self.kernels: dict[str, PtxKernel] = kernels
        self.variables: list[ModuleVariable] = variables
        self.version = dec.module.version
        #: the module's hash: compiled kernels are cached by it (jit/)
        self.source_hash = ""
        #: launches per kernel name (the compiler waits for a kernel to earn its compile)
        self._launch_counts: dict[str, int] = {}
        #: per kernel: its PTX instructions, and the seconds its launches ran interpreted (what
        #: jit.worth_compiling weighs a compile against)
        self._sizes: dict[str, int] = {}
        self._interpreted_s: dict[str, float] = {}
        #: what each launch configuration's checks and sizes came to (:class:`_Plan`)
        self._plans: dict[tuple, _Plan] = {}
        #: each kernel's symbol values, and the symbol table they were read from
        self._symvals_of: dict[str, tuple[Mapping[str, int], int, np.ndarray]] = {}
        #: the compiled kernel each (kernel, block shape) runs, once it has one
        self._natives: dict[tuple[str, tuple[int, int, int]], object] = {}
        self.target = dec.module.target
        #: calls device malloc/free: launches need the context's device heap (heap.py)
        #: launches kernels from the device (dynamic parallelism, device_launch.py)
        self.uses_device_launch = any(fi.builtin in DEVICE_RUNTIME for fi in dec.funcs.values())
        self.uses_heap = self.uses_device_launch or any(
            fi.builtin in ("malloc", "free") for fi in dec.funcs.values()
        )

    def function_addresses(self) -> dict[str, int]:
        """Each function's address (what ``mov.u64 %rd, f`` and an initializer ``{f}`` hold)."""
        return {name: function_address(fi.fid) for name, fi in self._dec.funcs.items()}

    @property
    def instruction_count(self) -> int:
        return len(self._dec.code)

    # ---- launch --------------------------------------------------------------------------
    def launch(
        self,
        name: str,
        grid: tuple[int, ...] = (1, 1, 1),
        block: tuple[int, ...] = (1, 1, 1),
        dynamic_shared: int = 0,
        params: bytes = b"",
        memory=None,
        symbols: Mapping[str, int] | None = None,
        profile=None,
        printf: Callable[[str], None] | None = None,
        *,
        max_dynamic_shared: int | None = None,
        cooperative: bool = False,
        grid_workspace: int = 0,
        heap=None,
        depth: int = 0,
        max_pending: int = MAX_PENDING,
        cluster: tuple[int, int, int] | None = None,
        non_portable_cluster: bool = False,
        deadline: float | None = None,
    ) -> None:
        """Run kernel ``name`` to completion; raise :class:`KernelFault` if the launch fails.

        ``deadline`` (``time.monotonic()``; None: none): past it the launch fails with
        CUDA_ERROR_LAUNCH_TIMEOUT, checked before each batch of blocks and at each backward
        branch, so a kernel that loops forever is ended (a kernel time limit).

        ``cluster`` is the launch's cluster dimensions (None or zeros: the kernel's compiled
        ones if any, else no clusters), checked as the driver does
        (:func:`crane.api.launch_check.check_cluster`); the CTAs of each cluster run in one
        batch, so they can wait for each other and reach each other's shared memory.

        ``max_dynamic_shared`` is the kernel's ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``
        (None: the default 48 KiB rule).

        ``cooperative`` (cuLaunchCooperativeKernel): ``grid_workspace`` is the device address of
        :data:`GRID_SYNC_BYTES` of global memory for grid-wide syncs; it is zeroed and handed to
        the kernel as ``%envreg1:%envreg2`` (high:low), and the whole grid runs as one batch so
        blocks can wait for each other. The grid must fit the device's co-residency limit
        (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, as the driver) and the interpreter's own
        limit: every lane's state at once within :data:`BATCH_BYTES` (the same error, with a
        message naming this limit). A non-cooperative launch leaves the envregs 0, as a GPU
        does, so grid.sync() traps (nvcc checks the workspace) instead of hanging.

        ``heap`` is the context's device heap (:class:`.heap.DeviceHeap`) for kernels that call
        malloc/free; its blocks outlive the launch. The grids the kernel launches from the
        device run after it (see :mod:`.device_launch`), ``depth`` levels deep.
        """
        key = (
            name, grid, block, dynamic_shared, max_dynamic_shared, cluster,
            non_portable_cluster, id(profile),
        )  # fmt: skip
        plan = None
        if not cooperative:  # (a cooperative launch is checked every time)
            try:
                plan = self._plans.get(key)
            except TypeError:  # (dimensions given as lists)
                key = tuple(tuple(x) if isinstance(x, list) else x for x in key)
                plan = self._plans.get(key)
        if plan is None or plan.profile is not profile:
            plan = self._plan(
                name, grid, block, dynamic_shared, profile, max_dynamic_shared, cluster,
                non_portable_cluster, cooperative, grid_workspace,
            )  # fmt: skip
            if not cooperative and len(self._plans) < _PLANS:
                self._plans[key] = plan
        k, geo, cdims, per_batch = plan.k, plan.geo, plan.cdims, plan.per_batch
        shared_stride, local_stride = plan.shared_stride, plan.local_stride
        params = bytes(params)
        if len(params) < k.param_bytes:
            raise KernelFault(
                int(CUresult.CUDA_ERROR_INVALID_VALUE),
                f"kernel {name} takes {k.param_bytes} bytes of parameters, got {len(params)}",
            )
        if memory is None:
            raise KernelFault(
                int(CUresult.CUDA_ERROR_INVALID_VALUE), "launch without device memory"
            )
        symvals = self._symvals(k, symbols if symbols is not None else _NO_SYMBOLS)
        if cooperative:
            try:
                memory.write(grid_workspace, bytes(GRID_SYNC_BYTES))
            except MemoryFault as e:
                raise KernelFault(
                    int(CUresult.CUDA_ERROR_INVALID_VALUE), f"grid-sync workspace: {e}"
                ) from None
        reg_counts, pm_sizes = plan.reg_counts, plan.pm_sizes
        # 8 bytes of padding (over-wide scalar reads) and whole 8-byte words, so the buffer can be
        # viewed as any scalar type by loads through a .param address
        kparams = np.frombuffer(params + bytes(8 + (-len(params)) % 8), np.uint8)
        sink = printf if printf is not None else _stdout
        nsm = plan.nsm
        launch_env = {
            "clock_khz": plan.clock_khz,
            "nwarps_per_sm": plan.nwarps_per_sm,
            "gridid": _next_gridid(),
            "cluster": cdims,
            "cluster_barrier": k.cluster_barrier,
        }
        fault: KernelFault | None = None
        launches = None
        if self.uses_device_launch:
            launches = DeviceLaunches(
                {self._dec.funcs[n].fid: (n, kk.param_bytes) for n, kk in self.kernels.items()},
                heap,
                depth,
                max_pending=max_pending,
            )
        try:
            self._run(
                k,
                geo,
                per_batch,
                reg_counts,
                pm_sizes,
                shared_stride,
                local_stride,
                memory,
                kparams,
                symvals,
                sink,
                dynamic_shared,
                nsm,
                grid_workspace if cooperative else 0,
                launch_env,
                heap,
                launches,
                deadline,
            )
            for child in launches.ordered() if launches is not None else ():
                self.launch(
                    child.kernel,
                    child.grid,
                    child.block,
                    child.shared,
                    child.params,
                    memory,
                    symbols,
                    profile,
                    printf,
                    max_dynamic_shared=max_dynamic_shared,
                    heap=heap,
                    depth=depth + 1,
                    max_pending=max_pending,
                    deadline=deadline,
                )
        except KernelFault as e:
            msg = e.message
            if not cooperative and e.code == _TRAP and k.reads_grid_workspace:
                msg += (
                    f"; {name} reads the grid-sync workspace (cooperative_groups this_grid(), "
                    "grid.sync()), which exists only in a cooperative launch: launch it with "
                    "cuLaunchCooperativeKernel / cudaLaunchCooperativeKernel"
                )
            fault = KernelFault(e.code, msg)
        if fault is not None:
            # a fresh exception: the original's traceback holds the batch state, whose views of
            # device memory would keep the session's mapping from being closed
            raise fault

    def _symvals(self, k: PtxKernel, symbols: Mapping[str, int]) -> np.ndarray:
        """Kernel ``k``'s symbol slots' values (read-only to launches), kept while the module's
        symbol table is the same object of the same size (it is filled at load)."""
        got = self._symvals_of.get(k.name)
        if got is not None and got[0] is symbols and got[1] == len(symbols):
            return got[2]
        symvals = np.zeros(max(len(self._dec.slots), 1), np.uint64)
        for slot, val in k.slot_values.items():
            symvals[slot] = val
        for slot, key in enumerate(self._dec.slots):
            if key == ("dynshared",):
                symvals[slot] = k.dynamic_shared_offset
        for slot, var in k.global_slots.items():
            addr = symbols.get(var)
            if addr is None:
                raise KernelFault(
                    int(CUresult.CUDA_ERROR_NOT_FOUND),
                    f"module variable {var!r} used by kernel {k.name} has no device address",
                )
            symvals[slot] = addr
        symvals.flags.writeable = False
        self._symvals_of[k.name] = (symbols, len(symbols), symvals)
        return symvals

    def _plan(
        self, name, grid, block, dynamic_shared, profile, max_dynamic_shared, cluster,
        non_portable_cluster, cooperative, grid_workspace,
    ) -> _Plan:  # fmt: skip
        """A launch configuration checked as the driver checks it, and its batch sizes (raises
        :class:`KernelFault` where the driver refuses it)."""
        k = self.kernels.get(name)
        if k is None:
            raise KernelFault(
                int(CUresult.CUDA_ERROR_NOT_FOUND), f"no kernel named {name!r} in this module"
            )
        grid3 = _dims(grid, "grid")
        block3 = _dims(block, "block")
        _check_launch(k, grid3, block3, dynamic_shared, profile, max_dynamic_shared)
        if cooperative:
            _check_cooperative(k, grid3, block3, dynamic_shared, profile, grid_workspace)
        cdims = _check_cluster(k, grid3, cluster, profile, non_portable_cluster)
        geo = LaunchGeometry(grid3, block3)
        t = geo.threads
        per_lane, shared_stride, local_stride = _batch_costs(k, dynamic_shared)
        by_mem = max(1, BATCH_BYTES // max(per_lane * t + shared_stride, 1))
        per_batch = max(1, min(geo.blocks, max(1, LANES_PER_BATCH // t), by_mem))
        csize = math.prod(cdims) if cdims else 1
        if csize > 1:  # whole clusters per batch
            need = (per_lane * t + shared_stride) * csize
            if need > BATCH_BYTES:
                raise KernelFault(
                    int(CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE),
                    f"a cluster of {csize} blocks x {t} threads of {name} would hold {need} "
                    f"bytes of lane state in the simulated GPU, above its limit of "
                    f"{BATCH_BYTES} bytes",
                )
            per_batch = max(csize, per_batch // csize * csize)
        if cooperative:
            most = self.cooperative_max_blocks(name, t, dynamic_shared)
            if geo.blocks > most:
                need = (per_lane * t + shared_stride) * geo.blocks
                raise KernelFault(
                    int(CUresult.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE),
                    f"cooperative launch of {geo.blocks} blocks x {t} threads of {name}: the "
                    f"simulated GPU runs a cooperative grid as one batch, which would hold "
                    f"{need} bytes of lane state, above its limit of {BATCH_BYTES} bytes "
                    f"(at most {most} such blocks)",
                )
            per_batch = geo.blocks
        return _Plan(
            k, profile, geo, cdims, per_batch, shared_stride, local_stride,
            {fid: tuple(self._dec.by_fid[fid].counts) for fid in k.reachable},
            {fid: self._dec.by_fid[fid].pm_size for fid in k.reachable},
            getattr(profile, "sm_count", 132) if profile is not None else 132,
            getattr(profile, "max_threads_per_sm", 2048) // 32,
            getattr(profile, "clock_khz", DEFAULT_CLOCK_KHZ),
        )  # fmt: skip

    def cooperative_max_blocks(self, name: str, threads: int, dynamic_shared: int = 0) -> int:
        """Most blocks of ``threads`` threads the interpreter runs in one cooperative launch of
        kernel ``name``: all their lanes' state (registers, local memory, per-lane scratch) and
        shared memory must fit :data:`BATCH_BYTES` at once, because every block of a grid that
        syncs must be live together. On the shipped profiles this is rarely below the device's
        own co-residency limit (SMs x 2048 threads: about 128 MiB at 512 bytes per lane)."""
        per_lane, shared_stride, _ = _batch_costs(self.kernels[name], dynamic_shared)
        return BATCH_BYTES // (per_lane * max(threads, 1) + shared_stride)

    def _run(
        self,
        k,
        geo,
        per_batch,
        reg_counts,
        pm_sizes,
        shared_stride,
        local_stride,
        memory,
        kparams,
        symvals,
        sink,
        dynamic_shared,
        nsm,
        grid_workspace,
        launch_env,
        heap=None,
        launches=None,
        deadline=None,
    ) -> None:
        def interpret(sink=sink) -> None:
            with np.errstate(all="ignore"):
                for first in range(0, geo.blocks, per_batch):
                    check_deadline(deadline)
                    nb = min(per_batch, geo.blocks - first)
                    st = State(
                        geometry=geo,
                        first_block=first,
                        nblocks=nb,
                        reg_counts=reg_counts,
                        shared_stride=shared_stride,
                        local_stride=local_stride,
                        pm_sizes=pm_sizes,
                        memory=memory,
                        kparams=kparams,
                        symvals=symvals,
                        printf=sink,
                        shared_bytes=k.static_shared_bytes + dynamic_shared,
                        nsm=nsm,
                        grid_workspace=grid_workspace,
                        dynamic_shared=dynamic_shared,
                        **launch_env,
                    )
                    st.local_frames = k.local_frames
                    st.heap = heap
                    st.device_launches = launches
                    st.deadline = deadline
                    run_batch(self._dec.code, k.entry_pc, st, self._dec.by_fid)

        mode = jit.mode()
        ck = None
        # the compiler takes ordinary and cooperative launches (device functions it inlines,
        # or refuses); clusters and launches from the device stay interpreted
        plain = launch_env["cluster"] is None and launches is None
        # a block's local memory is allocated whole per core: huge frames stay interpreted
        plain = plain and geo.threads * local_stride <= jit.MAX_BLOCK_LOCAL_BYTES
        # the compiled code assumes bounded block dimensions and shared offsets (jit/layout.py;
        # beyond them only without a profile's limits)
        plain = plain and max(geo.block) <= jit_layout.MAX_BLOCK_DIM
        plain = plain and shared_stride < jit_layout.MAX_SHARED
        if mode != "off" and plain and not k.cluster_barrier:
            ck = self._natives.get((k.name, geo.block))
            if ck is None:
                n = self._launch_counts[k.name] = self._launch_counts.get(k.name, 0) + 1
                if mode == "diff" or jit.worth_compiling(
                    self.source_hash,
                    k.name,
                    geo.blocks * geo.threads,
                    n,
                    self._size(k),
                    self._interpreted_s.get(k.name, 0.0),
                ):
                    ck = self._compiled(k, geo.block)
                    if ck is not None:
                        self._natives[(k.name, geo.block)] = ck
            if (
                ck is not None
                and grid_workspace
                and jit.cooperative_bytes(ck, geo.blocks, geo.threads, shared_stride, local_stride)
                > BATCH_BYTES
            ):  # every block's buffers at once: the interpreter's bound
                ck = None
        if ck is None:
            t0 = time.perf_counter()
            try:
                interpret()
            finally:
                spent = self._interpreted_s.get(k.name, 0.0) + time.perf_counter() - t0
                self._interpreted_s[k.name] = spent
            return

        def compiled(sink=sink) -> None:
            run_compiled(
                ck,
                geo=geo,
                memory=memory,
                kparams=kparams,
                symvals=symvals,
                shared_stride=shared_stride,
                local_stride=local_stride,
                deadline=deadline,
                serial=mode == "diff" and jit.orders_matter(self._dec.by_fid[k.fid].fn),
                printf=sink,
                grid_workspace=grid_workspace,
            )

        if mode == "diff":  # the compiled run's output is what the program sees
            heard: list[str] = []
            said: list[str] = []
            try:
                differential(
                    memory,
                    partial(interpret, heard.append),
                    partial(compiled, said.append),
                    k.name,
                    (heard, said),
                )
            finally:
                for text in said:
                    sink(text)
        else:
            compiled()

    def _size(self, k: PtxKernel) -> int:
        """Kernel ``k``'s PTX instructions and its callees' (which the compiler inlines): what
        a compile of it costs follows."""
        got = self._sizes.get(k.name)
        if got is None:
            bodies = [self._dec.by_fid[f].fn.body or [] for f in k.reachable]
            got = sum(1 for body in bodies for s in body if not isinstance(s, Label))
            self._sizes[k.name] = got
        return got

    def _compiled(self, k: PtxKernel, block=(1, 1, 1)):
        """Kernel ``k`` compiled to native code (cached by module hash) with the driver a
        launch of ``block`` runs, or None."""
        dec = self._dec
        fi = dec.by_fid[k.fid]
        mscope = dec.module.scope.vars
        # the function each reachable function's own variables belong to (a callee's are
        # inlined into the kernel, at the places the interpreter's layout gave them)
        owner = {
            id(v): f
            for f in k.reachable
            for v in (*dec.by_fid[f].fn.locals, *dec.by_fid[f].fn.shared)
        }

        def slot_of(var):
            if var.space in ("global", "const"):
                key: tuple = ("global", var.name)
            elif var.space == "shared":
                if var.extern:
                    key = ("dynshared",)
                elif mscope.get(var.name) is var:
                    key = ("shared", var.name)
                else:
                    key = ("fshared", owner.get(id(var), fi.fid), var.name)
            elif var.space == "local":  # its offset in the lane's local area
                key = ("local", owner.get(id(var), fi.fid), var.name)
            else:
                return None
            return dec.slot_index.get(key)

        externs = frozenset(f.fn.name for f in dec.by_fid.values() if f.builtin is not None)
        funcs = {
            f.fn.name: f.fn
            for f in dec.by_fid.values()
            if f.fn.body is not None and not f.fn.is_entry and f.builtin is None
        }
        return jit.compiled_kernel(
            self.source_hash,
            fi.fn,
            dec.kparam_offsets,
            slot_of,
            k.param_bytes,
            tuple(block),
            externs,
            funcs,
        )


@dataclass(frozen=True)
class _Plan:
    """What one launch configuration's checks and sizes came to: the same configuration
    launched again (a library's kernels, a training loop's) skips the driver's checks, which
    cost more than a small kernel's run. Only configurations the checks accepted are kept; a
    refused one is checked, and refused, every time."""

    k: PtxKernel
    profile: object  # the device profile it was checked against (kept: its id is the key's)
    geo: LaunchGeometry
    cdims: tuple[int, int, int] | None
    per_batch: int
    shared_stride: int
    local_stride: int
    reg_counts: dict
    pm_sizes: dict
    #: the profile's SM count, warps per SM and clock (%nsmid, %nwarpid's bound, %clock):
    #: read once, each a look-up in its attribute table
    nsm: int
    nwarps_per_sm: int
    clock_khz: int


#: the symbol table of a launch given none (one object: :meth:`PtxProgram._symvals` keys on it)
_NO_SYMBOLS: Mapping[str, int] = MappingProxyType({})
#: launch configurations kept per module (beyond it, new ones are checked every time)
_PLANS = 4096


_TRAP = int(CUresult.CUDA_ERROR_LAUNCH_FAILED)
#: a launch without a device profile (the interpreter driven directly) may use clusters
_CLUSTER_LAUNCH = int(CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)
#: SM clock used for %clock/%clock64 when a launch names no device profile (an H100 SXM's)
DEFAULT_CLOCK_KHZ = 1980000
_gridids = itertools.count(1)


def _next_gridid() -> int:
    """%gridid: a per-process launch counter, so concurrent or successive grids differ (the
    ISA only promises that it distinguishes grids of one context)."""
    return next(_gridids)


def _stdout(text: str) -> None:
    sys.stdout.write(text)


def _dims(d, what: str) -> tuple[int, int, int]:
    t = tuple(int(x) for x in (d if isinstance(d, (tuple, list)) else (d,)))
    if not 1 <= len(t) <= 3:
        raise KernelFault(
            int(CUresult.CUDA_ERROR_INVALID_VALUE), f"{what} must have 1 to 3 dimensions"
        )
    return ((*t, 1, 1))[:3]  # type: ignore[return-value]


def _batch_costs(k: PtxKernel, dynamic_shared: int) -> tuple[int, int, int]:
    """(bytes per lane, shared-memory stride per block, local-memory stride per lane)."""
    shared_total = (
        _align(k.dynamic_shared_offset + dynamic_shared, 16)
        if dynamic_shared
        else _align(k.static_shared_bytes, 16)
    )
    shared_stride = max(shared_total, 16)
    local_stride = _align(max(k.local_bytes, 8), 16)
    return k.lane_bytes + local_stride + 160, shared_stride, local_stride


def _check_cluster(k: PtxKernel, grid, cluster, profile, non_portable: bool):
    """The cluster dimensions the launch runs with (None: none), checked as the driver does."""
    from crane.api.launch_check import check_cluster
    from crane.api.results import CudaError

    attrs = profile.attributes if profile is not None else {_CLUSTER_LAUNCH: 1}
    try:
        return check_cluster(
            attrs,
            grid,
            cluster,
            required=k.cluster_dims,
            explicit=k.explicit_cluster,
            max_rank=k.max_cluster_rank,
            non_portable=non_portable,
        )
    except CudaError as e:
        raise KernelFault(int(e.code), e.message) from None


def _check_cooperative(k: PtxKernel, grid, block, dynamic_shared: int, profile, ws: int) -> None:
    """The driver's cooperative-launch checks (shared with the guest: crane.api.launch_check)."""
    if not ws:
        raise KernelFault(
            int(CUresult.CUDA_ERROR_INVALID_VALUE), "cooperative launch without a grid workspace"
        )
    if profile is None:
        return
    from crane.api.launch_check import check_cooperative
    from crane.api.results import CudaError

    try:
        check_cooperative(
            profile.attributes,
            grid,
            block,
            dynamic_shared,
            static_shared=k.static_shared_bytes,
            max_threads=k.max_threads,
        )
    except CudaError as e:
        raise KernelFault(int(e.code), e.message) from None


def _check_launch(k: PtxKernel, grid, block, dynamic_shared: int, profile, max_dyn) -> None:
    """The driver's launch checks (shared with the guest: crane.api.launch_check)."""
    if profile is None:
        for v in grid + block:
            if v < 1:
                raise KernelFault(int(CUresult.CUDA_ERROR_INVALID_VALUE), "zero launch dimension")
        return
    from crane.api.launch_check import check_launch
    from crane.api.results import CudaError

    try:
        check_launch(
            profile.attributes,
            grid,
            block,
            dynamic_shared,
            static_shared=k.static_shared_bytes,
            max_threads=k.max_threads,
            max_dynamic_shared=max_dyn,
        )
    except CudaError as e:
        raise KernelFault(int(e.code), e.message) from None
    if k.reqntid is not None:
        want = ((*tuple(k.reqntid), 1, 1))[:3]
        if tuple(block) != want:
            raise KernelFault(
                int(CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
                f"block {block} differs from the kernel's .reqntid {want}",
            )


# ---- loading ----------------------------------------------------------------------------------


def load_ptx(text: str, info=None) -> PtxProgram:
    """Parse and decode a PTX module; every unsupported instruction is refused here. ``info``:
    the module's declaration scan (:func:`crane.modules.ptx_info.scan_ptx` of ``text``) when
    the caller has it already."""
    if info is None:
        info = scan_module(text)
    mod = parse_module(text)
    if mod.version > SUPPORTED_VERSION:
        # newer ISA versions are accepted; any instruction we do not know is refused below
        pass
    mapped = apply_target_options(text, mod.target)
    if mapped is not text:
        mod = parse_module(mapped)
    dec = decode_module(mod, info)
    cluster_barrier = uses_cluster_barrier(dec.code)
    kernels: dict[str, PtxKernel] = {}
    for name, fi in dec.funcs.items():
        if not fi.fn.is_entry or fi.fn.body is None:  # a prototype (see lazy.py) is no kernel
            continue
        einfo = info.entries.get(name)
        kernels[name] = k = _kernel_layout(dec, fi, einfo)
        if einfo is not None:
            d = einfo.directives
            k.cluster_dims = d.get(".reqnctapercluster") or None
            k.explicit_cluster = ".explicitcluster" in d or k.cluster_dims is not None
            k.max_cluster_rank = (d.get(".maxclusterrank") or (None,))[0]
        k.cluster_barrier = cluster_barrier
    prog = PtxProgram(dec, info, kernels, module_variables(info))
    prog.source_hash = jit.module_hash(text)
    return prog


def scan_module(text: str):
    """The declaration scan of a module (:func:`crane.modules.ptx_info.scan_ptx`), its errors
    as :class:`PtxError`."""
    from crane.modules import ptx_info

    try:
        return ptx_info.scan_ptx(text)
    except ptx_info.PtxImageError as e:
        raise PtxError(str(e)) from None


def module_variables(info) -> list[ModuleVariable]:
    """The module's own ``.global``/``.const`` variables (``info``: its declaration scan), which
    the backend places and whose addresses it passes to launches as ``symbols``."""
    variables = []
    for v in info.variables.values():
        space = v.space.lstrip(".")
        if space not in ("global", "const") or v.scope is not None or v.is_extern:
            continue
        variables.append(
            ModuleVariable(
                name=v.name,
                space=space,
                size=v.size or 0,
                align=v.align,
                init=v.init,
                relocs=tuple((r.offset, r.size, r.symbol, r.addend) for r in v.relocs),
            )
        )
    return variables


def _reachable(dec: Decoded, fid: int) -> list[int]:
    out, stack = [], [fid]
    seen = {fid}
    while stack:
        f = stack.pop()
        out.append(f)
        for c in dec.by_fid[f].callees:
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return sorted(out)


#: What ptxas lets one kernel declare: 48 KiB of static shared memory per block (more must be
#: dynamic and opted into) and 512 KiB of local memory per thread (the CUDA programming guide's
#: per-thread limit); beyond them it refuses the module ("uses too much shared data").
MAX_STATIC_SHARED = 0xC000
MAX_LOCAL_PER_THREAD = 0x80000


def _check_static_sizes(k: PtxKernel) -> None:
    """Refuse a kernel whose declarations no device could hold, as ptxas does at JIT time,
    rather than fail at launch with a nonsense limit or exhaust the worker's memory."""
    for what, size, most in (
        ("shared", k.static_shared_bytes, MAX_STATIC_SHARED),
        ("local", k.local_bytes, MAX_LOCAL_PER_THREAD),
    ):
        if size > most:
            raise PtxError(
                f"entry function '{k.name}' uses too much {what} data "
                f"({size:#x} bytes, {most:#x} max)"
            )


def _kernel_layout(dec: Decoded, fi: FuncInfo, einfo) -> PtxKernel:
    fn = fi.fn
    reach = _reachable(dec, fi.fid)
    if einfo is not None:
        params = tuple((p.offset, p.size) for p in einfo.params)
        pbytes = einfo.param_bytes
        maxntid = einfo.maxntid
        reqntid = einfo.reqntid
        layout = {name: off for name, off, _ in einfo.shared_layout}
        static_shared = einfo.static_shared_bytes
    else:
        params = tuple((dec.kparam_offsets[id(p)], p.size) for p in fn.params)
        pbytes = max((o + s for o, s in params), default=0)
        maxntid = fn.directives.get("maxntid")
        reqntid = fn.directives.get("reqntid")
        layout, static_shared = {}, 0
    k = PtxKernel(
        name=fn.name,
        params=params,
        param_bytes=pbytes,
        static_shared_bytes=static_shared,
        local_bytes=0,
        maxntid=tuple(maxntid) if maxntid else None,
        reqntid=tuple(reqntid) if reqntid else None,
        fid=fi.fid,
        entry_pc=fi.entry_pc,
        reachable=tuple(reach),
    )
    reach_set = set(reach)
    # shared variables: ptx_info's layout (ptxas order) by name; anything it lacks goes after
    extern_align = 16
    for slot, key in enumerate(dec.slots):
        kind = key[0]
        if kind == "global":
            if slot in _slots_used(dec, reach):
                k.global_slots[slot] = key[1]
        elif kind in ("shared", "fshared"):
            if kind == "fshared" and key[1] not in reach_set:
                continue
            name = key[-1]
            var = _find_var(dec, key)
            if name in layout:
                k.slot_values[slot] = layout[name]
            else:
                off = _align(static_shared, var.align if var else 16)
                k.slot_values[slot] = off
                static_shared = off + (var.size if var else 0)
        elif kind == "local" and key[1] not in reach_set:
            continue
    k.static_shared_bytes = static_shared
    for v in dec.module.variables:
        if v.space == "shared" and v.extern:
            extern_align = max(extern_align, v.align)
    for f in reach:
        for v in dec.by_fid[f].fn.shared:
            if v.extern:
                extern_align = max(extern_align, v.align)
    k.dynamic_shared_offset = _align(static_shared, extern_align)
    # local memory: every reachable function's .local variables (the __local_depot frames)
    off = 0
    for f in reach:
        start = None
        for v in dec.by_fid[f].fn.locals:
            off = _align(off, v.align)
            start = off if start is None else start
            slot = dec.slot_index.get(("local", f, v.name))
            if slot is not None:
                k.slot_values[slot] = off
            off += v.size
        if start is not None:
            k.local_frames[f] = (start, off)
    k.local_bytes = off
    _check_static_sizes(k)
    lane = 0
    for f in reach:
        n16, n32, n64, npred = dec.by_fid[f].counts
        lane += 2 * n16 + 4 * n32 + 8 * n64 + npred + dec.by_fid[f].pm_size
    k.lane_bytes = lane
    k.reads_grid_workspace = any(
        "%envreg1" in ins.text or "%envreg2" in ins.text
        for f in reach
        for ins in dec.code[dec.by_fid[f].entry_pc : dec.by_fid[f].end_pc]
    )
    return k


def _slots_used(dec: Decoded, reach: list[int]) -> set[int]:
    used: set[int] = set()
    for f in reach:
        used |= dec.by_fid[f].used_slots
    return used


def _find_var(dec: Decoded, key: tuple):
    if key[0] == "shared":
        return dec.module.scope.vars.get(key[1])
    fi = dec.by_fid[key[1]]
    for v in fi.fn.shared:
        if v.name == key[2]:
            return v
    return None
