"""The call table is consistent and drives the worker's dispatch."""

from __future__ import annotations

import struct

import pytest

from crane.api.ops import OPS, OPS_BY_ID, OPS_BY_NAME, Kind
from crane.worker.executor import Executor


def test_ids_unique_positive_and_names_upper() -> None:
    assert len({o.id for o in OPS}) == len(OPS)
    assert all(o.id > 0 and o.name.isupper() for o in OPS)
    assert OPS_BY_ID[1] is OPS_BY_NAME["SESSION_CLOSE"]


def test_ids_are_append_only() -> None:
    # Pinned: changing an existing id breaks every deployed guest. Add new ops at the end.
    pinned = {
        "SESSION_CLOSE": 1,
        "MEM_MAP_CHUNK": 5,
        "MEMCPY_HTOD": 10,
        "MODULE_LOAD": 25,
        "LAUNCH": 28,
    }
    for name, id_ in pinned.items():
        assert OPS_BY_NAME[name].id == id_
    assert [o.id for o in OPS] == sorted(o.id for o in OPS)


def test_pack_round_trip_and_malformed_args_raise() -> None:
    op = OPS_BY_NAME["MEMSET"]
    raw = op.pack(0x2000_0000_0000, 0xDEADBEEF, 4, 10, 7)
    assert op.unpack(raw) == (0x2000_0000_0000, 0xDEADBEEF, 4, 10, 7)
    with pytest.raises(struct.error):
        op.unpack(raw[:-1])
    elapsed = OPS_BY_NAME["EVENT_ELAPSED"]
    assert elapsed.unpack_results(elapsed.pack_results(1.5)) == (1.5,)


def test_every_op_has_a_worker_handler_with_matching_arity() -> None:
    import inspect

    for o in OPS:
        fn = getattr(Executor, o.handler)
        n = len(inspect.signature(fn).parameters) - 1  # self
        assert n == len(o.args) + (1 if o.data_in else 0), o.name


def test_writes_name_device_pointer_args() -> None:
    for o in OPS:
        kinds = {p.name: p.kind for p in o.args}
        for w in o.writes:
            assert kinds[w] is Kind.DEVPTR, (o.name, w)
