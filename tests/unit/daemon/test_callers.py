"""Who is calling: unix ids and certificates mapped to tenants and roles, and the signed
credential of the ident handshake (pure logic; the integration tests run it against craned)."""

from __future__ import annotations

import pytest

from crane.daemon.callers import Caller, from_cert, from_unix
from crane.daemon.ident import Signer, UnixIds
from crane.daemon.tenants import TenantConfig

DAEMON = 990  # the daemon's euid in these tests


def ids(uid: int, gid: int = 100, groups: tuple[int, ...] = ()) -> UnixIds:
    return UnixIds(pid=4242, uid=uid, gid=gid, groups=groups)


TENANTS = {
    "alice": TenantConfig("alice", uids=[1001], certs=["alice", "alice.example"]),
    "lab": TenantConfig("lab", gids=[500]),
    "ops": TenantConfig("ops", uids=[1500], certs=["ops"], operator=True),
}


def test_without_tenants_each_uid_is_its_own_tenant_and_root_or_the_daemon_operates() -> None:
    user = Caller("uid:1001", False, "uid 1001", unix=True, uid=1001)
    assert from_unix(ids(1001), {}, DAEMON) == user
    assert from_unix(ids(0), {}, DAEMON) == Caller("uid:0", True, "uid 0", unix=True, uid=0)
    assert from_unix(ids(DAEMON), {}, DAEMON) == Caller(
        f"uid:{DAEMON}", True, f"uid {DAEMON}", unix=True, uid=DAEMON
    )


def test_with_tenants_uid_then_primary_gid_then_supplementary_groups() -> None:
    alice = from_unix(ids(1001, gid=500), TENANTS, DAEMON)  # its uid wins over its group
    assert isinstance(alice, Caller) and alice.tenant == "alice" and not alice.operator
    by_gid = from_unix(ids(2000, gid=500), TENANTS, DAEMON)
    assert isinstance(by_gid, Caller) and by_gid.tenant == "lab"
    by_group = from_unix(ids(2001, gid=100, groups=(7, 500)), TENANTS, DAEMON)
    assert isinstance(by_group, Caller) and by_group.tenant == "lab"
    ops = from_unix(ids(1500), TENANTS, DAEMON)
    assert isinstance(ops, Caller) and ops.tenant == "ops" and ops.operator


def test_with_tenants_an_unlisted_uid_is_refused_by_uid_but_root_stays_operator() -> None:
    why = from_unix(ids(3000, gid=3000), TENANTS, DAEMON)
    assert why == "uid 3000 (gid 3000) is in no tenant of this daemon"
    root = from_unix(ids(0, gid=0), TENANTS, DAEMON)
    assert isinstance(root, Caller) and root.operator and root.tenant == "uid:0"
    daemon = from_unix(ids(DAEMON, gid=500), TENANTS, DAEMON)  # in lab by group: still operator
    assert isinstance(daemon, Caller) and daemon.tenant == "lab" and daemon.operator


def test_certificates_by_common_name_or_any_alternative_name() -> None:
    by_cn = from_cert("alice", [], TENANTS, [])
    assert isinstance(by_cn, Caller) and by_cn.tenant == "alice" and by_cn.how == "cert CN=alice"
    by_san = from_cert("someone", ["x.example", "alice.example"], TENANTS, [])
    assert isinstance(by_san, Caller) and by_san.tenant == "alice"
    ops = from_cert("ops", [], TENANTS, [])
    assert isinstance(ops, Caller) and ops.operator and not ops.unix
    assert from_cert("mallory", ["m.example"], TENANTS, []) == (
        "certificate CN=mallory is in no tenant of this daemon"
    )


def test_certificates_without_tenants_and_peer_daemons() -> None:
    assert from_cert("", [], {}, []) == "the client certificate names no one (no CN, no SAN)"
    bob = from_cert("bob", ["bob"], {}, ["craned-b"])
    assert bob == Caller("cert:bob", False, "cert CN=bob")
    peer = from_cert("craned-b", ["craned-b", "127.0.0.1"], TENANTS, ["craned-b"])
    assert peer == Caller("", False, "peer craned-b", peer=True)  # a peer, no tenant
    peer_no_tenants = from_cert("x", ["craned-b"], {}, ["craned-b"])
    assert isinstance(peer_no_tenants, Caller) and peer_no_tenants.peer
    assert from_cert("craned-c", [], TENANTS, ["craned-b"]) == (
        "certificate CN=craned-c is in no tenant of this daemon nor one of its peers"
    )


def test_credentials_verify_only_with_the_issuing_key_and_until_they_expire() -> None:
    signer = Signer(ttl_s=60)
    cred = signer.issue(ids(1001, groups=(5, 6)), now=1000.0)
    assert signer.verify(cred, now=1059.0) == ids(1001, groups=(5, 6))
    with pytest.raises(ValueError, match="expired"):
        signer.verify(cred, now=1061.0)
    with pytest.raises(ValueError, match="not one this daemon issued"):
        Signer().verify(cred, now=1000.0)  # another daemon (or a restarted one)
    forged = cred.replace(b'"uid":1001', b'"uid":0')
    with pytest.raises(ValueError, match="not one this daemon issued"):
        signer.verify(forged, now=1000.0)
    with pytest.raises(ValueError):
        signer.verify(b"short", now=1000.0)
