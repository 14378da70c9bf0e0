"""Who a session is, wherever it runs: the record checkpoints and migrations carry.

A session keeps its id, its resume token, its VA window slot (invariant 2: the same device
addresses everywhere), the seed of its virtual device UUID, what its guest was told about its
device (:mod:`crane.state.told`), its tenant and its libvirt domain on every daemon it moves
to. The daemon that holds the session makes the record; a checkpoint writes it into META's
``session`` as JSON, a migration sends the same JSON to the destination, and a restore or an
incoming migration reads it back with :meth:`SessionRecord.from_meta`, which accepts every
checkpoint format still readable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crane.device.layout import window_base
from crane.state.told import identity_to_json, told_from_meta, told_to_json
from crane.v1 import common_pb2

__all__ = ["SessionRecord"]


@dataclass(frozen=True)
class SessionRecord:
    id: str
    token: bytes
    slot: int
    uuid_seed: str = ""
    client: str = ""
    #: Every attribute (limit) the guest was told at open.
    told: dict[int, int] = field(default_factory=dict)
    #: The rest of the identity the guest was told (None: not recorded, format 1 files).
    device: common_pb2.DeviceIdentity | None = None
    #: The tenant whose caller opened the session: it stays theirs wherever it moves, and its
    #: quotas with it ("": not recorded, files made before tenants; only operators may act on
    #: such a session).
    tenant: str = ""
    #: The libvirt domain whose guest opened the session ("": not a VM's guest, or a file made
    #: before domains): only that domain's guest may resume it wherever it moves.
    domain: str = ""

    @property
    def va_base(self) -> int:
        return window_base(self.slot)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "token": self.token.hex(),
            "slot": self.slot,
            "va_base": self.va_base,
            "uuid_seed": self.uuid_seed,
            "client": self.client,
            "told": told_to_json(self.told),
            "tenant": self.tenant,
            "domain": self.domain,
        }
        if self.device is not None:
            out["device"] = identity_to_json(self.device)
        return out

    @classmethod
    def from_meta(
        cls, meta: Mapping[str, Any], version: int, name: str
    ) -> tuple[SessionRecord, str]:
        """The record in a checkpoint's META (or ``{"session": record}`` for a migration's),
        and a note saying how the told limits were obtained when the file does not record
        them. ``ValueError`` (``KeyError``, ``TypeError``) names what is missing or malformed.
        """
        ident = meta["session"]
        told = told_from_meta(meta, version, name)
        record = cls(
            id=str(ident["id"]),
            token=bytes.fromhex(ident["token"]),
            slot=int(ident["slot"]),
            uuid_seed=str(ident.get("uuid_seed") or ""),
            client=str(ident.get("client", "")),
            told=dict(told.limits),
            device=told.identity,
            tenant=str(ident.get("tenant") or ""),
            domain=str(ident.get("domain") or ""),
        )
        return record, told.note
