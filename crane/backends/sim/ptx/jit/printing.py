"""Device ``printf`` in compiled kernels: a call back into Python per ``vprintf``, the lines
put in a GPU's order when the launch ends.

Why a callback: ``vprintf(fmt, args)`` reads a format string and an argument buffer whose
layout only the format says (the interpreter's :func:`..printf.format_printf`), so the lane
hands the two generic addresses, its local area and its coordinates to :func:`_callback`
(a ctypes callback: it takes the GIL, which the launch's native call released) and goes on
with the count of arguments read, as the interpreter's ``vprintf`` returns. A printf costs
microseconds this way; kernels print on their debugging paths, and refusing them sent the
whole kernel to the interpreter.

Why reordered: lanes run one after another (region by region, blocks on every core at once),
so lines arrive in no order a GPU would give. Each is kept with its block, warp, the
thread's count of lines so far and its lane, and the launch's lines are written in that order
when it ends (a GPU writes a warp's lines together, a call at a time, warps in no set order):
the same text whatever the cores did. A failed ``assert``'s line comes after them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from crane.backends.sim.memory import MemoryFault

from ..errors import KernelFault, fault_code
from ..memspace import LOCAL_WINDOW, SHARED_WINDOW, WINDOW_SIZE
from ..printf import MAX_STRING, PrintfArgs, c_string, format_printf, read_global
from . import layout as L

__all__ = ["CALLBACK_ADDRESS", "Output"]


class Output:
    """One compiled launch's device output (registered per context word array it runs)."""

    def __init__(self, sink: Callable[[str], None], memory, grid, block) -> None:
        self.sink = sink
        self.memory = memory
        self.grid, self.block = grid, block
        self._lines: list[tuple[tuple[int, int, int, int], str]] = []
        self._calls: dict[tuple[int, int], int] = {}
        self._tail: list[str] = []
        #: what made a printf fail the launch (a bad argument buffer or string)
        self.fault: KernelFault | None = None

    def printf(self, ctx: int, fmt: int, args: int, local: int, tid: int, cta: int) -> int:
        """Format one lane's ``vprintf`` and keep the line; the arguments read."""
        words = (ctypes.c_int64 * L.FIXED).from_address(ctx)

        def read(addr: int, n: int, partial: bool = False) -> bytes:
            for window, base, size, what in (
                (LOCAL_WINDOW, local, words[L.LOCAL_SIZE], "local"),
                (SHARED_WINDOW, words[L.SHARED], words[L.SHARED_SIZE], "shared"),
            ):
                if window <= addr < window + WINDOW_SIZE:
                    off = addr - window
                    end = min(off + n, size) if partial else off + n
                    if not base or off >= size or end > size:
                        raise MemoryFault(f"{what} read at {addr:#x} out of range", addr, "illegal")
                    return ctypes.string_at(base + off, end - off)
            return read_global(self.memory, addr, n, partial=partial)

        def cstring(addr: int) -> str:
            return c_string(read(addr, MAX_STRING, partial=True))

        reader = PrintfArgs(read, args)
        text = format_printf(cstring(fmt), reader, cstring)
        (gx, gy, _), (bx, by, _) = self.grid, self.block
        cx, cy, cz = L.unpack(cta, L.CTAID_SHIFTS)
        tx, ty, tz = L.unpack(tid, L.TID_SHIFTS)
        block = cx + gx * (cy + gy * cz)
        thread = tx + bx * (ty + by * tz)
        n = self._calls.get((block, thread), 0)
        self._calls[(block, thread)] = n + 1
        self._lines.append(((block, thread >> 5, n, thread & 31), text))
        return reader.count

    def say(self, text: str) -> None:
        """A line written after the launch's printf lines (a failed ``assert``'s)."""
        self._tail.append(text)

    def flush(self) -> None:
        """Write the launch's lines in a GPU's order, then the tail."""
        self._lines.sort(key=lambda kv: kv[0])
        for _, text in self._lines:
            self.sink(text)
        for text in self._tail:
            self.sink(text)
        self._lines.clear()
        self._tail.clear()


#: the outputs of the launches running now, by the address of each core's context words
_live: dict[int, Output] = {}


def attach(ctx: int, out: Output) -> None:
    _live[ctx] = out


def detach(ctx: int) -> None:
    _live.pop(ctx, None)


def _callback(ctx: int, fmt: int, args: int, local: int, tid: int, cta: int) -> int:
    """What a compiled ``vprintf`` calls: -1 (the launch then fails with the fault kept)
    when the output is unknown or a read faulted. Never raises (a ctypes callback's
    exception would only be printed)."""
    out = _live.get(ctx or 0)
    if out is None:
        return -1
    try:
        return out.printf(ctx, fmt, args, local or 0, tid, cta)
    except MemoryFault as e:
        out.fault = KernelFault(fault_code(e.kind), f"{e} in vprintf")
    except KernelFault as e:
        out.fault = e
    except Exception as e:  # a bug of ours: the launch fails, the worker lives
        out.fault = KernelFault(719, f"vprintf failed: {type(e).__name__}: {e}")
    return -1


_CALLBACK_TYPE = ctypes.CFUNCTYPE(
    ctypes.c_int32,
    ctypes.c_void_p,
    ctypes.c_uint64,
    ctypes.c_uint64,
    ctypes.c_void_p,
    ctypes.c_uint64,
    ctypes.c_uint64,
)
_CALLBACK = _CALLBACK_TYPE(_callback)  # (kept alive for the process)
#: what the context word PRINTF_FN holds for compiled code to call
CALLBACK_ADDRESS: int = ctypes.cast(_CALLBACK, ctypes.c_void_p).value or 0
