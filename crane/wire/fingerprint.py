"""Protocol fingerprint: both ends must be built from the same wire definition.

It hashes the compiled descriptors of every proto file the guest, the daemons and their peers
speak (every ``*_pb2`` module of :mod:`crane.v1`, found, not listed, so a new proto file is
covered the day it is added), the call table and the packed calls' layout
(:mod:`crane.wire.packed`), so a guest and a daemon, or two daemons, whose messages or op ids
differ refuse each other with a clear message instead of misreading arguments (the failure mode
of hand-numbered remoting protocols).
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
from functools import cache

__all__ = ["fingerprint", "mismatch", "proto_modules"]


def proto_modules() -> list[str]:
    """Names of every generated message module (``crane.v1.*_pb2``), sorted."""
    import crane.v1

    return sorted(
        f"crane.v1.{m.name}"
        for m in pkgutil.iter_modules(crane.v1.__path__)
        if m.name.endswith("_pb2")
    )


def mismatch(theirs: str, they: str, we: str, builds: str) -> str | None:
    """Why a peer of fingerprint ``theirs`` cannot talk to this build (None: it can): the one
    wording of the refusal, naming both ends (``they``, ``we``) and what ``builds`` differ."""
    ours = fingerprint()
    if theirs == ours:
        return None
    return (
        f"protocol fingerprint mismatch: {they} {theirs!r}, {we} {ours!r}; {builds} come from "
        "different Crane builds"
    )


@cache
def fingerprint() -> str:
    from crane.api.ops import OPS
    from crane.wire.packed import layout

    h = hashlib.sha256()
    for name in proto_modules():
        h.update(importlib.import_module(name).DESCRIPTOR.serialized_pb)
    for o in OPS:
        h.update(o.signature().encode())
    h.update(layout().encode())  # which calls travel packed, and how
    return h.hexdigest()[:16]
