"""LLVM IR → native code for the host CPU (llvmlite's MCJIT), one engine per kernel.

Why one engine per kernel: a kernel's machine code must live as long as any module that uses
it, and an engine per kernel lets the cache (``jit.compiled_kernel``) hold exactly what it
compiled. The target machine is the host's own CPU with all its features (AVX-512 where
present); the module is optimized with LLVM's -O2 pipeline (it vectorizes as -O3 does here,
at two thirds of the compile time) without loop unrolling, loop interleaving and SLP
vectorization, and emitted at codegen level 2: on the benchmark kernels (bench_ptx.py) those
cost 10-15% of the compile time and bought no measurable speed (the lane loops are vectorized
by the loop vectorizer; the kernels are memory- or latency-bound, and nvcc has already
unrolled the loops that matter). The compile's target machine is made once and kept (an
engine still gets its own: it frees the one it is built with).
"""

from __future__ import annotations

import ctypes
import threading

import llvmlite.binding as llvm

from .coldsplit import split

__all__ = ["Compiled", "KernelFn", "compile_ir", "host_signature", "load_object", "optimize"]

#: the compiled entry point: ``int32 kern(int64 *ctx)``; ctypes releases the GIL during the
#: call, so the launch's watchdog thread can set the stop flag
KernelFn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)

_lock = threading.Lock()
_ready = False


_compile_tm = None


def _target_machine(opt: int = 3):
    """A new target machine for the host CPU: an MCJIT engine takes ownership of the one it is
    built with (and frees it with itself), so engines must not share one."""
    global _ready
    with _lock:
        if not _ready:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _ready = True
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(),
        features=llvm.get_host_cpu_features().flatten(),
        opt=opt,
    )


def _compiler():
    """The target machine compiles run on (made once: compiles are serialized by the caller,
    ``jit.compiled_kernel``'s lock, and nothing takes ownership of it)."""
    global _compile_tm
    if _compile_tm is None:
        _compile_tm = _target_machine(opt=2)
    return _compile_tm


class Compiled:
    """A kernel's machine code and the engine that owns it; ``obj`` is the object file the
    code was loaded from (what the disk cache keeps)."""

    def __init__(self, engine, fn: KernelFn | None, fast: KernelFn | None, obj: bytes) -> None:
        self._engine = engine  # keeps the code mapped
        self.fn = fn
        self.fast = fast
        self.obj = obj


def compile_ir(
    ir_text: str,
    entry: str | None,
    fast: str | None = None,
    drop: tuple[str, ...] = (),
    cold: tuple[str, ...] = (),
) -> Compiled:
    """Verify, optimize (-O2) and compile a module to an object file, and load that; return
    its ``entry`` function (and the ``fast`` one, if named). The exported functions named in
    ``drop`` are left out (made internal, so nothing of them is compiled that the others do
    not use): a kernel's two drivers are compiled apart, each when a launch needs it. The
    functions named in ``cold`` rarely run: they get a short pipeline (:mod:`.coldsplit`).
    Callers serialize compiles.
    (Verifying costs under 1% of a compile; it turns a lowering bug into a refusal where the
    optimizer could crash the process.)"""
    mod = optimize(ir_text, drop, cold)
    return load_object(_compiler().emit_object(mod), entry, fast)


def optimize(ir_text: str, drop: tuple[str, ...] = (), cold: tuple[str, ...] = ()):
    """The module parsed, verified and optimized as :func:`compile_ir` compiles it (tests
    look at what LLVM made of a lowering: which loads it vectorized)."""
    if cold:
        try:
            hot_text, cold_text, linked = split(ir_text, cold)
            mod = optimize(hot_text, drop)
            part = _parse(cold_text)
            _cold_pipeline(part)
            mod.link_in(part)
            for name in linked:
                mod.get_function(name).linkage = llvm.Linkage.internal
            return mod
        except (RuntimeError, NameError):  # a text the split misread: one module, as before
            pass
    tm = _compiler()
    mod = _parse(ir_text)
    for name in drop:
        mod.get_function(name).linkage = llvm.Linkage.internal
    pto = llvm.create_pipeline_tuning_options(speed_level=2)
    pto.loop_unrolling = False
    pto.loop_interleaving = False
    pto.slp_vectorization = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def _parse(text: str):
    tm = _compiler()
    mod = llvm.parse_assembly(text)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    return mod


def _cold_pipeline(mod) -> None:
    """The short pipeline of rarely run functions (:mod:`.coldsplit`): the registers' allocas
    to SSA values, instruction combining, CFG simplification. On the tiled matmul's scalar
    lane function: a tenth of -O2's time."""
    pb = llvm.create_pass_builder(_compiler(), llvm.create_pipeline_tuning_options(speed_level=1))
    fpm = llvm.create_new_function_pass_manager()
    fpm.add_sroa_pass()
    fpm.add_instruction_combine_pass()
    fpm.add_simplify_cfg_pass()
    for fn in mod.functions:
        if not fn.is_declaration:
            fpm.run(fn, pb)


def load_object(obj: bytes, entry: str | None, fast: str | None = None) -> Compiled:
    """Machine code from an object file this module compiled (now or, through the disk
    cache, in an earlier process on the same CPU), linked into an engine of its own."""
    tm = _target_machine()  # the engine's own: it frees it
    empty = llvm.parse_assembly("")
    empty.triple = tm.triple
    engine = llvm.create_mcjit_compiler(empty, tm)
    engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    engine.finalize_object()
    fn = None
    if entry:
        addr = engine.get_function_address(entry)
        if not addr:
            raise LookupError(f"{entry} is not in the object file")
        fn = KernelFn(addr)
    fast_fn = None
    if fast:
        faddr = engine.get_function_address(fast)
        if not faddr:
            raise LookupError(f"{fast} is not in the object file")
        fast_fn = KernelFn(faddr)
    return Compiled(engine, fn, fast_fn, obj)


def host_signature() -> str:
    """What machine code compiled here depends on besides the IR: LLVM and llvmlite
    versions, the target triple, the host CPU and its features (part of the disk cache's
    key, so code is never loaded on a CPU it was not compiled for)."""
    import llvmlite

    _target_machine()  # initializes the native target
    return "|".join(
        (
            llvmlite.__version__,
            ".".join(map(str, llvm.llvm_version_info)),
            llvm.get_process_triple(),
            llvm.get_host_cpu_name(),
            llvm.get_host_cpu_features().flatten(),
        )
    )
