"""Which registers hold a value affine in %tid.x: the same base for a row of the block plus a
constant stride times the lane's x.

Why: a vectorized region (:mod:`.lower`) gets the registers live across a stop back from the
save area, one word per lane. An address register restored so (a grid-stride loop's
``&in[i]``, a tiled matmul's ``&A[row * n + t + tx]`` that advances per tile) is, to LLVM, an
arbitrary value per lane, and every load through it a gather. When this analysis predicts that
the register is ``base + stride * x`` (``stride`` 0: the same for every lane of a row, a loop
counter, a tile offset), the vector form restores it *as that expression*, with the base read
once per row from the row's first lane, so LLVM sees consecutive (or uniform) addresses and
makes vector loads of them. The prediction is a heuristic (it ignores control dependence, and
wrapping arithmetic): the restore compares the expression with the lane's saved word, and a
lane where they differ fails its check and runs the region again, scalar, as a lane outside its
cached allocation does. Correctness never rests on this module; speed does.

A forward data flow to a fixed point over every definition of each register: a register is
affine with stride ``c`` if all its definitions give stride ``c`` from their operands
(``%tid.x``: 1; other geometry registers, immediates, symbols, kernel parameters: 0; add/sub
add strides, multiplication and left shift by an immediate scale them, conversions keep them;
anything else of row-uniform operands is row-uniform); loads, other special registers and
guarded definitions under a predicate that is not row-uniform make it varying.
"""

from __future__ import annotations

from ..parser import Function, Instr
from .liveness import dest_src

__all__ = ["lane_strides"]

_VARYING = "varying"

#: geometry special registers the same for every lane of a row
_ROW_UNIFORM = frozenset(
    {"%tid.y", "%tid.z", "%ntid.x", "%ntid.y", "%ntid.z"}
    | {"%ctaid.x", "%ctaid.y", "%ctaid.z", "%nctaid.x", "%nctaid.y", "%nctaid.z"}
)

#: opcodes whose result follows the strides of their operands (see :func:`_transfer`)
_LINEAR = frozenset({"mov", "add", "sub", "mul", "mad", "shl", "cvt", "cvta", "neg"})


def lane_strides(fn: Function) -> dict[int, int]:
    """``{register uid: stride}`` for the registers of ``fn`` predicted affine in %tid.x (see
    the module); registers never written (always 0) are row-uniform."""
    code = [s for s in fn.body or [] if isinstance(s, Instr)]
    written: set[int] = set()
    val: dict[int, object] = {}  # uid -> stride, or _VARYING; absent: no definition seen yet
    for ins in code:
        dst = dest_src(ins)[0]
        written |= dst
        ops = ins.operands if isinstance(ins.operands, list) else []
        if dst and (len(dst) > 1 or ops[0][0] != "reg"):  # vector and pair destinations
            val.update(dict.fromkeys(dst, _VARYING))
    val.update({r.uid: 0 for r in fn.regs if r.uid not in written})
    changed = True
    while changed:
        changed = False
        for ins in code:
            dst = dest_src(ins)[0]
            if len(dst) != 1:
                continue
            (uid,) = dst
            ops = ins.operands
            got = _transfer(ins, ins.opcode.split(".")[0], ops, val)
            if got is not None and ins.guard is not None:
                g = _operand(("reg", ins.guard[0]), ins, val)
                got = None if g is None else (got if g == 0 else _VARYING)
            if got is None:
                continue
            old = val.get(uid)
            new = got if old is None or old == got else _VARYING
            if new != old:
                val[uid] = new
                changed = True
    return {uid: c for uid, c in val.items() if c != _VARYING}  # type: ignore[misc]


def _operand(o, ins: Instr, val: dict):
    """An operand's stride, ``_VARYING``, or None (a register with no definition seen yet)."""
    kind = o[0] if isinstance(o, tuple) and o else None
    if kind in ("int", "f32", "f64", "name"):
        return 0
    if kind == "not":
        return _operand(o[1], ins, val)
    if kind != "reg":
        return _VARYING
    name = o[1]
    if name == "%tid.x":
        return 1
    if name in _ROW_UNIFORM:
        return 0
    r = ins.scope.reg(name) if ins.scope is not None else None
    if r is None:
        return _VARYING
    return val.get(r.uid)


def _transfer(ins: Instr, op: str, ops: list, val: dict):
    """The stride instruction ``ins`` gives its destination, ``_VARYING``, or None (an operand
    not known yet)."""
    if op == "ld":
        return 0 if ".param" in ins.opcode else _VARYING
    srcs = [_operand(o, ins, val) for o in ops[1:]]
    if _VARYING in srcs:
        return _VARYING
    if None in srcs:
        return None
    if all(c == 0 for c in srcs):
        return 0
    if op not in _LINEAR or ins.opcode.split(".")[1:2] == ["hi"]:
        return _VARYING
    if op in ("mov", "cvt", "cvta"):
        return srcs[0] if len(srcs) == 1 else _VARYING
    if op == "neg":
        return -srcs[0]
    if op == "add":
        return srcs[0] + srcs[1]
    if op == "sub":
        return srcs[0] - srcs[1]
    if op == "shl":
        k = _imm(ops[2])
        return srcs[0] << k if k is not None and srcs[1] == 0 and k < 32 else _VARYING
    # mul / mad: a * b (+ c), one factor an immediate
    prod = _scaled(ops[1], ops[2], srcs[0], srcs[1])
    if prod is _VARYING or op == "mul":
        return prod
    return prod + srcs[2] if len(srcs) == 3 else _VARYING


def _scaled(a, b, ca, cb):
    if ca == 0 and cb == 0:
        return 0
    if cb == 0 and _imm(b) is not None:
        return ca * _imm(b)
    if ca == 0 and _imm(a) is not None:
        return cb * _imm(a)
    return _VARYING


def _imm(o) -> int | None:
    return o[1] if isinstance(o, tuple) and o and o[0] == "int" else None
