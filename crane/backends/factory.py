"""Builds a session's backend inside its worker process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crane.backends.base import Backend
from crane.device.ledger import Ledger
from crane.device.model_file import model_from_dict
from crane.device.quota import TenantLedger

__all__ = ["make_backend"]


def make_backend(
    kind: str,
    arg: str,
    window: tuple[int, int],
    uuid_seed: bytes,
    ledger_path: str,
    ledger_slot: int,
    *,
    tenant_ledger: str = "",
    tenant: str = "",
    kernel_time_limit_s: float = 0.0,
    model: Mapping[str, Any] | None = None,
) -> Backend:
    """The backend of one session: ``kind`` "sim" (``arg`` a model key) or "cuda" (``arg``
    the CUDA ordinal), over the session's VA ``window``, charging the device's ledger and, with
    ``tenant_ledger``, its ``tenant``'s quota (:mod:`crane.device.quota`).
    ``kernel_time_limit_s`` (0: none): a launch running longer fails with
    CUDA_ERROR_LAUNCH_TIMEOUT (the simulated GPU only; craned refuses it for cuda devices).
    ``model`` (:func:`~crane.device.model_file.model_to_dict`'s form): the device model the
    guest is told instead of the device itself, which the daemon checked promises no more
    than the device has; launches are checked against its limits and the ledger against its
    memory, while the device (the simulator's profile, the GPU) still executes."""
    tenants = TenantLedger(tenant_ledger) if tenant_ledger else None
    told = model_from_dict(model, "the session's device model") if model else None
    if kind == "sim":
        from crane.backends.catalog import builtin_model
        from crane.backends.sim.backend import SimBackend

        model = builtin_model(arg)
        told_as = told or model
        ledger = Ledger(ledger_path, told_as.total_mem)
        return SimBackend(
            model,
            told_as.snapshot(uuid_seed),
            window,
            ledger,
            ledger_slot,
            tenants=tenants,
            tenant=tenant,
            kernel_time_limit_s=kernel_time_limit_s or None,
        )
    if kind == "cuda":
        from crane.backends.cuda import driver
        from crane.backends.cuda.backend import CudaBackend
        from crane.backends.cuda.device import device_snapshot

        drv = driver.load()
        driver.unwrap("cuInit", drv.cuInit(0))
        ordinal = int(arg or 0)
        snapshot = told.snapshot(uuid_seed) if told else device_snapshot(drv, ordinal, uuid_seed)
        ledger = Ledger(ledger_path, snapshot.total_mem)
        return CudaBackend(
            drv, ordinal, snapshot, window, ledger, ledger_slot, tenants=tenants, tenant=tenant
        )
    raise ValueError(f"backend {kind!r} is not available in this build")
