"""Domain names, domain tables and who may act on a VM's session (crane/daemon/domains.py,
callers.py)."""

from __future__ import annotations

import pytest

from crane.api.errors import ProtocolError
from crane.daemon.callers import Caller, may_use
from crane.daemon.domains import DomainConfig, check_domain_name, domain_caller, resolve_group


@pytest.mark.parametrize("name", ["vm1", "web-01.prod", "a_b+c:d", "_x", "9" * 64])
def test_libvirt_names_are_accepted(name: str) -> None:
    assert check_domain_name(name) == name


@pytest.mark.parametrize("name", ["", "a/b", "../x", ".x", "-x", "a b", "é", "x" * 65, "a\nb"])
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        check_domain_name(name)


def test_domain_tables() -> None:
    assert DomainConfig.from_table("vm1", {}).effective_tenant == "domain:vm1"
    assert DomainConfig.from_table("vm1", {"tenant": "alice"}).effective_tenant == "alice"
    with pytest.raises(ValueError, match="unknown keys"):
        DomainConfig.from_table("vm1", {"tenant": "a", "cid": 3})
    with pytest.raises(ValueError, match=r"\[domains.a/b\]"):
        DomainConfig.from_table("a/b", {})
    with pytest.raises(ValueError, match="no group"):
        resolve_group("no-such-group-here")
    assert resolve_group("") == 0 and resolve_group("5") == 5


def test_a_domain_guest_is_never_an_operator_and_keeps_to_its_domain() -> None:
    g1 = domain_caller("vm1", "alice")
    assert not g1.operator and g1.domain == "vm1" and g1.uid is None
    may_use(g1, "alice", "s1", "vm1")
    with pytest.raises(ProtocolError) as e:
        may_use(g1, "alice", "s1", "vm2")  # same tenant, another VM
    assert e.value.status == "PERMISSION_DENIED"
    assert "domain vm2" in e.value.message and "domain vm1" in e.value.message
    with pytest.raises(ProtocolError, match="no domain"):
        may_use(g1, "alice", "s1", "")  # a host process's session
    host = Caller("alice", False, "uid 1001", unix=True, uid=1001)
    with pytest.raises(ProtocolError, match="domain vm1"):
        may_use(host, "alice", "s1", "vm1")  # a host process cannot take a VM's session
    may_use(Caller("uid:0", True, "uid 0", unix=True, uid=0), "alice", "s1", "vm1")  # operator


def test_a_certificate_naming_a_domain() -> None:
    from crane.daemon.callers import from_cert
    from crane.daemon.tenants import TenantConfig

    tenants = {"alice": TenantConfig("alice", certs=["guest"], operator=True)}
    got = from_cert("guest", ["urn:crane:domain:vm1"], tenants, ["guest"], lambda d: "t-" + d)
    assert isinstance(got, Caller)
    # the domain wins over the tenant and peer lists that name its CN: never operator nor peer
    assert (got.tenant, got.domain, got.operator, got.peer) == ("t-vm1", "vm1", False, False)
    got = from_cert("", ["urn:crane:domain:vm2", "dns.example"], {}, [])
    assert isinstance(got, Caller) and (got.tenant, got.domain) == ("domain:vm2", "vm2")
    assert "several domains" in str(
        from_cert("x", ["urn:crane:domain:a", "urn:crane:domain:b"], {}, [])
    )
    assert "not accepted" in str(from_cert("x", ["urn:crane:domain:../a"], {}, []))
    plain = from_cert("guest", ["urn:other:thing"], {}, [])
    assert isinstance(plain, Caller) and plain.domain == ""
