"""The protocol fingerprint covers every proto file the guest and the daemons speak."""

from __future__ import annotations

from crane.codegen.protos import PROTO_ROOT
from crane.wire.fingerprint import proto_modules


def test_every_proto_file_is_hashed() -> None:
    files = sorted(p.stem for p in (PROTO_ROOT / "crane" / "v1").glob("*.proto"))
    assert [m.removeprefix("crane.v1.").removesuffix("_pb2") for m in proto_modules()] == files
    assert "peer" in files  # daemon to daemon: a migration between builds is refused too
