"""The device identity a session is given, and its wire form.

The guest answers every device query (name, UUID, memory, all attributes, PCI ids) from this
snapshot, locally (invariant 3). The UUID is *virtual*: derived from a per-session seed, so a
session keeps one identity on every daemon it moves to (cudart's integrity check hashes it).
"""

from __future__ import annotations

from crane.backends.base import DeviceSnapshot
from crane.backends.sim.profiles import DeviceProfile
from crane.v1 import common_pb2

__all__ = ["sim_snapshot", "snapshot_from_proto", "snapshot_to_proto"]


def sim_snapshot(profile: DeviceProfile, seed: bytes) -> DeviceSnapshot:
    attrs = {int(k): int(v) for k, v in profile.attributes.items()}
    return DeviceSnapshot(
        name=profile.name,
        uuid=profile.uuid_for(seed),
        total_mem=profile.total_mem,
        cc=profile.compute_capability,
        attributes=attrs,
        profile=profile.key,
        pci_bus_id=profile.pci_bus_id_string,
    )


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
