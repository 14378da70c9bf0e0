"""libvirt domain XML for a Crane guest, and the Crane facts it carries.

A Crane guest's VM has no GPU device: its libcuda.so.1 dials ``vm://10.0.2.100:7000``, which
QEMU's user networking forwards (``guestfwd=...-cmd:socat - UNIX-CONNECT:<socket>``) to the
domain's socket on the host's craned (``<run_dir>/domains/<domain>.sock``, made by the daemon's
AttachDomain): the host, not the guest, says which domain a connection is. libvirt 9.0's
``<interface type='user'>`` has no guestfwd, so the netdev goes in ``<qemu:commandline>``
(libvirt marks the domain "custom-argv" tainted; it migrates all the same, since the destination
QEMU gets the same arguments). That argument names a host path, which differs between the two
daemons when they do not share a run directory (two daemons on one host, or hosts configured
differently): :func:`retarget` rewrites it in the XML the destination starts from (the libvirt
hook's ``migrate`` filter, or ``crane migrate DOMAIN``'s destination XML).

The ``<metadata>`` element in Crane's namespace names the daemon serving the domain (where its
sessions are listed and migrated from) and the socket the forward reaches; :func:`crane_meta`
reads it back, so a hook that only gets the XML on stdin knows where to ask.

Why TCG, direct kernel boot, a file-backed serial port and no balloon: that is what boots and
live-migrates on hosts without usable KVM (``shared/reference/vm-lab-facts.md``); production
domains change ``type`` to ``kvm`` and keep the rest.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from xml.sax.saxutils import quoteattr

__all__ = [
    "CRANE_NS",
    "GUEST_ADDRESS",
    "CraneMeta",
    "DomainSpec",
    "crane_meta",
    "domain_xml",
    "guestfwd",
    "retarget",
]

#: The XML namespace of Crane's domain metadata.
CRANE_NS = "https://crane.dev/xmlns/libvirt-domain/1"
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
#: Where a guest in the VM reaches its daemon (CRANE_DAEMON in the guest).
GUEST_IP, GUEST_PORT = "10.0.2.100", 7000
GUEST_ADDRESS = f"vm://{GUEST_IP}:{GUEST_PORT}"
#: The netdev's id in the QEMU command line (what :func:`retarget` looks for).
NETDEV_ID = "cranenet"


@dataclass(frozen=True)
class CraneMeta:
    """What the domain XML says about its Crane daemon."""

    daemon: str  # control address of the daemon serving the domain's sessions
    socket: str  # the domain socket its guest forward reaches


@dataclass(frozen=True)
class DomainSpec:
    name: str
    kernel: str
    initrd: str
    cmdline: str
    serial_log: str
    crane_socket: str
    crane_daemon: str
    memory_mib: int = 256
    vcpus: int = 1
    domain_type: str = "qemu"  # TCG; "kvm" where the host has it
    #: libvirt's CPU mode: "maximum" (QEMU's -cpu max: every feature TCG emulates; a guest
    #: whose NumPy wants x86-64-v2 needs it), "host-model" under KVM
    cpu_mode: str = "maximum"
    emulator: str = "/usr/bin/qemu-system-x86_64"


def guestfwd(socket: str) -> str:
    """The user-networking netdev: no route out (restrict=on), one forward to ``socket``."""
    if "," in socket or " " in socket:
        raise ValueError(f"domain socket path {socket!r} cannot go in a QEMU netdev option")
    return (
        f"user,id={NETDEV_ID},restrict=on,"
        f"guestfwd=tcp:{GUEST_IP}:{GUEST_PORT}-cmd:socat - UNIX-CONNECT:{socket}"
    )


def domain_xml(spec: DomainSpec) -> str:
    """A transient-or-persistent domain definition for ``spec`` (libvirt 9.0 schema)."""
    q = quoteattr
    return f"""<domain type={q(spec.domain_type)} xmlns:qemu={q(QEMU_NS)}>
  <name>{_text(spec.name)}</name>
  <metadata>
    <crane:guest xmlns:crane={q(CRANE_NS)} daemon={q(spec.crane_daemon)} \
socket={q(spec.crane_socket)}/>
  </metadata>
  <memory unit='MiB'>{int(spec.memory_mib)}</memory>
  <vcpu>{int(spec.vcpus)}</vcpu>
  <cpu mode={q(spec.cpu_mode)} check='none'/>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{_text(spec.kernel)}</kernel>
    <initrd>{_text(spec.initrd)}</initrd>
    <cmdline>{_text(spec.cmdline)}</cmdline>
  </os>
  <features>
    <acpi/>
  </features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>{_text(spec.emulator)}</emulator>
    <serial type='file'>
      <source path={q(spec.serial_log)} append='on'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-netdev'/>
    <qemu:arg value={q(guestfwd(spec.crane_socket))}/>
    <qemu:arg value='-device'/>
    <qemu:arg value='virtio-net-pci,netdev={NETDEV_ID},addr=0x8'/>
  </qemu:commandline>
</domain>
"""


def _text(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def crane_meta(xml: str) -> CraneMeta | None:
    """The Crane metadata of a domain XML (None: not a Crane guest)."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return None
    el = root.find(f"./metadata/{{{CRANE_NS}}}guest")
    if el is None:
        return None
    return CraneMeta(daemon=el.get("daemon", ""), socket=el.get("socket", ""))


def retarget(xml: str, socket: str, daemon: str) -> str:
    """``xml`` with its guest forward and metadata pointing at ``socket`` / ``daemon`` (the
    destination's). Text substitution, not a re-serialization: libvirt compares the
    destination's XML with the source's ABI, and a rewrite must change nothing else."""
    meta = crane_meta(xml)
    if meta is None:
        raise ValueError("not a Crane guest: no crane metadata in the domain XML")
    fwd_old = re.escape(f"UNIX-CONNECT:{meta.socket}")
    out, n = re.subn(fwd_old, f"UNIX-CONNECT:{socket}".replace("\\", r"\\"), xml)
    if n == 0:
        raise ValueError(f"the domain's QEMU arguments have no forward to {meta.socket}")
    guestfwd(socket)  # the same checks on the new path
    out = re.sub(
        r"(<(?:\w+:)?guest\b[^>]*\bsocket=)(['\"])[^'\"]*\2",
        lambda m: f"{m.group(1)}{quoteattr(socket)}",
        out,
        count=1,
    )
    return re.sub(
        r"(<(?:\w+:)?guest\b[^>]*\bdaemon=)(['\"])[^'\"]*\2",
        lambda m: f"{m.group(1)}{quoteattr(daemon)}",
        out,
        count=1,
    )
