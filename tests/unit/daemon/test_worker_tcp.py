"""Workers' TCP endpoints: the port range, its allocation, and where a guest dials what it is
offered (crane.daemon.worker_tcp, crane.guest.transport)."""

from __future__ import annotations

import socket

import pytest

from crane.daemon.tenants import TenantConfig
from crane.daemon.worker_tcp import WorkerTcp, parse_port_range
from crane.guest.transport import worker_target


@pytest.mark.parametrize(
    ("value", "expected"),
    [("7481-7484", range(7481, 7485)), ([9000, 9000], range(9000, 9001)), ("", range(0))],
)
def test_port_ranges(value: object, expected: range) -> None:
    assert parse_port_range(value) == expected


@pytest.mark.parametrize("bad", ["7481", "9-8", "0-10", "1-70000", [1, 2, 3], "a-b", 7481])
def test_bad_port_ranges_are_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match="worker_tcp_ports"):
        parse_port_range(bad)


def test_allocation_skips_ports_in_use_and_reuses_freed_ones() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        if port + 1 >= 65536:
            pytest.skip("the system's port is the last one")
        tcp = WorkerTcp("127.0.0.1", range(port, port + 2))
        got = tcp.allocate()
        assert got == port + 1  # the held one is skipped
        assert tcp.allocate() == 0  # none left: the session uses the relay
        tcp.free(got)
        assert tcp.allocate() == got


def test_worker_fields_carry_the_caller_rules() -> None:
    tcp = WorkerTcp(
        "127.0.0.1",
        range(1, 2),
        "c.pem",
        "c.key",
        "ca.pem",
        {"t": TenantConfig("t", uids=[5], certs=["alice"], operator=True)},
        ["craned-b"],
    )
    fields = tcp.worker_fields(7481)
    assert fields["tcp_listen"] == "127.0.0.1:7481"
    rules = fields["tcp_rules"]
    assert rules["tenants"] == {"t": {"certs": ["alice"], "operator": True}}
    assert (rules["cert"], rules["key"], rules["ca"]) == ("c.pem", "c.key", "ca.pem")
    assert rules["peers"] == ["craned-b"] and rules["insecure_tcp"] is False


@pytest.mark.parametrize(
    ("daemon", "offered", "target"),
    [
        ("tcp://10.0.0.5:7480", "tcp://*:7490", "10.0.0.5:7490"),
        ("tcp://gpu.example:7480", "tcp://*:7490", "gpu.example:7490"),
        ("gpu.example:7480", "tcp://*:7490", "gpu.example:7490"),
        (
            "unix:///run/crane/crane.sock",
            "unix:///run/crane/sessions/s.sock",
            "unix:/run/crane/sessions/s.sock",
        ),
        ("tcp://10.0.0.5:7480", "unix:///run/crane/sessions/s.sock", ""),  # another host's path
        ("unix:///run/crane/crane.sock", "tcp://*:7490", ""),
        ("vm://10.0.2.100:7000", "tcp://*:7490", ""),  # a VM reaches only its forward
        ("tcp://10.0.0.5:7480", "", ""),
    ],
)
def test_where_a_guest_dials_its_worker(daemon: str, offered: str, target: str) -> None:
    assert worker_target(daemon, offered) == target
