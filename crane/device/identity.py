"""The device identity a session is given, and its wire form.

The guest answers every device query (name, UUID, memory, all attributes, PCI ids) from this
snapshot, locally (invariant 3). The UUID is *virtual*: derived from the device's model key and
a per-session seed, so a session keeps one identity on every daemon it moves to (cudart's
integrity check hashes it), while different sessions or models see different devices.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from crane.v1 import common_pb2

__all__ = [
    "CRANE_UUID_NAMESPACE",
    "DeviceSnapshot",
    "snapshot_from_proto",
    "snapshot_to_proto",
    "uuid_text",
    "virtual_uuid",
]

#: Namespace of Crane's name-based (RFC 4122 version 5) virtual device UUIDs. Fixed forever:
#: changing it would change every session's device identity.
CRANE_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:crane:virtual-gpu")


@dataclass(frozen=True)
class DeviceSnapshot:
    """The device identity a guest is given at session open (answers all device queries).

    ``profile`` is the device's model key: a simulator profile (``h100-80gb``) or, for a real
    GPU, ``cuda:<product name>``; it names the model in checkpoints and log lines."""

    name: str
    uuid: bytes
    total_mem: int
    cc: tuple[int, int]
    attributes: dict[int, int]
    profile: str
    pci_bus_id: str


def virtual_uuid(key: str, seed: bytes) -> bytes:
    """RFC 4122 version 5 over Crane's namespace, the model key and the session seed."""
    digest = hashlib.sha1(
        CRANE_UUID_NAMESPACE.bytes + key.encode() + b"\0" + bytes(seed), usedforsecurity=False
    ).digest()
    return uuid.UUID(bytes=digest[:16], version=5).bytes


def uuid_text(raw: bytes) -> str:
    """``GPU-xxxxxxxx-xxxx-...`` as nvidia-smi prints a UUID."""
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def snapshot_to_proto(s: DeviceSnapshot) -> common_pb2.DeviceIdentity:
    return common_pb2.DeviceIdentity(
        name=s.name,
        uuid=s.uuid,
        total_mem=s.total_mem,
        cc_major=s.cc[0],
        cc_minor=s.cc[1],
        attributes=s.attributes,
        profile=s.profile,
        pci_bus_id=s.pci_bus_id,
    )


def snapshot_from_proto(p: common_pb2.DeviceIdentity) -> DeviceSnapshot:
    return DeviceSnapshot(
        name=p.name,
        uuid=bytes(p.uuid),
        total_mem=p.total_mem,
        cc=(p.cc_major, p.cc_minor),
        attributes=dict(p.attributes),
        profile=p.profile,
        pci_bus_id=p.pci_bus_id,
    )
