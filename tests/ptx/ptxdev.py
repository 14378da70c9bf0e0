"""A tiny "device" for the PTX interpreter tests: memory, parameter packing, module globals.

It does what the sim backend does around ``PtxProgram.launch``: a SimMemory over a session
window, a bump allocator, packing of arguments at the offsets of ``PtxKernel.params``, and
placement of the module's ``.global``/``.const`` variables.
"""

from __future__ import annotations

import numpy as np

from crane.backends.sim.memory import SimMemory
from crane.backends.sim.profiles import get_profile

BASE = 0x2000_0000_0000
CHUNK = 64 << 20


class Ptr(int):
    """A device pointer argument (packed as 8 bytes)."""


class Device:
    def __init__(self, profile: str = "h100-80gb") -> None:
        self.mem = SimMemory(BASE, 1 << 40)
        self.profile = get_profile(profile)
        self._next = BASE
        self._mapped = BASE
        self.printed: list[str] = []
        self._globals: dict[int, dict[str, int]] = {}

    def close(self) -> None:
        self.mem.close()

    # ---- memory ------------------------------------------------------------------------
    def alloc(self, nbytes: int, align: int = 256) -> Ptr:
        nbytes = max(int(nbytes), 1)
        addr = (self._next + align - 1) // align * align
        end = addr + nbytes
        while end > self._mapped:
            self.mem.map_chunk(self._mapped, CHUNK)
            self._mapped += CHUNK
        self.mem.alloc(addr, nbytes)
        self._next = end
        return Ptr(addr)

    def upload(self, arr: np.ndarray) -> Ptr:
        arr = np.ascontiguousarray(arr)
        p = self.alloc(arr.nbytes)
        if arr.nbytes:
            self.mem.write(p, arr.view(np.uint8).reshape(-1))
        return p

    def zeros(self, n: int, dtype) -> Ptr:
        return self.upload(np.zeros(n, dtype))

    def download(self, p: int, n: int, dtype) -> np.ndarray:
        dt = np.dtype(dtype)
        return np.frombuffer(self.mem.read(p, n * dt.itemsize), dt).copy()

    # ---- launches ----------------------------------------------------------------------
    def symbols(self, prog) -> dict[str, int]:
        key = id(prog)
        if key not in self._globals:
            syms = {}
            for v in prog.variables:
                a = self.alloc(v.size, max(v.align, 8))
                if v.init:
                    self.mem.write(a, v.init)
                syms[v.name] = a
            # address initializers, as the backend patches them: variables and functions
            code = prog.function_addresses()
            for v in prog.variables:
                for off, size, sym, addend in v.relocs:
                    target = code.get(sym, syms.get(sym))
                    if target is not None:
                        value = (target + addend) & ((1 << (8 * size)) - 1)
                        self.mem.write(syms[v.name] + off, value.to_bytes(size, "little"))
            self._globals[key] = syms
        return self._globals[key]

    def pack(self, prog, kernel: str, args) -> bytes:
        k = prog.kernels[kernel]
        if len(args) != len(k.params):
            raise TypeError(f"{kernel} takes {len(k.params)} arguments, got {len(args)}")
        buf = bytearray(k.param_bytes)
        for (off, size), a in zip(k.params, args, strict=True):
            if isinstance(a, Ptr):
                raw = int(a).to_bytes(8, "little")
            elif isinstance(a, (bytes, bytearray)):
                raw = bytes(a)
            elif isinstance(a, np.generic | np.ndarray):
                raw = np.asarray(a).tobytes()
            else:
                raise TypeError(f"argument {a!r}: use numpy scalars, Ptr or bytes")
            if len(raw) != size:
                raise TypeError(f"argument {a!r} is {len(raw)} bytes, parameter is {size}")
            buf[off : off + size] = raw
        return bytes(buf)

    def launch(self, prog, kernel: str, grid, block, args, shared: int = 0, **kw) -> list[str]:
        out: list[str] = []
        try:
            prog.launch(
                kernel,
                grid=grid if isinstance(grid, tuple) else (grid, 1, 1),
                block=block if isinstance(block, tuple) else (block, 1, 1),
                dynamic_shared=shared,
                params=self.pack(prog, kernel, args),
                memory=self.mem,
                symbols=self.symbols(prog),
                profile=self.profile,
                printf=out.append,
                **kw,
            )
        finally:  # (a failed assert prints before its launch fails)
            self.printed.extend(out)
        return out


def i32(x) -> np.int32:
    return np.int32(x)


def u32(x) -> np.uint32:
    return np.uint32(x)


def f32(x) -> np.float32:
    return np.float32(x)


def f64(x) -> np.float64:
    return np.float64(x)


def i64(x) -> np.int64:
    return np.int64(x)


def blocks(n: int, bs: int) -> int:
    return max((n + bs - 1) // bs, 1)


def fma32_ref(a, b, c) -> np.ndarray:
    """float32 fma reference: exact product and sum in float64 when that is exact, else
    exact rational arithmetic (independent of the interpreter's implementation)."""
    from fractions import Fraction

    a, b, c = np.broadcast_arrays(
        np.asarray(a, np.float32), np.asarray(b, np.float32), np.asarray(c, np.float32)
    )
    p = a.astype(np.float64) * b.astype(np.float64)
    s = p + c.astype(np.float64)
    bb = s - p
    err = (p - (s - bb)) + (c.astype(np.float64) - bb)
    out = s.astype(np.float32)
    hard = np.flatnonzero((err != 0).reshape(-1))
    flat = out.reshape(-1)
    for i in hard:
        x = Fraction(float(a.flat[i])) * Fraction(float(b.flat[i])) + Fraction(float(c.flat[i]))
        lo = np.float32(float(x))
        # choose between the two float32 neighbours of x by exact distance
        cands = [lo, np.nextafter(lo, np.float32(np.inf)), np.nextafter(lo, np.float32(-np.inf))]
        best = min(
            cands,
            key=lambda f: (abs(Fraction(float(f)) - x), int(np.float32(f).view(np.uint32)) & 1),
        )
        flat[i] = best
    return out
