"""The daemon's side of quotas: limits written at start, slots tagged and cleared, what a
worker is told, and the kernel time limit a cuda device cannot keep."""

from __future__ import annotations

from pathlib import Path

from crane.daemon.quotas import Quotas
from crane.daemon.tenants import TenantConfig

GiB = 1 << 30


def _quotas(tmp_path: Path) -> Quotas:
    return Quotas(
        {
            "alice": TenantConfig("alice", memory=GiB, max_sessions=2, kernel_time_limit_s=5.0),
            "bob": TenantConfig("bob"),
        },
        tmp_path,
    )


def test_slots_are_tagged_and_cleared(tmp_path: Path) -> None:
    q = _quotas(tmp_path)
    q.assign(4, "alice")
    assert q.ledger.charge(4, GiB) is None
    assert q.ledger.charge(4, 1) is not None  # alice's limit, written at start
    assert q.memory("alice") == (GiB, GiB)
    q.clear(4)
    assert q.memory("alice") == (GiB, 0)
    q.assign(4, "stranger")  # a tenant the configuration does not name: no limits
    assert q.ledger.charge(4, 10 * GiB) is None
    assert q.memory("stranger") == (None, 0)


def test_what_workers_and_the_table_are_told(tmp_path: Path) -> None:
    q = _quotas(tmp_path)
    assert q.max_sessions() == {"alice": 2}
    fields = q.worker_fields("alice")
    assert fields["tenant"] == "alice" and fields["kernel_time_limit_s"] == 5.0
    assert fields["tenant_ledger"] == str(tmp_path / "tenants.ledger")
    assert q.worker_fields("bob")["kernel_time_limit_s"] == 0.0


def test_a_kernel_time_limit_with_a_cuda_device_is_refused_by_name(tmp_path: Path) -> None:
    q = _quotas(tmp_path)
    assert q.cuda_refusals(["sim", "sim"]) == []
    assert q.cuda_refusals(["sim", "cuda"]) == [
        "tenant alice sets kernel_time_limit_s, which the cuda backend does not enforce"
    ]
