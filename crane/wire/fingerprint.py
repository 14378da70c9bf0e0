"""Protocol fingerprint: both ends must be built from the same wire definition.

It hashes the compiled proto descriptors and the call table, so a guest and a daemon whose
messages or op ids differ refuse each other at session open with a clear message, instead of
misreading arguments (the failure mode of hand-numbered remoting protocols).
"""

from __future__ import annotations

import hashlib
from functools import cache

__all__ = ["fingerprint"]


@cache
def fingerprint() -> str:
    from crane.api.ops import OPS
    from crane.v1 import common_pb2, control_pb2, diag_pb2, guest_pb2

    h = hashlib.sha256()
    for mod in (common_pb2, guest_pb2, control_pb2, diag_pb2):
        h.update(mod.DESCRIPTOR.serialized_pb)
    for o in OPS:
        h.update(o.signature().encode())
    return h.hexdigest()[:16]
