"""The decoded instruction: one object per PTX instruction, built once at load.

``kind`` tells the executor how to run it: ``PLAIN`` instructions call ``fn(st, ins, idx)`` for
the lanes ``idx`` (after the guard predicate); the others change which lanes run where and are
handled by :mod:`.executor` itself. Handler-specific, pre-resolved data lives in the operand
slots (``d``, ``d2``, ``a``, ``b``, ``c``, ``e``) and in ``x``.
"""

from __future__ import annotations

__all__ = [
    "BAR",
    "BRA",
    "CALL",
    "CLUSTER_WAIT",
    "EXIT",
    "KIND_NAMES",
    "MWAIT",
    "PLAIN",
    "RET",
    "TRAP",
    "WBAR",
    "Ins",
]

# MWAIT: an mbarrier wait; ``fn`` writes each lane's result and returns which lanes' phase
# completed, ``e(st, ins, idx)`` tells the same without writing (the executor parks the others)
PLAIN, BRA, CALL, RET, EXIT, BAR, TRAP, WBAR, MWAIT = range(9)
KIND_NAMES = ("plain", "bra", "call", "ret", "exit", "bar", "trap", "wbar", "mwait")
#: ``Ins.x`` of a ``barrier.cluster.wait`` (an MWAIT): the executor keeps such waits parked
#: rather than answering them false when nothing else can run (a barrier has no "not yet")
CLUSTER_WAIT = "barrier.cluster.wait"


class Ins:
    __slots__ = (
        "a",
        "b",
        "c",
        "cls",
        "d",
        "d2",
        "e",
        "fid",
        "fn",
        "gneg",
        "guard",
        "kind",
        "line",
        "opcode",
        "pc",
        "t",
        "text",
        "x",
    )

    def __init__(self, pc: int, line: int, text: str, opcode: str, fid: int) -> None:
        self.pc = pc
        self.line = line
        self.text = text
        self.opcode = opcode
        self.cls = ""
        self.kind = PLAIN
        self.fn = None
        self.guard = None
        self.gneg = False
        self.d = self.d2 = self.a = self.b = self.c = self.e = None
        self.t = None
        self.x = None
        self.fid = fid

    def __repr__(self) -> str:
        return f"<{self.pc}: {self.text} (line {self.line})>"
