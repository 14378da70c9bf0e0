"""The worker's accounting (crane.engine.meter): histogram buckets, the sliding window, the
work each metered op counts, and the profile's shares."""

from __future__ import annotations

import pytest

from crane.api.ops import OPS, OPS_BY_NAME
from crane.engine.meter import HIST_BUCKETS, Meter, bucket_upper_s, profile_view

S = 1_000_000_000  # ns


class Clock:
    """A hand-moved clock (ns)."""

    def __init__(self, t: int = 1000 * S) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def meter(clock: Clock, window_s: float = 10.0, inline: bool = True) -> Meter:
    names = {1: "heavy", 2: "light"}
    return Meter(OPS, names.__getitem__, window_s=window_s, inline=inline, clock=clock)


def op(name: str) -> int:
    return OPS_BY_NAME[name].id


def test_every_launch_op_is_metered_as_a_launch_and_copies_by_direction() -> None:
    """The table says what each op counts as: every launch (writes through its parameters)
    is metered as one, and each copy direction names the argument it sizes."""
    for o in OPS:
        if o.writes_via_params:
            assert o.meter == "launch", o.name
        assert o.meter in ("", "launch", "h2d", "d2h", "d2d", "memset"), o.name
    m = meter(Clock())
    assert set(m.work_ops) == {o.id for o in OPS if o.meter and o.meter != "memset"}


def test_histogram_bucket_is_the_bit_length_of_the_duration() -> None:
    m = meter(Clock())
    i = op("STREAM_SYNCHRONIZE")
    for ns in (1, 1023, 1024, 5000, 1 << 45):
        m.call(i, ns)
    h = m.histogram(i)
    assert len(h) == HIST_BUCKETS
    assert h[1] == 1  # 1 ns < 2**1
    assert h[10] == 1  # 1023 < 2**10
    assert h[11] == 1  # 1024 < 2**11
    assert h[13] == 1  # 5000 < 2**13 = 8192
    assert h[HIST_BUCKETS - 1] == 1  # past the last bucket: the last one
    assert m.calls[i] == 5 and m.call_ns[i] == 1 + 1023 + 1024 + 5000 + (1 << 45)
    assert bucket_upper_s(10) == pytest.approx(1.024e-6)


def test_launches_and_copies_count_what_the_calls_did() -> None:
    clock = Clock()
    m = meter(clock)
    launch = op("LAUNCH")
    for _ in range(3):
        m.work_call(launch, (1, None, 0), b"", 2 * S // 10)  # heavy: 0.2 s each
    m.work_call(launch, (2, None, 0), b"", S // 100)  # light: 10 ms
    m.work_call(op("MEMCPY_HTOD"), (0x10, 0), b"x" * 300, 5)
    m.work_call(op("MEMCPY_DTOH"), (0x10, 4096, 0), b"", 5)
    m.work_call(op("MEMCPY_DTOD"), (0x20, 0x10, 77, 0), b"", 5)
    assert m.launches == 4
    assert m.bytes == {"h2d": 300, "d2h": 4096, "d2d": 77}
    assert m.kernel_ns == 6 * S // 10 + S // 100
    clock.t += 2 * S
    p = profile_view(m.profile())
    assert [k["name"] for k in p["kernels"]] == ["heavy", "light"]
    heavy = p["kernels"][0]
    assert heavy["launches"] == 3 and heavy["mean_s"] == pytest.approx(0.2)


def test_copy_time_is_the_copy_and_memset_calls_time_and_shares_add_up() -> None:
    clock = Clock()
    m = meter(clock)
    clock.t += 4 * S
    m.call(op("MEMSET"), S)  # the codec's loop counts every call and its time
    m.call(op("MEMCPY_HTOD"), S)
    m.call(op("STREAM_SYNCHRONIZE"), S)  # not copy time
    m.work("launch", "heavy", 2 * S)
    assert m.copy_ns == 2 * S
    p = profile_view(m.profile())
    assert p["span_s"] == pytest.approx(4.0)
    assert p["kernel_share"] == pytest.approx(0.5)
    assert p["copy_share"] == pytest.approx(0.5)
    assert p["idle_share"] == pytest.approx(0.0)


def test_work_older_than_the_window_leaves_the_profile() -> None:
    clock = Clock()
    m = meter(clock, window_s=10)
    m.work("launch", "heavy", S)
    clock.t += 5 * S
    m.work("launch", "light", S // 2)
    p = m.profile()
    assert {k[0] for k in p["kernels"]} == {"heavy", "light"}
    clock.t += 7 * S  # heavy's slot is now past the window, light's is not
    p = m.profile()
    assert [k[0] for k in p["kernels"]] == ["light"]
    assert p["span_ns"] <= 11 * S  # the window (and the slot its edge falls in), no more
    clock.t += 20 * S
    p = profile_view(m.profile())
    assert p["kernels"] == [] and p["idle_share"] == 1.0
    assert m.kernel_ns == S + S // 2  # the totals since the start stay


def test_an_async_backend_reports_gpu_time_itself() -> None:
    """With a backend whose work is asynchronous, a launch counts but its call's time is not
    GPU time; the time comes from the backend's reports."""
    clock = Clock()
    m = meter(clock, inline=False)
    m.work_call(op("LAUNCH"), (1, None, 0), b"", 50)
    assert m.launches == 1 and m.kernel_ns == 0
    m.work("launch", "heavy", 3 * S)
    m.work("h2d", "", S)
    m.call(op("MEMCPY_HTOD"), 40)  # an enqueue: not copy time
    assert m.kernel_ns == 3 * S and m.copy_ns == S


def test_shares_are_clamped_when_overlapping_work_exceeds_the_span() -> None:
    p = profile_view({"window_s": 60, "span_ns": 10, "kernel_ns": 8, "copy_ns": 8, "kernels": []})
    assert p["kernel_share"] == 0.8 and p["copy_share"] == pytest.approx(0.2)
    assert p["idle_share"] == 0.0


def test_snapshot_has_only_the_ops_called() -> None:
    m = meter(Clock())
    m.call(op("LAUNCH"), 100)
    snap = m.snapshot()
    assert list(snap["calls"]) == ["LAUNCH"]
    count, ns, hist = snap["calls"]["LAUNCH"]
    assert (count, ns, sum(hist)) == (1, 100, 1)
