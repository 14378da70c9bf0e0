"""Memory ordering in compiled kernels: ``.volatile``/``.relaxed``/``.acquire``/``.release``
loads and stores, ``fence`` and ``membar``.

Why atomics: the runner runs ranges of blocks on several cores at once, and a block may wait
for another block's store (CUB's decoupled look-back: a block publishes its counts with
``st.volatile.global``, the next blocks spin on ``ld.volatile.global`` until they appear). A
plain LLVM load in such a loop may be hoisted out of it (the loop then never ends) and a plain
store may be delayed or merged. So these accesses become LLVM atomic loads and stores on the
same checked address (the same bounds checks and faults as plain ones): ``monotonic`` for
``.volatile`` (which the PTX ISA treats as ``.relaxed.sys`` from sm_70 on) and ``.relaxed``,
``acquire`` and ``release`` as named; a vector access is one atomic access per element.
``fence.sc``/``membar`` become sequentially consistent fences, ``fence.acq_rel`` an
acquire-release one; other fence forms (proxy fences, ``mbarrier_init``) are not taken.

``.volatile`` on shared memory, and on a generic address (which may point into it), is legacy
warp-synchronous code (the ``if (tid < 32) { vs[tid] += vs[tid + 32]; ...}`` tail of a
reduction on a ``volatile`` shared array, with no ``__syncwarp``), which relies on a warp's
lanes running in lockstep: :mod:`.lockstep` puts a warp-level stop before each such access, and
only an access behind one is taken. ``.relaxed``/``.acquire``/``.release`` on shared memory are
the memory model's own accesses, written for independently scheduled threads, and are taken
without. ``.mmio`` is refused.

A loop that waits on one of these loads (its branch depends on the loaded value) would hang the
compiled schedule when the value comes from a later lane of the same block: see :mod:`.spin`,
which makes the branch back of such a loop a yield point.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..parser import Instr

if TYPE_CHECKING:
    from .lower import KernelLowering

__all__ = ["ORDER_HANDLERS", "ORDER_MODS", "access_ordering", "is_ordered", "waitable_load"]

#: the qualifiers through which threads order their accesses to each other's
ORDER_MODS = frozenset({"volatile", "relaxed", "acquire", "release"})


def access_ordering(k: KernelLowering, mods, space: str, store: bool) -> str | None:
    """The LLVM ordering of an ld/st with modifiers ``mods`` in ``space``, None for a plain
    access (also for ``.local`` and ``.param``, which only the lane itself sees); raises the
    refusal for the forms not taken (see the module)."""
    if "mmio" in mods:
        raise k.refuse(".mmio access")
    if "volatile" in mods:
        if space in ("shared", "generic") and id(k.ins) not in k.lockstepped:
            raise k.refuse(f".volatile {space} access (warp-synchronous code needs lockstep lanes)")
        order = "monotonic"
    elif "acquire" in mods:
        if store:
            raise k.refuse("st.acquire")
        order = "acquire"
    elif "release" in mods:
        if not store:
            raise k.refuse("ld.release")
        order = "release"
    elif "relaxed" in mods:
        order = "monotonic"
    else:
        return None
    return None if space in ("local", "param") else order


def is_ordered(ins) -> bool:
    """Whether ``ins`` is an ordered ld/st or a fence: code the two-pass vectorizable form (which
    defers a lane's stores and predicates its loads) must not take."""
    if not isinstance(ins, Instr):
        return False
    parts = ins.opcode.split(".")
    if parts[0] in ("fence", "membar"):
        return True
    return parts[0] in ("ld", "st") and bool(ORDER_MODS.intersection(parts[1:]))


def waitable_load(ins) -> bool:
    """A load another thread's store may change while this one waits on it: ``ld`` with
    ``.volatile``/``.relaxed``/``.acquire`` (a loop branching on its value is a spin-wait)."""
    if not isinstance(ins, Instr):
        return False
    parts = ins.opcode.split(".")
    return parts[0] == "ld" and bool({"volatile", "relaxed", "acquire"}.intersection(parts[1:]))


def _h_fence(k: KernelLowering, types, mods, ops) -> None:
    scopes = [m for m in mods if m in ("cta", "gpu", "sys", "gl", "cluster")]
    sem = [m for m in mods if m not in scopes]
    if types or ops or len(scopes) > 1:
        raise k.refuse("fence form")
    op = k.ins.opcode.split(".")[0]
    if (op == "membar" and not sem) or (op == "fence" and sem in (["sc"], [])):
        order = "seq_cst"
    elif op == "fence" and sem == ["acq_rel"]:
        order = "acq_rel"
    else:
        raise k.refuse("fence form")
    k.b.fence(order)


ORDER_HANDLERS = {"fence": _h_fence, "membar": _h_fence}
