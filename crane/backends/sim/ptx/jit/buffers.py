"""Per-core launch buffers kept between launches: a compiled launch's shared memory, barrier
save area, resume words and local memory, reused instead of allocated and zeroed again.

Why reuse is safe: the compiled driver clears each of these itself before a block uses it
(shared memory and the local areas when the kernel can reach them, the save area and the
resume words when it has barriers; :meth:`.lower.KernelLowering.open_driver` and
``build_driver``), so a buffer's old contents are never read; a launch takes a set out of the
pool and gives it back when it has ended, so two launches running at once never share one.
Why it matters: a small launch spent about a third of its fixed cost (some 15 µs of 40) in
allocating them, and a block with large local frames pays page faults on fresh zeroed memory
at every launch.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

__all__ = ["KPARAM_AREA", "MAX_POOLED_BYTES", "Buffers", "give", "pooled_bytes", "take"]

#: bytes of buffers the pool keeps at most (least recently used sizes are dropped first)
MAX_POOLED_BYTES = 64 << 20
#: bytes of kernel parameters (with the launch's padding) a pooled set holds; CUDA's own limit
#: is 32764 bytes, but kernels take a few dozen: larger ones go from their own array
KPARAM_AREA = 4096 + 16
#: sets kept per size (one per core of a launch, and a second launch beside it)
_PER_KEY = 4


class Buffers:
    """One core's buffers for one launch shape."""

    __slots__ = (
        "addrs", "ctx", "ctx_addr", "ctx_words", "key", "kparams", "kparams_addr", "local",
        "nbytes", "resume", "save", "shared",
    )  # fmt: skip

    def __init__(self, key: tuple[int, int, int, int, int]) -> None:
        shared_bytes, save_words, resume_words, local_bytes, ctx_words = key
        self.key = key
        self.shared = np.zeros(shared_bytes, np.uint8)
        self.save = np.zeros(save_words, np.int64)
        self.resume = np.zeros(resume_words, np.int32)
        self.local = np.zeros(local_bytes, np.uint8)
        #: the context words' array (the launch fills it whole), and its address: asking
        #: numpy for an address costs 1-2 µs, a part of a small launch worth keeping
        self.ctx = np.zeros(ctx_words, np.int64)
        self.ctx_addr = self.ctx.ctypes.data
        #: the same words through a memoryview: a launch sets a dozen of them, and setting an
        #: item through it costs half what numpy's item assignment does
        self.ctx_words = memoryview(self.ctx)
        #: a launch's kernel parameters copied here when they fit (a set with context words:
        #: one core's launch), whose address is known: numpy's ``.ctypes.data`` on the
        #: launch's own parameter array costs 1-3 µs
        kp = KPARAM_AREA if ctx_words else 0
        self.kparams = memoryview(np.zeros(kp, np.uint8))
        self.kparams_addr = np.frombuffer(self.kparams, np.uint8).ctypes.data if kp else 0
        self.nbytes = (
            shared_bytes + 8 * save_words + 4 * resume_words + local_bytes + 8 * ctx_words + kp
        )
        #: the buffers' addresses (shared, save, resume, local), for the context words
        self.addrs = tuple(a.ctypes.data for a in (self.shared, self.save, self.resume, self.local))


_lock = threading.Lock()
_free: OrderedDict[tuple[int, int, int, int, int], list[Buffers]] = OrderedDict()
_pooled = 0


def take(
    shared_bytes: int, save_words: int, resume_words: int, local_bytes: int, ctx_words: int = 0
) -> Buffers:
    """A buffer set of these sizes: a pooled one (contents left from an earlier launch) or a
    new, zeroed one."""
    key = (shared_bytes, save_words, resume_words, local_bytes, ctx_words)
    global _pooled
    with _lock:
        sets = _free.get(key)
        if sets:
            got = sets.pop()
            _pooled -= got.nbytes
            _free.move_to_end(key)
            return got
    return Buffers(key)


def give(bufs: Buffers) -> None:
    """Return a set after its launch ended (faulted or not); kept while the pool has room."""
    global _pooled
    if bufs.nbytes > MAX_POOLED_BYTES:
        return
    with _lock:
        sets = _free.setdefault(bufs.key, [])
        _free.move_to_end(bufs.key)
        if len(sets) >= _PER_KEY:
            return
        sets.append(bufs)
        _pooled += bufs.nbytes
        while _pooled > MAX_POOLED_BYTES:
            key, old = next(iter(_free.items()))
            if not old:
                del _free[key]
                continue
            _pooled -= old.pop(0).nbytes


def pooled_bytes() -> int:
    """Bytes the pool holds now (for tests and diagnostics)."""
    with _lock:
        return _pooled
