"""The Python side of the guest library ``libcuda.so.1`` (architecture invariant 1).

The C entry points (``interposer/``) call the handlers registered here through cffi's
embedding API; the handlers translate driver-API calls into
:class:`crane.guest.session.GuestSession` calls. :func:`library_path` finds the built library
for ``crane run`` / ``crane guest-lib``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["library_path"]


def library_path() -> Path:
    """Where the built ``libcuda.so.1`` lives (it may not exist yet: see interposer/)."""
    return Path(__file__).resolve().parent / "_lib" / "libcuda.so.1"
