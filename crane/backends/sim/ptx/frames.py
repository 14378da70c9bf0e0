"""Activation frames of recursive device functions.

Why: every function has one register file, one parameter area and one local-memory frame per
lane (no call stack in memory), which is exact as long as no function is active twice in a
lane. A function on a cycle of the call graph (``decode.FuncInfo.recursive``) can be: so a call
to one saves, for the calling lanes, the callee's registers, parameter area and local frame
(the outer activation's values, if any) under the call stack the lanes enter with, and the
return restores them for the returning lanes. Lanes of one call may return at different times
(divergence inside the callee); each record keeps the lanes it still holds.

The depth is bounded like the hardware's per-thread stack (CU_LIMIT_STACK_SIZE): a lane nested
deeper than :data:`MAX_DEPTH` calls faults with CUDA_ERROR_LAUNCH_FAILED instead of growing
without end.
"""

from __future__ import annotations

import numpy as np

from .errors import KernelFault

__all__ = ["MAX_DEPTH", "Frames"]

#: Deepest call nesting a lane may reach (1 KiB of stack at a small frame each on hardware).
MAX_DEPTH = 1024
_LAUNCH_FAILED = 719
_FILES = (0, 2, 5, 8)  # the 16/32/64-bit and predicate register files among State.fv's views


class Frames:
    """The saved activations of one batch, keyed by call stack."""

    def __init__(self) -> None:
        self.saved: dict[tuple, list[list]] = {}

    def push(self, st, fid: int, stack: tuple, idx, ins) -> None:
        """Lanes ``idx`` call recursive function ``fid`` and enter with call stack ``stack``."""
        if len(stack) > MAX_DEPTH:
            raise KernelFault(
                _LAUNCH_FAILED,
                f"call stack overflow: more than {MAX_DEPTH} nested calls at `{ins.text}` "
                f"(PTX line {ins.line})",
            )
        lanes = np.arange(st.n) if idx is None else idx
        regs = [st.fv[fid][k][:, lanes] for k in _FILES]
        pm = st.pm[fid][lanes]
        a, b = st.local_frames.get(fid, (0, 0))
        local = _local(st)[lanes, a:b] if b > a else None
        self.saved.setdefault(stack, []).append([lanes, regs, pm, local])

    def pop(self, st, fid: int, stack: tuple, idx) -> None:
        """Lanes ``idx`` return from ``fid`` entered with ``stack``: restore their frames."""
        records = self.saved.get(stack)
        if not records:
            return
        keep = []
        for rec in records:
            lanes, regs, pm, local = rec
            sel = np.ones(lanes.size, np.bool_) if idx is None else np.isin(lanes, idx)
            if sel.any():
                back = lanes[sel]
                for k, saved in zip(_FILES, regs, strict=True):
                    st.fv[fid][k][:, back] = saved[:, sel]
                st.pm[fid][back] = pm[sel]
                if local is not None:
                    a, b = st.local_frames[fid]
                    _local(st)[back, a:b] = local[sel]
            if not sel.all():
                rest = ~sel
                rec[0] = lanes[rest]
                rec[1] = [r[:, rest] for r in regs]
                rec[2] = pm[rest]
                rec[3] = None if local is None else local[rest]
                keep.append(rec)
        if keep:
            self.saved[stack] = keep
        else:
            del self.saved[stack]


def _local(st) -> np.ndarray:
    return st.local[: st.n * st.local_stride].reshape(st.n, st.local_stride)
