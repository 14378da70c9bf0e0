"""The PTX compiler's own behaviour: faults as the interpreter reports them, refusals that fall
back to the interpreter with one log line, the CRANE_PTX_JIT switch, the cache by module hash,
the deadline. (That compiled and interpreted kernels give the same bytes is checked on every
launch of the PTX suite: conftest.py runs it with CRANE_PTX_JIT=diff.)"""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from ptxdev import Ptr

from crane.backends.sim.ptx import KernelFault, jit, load_ptx

HEAD = """
.version 8.0
.target sm_80
.address_size 64
"""

#: each thread i stores (i * 3) to out[i + shift]; one thread is enough to fault exactly
STORE = (
    HEAD
    + """
.visible .entry t(.param .u64 out, .param .u32 shift)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [shift];
    mov.u32 %r2, %tid.x;
    add.s32 %r3, %r2, %r1;
    mul.wide.s32 %rd2, %r3, 4;
    add.s64 %rd3, %rd1, %rd2;
    mul.lo.s32 %r4, %r2, 3;
    st.global.u32 [%rd3], %r4;
    ret;
}
"""
)

SHARED = (
    HEAD
    + """
.visible .entry t(.param .u64 out, .param .u32 idx)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    .shared .align 4 .b8 sh[64];
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [idx];
    mov.u32 %r2, sh;
    shl.b32 %r3, %r1, 2;
    add.s32 %r4, %r2, %r3;
    st.shared.u32 [%r4], %r1;
    bar.sync 0;
    ld.shared.u32 %r5, [%r4];
    st.global.u32 [%rd1], %r5;
    ret;
}
"""
)

LOOP = (
    HEAD
    + """
.visible .entry t(.param .u64 out, .param .u32 start)
{
    .reg .b32 %r<4>;
    .reg .pred %p<2>;
    ld.param.u32 %r1, [start];
$L_top:
    add.s32 %r1, %r1, 1;
    setp.ne.s32 %p1, %r1, 0;
    @%p1 bra $L_top;
    ret;
}
"""
)

#: bmsk (a bit-field mask) is an instruction the compiler does not take
#: an instruction the compiler does not take (``cnot``: 1 where the operand is 0)
CNOT = (
    HEAD
    + """
.visible .entry t(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    cnot.b32 %r2, %r1;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r2;
    ret;
}
"""
)


pytestmark = pytest.mark.usefixtures("compile_every_launch")


def _fault(dev, prog, args, monkeypatch, mode: str, threads: int = 1) -> KernelFault:
    monkeypatch.setenv("CRANE_PTX_JIT", mode)
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "t", 1, threads, args)
    return e.value


def _compiled_names() -> set[str]:
    return {name for name, _ in jit.stats()["compiled"]}


def test_compiled_result(dev, monkeypatch):
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    prog = load_ptx(STORE)
    out = dev.zeros(300, np.uint32)
    dev.launch(prog, "t", 1, 300, [Ptr(out), np.uint32(0)])
    assert np.array_equal(dev.download(out, 300, np.uint32), np.arange(300) * 3)
    assert "t" in _compiled_names()


@pytest.mark.parametrize("shift", [1, -1, 1 << 20])
def test_global_fault_same_as_interpreter(dev, monkeypatch, shift):
    """One thread: the compiled kernel reports the very fault the interpreter reports."""
    prog = load_ptx(STORE)
    out = dev.zeros(1, np.uint32)
    args = [Ptr(out), np.uint32(shift & 0xFFFFFFFF)]
    got = _fault(dev, prog, args, monkeypatch, "1")
    want = _fault(dev, prog, args, monkeypatch, "0")
    assert got.code == want.code == 700
    assert str(got) == str(want)
    assert "PTX line 17" in str(got) and "st.global.u32" in str(got)


def test_misaligned_global(dev, monkeypatch):
    prog = load_ptx(STORE)
    out = dev.zeros(8, np.uint32)
    args = [Ptr(out + 2), np.uint32(0)]
    got = _fault(dev, prog, args, monkeypatch, "1")
    want = _fault(dev, prog, args, monkeypatch, "0")
    assert got.code == want.code == 716
    assert str(got) == str(want)


@pytest.mark.parametrize("idx", [16, 0xFFFFFFFF, 1000, (1 << 22) + 16, (2 << 22) + 1])
def test_shared_fault_same_as_interpreter(dev, monkeypatch, idx):
    prog = load_ptx(SHARED)
    out = dev.zeros(1, np.uint32)
    args = [Ptr(out), np.uint32(idx)]
    got = _fault(dev, prog, args, monkeypatch, "1")
    want = _fault(dev, prog, args, monkeypatch, "0")
    assert got.code == want.code == 700
    assert str(got) == str(want)
    assert "st.shared.u32" in str(got)


@pytest.mark.parametrize("idx", [15, (1 << 22) + 3])
def test_shared_in_bounds_across_barrier(dev, monkeypatch, idx):
    """In bounds, also through a .shared::cluster address of the CTA's own rank (tag 1)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    prog = load_ptx(SHARED)
    out = dev.zeros(1, np.uint32)
    dev.launch(prog, "t", 1, 1, [Ptr(out), np.uint32(idx)])
    assert dev.download(out, 1, np.uint32)[0] == idx


def test_refused_kernel_runs_interpreted_with_one_log_line(dev, monkeypatch, caplog):
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    prog = load_ptx(CNOT + "\n// refusal test\n")  # a module of its own (cache by hash)
    out = dev.zeros(64, np.uint32)
    with caplog.at_level(logging.INFO, logger="crane.sim.ptx.jit"):
        dev.launch(prog, "t", 1, 64, [Ptr(out)])
        dev.launch(prog, "t", 1, 64, [Ptr(out)])
    lines = [r.getMessage() for r in caplog.records if r.name == "crane.sim.ptx.jit"]
    assert len(lines) == 1, lines
    assert "runs interpreted" in lines[0] and "cnot" in lines[0] and "PTX line 12" in lines[0]
    want = [int(i == 0) for i in range(64)]
    assert dev.download(out, 64, np.uint32).tolist() == want


def test_switch_off_never_compiles(dev, monkeypatch):
    monkeypatch.setenv("CRANE_PTX_JIT", "0")

    def boom(*a, **k):
        raise AssertionError("compiled with CRANE_PTX_JIT=0")

    monkeypatch.setattr(jit, "compiled_kernel", boom)
    prog = load_ptx(STORE + "\n// off\n")
    out = dev.zeros(4, np.uint32)
    dev.launch(prog, "t", 1, 4, [Ptr(out), np.uint32(0)])
    assert dev.download(out, 4, np.uint32).tolist() == [0, 3, 6, 9]


def test_cached_by_module_hash(dev, monkeypatch):
    """Loading the same module text again reuses the machine code: no second compile."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    text = STORE + "\n// cache test\n"
    out = dev.zeros(4, np.uint32)
    load_ptx(text).launch  # noqa: B018
    dev.launch(load_ptx(text), "t", 1, 4, [Ptr(out), np.uint32(0)])
    n = len(jit.stats()["compiled"])
    t = time.perf_counter()
    dev.launch(load_ptx(text), "t", 1, 4, [Ptr(out), np.uint32(0)])
    assert len(jit.stats()["compiled"]) == n
    assert time.perf_counter() - t < 0.05  # a compile takes tens of milliseconds


def test_deadline_ends_a_compiled_loop(dev, monkeypatch):
    """A first launch that counts from 2**32 - 1 leaves the loop at once and pays the compile,
    which the deadline must not include (under load the compile alone outran it). One lane
    is compiled at once (``COMPILE_MIN_LANES``), so the loop the deadline ends is native."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    monkeypatch.setattr(jit, "COMPILE_MIN_LANES", 1)
    prog = load_ptx(LOOP)
    out = Ptr(dev.zeros(1, np.uint32))

    def native() -> int:  # kernels this process holds compiled (or loaded from disk)
        st = jit.stats()
        return len(st["compiled"]) + len(st["loaded"])

    before = native()
    dev.launch(prog, "t", 1, 1, [out, np.uint32(0xFFFFFFFF)])
    assert native() == before + 1
    t = time.monotonic()
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "t", 1, 1, [out, np.uint32(0)], deadline=t + 0.3)
    # 2**32 iterations would take seconds; the watchdog stops it at the backward branch
    assert e.value.code == 702
    assert "PTX line 14" in str(e.value) and "bra" in str(e.value)
    assert time.monotonic() - t < 2.0


def test_small_launches_wait_before_compiling(dev, monkeypatch):
    """In ``on`` mode a kernel launched small is compiled at its third launch (a compile
    costs more than a few small launches interpreted), a big first launch at once."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    monkeypatch.setattr(jit, "COMPILE_MIN_LANES", 1 << 14)
    prog = load_ptx(STORE + "\n// policy\n")
    out = dev.zeros(1 << 14, np.uint32)
    before = len(jit.stats()["compiled"])
    for _ in range(2):
        dev.launch(prog, "t", 1, 32, [Ptr(out), np.uint32(0)])
    assert len(jit.stats()["compiled"]) == before
    dev.launch(prog, "t", 1, 32, [Ptr(out), np.uint32(0)])
    assert len(jit.stats()["compiled"]) == before + 1
    big = load_ptx(STORE + "\n// policy, big\n")
    dev.launch(big, "t", 64, 256, [Ptr(out), np.uint32(0)])
    assert len(jit.stats()["compiled"]) == before + 2
    got = dev.download(out, 1 << 14, np.uint32)  # every block writes out[%tid.x]
    assert np.array_equal(got[:256], np.arange(256) * 3) and not got[256:].any()


def test_a_big_kernel_compiles_once_interpreting_it_cost_as_much(monkeypatch):
    """Rent or buy: a kernel whose compile costs more than BASE_COMPILE_S (its size times
    COMPILE_S_PER_INSTRUCTION) is not compiled at its third launch or for a launch whose
    expected interpreted time is small, but once the time its launches ran interpreted
    (this one's expected time included) reaches the compile's cost; a small kernel keeps the
    plain thresholds."""
    monkeypatch.setattr(jit, "COMPILE_MIN_LANES", 1 << 14)
    big = 2000  # instructions: a compile of about 8 s
    cost = big * jit.COMPILE_S_PER_INSTRUCTION
    assert cost > jit.BASE_COMPILE_S

    def worth(lanes: int, launches: int, spent: float, size: int = big) -> bool:
        return jit.worth_compiling("policy-test", "k", lanes, launches, size, spent)

    assert not worth(256, 3, 0.0) and not worth(1 << 14, 10, 0.0)
    assert not worth(256, 50, cost * 0.9)
    assert worth(256, 50, cost)
    assert worth(1 << 30, 1, 0.0)  # a launch that would take longer interpreted than a compile
    assert worth(256, 3, 0.0, size=20) and worth(1 << 14, 1, 0.0, size=20)
    assert not worth(256, 2, 10.0, size=20)  # (small kernels: the plain thresholds only)


#: three regions: 0 stores shared then loads global (other memory: vectorizable), lanes at or
#: past ``live`` exit there; 1 reads the shared slot ``lim`` lanes further on (vectorizable,
#: stores nothing: one pass); 2 stores shared and loads it back (stays scalar)
REGIONS = (
    HEAD
    + """
.visible .entry t(.param .u64 out, .param .u32 lim, .param .u32 live)
{
    .reg .b32 %r<24>;
    .reg .b64 %rd<8>;
    .reg .pred %p<4>;
    .shared .align 4 .b8 sh[1024];
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r9, [lim];
    ld.param.u32 %r20, [live];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %tid.y;
    mov.u32 %r3, %ntid.x;
    mad.lo.s32 %r4, %r2, %r3, %r1;
    shl.b32 %r5, %r4, 2;
    mov.u32 %r6, sh;
    add.s32 %r7, %r6, %r5;
    st.shared.u32 [%r7], %r4;
    mul.wide.u32 %rd2, %r4, 4;
    add.s64 %rd3, %rd1, %rd2;
    ld.global.u32 %r8, [%rd3];
    setp.ge.u32 %p1, %r4, %r20;
    @%p1 bra $L_end;
    bar.sync 0;
    add.s32 %r10, %r4, %r9;
    shl.b32 %r11, %r10, 2;
    add.s32 %r12, %r6, %r11;
    ld.shared.u32 %r13, [%r12];
    add.s32 %r14, %r13, %r8;
    bar.sync 0;
    st.shared.u32 [%r7], %r14;
    ld.shared.u32 %r15, [%r7];
    st.global.u32 [%rd3], %r15;
$L_end:
    ret;
}
"""
)


def test_vectorizable_regions():
    """Regions are taken for the vectorized form by their own code: loads after stores to
    other memory are fine, a load after a store to the same memory is not; a region that
    stores nothing needs no committing pass."""
    from crane.backends.sim.ptx.jit.lower import KernelLowering
    from crane.backends.sim.ptx.parser import parse_module

    fn = parse_module(REGIONS).functions["t"]
    assert KernelLowering(fn, {}, lambda v: None, 16).vector_regions() == ([0, 1], [0])


@pytest.mark.parametrize("live", [64, 40, 0])
def test_vectorized_regions_same_as_interpreter(dev, monkeypatch, live):
    """2-D blocks; all lanes at each barrier (vectorized rounds), or some exited before it
    (the rounds after run scalar); diff mode compares every byte with the interpreter."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(REGIONS)
    base = np.arange(64, dtype=np.uint32) * 10
    out = dev.upload(base)
    dev.launch(prog, "t", 1, (16, 4, 1), [Ptr(out), np.uint32(1), np.uint32(live)])
    t = np.arange(64, dtype=np.uint32)
    nxt = np.where(t + 1 < 64, t + 1, 0).astype(np.uint32)
    want = np.where(t < live, base + nxt, base)
    assert np.array_equal(dev.download(out, 64, np.uint32), want)
    assert "t" in _compiled_names()


def test_vectorized_region_fault_same_as_interpreter(dev, monkeypatch):
    """Lanes 56.. read past the 1024 bytes of shared memory in a vectorized region: they
    run again scalar, and the first of them faults as the interpreter words it."""
    prog = load_ptx(REGIONS)
    out = dev.zeros(64, np.uint32)
    args = [Ptr(out), np.uint32(200), np.uint32(64)]
    got = _fault(dev, prog, args, monkeypatch, "1", threads=64)
    want = _fault(dev, prog, args, monkeypatch, "0", threads=64)
    assert got.code == want.code == 700
    assert str(got) == str(want)
    assert "ld.shared.u32" in str(got)


_CACHE_RUN = """
import json, sys
import numpy as np
from ptxdev import Device, Ptr
from crane.backends.sim.ptx import jit, load_ptx
import test_jit as T
jit.COMPILE_MIN_LANES = 1
dev = Device()
out = dev.zeros(300, np.uint32)
dev.launch(load_ptx(T.STORE), "t", 1, 300, [Ptr(out), np.uint32(0)])
ok = bool(np.array_equal(dev.download(out, 300, np.uint32), np.arange(300) * 3))
st = jit.stats()
print(json.dumps({"ok": ok, "compiled": len(st["compiled"]), "loaded": len(st["loaded"])}))
"""


def _cache_run(tmp_path) -> dict:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = dict(os.environ, CRANE_PTX_JIT="1", CRANE_PTX_JIT_CACHE=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([str(here), str(here.parent.parent)])
    r = subprocess.run(
        [sys.executable, "-c", _CACHE_RUN], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_disk_cache_across_processes(tmp_path):
    """A second process loads the kernel's machine code from the disk cache instead of
    compiling it, and runs it right; a damaged entry is compiled again."""
    assert _cache_run(tmp_path) == {"ok": True, "compiled": 1, "loaded": 0}
    objs = list(tmp_path.glob("*.o"))
    assert len(objs) == 1 and len(list(tmp_path.glob("*.json"))) == 1
    assert _cache_run(tmp_path) == {"ok": True, "compiled": 0, "loaded": 1}
    objs[0].write_bytes(objs[0].read_bytes()[:100])  # truncated: its size no longer matches
    assert _cache_run(tmp_path) == {"ok": True, "compiled": 1, "loaded": 0}
    assert _cache_run(tmp_path) == {"ok": True, "compiled": 0, "loaded": 1}


#: every lane loops around a barrier forever: both regions are vectorizable
BARRIER_LOOP = (
    HEAD
    + """
.visible .entry t(.param .u64 out, .param .u32 once)
{
    .reg .b32 %r<2>;
    .reg .pred %p<2>;
    ld.param.u32 %r1, [once];
    setp.ne.u32 %p1, %r1, 0;
$L_top:
    bar.sync 0;
    @%p1 bra $L_done;
    bra.uni $L_top;
$L_done:
    ret;
}
"""
)


def test_deadline_ends_a_loop_around_barriers(dev, monkeypatch):
    """A loop whose only way back is through barriers, all its regions vectorized: the
    rounds notice the deadline (the scalar round's branch back reports it). A first launch
    that leaves the loop at once pays the compile, which the deadline must not include
    (under load the compile alone outran the bound)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    prog = load_ptx(BARRIER_LOOP)
    out = Ptr(dev.zeros(1, np.uint32))
    dev.launch(prog, "t", 2, 64, [out, np.uint32(1)])
    t = time.monotonic()
    with pytest.raises(KernelFault) as e:
        dev.launch(prog, "t", 2, 64, [out, np.uint32(0)], deadline=t + 0.3)
    assert e.value.code == 702
    assert "bra.uni" in str(e.value)
    assert time.monotonic() - t < 2.0


#: %r5 is defined only by lanes with tid.x odd (it does not dominate the barrier: the others
#: keep 0), %r6 on every path before it (computed again after the barrier, not saved)
COND_DEF = (
    HEAD
    + """
.visible .entry t(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .reg .pred %p<2>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    and.b32 %r2, %r1, 1;
    setp.eq.u32 %p1, %r2, 0;
    @%p1 bra $L_skip;
    add.s32 %r5, %r1, 100;
$L_skip:
    shl.b32 %r6, %r1, 1;
    bar.sync 0;
    add.s32 %r7, %r5, %r6;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r7;
    ret;
}
"""
)


def test_registers_computed_again_after_a_barrier(dev, monkeypatch):
    """Only registers whose one definition every lane ran before the barrier are computed
    again instead of saved; a conditionally defined one keeps each lane's own value."""
    from crane.backends.sim.ptx.jit.lower import rematerializable
    from crane.backends.sim.ptx.parser import parse_module

    fn = parse_module(COND_DEF).functions["t"]
    remat, prefix = rematerializable(fn.body)
    names = [ins.text.split()[1].rstrip(",") for ins, _ in prefix]
    assert "%r6" in names and "%r1" in names and "%r5" not in names
    assert len(remat) == len(prefix)
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    out = dev.zeros(64, np.uint32)
    dev.launch(load_ptx(COND_DEF), "t", 1, 64, [Ptr(out)])
    t = np.arange(64, dtype=np.uint32)
    want = np.where(t % 2 == 1, t + 100, 0) + 2 * t
    assert np.array_equal(dev.download(out, 64, np.uint32), want)


def test_without_llvmlite_every_kernel_runs_interpreted() -> None:
    """llvmlite is the optional ``sim`` extra: a host without it runs kernels interpreted,
    saying so once, rather than failing to import the simulator."""
    import subprocess
    import sys

    code = (
        "import sys, logging; sys.modules['llvmlite'] = None; logging.basicConfig(level=20)\n"
        "from crane.backends.sim.ptx import jit\n"
        "assert jit.mode() == 'off' and jit.mode() == 'off'\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
    assert r.stderr.count("PTX kernels run interpreted: llvmlite is not installed") == 1


_LAZY_LLVM_RUN = """
import sys
import numpy as np
from ptxdev import Device, Ptr
from crane.backends.sim.ptx import load_ptx
import test_jit as T
dev = Device()
prog = load_ptx(T.STORE)
out = dev.zeros(64, np.uint32)
dev.launch(prog, "t", 1, 64, [Ptr(out), np.uint32(0)])
assert "llvmlite" not in sys.modules, "LLVM loaded before any compile"
dev.launch(prog, "t", 1, 64, [Ptr(out), np.uint32(0)])
dev.launch(prog, "t", 1, 64, [Ptr(out), np.uint32(0)])
assert "llvmlite.binding" in sys.modules, "the third launch compiled nothing"
assert np.array_equal(dev.download(out, 64, np.uint32), np.arange(64) * 3)
print("ok")
"""


def test_llvm_is_loaded_only_when_a_kernel_is_compiled() -> None:
    """A module loaded and a small kernel launched once (interpreted: not yet worth a compile)
    leave LLVM unloaded (it adds ~44 MB to a worker that may never compile); the compile
    that the third launch brings loads it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = dict(os.environ, CRANE_PTX_JIT="1", CRANE_PTX_JIT_CACHE="")
    env["PYTHONPATH"] = os.pathsep.join([str(here), str(here.parent.parent)])
    r = subprocess.run(
        [sys.executable, "-c", _LAZY_LLVM_RUN], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


#: nvcc's local frame: each thread fills a local array a[i] = tid + i (through .local
#: addresses), crosses a barrier, then reads a[idx] back through the generic address
#: (cvta.local) and stores it to out[tid]; idx out of the frame faults in the local window
LOCAL = (
    HEAD
    + """
.visible .entry t(.param .u64 out, .param .u32 idx)
{
    .local .align 4 .b8 __local_depot0[32];
    .reg .b64 %SP;
    .reg .b64 %SPL;
    .reg .pred %p<2>;
    .reg .b32 %r<10>;
    .reg .b64 %rd<10>;
    mov.u64 %SPL, __local_depot0;
    cvta.local.u64 %SP, %SPL;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [idx];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, 0;
$L_fill:
    add.s32 %r4, %r2, %r3;
    mul.wide.u32 %rd2, %r3, 4;
    add.s64 %rd3, %SPL, %rd2;
    st.local.u32 [%rd3], %r4;
    add.s32 %r3, %r3, 1;
    setp.lt.u32 %p1, %r3, 8;
    @%p1 bra $L_fill;
    bar.sync 0;
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd5, %SP, %rd4;
    ld.u32 %r5, [%rd5];
    mul.wide.u32 %rd6, %r2, 4;
    add.s64 %rd7, %rd1, %rd6;
    st.global.u32 [%rd7], %r5;
    ret;
}
"""
)


@pytest.mark.parametrize("idx", [0, 5, 7])
def test_local_frame_compiled(dev, monkeypatch, idx):
    """A kernel with a __local_depot frame compiles (not refused) and each lane sees its own
    area, kept across a barrier: the interpreter's result."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(LOCAL + f"\n// local {idx}\n")
    out = dev.zeros(70, np.uint32)
    dev.launch(prog, "t", 1, 70, [Ptr(out), np.uint32(idx)])
    assert np.array_equal(dev.download(out, 70, np.uint32), np.arange(70) + idx)
    assert "t" in _compiled_names()


@pytest.mark.parametrize("idx", [8, 100, 1 << 20])
def test_local_fault_same_as_interpreter(dev, monkeypatch, idx):
    """Past the lane's local stride (32 bytes): the interpreter's illegal-address fault, same
    message, same instruction and PTX line (idx 8 is the first word past the frame)."""
    prog = load_ptx(LOCAL)
    out = dev.zeros(4, np.uint32)
    args = [Ptr(out), np.uint32(idx)]
    got = _fault(dev, prog, args, monkeypatch, "1", threads=4)
    want = _fault(dev, prog, args, monkeypatch, "0", threads=4)
    assert got.code == want.code == 700
    assert str(got) == str(want)
    assert "ld.u32" in str(got) and "PTX line 31" in str(got)
    assert "local" in str(got)


#: every thread: a ticket from atom.add on cnt[0] (stored to tickets[gid]), then updates of
#: every kind on words of ``w`` (global) and of a shared array copied out by thread 0; the
#: address of the ticket counter is cnt + off (off out of bounds faults)
ATOMS = (
    HEAD
    + """
.visible .entry t(.param .u64 cnt, .param .u64 tickets, .param .u64 w, .param .u64 f,
                  .param .u64 sh_out, .param .u64 off)
{
    .shared .align 8 .b8 sh[32];
    .reg .pred %p<2>;
    .reg .b32 %r<20>;
    .reg .f32 %f<4>;
    .reg .f64 %fd<4>;
    .reg .b64 %rd<20>;
    ld.param.u64 %rd1, [cnt];
    ld.param.u64 %rd2, [tickets];
    ld.param.u64 %rd3, [w];
    ld.param.u64 %rd4, [f];
    ld.param.u64 %rd5, [sh_out];
    ld.param.u64 %rd6, [off];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.s32 %r4, %r2, %r3, %r1;
    add.s64 %rd7, %rd1, %rd6;
    atom.global.add.u32 %r5, [%rd7], 1;
    mul.wide.u32 %rd8, %r4, 4;
    add.s64 %rd9, %rd2, %rd8;
    st.global.u32 [%rd9], %r5;
    red.global.add.u32 [%rd3], %r4;
    atom.global.min.s32 %r6, [%rd3+4], %r4;
    atom.global.max.u32 %r6, [%rd3+8], %r4;
    atom.global.inc.u32 %r6, [%rd3+12], 5;
    atom.global.dec.u32 %r6, [%rd3+16], 7;
    atom.global.and.b32 %r6, [%rd3+20], %r4;
    atom.global.or.b32 %r6, [%rd3+24], %r4;
    atom.global.xor.b32 %r6, [%rd3+28], %r4;
    atom.global.exch.b32 %r6, [%rd3+32], %r4;
    add.s32 %r7, %r6, 1;
    atom.global.cas.b32 %r8, [%rd3+36], %r4, %r7;
    cvt.u64.u32 %rd10, %r4;
    atom.global.add.u64 %rd11, [%rd3+40], %rd10;
    atom.global.max.s64 %rd11, [%rd3+48], %rd10;
    cvt.rn.f32.u32 %f1, %r4;
    mul.f32 %f2, %f1, 0f3DCCCCCD;
    atom.global.add.f32 %f3, [%rd4], %f2;
    red.global.add.f32 [%rd4+4], 0f00400000;
    cvt.rn.f64.u32 %fd1, %r4;
    atom.global.add.f64 %fd2, [%rd4+8], %fd1;
    mov.u32 %r9, sh;
    and.b32 %r10, %r1, 3;
    shl.b32 %r11, %r10, 2;
    add.s32 %r12, %r9, %r11;
    atom.shared.add.u32 %r13, [%r12], %r1;
    atom.shared.max.s32 %r13, [%r9+16], %r1;
    bar.sync 0;
    setp.ne.s32 %p1, %r1, 0;
    @%p1 bra $L_done;
    ld.shared.v4.u32 {%r14, %r15, %r16, %r17}, [%r9];
    mul.wide.u32 %rd13, %r2, 20;
    add.s64 %rd14, %rd5, %rd13;
    st.global.u32 [%rd14], %r14;
    st.global.u32 [%rd14+4], %r15;
    st.global.u32 [%rd14+8], %r16;
    st.global.u32 [%rd14+12], %r17;
    ld.shared.u32 %r18, [%r9+16];
    st.global.u32 [%rd14+16], %r18;
$L_done:
    ret;
}
"""
)


def _atoms_args(dev, blocks: int, threads: int, off: int = 0):
    n = blocks * threads
    bufs = {
        "cnt": dev.zeros(1, np.uint32),
        "tickets": dev.zeros(n, np.uint32),
        "w": dev.zeros(14, np.uint32),
        "f": dev.zeros(4, np.float32),
        "sh": dev.zeros(5 * blocks, np.uint32),
    }
    args = [Ptr(bufs[k]) for k in ("cnt", "tickets", "w", "f", "sh")] + [np.uint64(off)]
    return bufs, args


@pytest.mark.parametrize("blocks,threads", [(1, 33), (3, 64)])
def test_atomics_compiled_same_as_interpreter(dev, monkeypatch, blocks, threads):
    """Every atomic operation on global and shared memory compiles (not refused) and gives
    the interpreter's bytes, returned old values (tickets, float sums) included: diff mode."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(ATOMS + f"\n// atoms {blocks} {threads}\n")
    bufs, args = _atoms_args(dev, blocks, threads)
    dev.launch(prog, "t", blocks, threads, args)
    n = blocks * threads
    assert "t" in _compiled_names()
    tickets = dev.download(bufs["tickets"], n, np.uint32)
    assert np.array_equal(tickets, np.arange(n))  # the lanes in order, as the interpreter's
    w = dev.download(bufs["w"], 14, np.uint32)
    assert w[0] == n * (n - 1) // 2 and w[2] == n - 1
    sh = dev.download(bufs["sh"], 5 * blocks, np.uint32).reshape(blocks, 5)
    lanes = np.arange(threads)
    assert [int(sh[0, i]) for i in range(4)] == [int(lanes[lanes % 4 == i].sum()) for i in range(4)]
    assert sh[0, 4] == threads - 1


def test_atomics_on_many_cores(dev, monkeypatch):
    """A launch big enough to run on several cores: the real atomics lose no update and hand
    out every ticket once."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    prog = load_ptx(ATOMS + "\n// atoms big\n")
    blocks, threads = 512, 256
    bufs, args = _atoms_args(dev, blocks, threads)
    dev.launch(prog, "t", blocks, threads, args)
    n = blocks * threads
    assert dev.download(bufs["cnt"], 1, np.uint32)[0] == n
    tickets = dev.download(bufs["tickets"], n, np.uint32)
    assert np.array_equal(np.sort(tickets), np.arange(n))
    w = dev.download(bufs["w"], 14, np.uint32)
    assert w[0] == (n * (n - 1) // 2) & 0xFFFFFFFF and w[1] == 0 and w[2] == n - 1
    assert int(w[10]) | int(w[11]) << 32 == n * (n - 1) // 2
    f = dev.download(bufs["f"], 4, np.float32)
    assert f[1] == 0.0  # subnormal increments flush to zero, as the interpreter's add.f32
    assert int(f[2:4].view(np.float64)[0]) == n * (n - 1) // 2


@pytest.mark.parametrize("off", [4, -8, 2])
def test_atomic_fault_same_as_interpreter(dev, monkeypatch, off):
    """An atomic outside its allocation (or misaligned): the interpreter's fault, message,
    instruction and PTX line."""
    prog = load_ptx(ATOMS)
    _, args = _atoms_args(dev, 1, 1, off & (2**64 - 1))
    got = _fault(dev, prog, args, monkeypatch, "1")
    want = _fault(dev, prog, args, monkeypatch, "0")
    assert got.code == want.code == (716 if off == 2 else 700)
    assert str(got) == str(want)
    assert "atom.global.add.u32" in str(got) and "PTX line 26" in str(got)


#: each thread: the bit instructions on (a, b, c) = (x[i], y[i], z[i]) with the field
#: positions and lengths taken from y and z unmasked (so 0, widths and >= 256 all occur),
#: one result word per instruction form in out[16 * i ...]
BITS = (
    HEAD
    + """
.visible .entry t(.param .u64 x, .param .u64 y, .param .u64 z, .param .u64 out)
{
    .reg .b32 %r<40>;
    .reg .b64 %rd<40>;
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    ld.param.u64 %rd3, [z];
    ld.param.u64 %rd4, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd6, %rd1, %rd5;
    ld.global.u32 %r2, [%rd6];
    add.s64 %rd7, %rd2, %rd5;
    ld.global.u32 %r3, [%rd7];
    add.s64 %rd8, %rd3, %rd5;
    ld.global.u32 %r4, [%rd8];
    mov.b64 %rd9, {%r2, %r3};
    mul.wide.u32 %rd10, %r1, 80;
    add.s64 %rd11, %rd4, %rd10;
    popc.b64 %r5, %rd9;
    clz.b32 %r6, %r2;
    bfind.s32 %r7, %r2;
    bfind.shiftamt.u64 %r8, %rd9;
    bfe.u32 %r9, %r2, %r3, %r4;
    bfe.s32 %r10, %r2, %r3, %r4;
    bfe.s64 %rd12, %rd9, %r3, %r4;
    cvt.u32.u64 %r11, %rd12;
    bfi.b32 %r12, %r2, %r4, %r3, %r4;
    bfi.b64 %rd13, %rd9, %rd9, %r4, %r3;
    cvt.u32.u64 %r13, %rd13;
    prmt.b32 %r14, %r2, %r3, %r4;
    prmt.b32.b4e %r15, %r2, %r3, %r4;
    prmt.b32.rc16 %r16, %r2, %r3, %r4;
    lop3.b32 %r17, %r2, %r3, %r4, 0xe8;
    shf.l.wrap.b32 %r18, %r2, %r3, %r4;
    shf.r.clamp.b32 %r19, %r2, %r3, %r4;
    brev.b64 %rd14, %rd9;
    cvt.u32.u64 %r20, %rd14;
    sad.s32 %r21, %r2, %r3, %r4;
    dp4a.s32.u32 %r22, %r2, %r3, %r4;
    dp2a.hi.u32.s32 %r23, %r2, %r3, %r4;
    bmsk.clamp.b32 %r24, %r3, %r4;
    bmsk.wrap.b32 %r25, %r4, %r3;
    szext.clamp.s32 %r26, %r2, %r3;
    szext.wrap.u32 %r27, %r2, %r4;
    nanosleep.u32 %r3;
    st.global.v4.u32 [%rd11], {%r5, %r6, %r7, %r8};
    st.global.v4.u32 [%rd11+16], {%r9, %r10, %r11, %r12};
    st.global.v4.u32 [%rd11+32], {%r13, %r14, %r15, %r16};
    st.global.v4.u32 [%rd11+48], {%r17, %r18, %r19, %r20};
    st.global.v4.u32 [%rd11+64], {%r24, %r25, %r26, %r27};
    ret;
}
"""
)


def test_bit_instructions_compiled_same_as_interpreter(dev, monkeypatch):
    """popc, clz, bfind, bfe, bfi, prmt (default and modes), lop3, shf, brev, sad, dp4a, dp2a,
    bmsk, szext (and nanosleep) compile (not refused) and give the interpreter's bits on
    edge-case fields: diff mode."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    rng = np.random.default_rng(7)
    n = 256
    edge = np.array([0, 1, 7, 8, 31, 32, 33, 63, 64, 65, 255, 256, 257, 0xFFFFFFFF], np.uint32)
    x = rng.integers(0, 2**32, n, dtype=np.uint32)
    x[:4] = [0, 0xFFFFFFFF, 0x80000000, 1]
    y = np.concatenate([np.repeat(edge, 14)[: n // 2], rng.integers(0, 300, n // 2)]).astype(
        np.uint32
    )
    z = np.concatenate([np.tile(edge, 14)[: n // 2], rng.integers(0, 2**32, n // 2)]).astype(
        np.uint32
    )
    bufs = [dev.upload(v) for v in (x, y, z)]
    out = dev.zeros(20 * n, np.uint32)
    prog = load_ptx(BITS)
    dev.launch(prog, "t", 1, n, [*(Ptr(b) for b in bufs), Ptr(out)])
    assert "t" in _compiled_names()
    got = dev.download(out, 20 * n, np.uint32).reshape(n, 20)
    assert got[0, 1] == 32 and got[1, 2] == 0xFFFFFFFF  # clz(0); bfind.s32(-1): no clear bit
    assert got[2, 0] == bin(int(y[2]) << 32 | 0x80000000).count("1")


#: thread i converts x[i] (u64 bits) in every directed mode: as s64, u64 and s32 to f32, as
#: s64 to f64, and as an f64 to f32; 8 result words per thread
CVT = (
    HEAD
    + """
.visible .entry t(.param .u64 x, .param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .f32 %f<16>;
    .reg .f64 %fd<8>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 8;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.u64 %rd5, [%rd4];
    cvt.u32.u64 %r2, %rd5;
    mov.b64 %fd1, %rd5;
    mul.wide.u32 %rd6, %r1, 48;
    add.s64 %rd7, %rd2, %rd6;
    cvt.rz.f32.s64 %f1, %rd5;
    cvt.rm.f32.u64 %f2, %rd5;
    cvt.rp.f32.s32 %f3, %r2;
    cvt.rz.f32.f64 %f4, %fd1;
    cvt.rm.f32.f64 %f5, %fd1;
    cvt.rp.f32.f64 %f6, %fd1;
    cvt.rm.f32.s64 %f7, %rd5;
    cvt.rp.f32.u64 %f8, %rd5;
    st.global.v4.f32 [%rd7], {%f1, %f2, %f3, %f4};
    st.global.v4.f32 [%rd7+16], {%f5, %f6, %f7, %f8};
    cvt.rz.f64.s64 %fd2, %rd5;
    cvt.rp.f64.u64 %fd3, %rd5;
    st.global.v2.f64 [%rd7+32], {%fd2, %fd3};
    ret;
}
"""
)


def test_directed_cvt_compiled_same_as_interpreter(dev, monkeypatch):
    """Integer → float and float64 → float32 conversions with .rz/.rm/.rp compile (not
    refused) and round as the interpreter on edge values: ties, 2^63 and 2^64 neighbours,
    negative values, float32 overflow, subnormals, infinities and NaN (diff mode)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    ints = [0, 1, -1, (1 << 24) + 1, -((1 << 24) + 1), (1 << 63) - 1, -(1 << 63), 2**64 - 1]
    ints += [(1 << 53) + 1, (1 << 31) - 1, -(1 << 31), 0x7FFFFFC0_00000001, 12345678901]
    floats = [3.4028235e38 * 1.5, -3.4028235e38 * 1.5, 1e-40, -1e-40, 1e-50, -1e-50]
    floats += [float("inf"), float("-inf"), float("nan"), 1.0 + 2.0**-30, -(1.0 + 2.0**-30)]
    floats += [3.4028235677973366e38, 0.1, -0.1, 0.0, -0.0]
    vals = np.array([v & (2**64 - 1) for v in ints], np.uint64)
    vals = np.concatenate([vals, np.array(floats, np.float64).view(np.uint64)])
    rng = np.random.default_rng(3)
    vals = np.concatenate([vals, rng.integers(0, 2**63, 64, dtype=np.uint64) << np.uint64(1)])
    n = vals.size
    x = dev.upload(vals)
    out = dev.zeros(12 * n, np.uint32)
    dev.launch(load_ptx(CVT), "t", 1, n, [Ptr(x), Ptr(out)])
    assert "t" in _compiled_names()
    got = dev.download(out, 12 * n, np.uint32).reshape(n, 12)
    assert got[3, 0].view(np.float32) == np.float32(1 << 24)  # 2^24 + 1 toward zero
    assert got[3, 7].view(np.float32) == np.float32((1 << 24) + 2)  # and up


#: nvcc's double-halves idiom: unpack an f64 into {lo, _} and {_, hi}, four 16-bit parts of
#: the u64 (a sink among them), and pack them back in another order
PACK = (
    HEAD
    + """
.visible .entry t(.param .u64 x, .param .u64 out)
{
    .reg .b16 %rs<6>;
    .reg .b32 %r<6>;
    .reg .f64 %fd<4>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 8;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.f64 %fd1, [%rd4];
    mov.b64 {%r2, _}, %fd1;
    mov.b64 {_, %r3}, %fd1;
    mov.b64 {%rs1, %rs2, _, %rs4}, %fd1;
    mov.b64 %rd5, {%r3, %r2};
    mov.b64 %rd6, {%rs4, %rs1, %rs2, %rs4};
    mov.b32 %r4, {%rs2, %rs1};
    mul.wide.u32 %rd7, %r1, 24;
    add.s64 %rd8, %rd2, %rd7;
    st.global.u64 [%rd8], %rd5;
    st.global.u64 [%rd8+8], %rd6;
    st.global.u32 [%rd8+16], %r4;
    ret;
}
"""
)


def test_pack_unpack_compiled(dev, monkeypatch):
    """mov pack/unpack forms, with ``_`` sinks, compile (not refused) and move the
    interpreter's bits (diff mode)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    vals = np.array([0x0123456789ABCDEF, 0xFFFF0000FFFF0000, 1], np.uint64)
    out = dev.zeros(6 * vals.size, np.uint32)
    dev.launch(load_ptx(PACK), "t", 1, vals.size, [Ptr(dev.upload(vals)), Ptr(out)])
    assert "t" in _compiled_names()
    got = dev.download(out, 6 * vals.size, np.uint32).reshape(vals.size, 6)
    assert int(got[0, 0]) | int(got[0, 1]) << 32 == 0x89ABCDEF01234567
    assert int(got[0, 2]) | int(got[0, 3]) << 32 == 0x0123_89AB_CDEF_0123
    assert got[0, 4] == 0xCDEF89AB


#: an array passed by value, indexed per lane: out[tid] = a[tid + idx] through the parameter's
#: .param address and again through its generic address (cvta.param); with ``poke`` set, a
#: generic store into the parameters (read-only: a fault)
PARAMS = (
    HEAD
    + """
.visible .entry t(.param .align 4 .b8 a[64], .param .u64 out, .param .u32 idx,
                  .param .u32 poke)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [idx];
    ld.param.u32 %r7, [poke];
    mov.u32 %r2, %tid.x;
    add.s32 %r3, %r2, %r1;
    mul.wide.u32 %rd2, %r3, 4;
    mov.u64 %rd3, a;
    add.s64 %rd4, %rd3, %rd2;
    ld.param.u32 %r4, [%rd4];
    cvta.param.u64 %rd5, %rd3;
    add.s64 %rd6, %rd5, %rd2;
    ld.u32 %r5, [%rd6];
    add.s32 %r6, %r4, %r5;
    mul.wide.u32 %rd7, %r2, 4;
    add.s64 %rd8, %rd1, %rd7;
    st.global.u32 [%rd8], %r6;
    setp.ne.s32 %p1, %r7, 0;
    @%p1 st.u32 [%rd6], %r6;
    ret;
}
"""
)


def _params_args(out, idx: int, poke: int = 0) -> list:
    return [np.arange(16, dtype=np.uint32) * 10, Ptr(out), np.uint32(idx), np.uint32(poke)]


def test_param_array_indexed_compiled(dev, monkeypatch):
    """ld.param through a register and a generic load in the param window compile (not
    refused) and read the launch's parameters (diff mode)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    out = dev.zeros(12, np.uint32)
    dev.launch(load_ptx(PARAMS + "\n// params ok\n"), "t", 1, 12, _params_args(out, 4))
    assert "t" in _compiled_names()
    assert np.array_equal(dev.download(out, 12, np.uint32), (np.arange(12) + 4) * 20)


@pytest.mark.parametrize("idx,poke", [(20, 0), (0xFFFFFFF0, 0), (0, 1)])
def test_param_fault_same_as_interpreter(dev, monkeypatch, idx, poke):
    """Past the parameters, before them, or a store into them: the interpreter's fault,
    message and PTX line."""
    prog = load_ptx(PARAMS)
    out = dev.zeros(4, np.uint32)
    got = _fault(dev, prog, _params_args(out, idx, poke), monkeypatch, "1")
    want = _fault(dev, prog, _params_args(out, idx, poke), monkeypatch, "0")
    assert got.code == want.code == 700
    assert str(got) == str(want)
    assert ".param offset" in str(got)


def test_local_frames_on_many_cores(dev, monkeypatch):
    """A grid big enough for several cores: each core's blocks get their own local areas,
    zeroed per block, and every lane reads back what it wrote."""
    monkeypatch.setenv("CRANE_PTX_JIT", "1")
    gid = "mov.u32 %r6, %ctaid.x;\n    mov.u32 %r7, %ntid.x;\n    mov.u32 %r8, %tid.x;\n"
    gid += "    mad.lo.s32 %r2, %r6, %r7, %r8;"  # the lanes' values: their global index + i
    prog = load_ptx(LOCAL.replace("mov.u32 %r2, %tid.x;", gid))
    blocks, threads = 256, 256
    n = blocks * threads
    out = dev.zeros(n, np.uint32)
    dev.launch(prog, "t", blocks, threads, [Ptr(out), np.uint32(3)])
    assert "t" in _compiled_names()
    assert np.array_equal(dev.download(out, n, np.uint32), np.arange(n) + 3)


def test_misaligned_local_same_as_interpreter(dev, monkeypatch):
    """A 4-byte local access at an odd offset: CUDA_ERROR_MISALIGNED_ADDRESS, as interpreted."""
    prog = load_ptx(LOCAL.replace("mul.wide.u32 %rd4, %r1, 4;", "mul.wide.u32 %rd4, %r1, 1;"))
    out = dev.zeros(4, np.uint32)
    args = [Ptr(out), np.uint32(1)]
    got = _fault(dev, prog, args, monkeypatch, "1", threads=2)
    want = _fault(dev, prog, args, monkeypatch, "0", threads=2)
    assert got.code == want.code == 716
    assert str(got) == str(want)


#: CUB's inline-PTX idiom: registers declared in a block under plain names (no ``%``)
NAMED_REGS = (
    HEAD
    + """
.visible .entry t(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    cvt.u64.u32 %rd2, %r1;
    shl.b64 %rd3, %rd2, 32;
    or.b64 %rd4, %rd3, 7;
    {
    .reg .b32 lo, hi;
    mov.b64 {lo, hi}, %rd4;
    add.u32 %r2, lo, hi;
    }
    mul.wide.u32 %rd5, %r1, 4;
    add.s64 %rd5, %rd1, %rd5;
    st.global.u32 [%rd5], %r2;
    ret;
}
"""
)


def test_registers_named_without_percent_compile(dev, monkeypatch):
    """``mov.b64 {lo, hi}`` on block-scoped plain names (CUB's exclusive-sum kernel) compiles
    and gives the interpreter's result (diff mode compares both)."""
    monkeypatch.setenv("CRANE_PTX_JIT", "diff")
    prog = load_ptx(NAMED_REGS)
    out = dev.zeros(64, np.uint32)
    dev.launch(prog, "t", 1, 64, [Ptr(out)])
    assert dev.download(out, 64, np.uint32).tolist() == [7 + i for i in range(64)]
    assert "t" in _compiled_names()


def test_the_ptx_suite_runs_differentially(ptx_jit_at_start):
    """conftest.py's fixture puts these modules (and only these) in diff mode, unless the run
    chose a mode itself."""
    if ptx_jit_at_start is None:
        assert jit.mode() == "diff"
