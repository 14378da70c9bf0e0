"""Decoded operands: what an instruction reads and writes, resolved once at load.

Every source has ``get(st, idx)`` returning the values for the lanes ``idx`` (an index array,
or ``None`` for all lanes of the batch) as a NumPy array — or a NumPy scalar when the value is
the same for every lane (immediates, symbol addresses, ``%ntid``), which broadcasting handles
for free. Destinations have ``put(st, idx, values)`` and ``row(st)`` (the full-width array, for
``out=`` writes on the all-lanes fast path).
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["CastReg", "Dynamic", "Imm", "Reg", "Sink", "Special", "Sym", "Uniform"]


class Reg:
    """A register read or written through a typed view of its function's register file."""

    __slots__ = ("f", "name", "r", "v")

    def __init__(self, f: int, v: int, r: int, name: str) -> None:
        self.f, self.v, self.r, self.name = f, v, r, name

    def get(self, st, idx):
        row = st.fv[self.f][self.v][self.r]
        return row if idx is None else row[idx]

    def row(self, st):
        return st.fv[self.f][self.v][self.r]

    def put(self, st, idx, val) -> None:
        row = st.fv[self.f][self.v][self.r]
        if idx is None:
            row[...] = val
        else:
            row[idx] = val

    def __repr__(self) -> str:
        return self.name


class CastReg(Reg):
    """A register whose width differs from the instruction type (``st.u32 [a], %rd1``):
    reads truncate or extend to ``dtype``; writes convert to the register's own view."""

    __slots__ = ("dtype",)

    def __init__(self, f: int, v: int, r: int, name: str, dtype: np.dtype) -> None:
        super().__init__(f, v, r, name)
        self.dtype = dtype

    def get(self, st, idx):
        row = st.fv[self.f][self.v][self.r]
        return (row if idx is None else row[idx]).astype(self.dtype)

    def row(self, st):  # never used for out= writes
        raise AssertionError("CastReg has no typed row")

    def put(self, st, idx, val) -> None:
        row = st.fv[self.f][self.v][self.r]
        val = np.asarray(val)
        if val.dtype.kind == "f" and row.dtype.kind != "f":
            val = val.view(np.dtype(f"u{val.dtype.itemsize}"))
        if idx is None:
            row[...] = val
        else:
            row[idx] = val


class Imm:
    """An immediate, already a NumPy scalar of the instruction's type."""

    __slots__ = ("val",)

    def __init__(self, val) -> None:
        self.val = val

    def get(self, st, idx):
        return self.val

    def __repr__(self) -> str:
        return repr(self.val)


class Special:
    """A per-lane special register (``%tid.x``, ``%laneid`` ...)."""

    __slots__ = ("dtype", "name")

    def __init__(self, name: str, dtype) -> None:
        self.name, self.dtype = name, dtype

    def get(self, st, idx):
        a = st.special[self.name]
        a = a if idx is None else a[idx]
        return a if a.dtype == self.dtype else a.astype(self.dtype)


class Uniform:
    """A special register with one value per launch (``%ntid.x``, ``%nctaid.y`` ...)."""

    __slots__ = ("dtype", "name")

    def __init__(self, name: str, dtype) -> None:
        self.name, self.dtype = name, dtype

    def get(self, st, idx):
        return self.dtype.type(st.uniform[self.name])


#: wall-clock origins taken once per process: %clock64 counts from _T0 and %globaltimer is
#: _EPOCH0 (Unix time in ns) plus the monotonic time since, so neither runs backwards
_T0 = time.perf_counter_ns()
_EPOCH0 = time.time_ns()


def clock64(st) -> int:
    """%clock64: SM cycles at the profile's clock rate since the process started, from wall
    time (so a kernel that spins N cycles takes about N / clock rate seconds); strictly
    increasing across reads of one batch, as a running counter is."""
    v = int((time.perf_counter_ns() - _T0) * st.cycles_per_ns)
    if v <= st.clock_last:
        v = st.clock_last + 1
    st.clock_last = v
    return v


def globaltimer() -> int:
    """%globaltimer: nanoseconds, Unix epoch based, monotone within the process."""
    return _EPOCH0 + time.perf_counter_ns() - _T0


class Dynamic:
    """Clocks and timers, read when the instruction runs."""

    __slots__ = ("dtype", "hi", "name", "timer")

    def __init__(self, name: str, dtype) -> None:
        self.name, self.dtype = name, dtype
        self.timer = name.startswith("%globaltimer")
        self.hi = name.endswith("_hi")

    def get(self, st, idx):
        v = globaltimer() if self.timer else clock64(st)
        if self.hi:
            v >>= 32
        return self.dtype.type(v & ((1 << (8 * self.dtype.itemsize)) - 1))


class Sym:
    """The address of a variable; resolved per launch (module globals are placed by the
    backend, shared and local variables are laid out per kernel)."""

    __slots__ = ("dtype", "name", "slot")

    def __init__(self, slot: int, name: str, dtype) -> None:
        self.slot, self.name, self.dtype = slot, name, dtype

    def get(self, st, idx):
        return self.dtype.type(int(st.symvals[self.slot]) & ((1 << (8 * self.dtype.itemsize)) - 1))

    def __repr__(self) -> str:
        return self.name


class Sink:
    """``_``: a destination whose value is discarded."""

    __slots__ = ()

    def put(self, st, idx, val) -> None:
        pass

    def get(self, st, idx):
        return np.uint32(0)
