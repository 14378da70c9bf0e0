"""Daemon addresses, as users write them and as gRPC wants them.

Accepted forms: ``unix:///abs/path.sock``, ``unix:/abs/path.sock``, ``unix:rel.sock``,
``tcp://host:port``, ``host:port``, and ``vm://host:port`` (a VM's guest: plain HTTP/2 over TCP
to a forward that the host ties to the VM's domain socket, see :mod:`crane.wire.channel`).
``CRANE_DAEMON`` names the default for guests and the CLI.
"""

from __future__ import annotations

import os

__all__ = [
    "CHANNEL_OPTIONS",
    "DEFAULT_ADDRESS",
    "SERVER_KEEPALIVE_OPTIONS",
    "VM_CHANNEL_OPTIONS",
    "VM_SCHEME",
    "default_address",
    "is_vm",
    "to_grpc_target",
]

DEFAULT_ADDRESS = "unix:///run/crane/crane.sock"

#: Messages up to 64 MiB; payloads are split at 4 MiB (MAX_CHUNK) so this leaves headroom.
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]

#: A ``vm://`` address: the guest side of a forward whose host side identifies the VM.
VM_SCHEME = "vm://"

#: A VM guest's channel. Its connection goes through QEMU's user networking (or a vsock
#: bridge), which resets it when the VM migrates; a guest blocked waiting for a reply sends
#: nothing and would only notice at its next call, so it pings (a reset connection fails the
#: ping within seconds). Reconnection back-off stays short: the guest resumes at the same
#: address, where the destination's daemon is reachable as soon as the VM runs there. Each
#: channel connects on its own (no subchannel shared with an earlier channel to the same
#: address): a new channel must reach whatever the address reaches now.
VM_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.keepalive_time_ms", 2000),
    ("grpc.keepalive_timeout_ms", 10000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

#: What a server accepts of such pings (gRPC's defaults would answer a ping every 2 s without
#: data with GOAWAY "too_many_pings" after two of them, breaking a guest inside a long kernel).
SERVER_KEEPALIVE_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
]


def is_vm(address: str) -> bool:
    """Whether ``address`` is a VM guest's ``vm://host:port``."""
    return address.strip().startswith(VM_SCHEME)


def default_address() -> str:
    """``$CRANE_DAEMON`` or the system daemon's socket."""
    return os.environ.get("CRANE_DAEMON") or DEFAULT_ADDRESS


def to_grpc_target(address: str) -> str:
    """Translate a Crane address into a gRPC target/bind string."""
    a = address.strip()
    if a.startswith("unix://"):
        path = a[len("unix://") :]
        return "unix:" + path
    if a.startswith("unix:"):
        return a
    if a.startswith("tcp://"):
        return a[len("tcp://") :]
    if a.startswith(VM_SCHEME):
        hostport = a[len(VM_SCHEME) :]
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in hostport:
            raise ValueError(f"cannot parse daemon address {address!r}: use vm://HOST:PORT")
        return hostport
    if "://" in a:
        raise ValueError(
            f"cannot parse daemon address {address!r}: unknown scheme; use unix:///path.sock, "
            "tcp://host:port or vm://host:port"
        )
    if ":" in a:
        return a
    raise ValueError(
        f"cannot parse daemon address {address!r}: use unix:///path.sock, tcp://host:port "
        "or vm://host:port"
    )
