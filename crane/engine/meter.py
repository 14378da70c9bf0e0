"""A session's accounting: calls by op with their latency histogram, GPU work, and a profile.

Cheap enough for the worker's call path: every call costs one clock read and three list
increments, done inline in the codec's loop (a histogram bucket found by ``int.bit_length``:
log2 buckets, no search, no allocation, no method call); only launches and copies, which cost
far more themselves, call into the meter (:meth:`Meter.work_call`) for kernel names and bytes.
What an op counts as (a kernel launch, a copy in one direction, a memset) comes from the call
table (:attr:`crane.api.ops.Op.meter`), never a list kept here.

GPU time: on a backend that runs work inside the call (the simulator: ``inline`` True) a
launch's or copy's time is the call's execution time. A backend whose work is asynchronous
(the cuda backend) reports completed work itself (:meth:`Meter.work`) with the device's own
timing; the call's time is then only the enqueue and is not GPU time.

The profile is a sliding window (``window_s``, default 60 s) of one-second slots: per kernel
name its GPU time and launches, and the time in kernels and in copies/memsets; work is filed
under the slot in which it completed (a kernel longer than a slot counts whole in its last).
Copy time is not filed per call: each slot notes the session's copy time when it began, and
the window's is the difference (slots begin at launches and at publishing, about every
second). The worker publishes :meth:`Meter.snapshot` as JSON (crane.host.stats.SnapshotFile); the
daemon's exporter and ``crane profile``/``crane top`` read that, never the worker.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from crane.api.ops import Op

__all__ = [
    "COPY_KINDS",
    "HIST_BUCKETS",
    "RAW_BUCKETS",
    "Meter",
    "bucket_upper_s",
    "profile_view",
]

#: Latency histogram buckets: bucket ``k`` counts durations ``d`` (ns) with
#: ``d.bit_length() == k``, i.e. ``d < 2**k`` ns; the last one takes everything longer.
HIST_BUCKETS = 40
#: Buckets the call path fills: one per possible ``bit_length`` of a 64-bit duration, so the
#: codec's loop indexes with it directly (no clamp, no separate call count: both cost a few
#: percent of a 3 µs call); folded to :data:`HIST_BUCKETS` when read.
RAW_BUCKETS = 64
#: The work kinds that move bytes (a memset writes bytes but copies none: counted apart).
COPY_KINDS = ("h2d", "d2h", "d2d")
#: Kernels kept per profile in a snapshot (by GPU time), so a snapshot stays small.
TOP_KERNELS = 64


def bucket_upper_s(k: int) -> float:
    """Upper bound (seconds) of histogram bucket ``k``."""
    return (1 << k) / 1e9


class _Slot:
    """One second (``slot_ns``) of the window."""

    __slots__ = ("copy_mark", "kernel_ns", "kernels", "start")

    def __init__(self, start: int, copy_mark: int) -> None:
        self.start = start
        self.kernel_ns = 0
        #: The session's copy time (ns) when the slot began: the window's copy time is the
        #: difference to now (copies are not filed per slot, to keep them off the call path).
        self.copy_mark = copy_mark
        self.kernels: dict[str, list[int]] = {}  # name -> [gpu ns, launches]


class Meter:
    """One session's counters and profile window (mutated by the worker's batch thread only;
    read by the same thread or under the batch lock: see crane.worker.attach)."""

    def __init__(
        self,
        ops: Iterable[Op],
        kernel_name: Callable[[int], str],
        window_s: float = 60.0,
        inline: bool = True,
        slot_s: float = 1.0,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        ops = [o for o in ops if not o.retired]
        n = max(o.id for o in ops) + 1
        self.names = {o.id: o.name for o in ops}
        #: Per op id: the calls' summed time (ns) and their latency histogram by ``bit_length``
        #: (:data:`RAW_BUCKETS`; the call count is its sum). The codec's loop updates these in
        #: place (crane.engine.codec), no method call per call.
        self.call_ns = [0] * n
        self.hist = [[0] * RAW_BUCKETS for _ in range(n)]
        self.kernel_name = kernel_name
        self.inline = inline
        self.clock = clock
        #: Per metered op that needs its arguments (a launch's function, a copy's size):
        #: (kind, index of that argument, -1 for the data's length).
        self.work_ops: dict[int, tuple[str, int]] = {}
        #: Ops whose time is copy time (copies and memsets): inline, their calls' summed time is
        #: the copy time, so a memset costs nothing beyond being counted.
        self._copy_ops = [o.id for o in ops if o.meter and o.meter != "launch"]
        for o in ops:
            names = [p.name for p in o.args]
            if o.meter == "launch":
                self.work_ops[o.id] = ("launch", names.index("function"))
            elif o.meter == "h2d":
                self.work_ops[o.id] = ("h2d", -1)
            elif o.meter in COPY_KINDS:
                self.work_ops[o.id] = (o.meter, names.index("size"))
        self.launches = 0
        self.kernel_ns = 0
        self._reported_copy_ns = 0  # an async backend's copies (inline: the calls' time)
        self.bytes = dict.fromkeys(COPY_KINDS, 0)
        self.window_ns = int(window_s * 1e9)
        self.slot_ns = int(slot_s * 1e9)
        self.started = clock()
        self.slots: deque[_Slot] = deque([_Slot(self.started - self.started % self.slot_ns, 0)])

    # ---- the call path -------------------------------------------------------------------
    def call(self, op: int, ns: int) -> None:
        """One call of op ``op`` took ``ns`` (what the codec's loop does inline)."""
        self.call_ns[op] += ns
        self.hist[op][ns.bit_length()] += 1

    @property
    def calls(self) -> list[int]:
        """Calls per op id."""
        return [sum(h) for h in self.hist]

    def histogram(self, op: int) -> list[int]:
        """Op ``op``'s latency histogram in :data:`HIST_BUCKETS` buckets (the last one takes
        everything longer)."""
        h = self.hist[op]
        return [*h[: HIST_BUCKETS - 1], sum(h[HIST_BUCKETS - 1 :])]

    def work_call(self, op: int, args: tuple, data: bytes, ns: int) -> None:
        """A call of an op in :attr:`work_ops` succeeded with ``args`` and ``data``, and ran
        for ``ns``: a kernel launched, or bytes copied."""
        kind, at = self.work_ops[op]
        if kind == "launch":
            self.launches += 1
            if self.inline:
                self.work("launch", self.kernel_name(args[at]), ns)
            return
        self.bytes[kind] += len(data) if at < 0 else args[at]

    @property
    def copy_ns(self) -> int:
        """GPU time in copies and memsets since the session started."""
        if self.inline:
            return sum(self.call_ns[i] for i in self._copy_ops)
        return self._reported_copy_ns

    def work(self, kind: str, name: str, ns: int, now: int = 0) -> None:
        """GPU work of ``kind`` (``"launch"``: kernel ``name``; else a copy or memset) that
        took ``ns`` and completed at ``now`` (0: now). Inline, copies are not reported here
        (their calls' time is theirs)."""
        now = now or self.clock()
        s = self.slots[-1]
        if now - s.start >= self.slot_ns:
            s = self._rotate(now)
        if kind != "launch":
            self._reported_copy_ns += ns
            return
        self.kernel_ns += ns
        s.kernel_ns += ns
        e = s.kernels.get(name)
        if e is None:
            s.kernels[name] = [ns, 1]
        else:
            e[0] += ns
            e[1] += 1

    def _rotate(self, now: int) -> _Slot:
        s = _Slot(now - now % self.slot_ns, self.copy_ns)
        self.slots.append(s)
        self._expire(now)
        return s

    def _expire(self, now: int) -> None:
        """Drop the slots wholly older than the window."""
        oldest = self._window_start(now)
        while self.slots and self.slots[0].start < oldest:
            self.slots.popleft()

    def _window_start(self, now: int) -> int:
        """Where the window begins: the start of the slot that holds ``now - window``."""
        edge = now - self.window_ns
        return edge - edge % self.slot_ns

    # ---- reading -------------------------------------------------------------------------
    def profile(self, now: int = 0) -> dict[str, Any]:
        """The window's profile as plain data (see :func:`profile_view`)."""
        now = now or self.clock()
        if now - self.slots[-1].start >= self.slot_ns:
            self._rotate(now)
        lo = max(self._window_start(now), self.started)
        kernels: dict[str, list[int]] = {}
        kernel_ns = 0
        copy_ns = self.copy_ns - self.slots[0].copy_mark
        for s in self.slots:
            kernel_ns += s.kernel_ns
            for name, (ns, n) in s.kernels.items():
                e = kernels.setdefault(name, [0, 0])
                e[0] += ns
                e[1] += n
        top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:TOP_KERNELS]
        return {
            "window_s": self.window_ns / 1e9,
            "span_ns": max(now - lo, 1),
            "kernel_ns": kernel_ns,
            "copy_ns": copy_ns,
            "kernels": [[name, ns, n] for name, (ns, n) in top],
        }

    def snapshot(self, now: int = 0) -> dict[str, Any]:
        """Everything the daemon exports, as JSON-able data."""
        calls = {
            self.names[i]: [c, self.call_ns[i], self.histogram(i)]
            for i, c in enumerate(self.calls)
            if c
        }
        return {
            "calls": calls,
            "launches": self.launches,
            "kernel_ns": self.kernel_ns,
            "copy_ns": self.copy_ns,
            "bytes": dict(self.bytes),
            "inline_timing": self.inline,
            "profile": self.profile(now),
        }


def profile_view(p: dict[str, Any]) -> dict[str, Any]:
    """A snapshot's ``profile`` in seconds and shares: what ``crane profile`` shows.

    ``idle`` is the rest of the span; kernels and copies that overlapped (several streams on
    a real GPU) can add up to more than the span, so the shares are clamped to it."""
    span = p["span_ns"]
    k = min(p["kernel_ns"] / span, 1.0)
    c = min(p["copy_ns"] / span, 1.0 - k)
    return {
        "window_s": p["window_s"],
        "span_s": span / 1e9,
        "kernel_s": p["kernel_ns"] / 1e9,
        "copy_s": p["copy_ns"] / 1e9,
        "kernel_share": k,
        "copy_share": c,
        "idle_share": max(0.0, 1.0 - k - c),
        "kernels": [
            {"name": name, "gpu_s": ns / 1e9, "launches": n, "mean_s": ns / n / 1e9 if n else 0.0}
            for name, ns, n in p["kernels"]
        ],
    }
