"""The guest protocol fuzzed against a live daemon: every op of the call table with random and
boundary arguments in batches on real sessions (direct and relayed), raw and damaged CallBatch
bytes, and sessions closed mid-batch. Every case must be answered with a CUDA result (never
CUDA_ERROR_UNKNOWN), in time, with the session still serving; the daemon must live through all
of it while the bystander guest (conftest) keeps computing right answers."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from crane.api.ops import OPS, OPS_BY_NAME
from crane.v1 import guest_pb2
from crane.wire.batch_flags import EXPECTS_REPLY
from tests.fuzz.conftest import FuzzEnv, fuzz_settings
from tests.fuzz.harness import Fuzzer
from tests.fuzz.strategies import FUZZ_OPS, Call, call, mutate, mutations, wire

_CHECK_DAEMON_EVERY = 500
_CLOSE = OPS_BY_NAME["SESSION_CLOSE"]


def _wire(fuzzer: Fuzzer, calls: list[Call]) -> list[tuple[int, bytes, bytes]]:
    assert fuzzer.pool is not None
    return [wire(c, fuzzer.pool, fuzzer.image) for c in calls]


@fuzz_settings("ops")
@given(calls=st.lists(call(), min_size=1, max_size=6))
def test_every_op_with_random_and_boundary_arguments(
    fuzzer: Fuzzer, fuzz_env: FuzzEnv, calls: list[Call]
) -> None:
    fuzzer.run(_wire(fuzzer, calls))
    if fuzzer.cases % _CHECK_DAEMON_EVERY == 0:
        fuzz_env.check_daemon()


@dataclass(frozen=True)
class RawCall:
    seq: int  # < 0: relative to the session's next sequence number; else absolute
    op: int
    args: bytes
    data: bytes


_seq = st.sampled_from([-1, -2, -3, 0, 1]) | st.integers(-64, 1 << 20)
_unknown = max(o.id for o in OPS) + 1  # the first id the table has not issued
_op = st.sampled_from(
    [0, _unknown, 255, 1 << 31, (1 << 32) - 1] + [o.id for o in OPS if o is not _CLOSE]
)
_weird = st.tuples(
    st.lists(
        st.builds(RawCall, _seq, _op, st.binary(max_size=64), st.binary(max_size=64)), max_size=8
    ),
    st.sampled_from([0, EXPECTS_REPLY, 2, 0xFF, (1 << 32) - 1]),
    # 37 (not 0, which Hypothesis favours): one more call claims the end of the sequence space
    st.integers(0, 49),
)

raw_case = st.one_of(
    st.tuples(st.just("garbage"), st.binary(max_size=512)),
    st.tuples(st.just("flagged"), st.binary(max_size=512)),  # EXPECTS_REPLY first, then garbage
    st.tuples(st.just("damaged"), st.lists(call(), min_size=1, max_size=4), mutations),
    st.tuples(st.just("weird"), _weird),
    st.tuples(st.just("weird"), _weird),
    st.tuples(st.just("big"), st.sampled_from([64 << 10, 1 << 20, 4 << 20, 40 << 20])),
)


def _raw_bytes(fuzzer: Fuzzer, case: tuple) -> tuple[bytes, int]:
    """The bytes a raw case sends, and the highest sequence number they may carry."""
    s = fuzzer.session
    assert s is not None
    kind = case[0]
    if kind == "garbage":
        return case[1], 0
    if kind == "flagged":
        return b"\x08\x01" + case[1], 0
    if kind == "damaged":
        raw = s.batch(_wire(fuzzer, case[1]))
        return mutate(raw, case[2]), s.seq
    if kind == "big":
        b = guest_pb2.CallBatch(flags=EXPECTS_REPLY)
        b.calls.add(seq=s.seq + 1, op=10, args=b"\0" * 16, data=b"\1" * case[1])
        return b.SerializeToString(), s.seq + 1
    items, flags, claim_end = case[1]
    b = guest_pb2.CallBatch(flags=flags)
    top = 0
    if claim_end == 37:
        items = [*items, RawCall((1 << 64) - 1, 9, b"", b"")]
    for c in items:
        seq = s.seq + 1 - c.seq - 1 if c.seq < 0 else c.seq
        seq = max(seq, 0)
        top = max(top, seq)
        b.calls.add(seq=seq, op=c.op, args=c.args, data=c.data)
    return b.SerializeToString(), top


@fuzz_settings("raw")
@given(case=raw_case)
def test_garbage_truncated_and_oversized_batches(
    fuzzer: Fuzzer, fuzz_env: FuzzEnv, case: tuple
) -> None:
    s = fuzzer.session
    assert s is not None
    raw, top = _raw_bytes(fuzzer, case)
    s.send(raw)
    s.seq = max(s.seq, top)
    if s.seq >= 1 << 62:  # a batch claimed the end of the sequence space: nothing runs after it
        fuzzer.open()
        return
    fuzzer.run([])  # the session still answers, and the pool is usable
    if fuzzer.cases % _CHECK_DAEMON_EVERY == 0:
        fuzz_env.check_daemon()


@fuzz_settings("close")
@given(calls=st.lists(call() | st.just(None), min_size=1, max_size=6))
def test_batches_that_close_their_session(fuzzer: Fuzzer, calls: list[Call | None]) -> None:
    wired = [(_CLOSE.id, b"", b"") if c is None else wire(c, fuzzer.pool, fuzzer.image)
             for c in calls]  # fmt: skip
    if not any(c[0] == _CLOSE.id for c in wired):
        wired.append((_CLOSE.id, b"", b""))
    if fuzzer.run(wired, may_end=True) is not None:  # answered before the stream ended
        fuzzer.open()


def test_the_fuzz_covers_every_op() -> None:
    """The strategies draw from the whole table (a new op is fuzzed without a change here)."""
    assert {o.id for o in FUZZ_OPS} | {_CLOSE.id} == {o.id for o in OPS if not o.retired}
