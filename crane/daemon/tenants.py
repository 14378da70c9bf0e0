"""Tenants as the daemon's configuration describes them (``[tenants.NAME]`` tables): how a
caller is recognised as one, whether it operates the daemon, and its quotas."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

__all__ = ["TenantConfig", "parse_size"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20}
_UNITS |= {"g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}
_UNITS |= {"kb": 1000, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as ``"16GiB"``, ``"512 MiB"`` or ``"40GB"``
    (binary units for ``K``/``M``/``G``/``T`` alone, as memory sizes usually mean)."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        text = value.strip().replace(" ", "").lower()
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(digits) :]
        if unit not in _UNITS or not digits:
            raise ValueError(f"not a size: {value!r} (e.g. 16GiB, 512MiB, 40GB)")
        n = int(float(digits) * _UNITS[unit])
    else:
        raise ValueError(f"not a size: {value!r}")
    if n < 0:
        raise ValueError(f"a size cannot be negative: {value!r}")
    return n


@dataclass
class TenantConfig:
    """One tenant: how its callers are recognised, whether it operates the daemon, and what
    its sessions together may use (None: no limit)."""

    name: str
    uids: list[int] = field(default_factory=list)
    gids: list[int] = field(default_factory=list)
    #: Client certificates whose common name or a subject alternative name is one of these.
    certs: list[str] = field(default_factory=list)
    operator: bool = False
    memory: int | None = None  # bytes of device memory across the tenant's sessions
    max_sessions: int | None = None
    kernel_time_limit_s: float | None = None

    @classmethod
    def from_table(cls, name: str, table: object) -> TenantConfig:
        if not isinstance(table, dict):
            raise ValueError(f"[tenants.{name}] must be a table")
        known = {f.name for f in fields(cls)} - {"name"}
        unknown = set(table) - known
        if unknown:
            raise ValueError(
                f"[tenants.{name}]: unknown keys {sorted(unknown)}; known: {sorted(known)}"
            )
        t = cls(name=name)
        for key in ("uids", "gids"):
            ids = table.get(key, [])
            if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
            ):
                raise ValueError(f"[tenants.{name}] {key} must be a list of ids >= 0")
            setattr(t, key, list(ids))
        certs = table.get("certs", [])
        if not isinstance(certs, list) or not all(isinstance(c, str) and c for c in certs):
            raise ValueError(f"[tenants.{name}] certs must be a list of names")
        t.certs = list(certs)
        operator = table.get("operator", False)
        if not isinstance(operator, bool):
            raise ValueError(f"[tenants.{name}] operator must be true or false")
        t.operator = operator
        if "memory" in table:
            t.memory = parse_size(table["memory"])
        if "max_sessions" in table:
            n = table["max_sessions"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"[tenants.{name}] max_sessions must be an integer >= 0")
            t.max_sessions = n
        if "kernel_time_limit_s" in table:
            v = table["kernel_time_limit_s"]
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ValueError(f"[tenants.{name}] kernel_time_limit_s must be seconds > 0")
            t.kernel_time_limit_s = float(v)
        return t
