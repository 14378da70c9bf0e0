"""Daemon addresses, as users write them and as gRPC wants them.

Accepted forms: ``unix:///abs/path.sock``, ``unix:/abs/path.sock``, ``unix:rel.sock``,
``tcp://host:port``, ``host:port``. ``CRANE_DAEMON`` names the default for guests and the CLI.
"""

from __future__ import annotations

import os

__all__ = ["CHANNEL_OPTIONS", "DEFAULT_ADDRESS", "default_address", "to_grpc_target"]

DEFAULT_ADDRESS = "unix:///run/crane/crane.sock"

#: Messages up to 64 MiB; payloads are split at 4 MiB (MAX_CHUNK) so this leaves headroom.
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]


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
    if ":" in a:
        return a
    raise ValueError(
        f"cannot parse daemon address {address!r}: use unix:///path.sock or tcp://host:port"
    )
