"""The call table is consistent and drives the worker's dispatch."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from crane.api.ops import OPS, OPS_BY_ID, OPS_BY_NAME, Kind, LaunchConfig
from crane.engine.model import SessionDevice


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
        fn = getattr(SessionDevice, o.handler)
        n = len(inspect.signature(fn).parameters) - 1  # self
        assert n == len(o.args) + (1 if o.data_in else 0), o.name


def test_writes_name_device_pointer_args() -> None:
    for o in OPS:
        kinds = {p.name: p.kind for p in o.args}
        for w in o.writes:
            assert kinds[w] is Kind.DEVPTR, (o.name, w)


GOLDEN = Path(__file__).with_name("op_ids.golden")


def _golden() -> list[tuple[int, str]]:
    rows = []
    for line in GOLDEN.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            id_, name = line.split()
            rows.append((int(id_), name))
    return rows


def test_every_op_id_is_pinned_by_the_golden_file() -> None:
    """Append-only: an id in the golden file keeps its name forever (retired ops included), no
    id or name is issued twice, and a new op must be appended there with a higher id."""
    rows = _golden()
    ids = [i for i, _ in rows]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), "golden ids reordered or reused"
    assert len({n for _, n in rows}) == len(rows), "a name was given a second id"
    for id_, name in rows:
        assert id_ in OPS_BY_ID, f"op {id_} ({name}) was removed: retire it instead"
        assert OPS_BY_ID[id_].name == name, f"op {id_} was {name}, now {OPS_BY_ID[id_].name}"
    unpinned = [o for o in OPS if o.id not in dict(rows)]
    assert not unpinned, f"append {[(o.id, o.name) for o in unpinned]} to {GOLDEN.name}"
    assert all(o.id > max(ids) for o in unpinned)


def test_teardown_entry_points_send_only_teardown_ops() -> None:
    """What the guest still serves after a sticky fault, the worker still runs."""
    from crane.api.driver_spec import SPEC

    teardown_ops = {o.name for o in OPS if o.teardown}
    for e in SPEC:
        for name in e.sends:
            assert name in OPS_BY_NAME, (e.name, name)
            assert name in teardown_ops, f"{e.name} sends {name}, which the worker refuses"
        assert not e.sends or e.teardown, e.name
    sent = {n for e in SPEC for n in e.sends}
    assert teardown_ops - sent == {"SESSION_CLOSE"}, teardown_ops - sent


def test_dispatch_binds_each_op_to_its_handler_by_name() -> None:
    from crane.engine.dispatch import bind

    class Device:
        def launch(self, function, stream, config, params):  # type: ignore[no-untyped-def]
            """Arguments in the wrong order: refused at start, not misread per call."""

    with pytest.raises(RuntimeError, match="does not take op LAUNCH's arguments"):
        bind(Device(), OPS_BY_NAME["LAUNCH"])  # type: ignore[arg-type]


def test_launch_configuration_is_one_value() -> None:
    op = OPS_BY_NAME["LAUNCH_COOPERATIVE"]
    config = LaunchConfig((4, 2, 1), (128, 1, 1), 4096)
    raw = op.pack(7, config, 3)
    assert op.unpack(raw) == (7, config, 3)
    assert len(raw) == 8 + 7 * 4 + 8  # the same bytes as seven separate u32 fields


def test_cluster_launch_carries_dims_and_flags_after_the_config() -> None:
    """LAUNCH_CLUSTER is LAUNCH's arguments followed by the cluster shape and flags, so the
    config still decodes as one value wherever it sits."""
    op = OPS_BY_NAME["LAUNCH_CLUSTER"]
    config = LaunchConfig((8, 4, 1), (64, 1, 1), 0)
    raw = op.pack(7, config, 3, 2, 2, 1, 3)
    assert op.unpack(raw) == (7, config, 3, 2, 2, 1, 3)
    assert op.decoder(raw) == op.unpack(raw)
    assert op.param_names == (
        "function", "config", "stream", "cluster_x", "cluster_y", "cluster_z", "flags", "params"
    )  # fmt: skip


def test_kinds_sharing_a_layout_stay_distinct() -> None:
    assert Kind.HANDLE is not Kind.DEVPTR and Kind.HANDLE.code == Kind.DEVPTR.code
    assert "dst:DEVPTR" in OPS_BY_NAME["MEMSET"].signature()
