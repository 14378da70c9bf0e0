"""Device ``printf`` (``vprintf``) and ``assert`` (``__assertfail``).

nvcc compiles ``printf(fmt, ...)`` to ``vprintf(fmt, args)``: ``fmt`` is a generic pointer to
a string in a module ``.global``; ``args`` points to a local buffer holding the arguments, each
at an offset aligned to its size (ints 4 bytes, ``long``/pointers/doubles 8; floats arrive
promoted to double). We format with C semantics and pass each lane's text to the launch's
``printf`` sink, lanes in order.

``assert(e)`` compiles to ``__assertfail(message, file, line, function, charSize)``; like the
GPU we print ``file:line: function: block [x,y,z], thread [x,y,z] Assertion `message` failed.``
for each failing thread and then fail the launch with CUDA_ERROR_ASSERT.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

import numpy as np

from crane.backends.sim.memory import MemoryFault

from .errors import KernelFault
from .memspace import LOCAL_WINDOW, SHARED_WINDOW, WINDOW_SIZE

__all__ = [
    "MAX_STRING",
    "PrintfArgs",
    "assert_fault",
    "assert_line",
    "format_printf",
    "global_cstring",
    "h_assertfail",
    "h_vprintf",
    "read_bytes",
    "read_cstring",
]

#: the longest string a %s or an assert message reads
MAX_STRING = 1 << 16
_CONV = re.compile(
    r"%([-+ #0]*)(\*|\d+)?(?:\.(\*|\d*))?(hh|h|ll|l|L|z|j|t|q)?([diouxXeEfFgGaAcspn%])"
)


def read_bytes(st, lane: int, addr: int, n: int, *, partial: bool = False) -> bytes:
    """Up to ``n`` bytes at generic address ``addr`` as seen by ``lane``."""
    if SHARED_WINDOW <= addr < SHARED_WINDOW + WINDOW_SIZE:
        off = addr - SHARED_WINDOW
        end = min(off + n, st.shared_stride) if partial else off + n
        if off >= st.shared_stride or end > st.shared_stride:
            raise MemoryFault(f"shared read at {addr:#x} out of range", addr, "illegal")
        base = int(st.shbase[lane])
        return st.shared[base + off : base + end].tobytes()
    if LOCAL_WINDOW <= addr < LOCAL_WINDOW + WINDOW_SIZE:
        off = addr - LOCAL_WINDOW
        end = min(off + n, st.local_stride) if partial else off + n
        if off >= st.local_stride or end > st.local_stride:
            raise MemoryFault(f"local read at {addr:#x} out of range", addr, "illegal")
        base = int(st.lobase[lane])
        return st.local[base + off : base + end].tobytes()
    return read_global(st.mem, addr, n, partial=partial)


def read_global(mem, addr: int, n: int, *, partial: bool = False) -> bytes:
    """Up to ``n`` bytes of device memory ``mem`` at ``addr``, within one allocation."""
    alloc = mem.find(addr)
    end = min(addr + n, alloc.end) if partial else addr + n
    if end > alloc.end:
        raise MemoryFault(
            f"read of {n} bytes at {addr:#x} runs past its allocation", addr, "illegal"
        )
    return mem.read(addr, end - addr)


def read_cstring(st, lane: int, addr: int, limit: int = MAX_STRING) -> str:
    return c_string(read_bytes(st, lane, addr, limit, partial=True))


def global_cstring(mem, addr: int) -> str:
    """The C string at ``addr`` in device memory ``mem`` (no shared or local window)."""
    return c_string(read_global(mem, addr, MAX_STRING, partial=True))


def c_string(raw: bytes) -> str:
    z = raw.find(b"\0")
    if z >= 0:
        raw = raw[:z]
    return raw.decode("utf-8", "replace")


class PrintfArgs:
    """Sequential reader of a vprintf argument buffer at generic address ``addr``, read
    through ``read(addr, n)`` (the interpreter's lane view, or a compiled lane's)."""

    def __init__(self, read: Callable[[int, int], bytes], addr: int) -> None:
        self.read, self.addr, self.off = read, addr, 0
        self.count = 0

    def take(self, size: int, kind: str):
        self.off = (self.off + size - 1) // size * size
        if self.addr == 0:
            raise KernelFault(719, "printf argument buffer is a null pointer")
        raw = self.read(self.addr + self.off, size)
        self.off += size
        self.count += 1
        return np.frombuffer(raw, np.dtype(f"<{kind}{size}"))[0].item()


def format_printf(fmt: str, args: PrintfArgs, cstring: Callable[[int], str]) -> str:
    """``fmt`` formatted with C's semantics; ``cstring(p)`` reads a ``%s`` argument."""
    out = []
    pos = 0
    for m in _CONV.finditer(fmt):
        out.append(fmt[pos : m.start()])
        pos = m.end()
        flags, width, prec, length, conv = m.groups()
        if conv == "%":
            out.append("%")
            continue
        if width == "*":
            width = str(args.take(4, "i"))
        if prec == "*":
            prec = str(args.take(4, "i"))
        spec = "%" + flags + (width or "") + ("." + (prec or "0") if prec is not None else "")
        wide = length in ("l", "ll", "z", "j", "t", "q", "L")
        if conv in "di":
            v = args.take(8 if wide else 4, "i")
            out.append((spec + "d") % v)
        elif conv in "ouxX":
            v = args.take(8 if wide else 4, "u")
            out.append((spec + ("d" if conv == "u" else conv)) % v)
        elif conv in "eEfFgGaA":
            v = args.take(8, "f")
            if conv in "aA":
                s = float(v).hex()
                out.append(s.upper() if conv == "A" else s)
            else:
                out.append((spec + conv) % v)
        elif conv == "c":
            v = args.take(8 if wide else 4, "i")
            out.append((spec + "c") % chr(v & 0xFF))
        elif conv == "s":
            p = args.take(8, "u")
            s = "(null)" if p == 0 else cstring(p)
            out.append((spec + "s") % s)
        elif conv == "p":
            p = args.take(8, "u")
            out.append(("%" + flags.replace("0", "") + (width or "") + "s") % f"0x{p:x}")
        elif conv == "n":
            args.take(8, "u")
    out.append(fmt[pos:])
    return "".join(out)


def _pm_u64(st, fid: int, off: int, lanes) -> np.ndarray:
    pm = st.pm[fid]
    raw = pm[:, off : off + 8] if lanes is None else pm[lanes, off : off + 8]
    return np.ascontiguousarray(raw).view(np.uint64).reshape(-1)


def h_vprintf(st, ins, idx) -> None:
    fmt_off, args_off, ret_off = ins.x
    lanes = np.arange(st.n) if idx is None else idx
    fmts = _pm_u64(st, ins.fid, fmt_off, lanes)
    argps = _pm_u64(st, ins.fid, args_off, lanes)
    counts = np.zeros(lanes.size, np.int32)
    cache: dict[int, str] = {}
    for j, lane in enumerate(lanes.tolist()):
        fa = int(fmts[j])
        fmt = cache.get(fa)
        if fmt is None:
            fmt = read_cstring(st, lane, fa)
            cache[fa] = fmt
        args = PrintfArgs(partial(read_bytes, st, lane), int(argps[j]))
        st.printf(format_printf(fmt, args, partial(read_cstring, st, lane)))
        counts[j] = args.count
    if ret_off is not None:
        pm = st.pm[ins.fid]
        raw = counts.view(np.uint8).reshape(-1, 4)
        if idx is None:
            pm[:, ret_off : ret_off + 4] = raw
        else:
            pm[idx, ret_off : ret_off + 4] = raw


def h_assertfail(st, ins, idx) -> None:
    msg_off, file_off, line_off, func_off, _ = ins.x
    lanes = np.arange(st.n) if idx is None else idx
    msgs = _pm_u64(st, ins.fid, msg_off, lanes)
    files = _pm_u64(st, ins.fid, file_off, lanes)
    funcs = _pm_u64(st, ins.fid, func_off, lanes)
    pm = st.pm[ins.fid]
    lines = np.ascontiguousarray(pm[lanes, line_off : line_off + 4]).view(np.uint32).reshape(-1)
    sp = st.special
    first = ""
    for j, lane in enumerate(lanes.tolist()):
        text = assert_line(
            read_cstring(st, lane, int(files[j])),
            int(lines[j]),
            read_cstring(st, lane, int(funcs[j])),
            tuple(int(sp[f"%ctaid.{a}"][lane]) for a in "xyz"),
            tuple(int(sp[f"%tid.{a}"][lane]) for a in "xyz"),
            read_cstring(st, lane, int(msgs[j])),
        )
        st.printf(text)
        first = first or text
    raise assert_fault(first)


def assert_line(file: str, line: int, func: str, ctaid, tid, message: str) -> str:
    """The line a failed ``assert`` prints, as a GPU words it."""
    return (
        f"{file}:{line}: {func}: block [{ctaid[0]},{ctaid[1]},{ctaid[2]}], "
        f"thread [{tid[0]},{tid[1]},{tid[2]}] Assertion `{message}` failed.\n"
    )


def assert_fault(first_line: str) -> KernelFault:
    """The launch's fault after a failed ``assert`` (CUDA_ERROR_ASSERT): sticky, as on a
    GPU; it names the first failing thread's line."""
    return KernelFault(710, f"device-side assert triggered: {first_line.strip()}")
