"""``vm://HOST:PORT``: a VM guest's daemon address (crane/wire/address.py, channel.py)."""

from __future__ import annotations

import pytest

from crane.wire.address import is_vm, to_grpc_target


def test_vm_addresses_are_host_and_port() -> None:
    assert to_grpc_target("vm://10.0.2.100:7000") == "10.0.2.100:7000"
    assert to_grpc_target(" vm://127.0.0.1:1 ") == "127.0.0.1:1"
    assert is_vm("vm://10.0.2.100:7000") and not is_vm("tcp://10.0.2.100:7000")
    assert not is_vm("unix:///run/crane/crane.sock")


@pytest.mark.parametrize(
    "bad", ["vm://10.0.2.100", "vm://:7000", "vm://h:0", "vm://h:70000", "vm://h:x", "vm://h/p:1"]
)
def test_malformed_vm_addresses_are_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match="vm://HOST:PORT"):
        to_grpc_target(bad)


def test_unknown_schemes_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown scheme"):
        to_grpc_target("vsock://2:7000")
