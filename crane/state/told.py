"""The device identity a guest was told at session open, as a checkpoint records it.

Why it travels with the session: the guest caches its device's identity and limits once, at
open (invariant 3), and plans its launches around them (shared memory per block, threads per
block, grid limits, ...). Wherever the session is resumed, the daemon must (a) refuse a device
offering less than the guest was told, and (b) keep answering with what the guest was told, not
with what the new device happens to be. Live migration carries the limits in its identity record
(``told``); a checkpoint file (format 2) carries the same record plus the rest of the identity
(``device``) in its META section's ``session``::

    "told":   {"<CUdevice_attribute>": value, ...}     every attribute the guest was answered
    "device": {"name", "uuid" (hex), "total_mem", "cc": [major, minor], "profile", "pci_bus_id"}

Format 1 files (written before this was recorded) carry neither; their source device's profile
stands in for what the guest was told (exact for a session that never moved before it was
checkpointed; the simulator's profiles are the only devices format 1 files were written on).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crane.v1 import common_pb2

__all__ = ["Told", "identity_to_json", "told_from_meta", "told_to_json"]


class Told:
    """What a checkpointed guest was told: limits always (possibly empty), identity if known."""

    def __init__(
        self, limits: dict[int, int], identity: common_pb2.DeviceIdentity | None, note: str = ""
    ) -> None:
        self.limits = limits
        self.identity = identity
        self.note = note  # how the limits were obtained, when not recorded in the file


def told_to_json(told: Mapping[int, int]) -> dict[str, int]:
    return {str(k): int(v) for k, v in sorted(told.items())}


def identity_to_json(p: common_pb2.DeviceIdentity) -> dict[str, Any]:
    """The identity without its attributes (those are the ``told`` record)."""
    return {
        "name": p.name,
        "uuid": bytes(p.uuid).hex(),
        "total_mem": int(p.total_mem),
        "cc": [int(p.cc_major), int(p.cc_minor)],
        "profile": p.profile,
        "pci_bus_id": p.pci_bus_id,
    }


def told_from_meta(meta: Mapping[str, Any], version: int, name: str) -> Told:
    """The told identity of a checkpoint's META; ``ValueError`` names a malformed record."""
    session = meta.get("session") or {}
    raw = session.get("told")
    if raw is None:
        if version >= 2:
            raise ValueError(f"{name}: META (format {version}) lacks the limits the guest was told")
        return _from_source(meta, name)
    try:
        limits = {int(k): int(v) for k, v in dict(raw).items()}
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: META's told limits are malformed: {e}") from None
    dev = session.get("device")
    if dev is None:
        return Told(limits, None)
    try:
        major, minor = (int(x) for x in dev["cc"])
        identity = common_pb2.DeviceIdentity(
            name=str(dev["name"]),
            uuid=bytes.fromhex(dev["uuid"]),
            total_mem=int(dev["total_mem"]),
            cc_major=major,
            cc_minor=minor,
            attributes=limits,
            profile=str(dev.get("profile", "")),
            pci_bus_id=str(dev.get("pci_bus_id", "")),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{name}: META's told device identity is malformed: {e!r}") from None
    return Told(limits, identity)


def _from_source(meta: Mapping[str, Any], name: str) -> Told:
    from crane.backends.catalog import builtin_model  # the simulator's models, by key

    profile = str((meta.get("source") or {}).get("profile", ""))
    try:
        attrs = builtin_model(profile).attributes
    except KeyError:
        return Told(
            {},
            None,
            f"{name} is a format 1 checkpoint from device {profile!r}: the limits its guest was "
            "told are not recorded and not known here, so they are not checked",
        )
    return Told(
        {int(k): int(v) for k, v in attrs.items()},
        None,
        f"{name} is a format 1 checkpoint: the limits its guest was told are not recorded; "
        f"those of its source device ({profile}) stand in for them",
    )
