"""``atom`` and ``red`` in compiled kernels: real atomic instructions on the checked address.

Why real atomics: the runner runs ranges of blocks on several cores at once, and CUDA lets
blocks meet through atomics on global memory (counters, tickets, reductions). Each update is
one LLVM ``atomicrmw`` (``uinc_wrap``/``udec_wrap`` are exactly PTX's ``inc``/``dec``;
``fadd`` is IEEE addition, as NumPy's float64 add) or, where the interpreter rounds in its own
way, a ``cmpxchg`` loop: ``add.f32`` flushes subnormal operands and results to zero
(:func:`..fp.ftz`), so the new value is computed from the loaded old one and swapped in.
Half-precision ``add`` (``.f16``, ``.bf16`` and their pairs: ``atomicAdd`` on ``__half`` and
``__half2``, which PyTorch's and CuPy's scatter-adds use) goes the same way, each half
rounded once as the interpreter rounds it.

Semantics are the interpreter's (:mod:`..atomics`, :func:`..ops_mem._dec_atomic`): integer
``add`` wraps, ``min``/``max`` compare as the type's signedness (``b`` types as unsigned),
``cas`` stores ``c`` where the old value equals ``b``, ``exch`` returns the old bits (also on
16-bit words: how sm_80 code emulates a bfloat16 ``atomicAdd``). Not taken
(the kernel runs interpreted): vector atomics, half-precision operations other than ``add``,
float ``min``/``max`` (NumPy's NaN and signed-zero rules). An acquire/release ordering makes
the update sequentially consistent; a block waiting on another's release waits in an ordered
load's loop, which yields (:mod:`.spin`; in a cooperative launch, :mod:`.coop`, by
suspending the block).

The returned old values depend on the order the lanes update in. The compiled lanes of a block
run one after the other in linear thread order, as the interpreter serializes the lanes of one
instruction; ``diff`` mode runs such kernels on one core, so the
differential test sees the interpreter's order whenever all lanes reach the atomic together
(:func:`crane.backends.sim.ptx.jit.orders_matter`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..parser import Instr
from ..ptxtypes import TYPES
from .irtypes import F32, I32, vty
from .ops_half import half_add_bits, host_converts_halves
from .ops_sfu import ftz32

if TYPE_CHECKING:
    from ..ptxtypes import PtxType
    from .lower import KernelLowering

__all__ = ["ATOMIC_HANDLERS", "is_atomic"]

_OPS = ("and", "or", "xor", "cas", "exch", "add", "inc", "dec", "min", "max")
#: PTX op -> atomicrmw operation, for integer types (min/max: signed, unsigned)
_RMW = {"add": "add", "and": "and", "or": "or", "xor": "xor", "exch": "xchg"}
_SPACES = ("global", "shared")
#: half-precision kinds (``.f16``, ``.f16x2``, ``.bf16``, ``.bf16x2``): only ``add`` takes them
_HALVES = ("h", "h2", "bh", "bh2")
#: orderings an atomic may carry: it is then sequentially consistent (global atomics are so
#: anyway), stronger than each; a loop that waits on its result stays refused (:mod:`.spin`)
_ORDERS = ("acquire", "release", "acq_rel")


def is_atomic(ins) -> bool:
    return isinstance(ins, Instr) and ins.opcode.split(".")[0] in ("atom", "red")


def _h_atomic(has_dst: bool):
    def h(k: KernelLowering, types, mods, ops) -> None:
        b = k.b
        op = [m for m in mods if m in _OPS]
        spaces = [m for m in mods if m in ("global", "shared", "local", "param", "const")]
        ordered = [m for m in mods if m in _ORDERS]
        k.only(mods, (*op, *spaces, *ordered, "noftz"))
        if len(op) != 1 or len(spaces) > 1 or (spaces and spaces[0] not in _SPACES):
            raise k.refuse("atomic form")
        op = op[0]
        if len(types) != 1:
            raise k.refuse("expected one type")
        t = types[0]
        if t.kind in _HALVES:
            _half_add(k, op, t, has_dst, spaces, ordered, ops)
            return
        wide = t.bits in (32, 64) or (t.bits == 16 and t.kind == "b" and op in ("cas", "exch"))
        if t.kind not in ("u", "s", "b", "f") or not wide:
            raise k.refuse(f"atomic on .{t.name}")
        if t.kind == "f" and op not in ("add", "exch"):
            raise k.refuse(f"atomic {op}.{t.name}")
        if op in ("inc", "dec") and t.name != "u32":
            raise k.refuse(f"atomic {op}.{t.name}")
        nsrc = 2 if op == "cas" else 1
        first = 1 if has_dst else 0
        if len(ops) != first + 1 + nsrc:
            raise k.refuse("operand count")
        kind, addr = k.address(ops[first], spaces[0] if spaces else "generic")
        if kind != "value":
            raise k.refuse("atomic on a kernel parameter")
        it = ir.IntType(t.bits)
        src = [_bits(k, o, t) for o in ops[first + 1 : first + 1 + nsrc]]
        p = k.mem_ptr(spaces[0] if spaces else "generic", addr, t.bits // 8, True)
        p = b.bitcast(p, it.as_pointer())
        order = "seq_cst" if spaces != ["shared"] or ordered else "monotonic"
        old = _update(k, op, t, p, src, order)
        if has_dst and not (ops[0][0] == "reg" and ops[0][1] == "_"):
            _put_bits(k, ops[0], t, old)

    return h


def _half_add(k: KernelLowering, op: str, t: PtxType, has_dst: bool, spaces, ordered, ops):
    """``atom``/``red`` ``.add.noftz`` on ``.f16``, ``.bf16`` and their pairs: a
    compare-and-swap loop on the 16- or 32-bit word whose new value is the half sum the
    interpreter computes (:func:`.ops_half.half_add_bits`: each half rounded once)."""
    if op != "add":
        raise k.refuse(f"atomic {op}.{t.name}")
    if t.kind in ("h", "h2") and not host_converts_halves():
        raise k.refuse("half atomics (the host CPU has no F16C)")
    first = 1 if has_dst else 0
    if len(ops) != first + 2:
        raise k.refuse("operand count")
    word = TYPES["b16"] if t.kind in ("h", "bh") else TYPES["b32"]
    b = k.b
    kind, addr = k.address(ops[first], spaces[0] if spaces else "generic")
    if kind != "value":
        raise k.refuse("atomic on a kernel parameter")
    v = k.get(ops[first + 1], word)
    it = ir.IntType(word.bits)
    p = k.mem_ptr(spaces[0] if spaces else "generic", addr, word.bits // 8, True)
    p = b.bitcast(p, it.as_pointer())
    order = "seq_cst" if spaces != ["shared"] or ordered else "monotonic"
    old = _cas_loop(k, p, v, order, lambda k, cur, x: half_add_bits(k, t.kind, cur, x))
    if has_dst and not (ops[0][0] == "reg" and ops[0][1] == "_"):
        k.put(ops[0], word, old)


def _bits(k: KernelLowering, op, t: PtxType):
    """A source operand as the integer bits of type ``t``."""
    v = k.get(op, t)
    return k.b.bitcast(v, ir.IntType(t.bits)) if t.kind == "f" else v


def _put_bits(k: KernelLowering, op, t: PtxType, old) -> None:
    k.put(op, t, k.b.bitcast(old, vty(t)) if t.kind == "f" else old)


def _update(k: KernelLowering, op: str, t: PtxType, p, src, order: str):
    """Emit the update; the old value (integer bits)."""
    b = k.b
    if op == "cas":
        pair = b.cmpxchg(p, src[0], src[1], order, "monotonic" if order != "seq_cst" else order)
        return b.extract_value(pair, 0)
    if op == "add" and t.kind == "f":
        if t.bits == 64:
            return _rmw(b, "fadd", p, b.bitcast(src[0], vty(t)), order, t)
        return _cas_loop(k, p, src[0], order, _add_f32_ftz)
    if op in _RMW:
        return _rmw(b, _RMW[op], p, src[0], order, t)
    if op in ("min", "max"):
        name = op if t.kind == "s" else "u" + op
        return _rmw(b, name, p, src[0], order, t)
    if op in ("inc", "dec"):
        return _rmw(b, "uinc_wrap" if op == "inc" else "udec_wrap", p, src[0], order, t)
    raise k.refuse(f"atomic {op}")


def _rmw(b: ir.IRBuilder, name: str, p, v, order: str, t: PtxType):
    if name == "fadd":
        fp = b.bitcast(p, v.type.as_pointer())
        old = b.atomic_rmw(name, fp, v, order)
        return b.bitcast(old, ir.IntType(t.bits))
    return b.atomic_rmw(name, p, v, order)


def _add_f32_ftz(k: KernelLowering, old_bits, v_bits):
    b = k.b
    a = ftz32(k, b.bitcast(old_bits, F32))
    c = ftz32(k, b.bitcast(v_bits, F32))
    return b.bitcast(ftz32(k, b.fadd(a, c)), I32)


def _cas_loop(k: KernelLowering, p, v, order: str, new_of):
    """``old = *p; do { new = new_of(old, v) } while (!cmpxchg(p, old, new))``; the old value."""
    b = k.b
    it = v.type
    init = b.load_atomic(p, "monotonic", it.width // 8)
    start = b.block
    loop = k.step.append_basic_block("atomic_retry")
    done = k.step.append_basic_block("atomic_done")
    b.branch(loop)
    b.position_at_end(loop)
    cur = b.phi(it)
    cur.add_incoming(init, start)
    new = new_of(k, cur, v)
    pair = b.cmpxchg(p, cur, new, order, "monotonic" if order != "seq_cst" else order)
    seen = b.extract_value(pair, 0)
    cur.add_incoming(seen, b.block)
    b.cbranch(b.extract_value(pair, 1), done, loop)
    b.position_at_end(done)
    return cur


ATOMIC_HANDLERS = {"atom": _h_atomic(True), "red": _h_atomic(False)}
