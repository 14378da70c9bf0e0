"""What a libvirt domain name may be here: it becomes a socket file name and a tenant name, and
it arrives from operators, configuration files and client certificates alike."""

from __future__ import annotations

import re

__all__ = ["DOMAIN_NAME_MAX", "NAME_PATTERN", "check_domain_name"]

#: Longest domain name accepted (the socket path must fit ``sun_path``'s 108 bytes too).
DOMAIN_NAME_MAX = 64
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+:-]*")


def check_domain_name(name: str) -> str:
    """``name`` if it is an acceptable libvirt domain name here, else ``ValueError`` saying why.

    libvirt forbids ``/`` in names; this also keeps them to a safe file-name charset (letters,
    digits, ``_ . + : -``, not starting with ``.``, ``+``, ``:`` or ``-``) because the name
    becomes a socket file name and a tenant name."""
    if not isinstance(name, str) or not name:
        raise ValueError("a domain name is needed")
    if len(name) > DOMAIN_NAME_MAX:
        raise ValueError(f"domain name {name[:20]!r}... is longer than {DOMAIN_NAME_MAX}")
    if "/" in name or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"domain name {name!r} is not accepted: letters, digits and _ . + : - only, "
            "starting with a letter, digit or _"
        )
    return name
