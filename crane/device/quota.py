"""Device memory per tenant: limits and charges shared by every worker of one daemon.

A tenant's memory limit covers all of its sessions on the daemon, on every device, so it cannot
live in a device's ledger (:mod:`crane.device.ledger`, one file per device). This is one more
small file in the run directory, with the same discipline (an ``mmap`` under an ``fcntl``
lock): one entry per session slot (the window slot, unique on the daemon) holding the slot's
tenant and the bytes its worker committed, and one limit per tenant. The daemon tags a slot
with its session's tenant before the worker runs a call and clears it when it reaps the worker,
so a crashed worker's charge is returned, as with the device ledger; the worker checks "the
tenant's total + n <= its limit" and adds its bytes under the lock, so two sessions of one
tenant never both take the last bytes.

:class:`MemoryAccount` is what a backend charges: the device's ledger and, when the session
belongs to a tenant with a limit, this one, both or neither.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.device.ledger import LEDGER_SLOTS, Ledger

__all__ = ["MAX_TENANTS", "NO_LIMIT", "MemoryAccount", "QuotaRefusal", "TenantLedger"]

log = logging.getLogger("crane.quota")

#: Tenant ids 1..MAX_TENANTS-1 (0: a slot that belongs to no tenant).
MAX_TENANTS = 256
#: The limit of a tenant without one.
NO_LIMIT = (1 << 64) - 1
_ENTRY = struct.Struct("<IIQ")  # tenant id, unused, bytes committed
_ENTRIES = np.dtype([("tenant", "<u4"), ("unused", "<u4"), ("bytes", "<u8")])
_LIMIT = struct.Struct("<Q")
_LIMITS_AT = LEDGER_SLOTS * _ENTRY.size
_SIZE = _LIMITS_AT + MAX_TENANTS * _LIMIT.size


@dataclass(frozen=True)
class QuotaRefusal:
    """Why a charge was refused: the tenant's limit and what its sessions hold."""

    limit: int
    used: int


class TenantLedger:
    """Committed bytes per session slot, each slot tagged with a tenant, and each tenant's
    limit."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < _SIZE:
                os.ftruncate(fd, _SIZE)
            self._map = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        self._lock_fd = os.open(self.path, os.O_RDWR)

    # ---- under the lock ---------------------------------------------------------------------
    def _lock(self, kind: int = fcntl.LOCK_EX) -> _Held:
        return _Held(self._lock_fd, kind)

    def _entry(self, slot: int) -> tuple[int, int]:
        tenant, _, nbytes = _ENTRY.unpack_from(self._map, slot * _ENTRY.size)
        return tenant, nbytes

    def _limit(self, tenant: int) -> int:
        return _LIMIT.unpack_from(self._map, _LIMITS_AT + tenant * _LIMIT.size)[0]

    def _used(self, tenant: int) -> int:
        # one vectorized pass over a copy of the slots (20x faster than unpacking each entry;
        # a view of the mmap itself would keep it from being closed)
        slots = np.frombuffer(self._map[:_LIMITS_AT], _ENTRIES)
        return int(slots["bytes"][slots["tenant"] == tenant].sum())

    # ---- the daemon ---------------------------------------------------------------------------
    def reset(self, limits: dict[int, int | None]) -> None:
        """Forget every slot and set each tenant id's limit (None: none); a daemon starting up
        owns no sessions yet."""
        with self._lock():
            self._map[:] = bytes(_SIZE)
            for tenant in range(MAX_TENANTS):
                _LIMIT.pack_into(self._map, _LIMITS_AT + tenant * _LIMIT.size, NO_LIMIT)
            for tenant, limit in limits.items():
                if not 0 < tenant < MAX_TENANTS:
                    raise ValueError(f"tenant id {tenant} out of range 1..{MAX_TENANTS - 1}")
                value = NO_LIMIT if limit is None else min(limit, NO_LIMIT)
                _LIMIT.pack_into(self._map, _LIMITS_AT + tenant * _LIMIT.size, value)

    def assign(self, slot: int, tenant: int) -> None:
        """Slot ``slot`` now serves a session of ``tenant`` (0: none), nothing charged yet."""
        with self._lock():
            _ENTRY.pack_into(self._map, slot * _ENTRY.size, tenant, 0, 0)

    def clear(self, slot: int) -> None:
        """Forget a slot entirely (the daemon, after reaping its worker)."""
        self.assign(slot, 0)

    # ---- a worker -----------------------------------------------------------------------------
    def charge(
        self, slot: int, nbytes: int, then: Callable[[], bool] | None = None
    ) -> QuotaRefusal | None:
        """Add ``nbytes`` to ``slot`` if its tenant stays within its limit, and only if
        ``then()`` (the device ledger's charge, run under this lock so the pair is one step)
        returns True. Returns the refusal, None when charged (or when ``then`` refused: the
        caller knows)."""
        with self._lock():
            tenant, cur = self._entry(slot)
            limit = self._limit(tenant) if tenant else NO_LIMIT
            if limit != NO_LIMIT:
                used = self._used(tenant)
                if used + nbytes > limit:
                    return QuotaRefusal(limit, used)
            if then is not None and not then():
                return None
            _ENTRY.pack_into(self._map, slot * _ENTRY.size, tenant, 0, cur + nbytes)
            return None

    def release(self, slot: int, nbytes: int) -> None:
        with self._lock():
            tenant, cur = self._entry(slot)
            _ENTRY.pack_into(self._map, slot * _ENTRY.size, tenant, 0, max(cur - nbytes, 0))

    def usage(self, slot: int) -> tuple[int | None, int]:
        """(limit, bytes held) of ``slot``'s tenant: None and the slot's own bytes when it has
        no limit."""
        with self._lock(fcntl.LOCK_SH):
            tenant, cur = self._entry(slot)
            limit = self._limit(tenant) if tenant else NO_LIMIT
            if limit == NO_LIMIT:
                return None, cur
            return limit, self._used(tenant)

    def tenant_used(self, tenant: int) -> int:
        """Bytes ``tenant``'s sessions hold (``crane ps``/``crane devices``)."""
        with self._lock(fcntl.LOCK_SH):
            return self._used(tenant)

    def slot_bytes(self, slot: int) -> int:
        return self._entry(slot)[1]

    def close(self) -> None:
        self._map.close()
        os.close(self._lock_fd)


class _Held:
    """``with``: an ``fcntl`` lock held on the ledger's file."""

    def __init__(self, fd: int, kind: int) -> None:
        self.fd, self.kind = fd, kind

    def __enter__(self) -> None:
        fcntl.flock(self.fd, self.kind)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


class MemoryAccount:
    """What one session's worker charges its device memory to: the device's ledger and, when
    its tenant has a limit, the daemon's tenant ledger. Every commit of device memory (chunks,
    VMM mappings, pool blocks, module variables, the device heap) goes through :meth:`charge`.
    """

    def __init__(
        self,
        ledger: Ledger,
        slot: int,
        tenants: TenantLedger | None = None,
        tenant: str = "",
    ) -> None:
        self.ledger = ledger
        self.slot = slot
        self.tenants = tenants
        self.tenant = tenant

    def charge(self, nbytes: int) -> None:
        """Charge ``nbytes`` or raise CUDA_ERROR_OUT_OF_MEMORY saying whose limit it hit (the
        tenant's refusal is also one log line naming the tenant, its limit, its use and the
        request)."""
        if self.tenants is None:
            if not self.ledger.charge(self.slot, nbytes):
                raise self._device_full(nbytes)
            return
        device_ok: list[bool] = []

        def device() -> bool:
            device_ok.append(self.ledger.charge(self.slot, nbytes))
            return device_ok[0]

        refusal = self.tenants.charge(self.slot, nbytes, device)
        if refusal is not None:
            log.warning(
                "tenant %s: out of memory: limit %d bytes, %d in use, %d requested",
                self.tenant or "?",
                refusal.limit,
                refusal.used,
                nbytes,
            )
            raise CudaError(
                CUresult.CUDA_ERROR_OUT_OF_MEMORY,
                f"cannot commit {nbytes} bytes: tenant {self.tenant or '?'} holds "
                f"{refusal.used} of its {refusal.limit}-byte device memory limit",
            )
        if not device_ok[0]:
            raise self._device_full(nbytes)

    def _device_full(self, nbytes: int) -> CudaError:
        free = max(self.ledger.capacity - self.ledger.used(), 0)
        return CudaError(
            CUresult.CUDA_ERROR_OUT_OF_MEMORY,
            f"cannot commit {nbytes} bytes: {free} of {self.ledger.capacity} bytes free on "
            "the device",
        )

    def release(self, nbytes: int) -> None:
        if self.tenants is not None:
            self.tenants.release(self.slot, nbytes)
        self.ledger.release(self.slot, nbytes)

    def view(self, free: int, total: int) -> tuple[int, int]:
        """cuMemGetInfo as the session's tenant sees it: the device's (free, total) capped by
        the tenant's limit (total = min(device total, limit), free = min(device free, limit -
        the tenant's use))."""
        if self.tenants is None:
            return free, total
        limit, used = self.tenants.usage(self.slot)
        if limit is None:
            return free, total
        return min(free, max(limit - used, 0)), min(total, limit)

    def clear(self) -> None:
        """The session ends: nothing of it stays charged (the daemon clears the slots too)."""
        self.ledger.clear(self.slot)
        if self.tenants is not None:
            self.tenants.release(self.slot, self.tenants.slot_bytes(self.slot))

    def close(self) -> None:
        if self.tenants is not None:
            self.tenants.close()
