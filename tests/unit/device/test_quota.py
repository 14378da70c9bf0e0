"""The tenant ledger and a session's memory account: limits across slots and processes, edge
cases at the limit, and releases that return every charge to zero."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.device.ledger import Ledger
from crane.device.quota import MemoryAccount, QuotaRefusal, TenantLedger

MiB = 1 << 20
GiB = 1 << 30
A, B = 1, 2  # tenant ids


@pytest.fixture
def tl(tmp_path: Path) -> TenantLedger:
    t = TenantLedger(tmp_path / "tenants.ledger")
    t.reset({A: 1 * GiB, B: None})
    return t


def test_limit_covers_every_slot_of_the_tenant(tl: TenantLedger) -> None:
    tl.assign(3, A)
    tl.assign(7, A)
    assert tl.charge(3, 600 * MiB) is None
    refusal = tl.charge(7, 500 * MiB)
    assert refusal == QuotaRefusal(limit=GiB, used=600 * MiB)
    assert tl.slot_bytes(7) == 0  # a refusal changes nothing
    assert tl.charge(7, 424 * MiB) is None  # exactly up to the limit
    assert tl.tenant_used(A) == GiB
    assert tl.charge(7, 1) == QuotaRefusal(GiB, GiB)
    assert tl.usage(3) == (GiB, GiB)


def test_other_tenants_and_untagged_slots_are_not_limited(tl: TenantLedger) -> None:
    tl.assign(1, A)
    tl.assign(2, B)  # tenant without a limit
    assert tl.charge(1, GiB) is None
    assert tl.charge(2, 5 * GiB) is None
    assert tl.charge(4, 9 * GiB) is None  # a slot of no tenant
    assert tl.tenant_used(A) == GiB and tl.tenant_used(B) == 5 * GiB
    assert tl.usage(2) == (None, 5 * GiB)


def test_zero_limit_refuses_everything_but_zero(tmp_path: Path) -> None:
    tl = TenantLedger(tmp_path / "t")
    tl.reset({A: 0})
    tl.assign(0, A)
    assert tl.charge(0, 0) is None
    assert tl.charge(0, 1) == QuotaRefusal(0, 0)


def test_release_and_clear_return_to_zero(tl: TenantLedger) -> None:
    tl.assign(5, A)
    for _ in range(50):
        assert tl.charge(5, 2 * MiB) is None
    for _ in range(50):
        tl.release(5, 2 * MiB)
    assert tl.tenant_used(A) == 0
    tl.release(5, MiB)  # never below zero
    assert tl.slot_bytes(5) == 0
    assert tl.charge(5, GiB) is None
    tl.clear(5)  # the daemon reaped the worker: its charge is gone with its tag
    assert tl.tenant_used(A) == 0
    tl.assign(5, B)  # the slot serves another tenant now
    assert tl.charge(5, 2 * GiB) is None and tl.tenant_used(A) == 0


def test_reassigning_a_slot_starts_from_nothing(tl: TenantLedger) -> None:
    tl.assign(2, A)
    tl.charge(2, 100 * MiB)
    tl.assign(2, A)
    assert tl.tenant_used(A) == 0


def test_a_refused_device_charge_leaves_the_tenant_uncharged(tl: TenantLedger) -> None:
    tl.assign(0, A)
    assert tl.charge(0, MiB, lambda: False) is None
    assert tl.tenant_used(A) == 0
    assert tl.charge(0, MiB, lambda: True) is None
    assert tl.tenant_used(A) == MiB


def _grab(path: str, slot: int, n: int, out: multiprocessing.Queue) -> None:
    t = TenantLedger(path)
    got = sum(1 for _ in range(n) if t.charge(slot, MiB) is None)
    out.put(got)


def test_processes_of_one_tenant_never_overshoot_together(tmp_path: Path) -> None:
    """Four worker processes race for a 64 MiB limit, 1 MiB at a time: exactly 64 charges
    succeed in all, whatever the interleaving."""
    tl = TenantLedger(tmp_path / "t")
    tl.reset({A: 64 * MiB})
    for slot in range(4):
        tl.assign(slot, A)
    ctx = multiprocessing.get_context("spawn")
    q: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=_grab, args=(str(tl.path), s, 40, q)) for s in range(4)]
    for p in procs:
        p.start()
    got = sum(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert got == 64
    assert tl.tenant_used(A) == 64 * MiB
    assert sum(tl.slot_bytes(s) for s in range(4)) == 64 * MiB


# ---- the account a backend charges -----------------------------------------------------------


def _account(tmp_path: Path, capacity: int, limit: int | None, slot: int = 1):
    ledger = Ledger(tmp_path / "device.ledger", capacity)
    tl = TenantLedger(tmp_path / "tenants.ledger")
    tl.reset({A: limit})
    tl.assign(slot, A)
    return ledger, tl, MemoryAccount(ledger, slot, tl, "alice")


def test_account_refuses_past_the_tenant_limit_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger, tl, acct = _account(tmp_path, 80 * GiB, GiB)
    acct.charge(768 * MiB)
    with pytest.raises(CudaError) as e:
        acct.charge(512 * MiB)
    assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
    assert "tenant alice" in str(e.value)
    line = [r.getMessage() for r in caplog.records if "tenant alice" in r.getMessage()]
    assert line == [
        f"tenant alice: out of memory: limit {GiB} bytes, {768 * MiB} in use, {512 * MiB} requested"
    ]
    # the device ledger was not charged for the refused request
    assert ledger.used() == 768 * MiB and tl.tenant_used(A) == 768 * MiB
    acct.release(768 * MiB)
    assert ledger.used() == 0 and tl.tenant_used(A) == 0


def test_account_device_full_charges_neither(tmp_path: Path) -> None:
    ledger, tl, acct = _account(tmp_path, 100 * MiB, GiB)
    with pytest.raises(CudaError) as e:
        acct.charge(200 * MiB)
    assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY and "device" in str(e.value)
    assert ledger.used() == 0 and tl.tenant_used(A) == 0


def test_mem_info_is_the_tenant_view(tmp_path: Path) -> None:
    _, _, acct = _account(tmp_path, 80 * GiB, GiB)
    acct.charge(256 * MiB)
    assert acct.view(80 * GiB - 256 * MiB, 80 * GiB) == (768 * MiB, GiB)
    # the device has less free than the tenant's headroom: the device's free wins
    assert acct.view(100 * MiB, 80 * GiB) == (100 * MiB, GiB)
    # a limit above the device: the device's total
    (tmp_path / "big").mkdir()
    _, _, big = _account(tmp_path / "big", GiB, 8 * GiB)
    assert big.view(GiB, GiB) == (GiB, GiB)


def test_account_without_a_limit_is_the_device_view(tmp_path: Path) -> None:
    ledger, tl, acct = _account(tmp_path, 80 * GiB, None)
    acct.charge(GiB)
    assert acct.view(79 * GiB, 80 * GiB) == (79 * GiB, 80 * GiB)
    acct.clear()
    assert ledger.used() == 0 and tl.slot_bytes(1) == 0
