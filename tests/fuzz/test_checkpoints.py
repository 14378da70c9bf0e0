"""Checkpoint files fuzzed through Control.Restore: mutations (truncation, bit flips, huge
length words, insertions, deletions; half of them aimed at the head, where the sections'
lengths and the metadata live) of a real checkpoint of a session that used a module, streams,
events and device memory. Each restore is refused with a status that names a refusal (never
INTERNAL: an exception the daemon did not expect) or succeeds, in time; a restored session is
attached and closed again; the daemon lives and nothing is left charged."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crane.api.ops import OPS_BY_NAME
from crane.cli.control_client import ControlClient
from crane.guest.session import GuestSession
from crane.state.checkpoint import CheckpointReader, CheckpointWriter, Kind, read_meta
from tests.fuzz.conftest import FuzzEnv, fuzz_settings
from tests.fuzz.rawguest import RawSession, StreamEnded
from tests.fuzz.strategies import M64, Mutation, mutate, mutations

RESTORE_TIMEOUT_S = 120.0
#: What a refused restore may answer: anything that says why, not INTERNAL or a time-out.
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.PERMISSION_DENIED,
}


@dataclass
class Base:
    data: bytes
    session_id: str


@pytest.fixture(scope="module")
def base(fuzz_env: FuzzEnv) -> Iterator[Base]:
    """A checkpoint of a session that did real work, its session closed afterwards."""
    path = fuzz_env.checkpoint_path("fuzz-base.ckpt")
    with GuestSession(fuzz_env.daemon.address, client="fuzz-checkpoint") as s:
        mod = s.module_load(fuzz_env.images["fatbin"])
        fn = s.module_get_function(mod, "axpb")
        stream, event = s.stream_create(), s.event_create()
        n = 1024
        x = np.arange(n, dtype=np.int32)
        dx, dy = s.mem_alloc(n * 4), s.mem_alloc(n * 4)
        s.memcpy_htod(dx, x.tobytes(), stream=stream)
        s.launch(fn, grid=(n // 128,), block=(128,), params=[dx, dy, 3, 4, n], stream=stream)
        s.event_record(event, stream)
        s.synchronize()
        with ControlClient(fuzz_env.daemon.address, timeout=120) as c:
            c.checkpoint(s.session_id, str(path), release=False)
        sid = s.session_id
    fuzz_env.wait_no_sessions()  # a closed session leaves once its worker is stopped
    yield Base(path.read_bytes(), sid)


def _close_restored(fuzz_env: FuzzEnv, path: Path) -> None:
    """A restore that succeeded: its guest (the id and token the restored file holds, which a
    resealed META may have changed) attaches and closes the session."""
    with open(path, "rb") as f:
        ident = read_meta(f)["session"]
    token = bytes.fromhex(ident["token"])
    s = RawSession.attach(fuzz_env.daemon.address, str(ident["id"]), token)
    try:
        s.send(s.batch([(OPS_BY_NAME["SESSION_CLOSE"].id, b"", b"")]))
        with contextlib.suppress(StreamEnded):  # the close's answer, or the stream's end
            s.wait_for(s.seq, 60)
    finally:
        s.close()
    fuzz_env.wait_no_sessions()


#: Values a JSON leaf is replaced with in a resealed section.
_JSON_VALUES = [None, True, -1, 0, 1, M64, 1 << 64, 1 << 63, -(1 << 63), 1e308, "", "x" * 300,
                [], {}, [0] * 8, {"a": 1}]  # fmt: skip


def _leaves(value: object, path: tuple = ()) -> list[tuple]:
    """Paths to every value inside a JSON document (containers included)."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _leaves(v, (*path, i))
    return out


def _replace(doc: object, path: tuple, new: object, delete: bool) -> object:
    if not path:
        return new
    parent = doc
    for key in path[:-1]:
        parent = parent[key]  # type: ignore[index]
    if (delete and isinstance(parent, dict)) or (delete and isinstance(parent, list)):
        del parent[path[-1]]
    else:
        parent[path[-1]] = new  # type: ignore[index]
    return doc


@dataclass(frozen=True)
class Reseal:
    """Damage one section's payload and write it back with a valid checksum, so the damage
    reaches what reads the payload (JSON of META/OBJECTS/END, memory addresses and lengths,
    images, replies) instead of stopping at the CRC."""

    section: float  # which, as a fraction of the section count
    at: float  # which JSON value, as a fraction of their count
    value: int  # index into _JSON_VALUES
    delete: bool
    raw: list[Mutation]  # for binary payloads


reseal = st.builds(
    Reseal,
    st.floats(0, 1),
    st.floats(0, 1),
    st.integers(0, len(_JSON_VALUES) - 1),
    st.booleans(),
    mutations,
)


def resealed(data: bytes, how: Reseal) -> bytes:
    reader = CheckpointReader(io.BytesIO(data), "base")
    sections = list(reader.sections())
    target = min(int(how.section * len(sections)), len(sections) - 1)
    out = io.BytesIO()
    w = CheckpointWriter(out, level=None)
    try:
        for i, sec in enumerate(sections):
            payload = sec.payload
            if i == target:
                if sec.kind in (Kind.META, Kind.OBJECTS, Kind.END):
                    doc = json.loads(payload)
                    paths = _leaves(doc)
                    path = paths[min(int(how.at * len(paths)), len(paths) - 1)]
                    doc = _replace(doc, path, _JSON_VALUES[how.value], how.delete)
                    payload = json.dumps(doc).encode()
                else:
                    payload = mutate(payload, how.raw)
            w.section(sec.kind, payload, sec.flags)
    finally:
        w.abort()
    return out.getvalue()


@fuzz_settings("checkpoints")
@given(how=mutations | reseal)
def test_mutated_checkpoint_files(
    fuzz_env: FuzzEnv, base: Base, how: list[Mutation] | Reseal
) -> None:
    path = fuzz_env.checkpoint_path("fuzz-case.ckpt")
    path.write_bytes(
        resealed(base.data, how) if isinstance(how, Reseal) else mutate(base.data, how)
    )
    with ControlClient(fuzz_env.daemon.address, timeout=RESTORE_TIMEOUT_S) as c:
        try:
            c.restore(str(path))
        except grpc.RpcError as e:
            assert e.code() in REFUSALS, f"{e.code().name}: {e.details()}"
            assert e.details(), "a refusal without a reason"
            assert "internal error" not in e.details(), (  # an exception nobody expected: a bug
                f"{e.details()}\n{fuzz_env.daemon.log_text()[-6000:]}"
            )
        else:
            _close_restored(fuzz_env, path)
    fuzz_env.check_daemon()


def test_the_unmutated_checkpoint_restores(fuzz_env: FuzzEnv, base: Base) -> None:
    path = fuzz_env.checkpoint_path("fuzz-case.ckpt")
    path.write_bytes(base.data)
    for _ in range(3):  # restorable again as soon as the restored session closed
        with ControlClient(fuzz_env.daemon.address, timeout=RESTORE_TIMEOUT_S) as c:
            assert c.restore(str(path)).session_id == base.session_id
        _close_restored(fuzz_env, path)


@pytest.mark.parametrize(
    "path, value, delete",
    [
        (("calls",), None, True),
        (("done_seq",), 1e308, False),
        (("contexts",), 5, False),
        (("modules", 0), "x", False),
    ],
    ids=["missing-key", "float-count", "int-for-list", "string-for-object"],
)
def test_a_malformed_object_graph_is_refused_by_name(
    fuzz_env: FuzzEnv, base: Base, path: tuple, value: object, delete: bool
) -> None:
    """Found by the fuzzer: a resealed OBJECTS section with a key missing or a value of the
    wrong type was refused as "internal error: KeyError('calls')" (an exception logged as a
    bug) instead of as a damaged file."""
    reader = CheckpointReader(io.BytesIO(base.data), "base")
    out = io.BytesIO()
    w = CheckpointWriter(out, level=None)
    for sec in reader.sections():
        payload = sec.payload
        if sec.kind == Kind.OBJECTS:
            payload = json.dumps(_replace(json.loads(payload), path, value, delete)).encode()
        w.section(sec.kind, payload, sec.flags)
    w.abort()
    file = fuzz_env.checkpoint_path("fuzz-objects.ckpt")
    file.write_bytes(out.getvalue())
    with (
        ControlClient(fuzz_env.daemon.address, timeout=RESTORE_TIMEOUT_S) as c,
        pytest.raises(grpc.RpcError) as e,
    ):
        c.restore(str(file))
    assert "OBJECTS section 2 is malformed" in e.value.details(), e.value.details()
    fuzz_env.wait_no_sessions()
