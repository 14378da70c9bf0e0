"""The daemon's side of tenants' quotas: memory limits in the tenant ledger, the number of
sessions, and what a tenant's workers are told (its kernel time limit).

Memory is enforced by the workers themselves (each charges :class:`crane.device.quota.
TenantLedger` under its lock); the daemon's part is to write each tenant's limit when it
starts, tag a session's slot with its tenant before its worker runs a call, and clear the slot
when it reaps the worker. The number of sessions is counted in the session table
(:meth:`crane.daemon.registry.SessionTable.tenant_refusal`), which knows the sessions on their
way in as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crane.daemon.tenants import TenantConfig
from crane.device.quota import MAX_TENANTS, TenantLedger
from crane.v1 import control_pb2

__all__ = ["Quotas"]


class Quotas:
    """Every tenant's limits, as the daemon's configuration gives them."""

    def __init__(self, tenants: dict[str, TenantConfig], run_dir: Path) -> None:
        if len(tenants) >= MAX_TENANTS:
            raise ValueError(f"at most {MAX_TENANTS - 1} tenants, not {len(tenants)}")
        self.tenants = dict(tenants)
        #: Tenant name -> its id in the tenant ledger (0: no tenant).
        self.ids = {name: i for i, name in enumerate(sorted(self.tenants), start=1)}
        self.ledger = TenantLedger(run_dir / "tenants.ledger")
        self.ledger.reset({self.ids[n]: t.memory for n, t in self.tenants.items()})

    def config(self, tenant: str) -> TenantConfig | None:
        return self.tenants.get(tenant)

    def max_sessions(self) -> dict[str, int]:
        """Tenant -> its limit on sessions, for those that have one."""
        return {n: t.max_sessions for n, t in self.tenants.items() if t.max_sessions is not None}

    def assign(self, slot: int, tenant: str) -> None:
        """A worker is about to serve ``tenant``'s session in ``slot``."""
        self.ledger.assign(slot, self.ids.get(tenant, 0))

    def clear(self, slot: int) -> None:
        self.ledger.clear(slot)

    def worker_fields(self, tenant: str) -> dict[str, Any]:
        """What a worker of ``tenant``'s session is configured with
        (:class:`crane.host.messages.WorkerConfig`)."""
        t = self.tenants.get(tenant)
        return {
            "tenant_ledger": str(self.ledger.path),
            "tenant": tenant,
            "kernel_time_limit_s": (t.kernel_time_limit_s or 0.0) if t else 0.0,
        }

    def memory(self, tenant: str) -> tuple[int | None, int]:
        """(limit, bytes in use) of ``tenant``'s sessions (``crane ps``); limit None: none."""
        t = self.tenants.get(tenant)
        used = self.ledger.tenant_used(self.ids[tenant]) if tenant in self.ids else 0
        return (t.memory if t else None), used

    def usage(self, tenants: list[str], sessions: dict[str, int]) -> list[control_pb2.TenantUsage]:
        """``crane devices``' tenant lines: each configured tenant of ``tenants``, its memory
        and sessions (``sessions``: how many each holds) against its limits."""
        out = []
        for name in tenants:
            t = self.tenants.get(name)
            if t is None:
                continue
            limit, used = self.memory(name)
            out.append(
                control_pb2.TenantUsage(
                    name=name,
                    memory_used=used,
                    memory_limit=-1 if limit is None else limit,
                    sessions=sessions.get(name, 0),
                    max_sessions=-1 if t.max_sessions is None else t.max_sessions,
                )
            )
        return out

    def cuda_refusals(self, backends: list[str]) -> list[str]:
        """Tenants' kernel time limits that a cuda device cannot enforce (a kernel on a GPU
        cannot be pre-empted short of ending its context): craned refuses to start with them."""
        if "cuda" not in backends:
            return []
        return [
            f"tenant {n} sets kernel_time_limit_s, which the cuda backend does not enforce"
            for n, t in sorted(self.tenants.items())
            if t.kernel_time_limit_s is not None
        ]
