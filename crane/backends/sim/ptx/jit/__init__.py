"""PTX compiled to native CPU code: the simulated GPU's fast path beside the interpreter.

:func:`compiled_kernel` gives a kernel's machine code (compiled on first use, cached by the
module's hash and the kernel's name for the life of the process) or None when the compiler does
not take it — then the launch runs interpreted and one log line (logger ``crane.sim.ptx.jit``)
names the instruction or feature and its PTX line. :mod:`.lower` says what is covered.

``CRANE_PTX_JIT`` selects the path: ``1`` (default) compiled where possible, ``0`` always the
interpreter, ``diff`` both — every compiled launch also runs interpreted from the same memory
and a difference in any allocation's bytes (or in the fault) raises :class:`JitMismatch`. The
PTX tests run in ``diff`` mode, which is how the two paths are kept identical.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import threading
import time
from dataclasses import dataclass

from . import diskcache
from .refusal import Refusal

#: llvmlite is the optional `sim` extra: without it every kernel runs interpreted. It is only
#: looked for here; LLVM itself is imported at the first compile or disk-cache load (the
#: functions below), because loading it adds ~44 MB to a worker's resident memory, which a
#: session that never launches enough to compile (an idle one, a copy-only one) need not pay.
MISSING = (
    ""
    if importlib.util.find_spec("llvmlite")
    else "llvmlite is not installed (pip install 'crane[sim]')"
)


def compile_ir(*args, **kw):
    """:func:`.engine.compile_ir`, LLVM imported on first use."""
    from .engine import compile_ir as real

    return real(*args, **kw)


def load_object(*args, **kw):
    """:func:`.engine.load_object`, LLVM imported on first use."""
    from .engine import load_object as real

    return real(*args, **kw)


def lower_kernel(*args, **kw):
    """:func:`.lower.lower_kernel`, llvmlite's IR builder imported on first use."""
    from .lower import lower_kernel as real

    return real(*args, **kw)


def simd_lanes() -> int:
    from .simd import simd_lanes as real

    return real()


__all__ = [
    "COMPILE_AFTER_LAUNCHES",
    "COMPILE_MIN_LANES",
    "MAX_BLOCK_LOCAL_BYTES",
    "CompiledKernel",
    "JitMismatch",
    "compiled_kernel",
    "cooperative_bytes",
    "mode",
    "module_hash",
    "orders_matter",
    "stats",
    "worth_compiling",
]

log = logging.getLogger("crane.sim.ptx.jit")


class JitMismatch(AssertionError):
    """``diff`` mode: the compiled kernel and the interpreter disagreed."""


@dataclass
class CompiledKernel:
    name: str
    fn: object  # engine.KernelFn: the general driver; None until a launch needs it (below)
    sites: int
    nregs: int
    texts: list
    compile_s: float
    fast: object = None  # the vectorizable form (no barrier, no loop; 1-D blocks), or None
    _owner: object = None
    from_disk: bool = False  # loaded from the disk cache (compile_s: the load's time)
    _general: object = None  # the engine of the general driver, when compiled apart
    general_failed: bool = False  # its compile failed: launches that need it run interpreted
    prints: bool = False  # it calls vprintf: its launches collect output (:mod:`.printing`)

    def entry_for(self, block: tuple[int, int, int]):
        """The driver a launch with ``block`` runs: the vectorizable one for 1-D blocks (when
        the kernel has it), else the general one."""
        if self.fast is not None and block[1] == block[2] == 1:
            return self.fast
        return self.fn


_cache: dict[tuple[str, str], CompiledKernel | Refusal] = {}
_lock = threading.Lock()


def mode() -> str:
    """``"on"``, ``"off"`` or ``"diff"`` from ``CRANE_PTX_JIT`` (read per launch, so a test
    or an operator can switch it without restarting)."""
    v = os.environ.get("CRANE_PTX_JIT", "1").strip().lower()
    if v in ("0", "off", "false", "no"):
        return "off"
    if MISSING:
        _say_missing()
        return "off"
    if v == "diff":
        return "diff"
    return "on"


#: a kernel is compiled at its first launch of at least this many threads, or at its
#: COMPILE_AFTER_LAUNCHES-th launch: a compile costs 50-200 ms, which small launches of a
#: kernel run once or twice (most of a test suite's) would not earn back. A larger kernel's
#: thresholds grow with its compile's cost (:func:`worth_compiling`); 1 compiles every launch
#: (the compiler's own tests)
COMPILE_MIN_LANES = 1 << 14
COMPILE_AFTER_LAUNCHES = 3
#: what a compile costs per PTX instruction of the kernel, about: 1.4-5 ms on the 2-core
#: development machine (saxpy's 20 instructions 0.1 s, the tiled matmul's 103 0.5 s, CUB's
#: radix-sort histogram kernel's 635 2.5 s, its segmented sort kernel's 5396 7.6 s)
COMPILE_S_PER_INSTRUCTION = 0.004
#: the largest compile cost the two thresholds above serve; a kernel costing more is
#: compiled once its interpreted launches have cost as much (:func:`worth_compiling`)
BASE_COMPILE_S = 0.5
#: what the interpreter spends per PTX instruction run, and per lane of it, about (a 1M-lane
#: saxpy of 20 instructions: 0.13 s): the expected time of a launch not yet run
INTERPRET_S_PER_INSTRUCTION = 20e-6
INTERPRET_S_PER_LANE = 6e-9
#: compiled launches give each core a block's worth of local memory (threads x the local
#: stride) at once; blocks needing more (huge local arrays) run interpreted, whose batches are
#: sized by memory
MAX_BLOCK_LOCAL_BYTES = 64 << 20


def worth_compiling(
    mod_hash: str,
    name: str,
    lanes: int,
    launches: int,
    instructions: int = 0,
    interpreted_s: float = 0.0,
) -> bool:
    """Whether launch number ``launches`` (1 = the first) of kernel ``name`` with ``lanes``
    threads should use (and if need be compile) native code in mode ``on``; ``diff`` always
    compiles, so the differential tests see every kernel.

    ``instructions``: the kernel's size, which a compile's cost follows; ``interpreted_s``:
    the time its launches ran interpreted so far. A kernel whose compile would cost more than
    :data:`BASE_COMPILE_S` is compiled once its interpreted launches, this one's expected
    time included, would cost as much as the compile: the rent-or-buy rule, which never
    spends more than about twice the better choice. Why: a library's kernels run hundreds or
    thousands of instructions (CUB's radix sort: seconds to compile) on small inputs in most
    programs and tests; compiling them at their third launch made Thrust's test program
    take 10.5 instead of 7 s."""
    with _lock:
        if (mod_hash, name) in _cache:
            return True
    if COMPILE_MIN_LANES <= 1:
        return True
    cost = instructions * COMPILE_S_PER_INSTRUCTION
    if cost <= BASE_COMPILE_S:
        return lanes >= COMPILE_MIN_LANES or launches >= COMPILE_AFTER_LAUNCHES
    expect = instructions * (INTERPRET_S_PER_INSTRUCTION + lanes * INTERPRET_S_PER_LANE)
    return interpreted_s + expect >= cost


def cooperative_bytes(ck, blocks: int, threads: int, shared_stride: int, local_stride: int) -> int:
    """What a cooperative launch of compiled kernel ``ck`` holds at once (:mod:`.coop`: every
    block's save area, resume words, local and shared memory)."""
    lane = 8 * max(ck.nregs, 1) + 4 + local_stride
    return blocks * (threads * lane + max(shared_stride, 16))


def orders_matter(fn) -> bool:
    """Whether entry function ``fn``'s results may depend on the order its blocks run in (it
    has atomics, whose returned old values do): ``diff`` mode then runs the compiled kernel on
    one core, blocks in order, the interpreter's schedule."""
    return any(getattr(s, "opcode", "").split(".")[0] in ("atom", "red") for s in fn.body or [])


def _say_missing() -> None:
    global _missing_said
    if not _missing_said:
        _missing_said = True
        log.info("PTX kernels run interpreted: %s", MISSING)


_missing_said = False


def module_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def compiled_kernel(
    mod_hash: str,
    fn,
    kparam_offsets,
    slot_of,
    param_bytes: int,
    block=(1, 1, 1),
    externs: frozenset[str] = frozenset(),
    funcs: dict | None = None,
):
    """The compiled kernel for entry function ``fn`` of the module hashed ``mod_hash``, or
    None (logged once) when the compiler refuses it. A kernel with the vectorizable form
    (barrier-free, loop-free) is compiled with only the driver 1-D blocks run; the general
    driver, for a launch of ``block`` with more than one dimension, is compiled when such a
    launch first comes (most such kernels are never launched so: 10-20 ms of a 60 ms
    compile saved). ``externs``: the module's functions declared without a body; ``funcs``:
    its device functions with one, by name (inlined at their call sites)."""
    key = (mod_hash, fn.name)
    with _lock:
        got = _cache.get(key)
        if got is None:
            t0 = time.perf_counter()
            try:
                got = _from_disk(mod_hash, fn.name, t0)
                if got is None:
                    low, code = _lower_and_compile(
                        fn, kparam_offsets, slot_of, param_bytes, externs, funcs
                    )
                    split = low.fast is not None
                    got = CompiledKernel(
                        fn.name,
                        code.fn,
                        low.sites,
                        low.nregs,
                        low.texts,
                        time.perf_counter() - t0,
                        code.fast,
                        code,
                        prints=low.prints,
                    )
                    meta = {"entry": None if split else low.name, "fast": low.fast}
                    meta["prints"] = low.prints
                    meta["sites"] = low.sites
                    meta.update(nregs=low.nregs, texts=low.texts)
                    _to_disk(mod_hash, fn.name, meta, code.obj)
                    log.debug("kernel %s compiled in %.1f ms", fn.name, got.compile_s * 1e3)
            except Refusal as r:
                got = r
                log.info(
                    "kernel %s runs interpreted: the PTX compiler does not take %s", fn.name, r
                )
            except Exception as e:  # an LLVM error: the interpreter still runs the kernel
                got = Refusal(f"an internal compiler error ({type(e).__name__}: {e})", None)
                log.warning("kernel %s runs interpreted: %s", fn.name, got)
            _cache[key] = got
        if not isinstance(got, CompiledKernel):
            return None
        if got.entry_for(block) is None and not _add_general(
            got, fn, kparam_offsets, slot_of, param_bytes, externs, funcs
        ):
            return None
    return got


def _lower_and_compile(
    fn, kparam_offsets, slot_of, param_bytes: int, externs=frozenset(), funcs=None
):
    """Lower and compile ``fn`` (only the driver its first launches need when it has two);
    if LLVM fails on a kernel with vector-form regions (:mod:`.simd`), it is lowered again
    without them (logged): a lowering bug there must cost speed, never the compiled kernel."""
    try:
        low = lower_kernel(fn, kparam_offsets, slot_of, param_bytes, externs=externs, funcs=funcs)
        return low, _compile(low)
    except Refusal:
        raise
    except Exception as e:
        if not simd_lanes():  # no vector form to leave out
            raise
        log.warning(
            "kernel %s: vector-form regions left out (%s: %s)", fn.name, type(e).__name__, e
        )
        low = lower_kernel(
            fn, kparam_offsets, slot_of, param_bytes, simd=False, externs=externs, funcs=funcs
        )
        return low, _compile(low)


def _compile(low):
    split = low.fast is not None
    drop = (low.name,) if split else ()
    return compile_ir(low.ir_text(), None if split else low.name, low.fast, drop, low.cold)


def _add_general(
    ck: CompiledKernel,
    fn,
    kparam_offsets,
    slot_of,
    param_bytes: int,
    externs=frozenset(),
    funcs=None,
) -> bool:
    """Compile kernel ``ck``'s general driver (lowered again; its vectorizable driver left
    out); False, logged once, if that fails. Called under ``_lock`` (compiles share one
    target machine)."""
    if ck.general_failed:
        return False
    t0 = time.perf_counter()
    try:
        low = lower_kernel(fn, kparam_offsets, slot_of, param_bytes, externs=externs, funcs=funcs)
        drop = (low.fast,) if low.fast else ()
        code = compile_ir(low.ir_text(), low.name, None, drop, low.cold)
    except Exception as e:  # an LLVM error: those launches run interpreted
        ck.general_failed = True
        log.warning("kernel %s: multi-dimensional blocks run interpreted: %s", ck.name, e)
        return False
    ck.fn, ck._general = code.fn, code
    ck.compile_s += time.perf_counter() - t0
    log.debug(
        "kernel %s: general driver compiled in %.1f ms", ck.name, (time.perf_counter() - t0) * 1e3
    )
    return True


def _from_disk(mod_hash: str, name: str, t0: float) -> CompiledKernel | None:
    """The kernel from the disk cache (:mod:`.diskcache`), if it is configured and has it."""
    root = diskcache.cache_dir()
    if root is None:
        return None
    hit = diskcache.load(root, diskcache.entry_key(mod_hash, name))
    if hit is None:
        return None
    meta, obj = hit
    try:
        code = load_object(obj, meta["entry"], meta["fast"])
        texts = [(str(t), int(line)) for t, line in meta["texts"]]
        ck = CompiledKernel(
            name, code.fn, int(meta["sites"]), int(meta["nregs"]), texts, 0.0, code.fast, code
        )
        ck.prints = bool(meta.get("prints", False))
    except (KeyError, TypeError, ValueError, LookupError, RuntimeError) as e:
        log.debug("PTX compiler cache: entry for %s unusable (%s): compiling", name, e)
        return None
    ck.compile_s = time.perf_counter() - t0
    ck.from_disk = True
    log.debug("kernel %s loaded from the disk cache in %.1f ms", name, ck.compile_s * 1e3)
    return ck


def _to_disk(mod_hash: str, name: str, meta: dict, obj: bytes) -> None:
    root = diskcache.cache_dir()
    if root is not None:
        diskcache.store(root, diskcache.entry_key(mod_hash, name), meta, obj)


def stats() -> dict[str, list]:
    """What this process compiled, loaded from the disk cache and refused: ``{"compiled":
    [(kernel, ms)], "loaded": [(kernel, ms)], "refused": [(kernel, reason)]}`` (the
    differential test reports it)."""
    with _lock:
        items = list(_cache.items())
    out: dict[str, list] = {"compiled": [], "refused": [], "loaded": []}
    for (_, name), v in items:
        if isinstance(v, CompiledKernel):
            out["loaded" if v.from_disk else "compiled"].append((name, v.compile_s * 1e3))
        else:
            out["refused"].append((name, str(v)))
    return out
