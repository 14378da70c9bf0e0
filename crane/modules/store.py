"""Module images on disk, addressed by content (architecture invariant 7).

A daemon keeps one store that all its session workers share: a guest sends an image's digest
first and its bytes only if the store lacks them, a restore or an incoming migration finds the
images it carried there, and a pre-flight reads them to check their code against a device. An
image is written once, atomically (a temporary file renamed into place), so a reader never sees
half of one; one whose bytes do not match its digest is refused.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["DigestMismatch", "ImageStore"]


class DigestMismatch(ValueError):
    """The bytes offered for an image do not hash to the digest they were offered under."""


class ImageStore:
    """Content-addressed module images in one directory (``<sha256 hex>`` per image)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path(self, digest: bytes) -> Path:
        return self.root / digest.hex()

    def __contains__(self, digest: bytes) -> bool:
        return self.path(digest).exists()

    def get(self, digest: bytes) -> bytes | None:
        """The image stored under ``digest``, or None."""
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, digest: bytes, image: bytes) -> bytes:
        """Store ``image`` under ``digest`` unless it is there already; returns the image.
        :class:`DigestMismatch` when it does not hash to ``digest``."""
        if hashlib.sha256(image).digest() != digest:
            raise DigestMismatch("module image does not match its digest")
        path = self.path(digest)
        if not path.exists():
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(image)
            tmp.replace(path)
        return image
