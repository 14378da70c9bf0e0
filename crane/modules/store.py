"""Module images on disk, addressed by content (architecture invariant 7), bounded in size.

A daemon keeps one store that all its session workers share: a guest sends an image's digest
first and its bytes only if the store lacks them, a restore or an incoming migration finds the
images it carried there, and a pre-flight reads them to check their code against a device. An
image is written once, atomically (a temporary file renamed into place), so a reader never sees
half of one; one whose bytes do not match its digest is refused.

The store is a cache with a size bound (``limit``, craned's ``module_cache_bytes``): after each
new image it evicts the least recently used images (a hit refreshes an image's mtime) until the
images fit, except those a live worker *pins*. A worker pins the digest of every module it has
loaded (or is loading, or carried in with a restore or migration) because its checkpoints and
migrations read the image back from this store (``crane.state.record``, ``crane.migrate.source``);
a parked session needs nothing here (its checkpoint file carries its images). Pins are empty files
``.pins/<worker pid>/<digest hex>``: a directory whose pid is no longer alive is stale (a worker
that crashed, a previous daemon's) and is removed by the next eviction, and the daemon removes
a worker's directory when it reaps it. Evictions of the processes sharing a store are serialized
by an ``fcntl`` lock on ``.lock``. Pinned images may make the store exceed its bound (every image
in use is needed); that is logged with the eviction.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ["DigestMismatch", "ImageStore"]

log = logging.getLogger("crane.modules")

_PINS = ".pins"
_LOCK = ".lock"


class DigestMismatch(ValueError):
    """The bytes offered for an image do not hash to the digest they were offered under."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ImageStore:
    """Content-addressed module images in one directory (``<sha256 hex>`` per image).

    ``limit``: the most bytes of images to keep (0: unbounded). ``owner``: the pid pins are
    recorded under (a worker's own; the daemon's store pins nothing)."""

    def __init__(self, root: Path | str, limit: int = 0, owner: int | None = None) -> None:
        self.root = Path(root)
        self.limit = limit
        self.owner = os.getpid() if owner is None else owner

    def path(self, digest: bytes) -> Path:
        return self.root / digest.hex()

    def __contains__(self, digest: bytes) -> bool:
        return self.path(digest).exists()

    def get(self, digest: bytes) -> bytes | None:
        """The image stored under ``digest``, or None; a hit counts as a use (LRU)."""
        path = self.path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return data

    def put(self, digest: bytes, image: bytes) -> bytes:
        """Store ``image`` under ``digest`` unless it is there already, then evict down to the
        bound; returns the image. :class:`DigestMismatch` when it does not hash to ``digest``.
        The caller pins ``digest`` first if it needs the image to stay."""
        if hashlib.sha256(image).digest() != digest:
            raise DigestMismatch("module image does not match its digest")
        path = self.path(digest)
        if path.exists():
            with contextlib.suppress(OSError):
                os.utime(path)
            return image
        tmp = path.with_name(f".{digest.hex()}.{os.getpid()}.tmp")
        tmp.write_bytes(image)
        tmp.replace(path)
        if self.limit:
            self.trim()
        return image

    # ---- pins ------------------------------------------------------------------------------
    def _pin_dir(self, owner: int) -> Path:
        return self.root / _PINS / str(owner)

    def pin(self, digest: bytes) -> None:
        """Keep ``digest`` out of eviction while this store's owner is alive."""
        d = self._pin_dir(self.owner)
        d.mkdir(parents=True, exist_ok=True)
        (d / digest.hex()).touch()

    def unpin(self, digest: bytes) -> None:
        (self._pin_dir(self.owner) / digest.hex()).unlink(missing_ok=True)

    def release_owner(self, owner: int) -> None:
        """Drop every pin of ``owner`` (the daemon, when it reaps that worker)."""
        shutil.rmtree(self._pin_dir(owner), ignore_errors=True)

    def reset(self) -> None:
        """A daemon starting on this store: no worker of a previous run pins anything, and its
        half-written temporary files are garbage."""
        shutil.rmtree(self.root / _PINS, ignore_errors=True)
        for tmp in self.root.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        if self.limit:
            self.trim()

    def pinned(self) -> set[str]:
        """Digests (hex) some live owner pins; stale owners' pins are removed on the way."""
        out: set[str] = set()
        root = self.root / _PINS
        for d in root.iterdir() if root.is_dir() else ():
            try:
                owner = int(d.name)
            except ValueError:
                continue
            if not _alive(owner):
                shutil.rmtree(d, ignore_errors=True)
                continue
            out.update(p.name for p in d.iterdir())
        return out

    # ---- eviction --------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / _LOCK, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def images(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every stored image, least recently used first."""
        out = []
        for p in self.root.iterdir():
            if p.name.startswith(".") or len(p.name) != 64:
                continue
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out.append((st.st_mtime, st.st_size, p))
        return sorted(out)

    def size(self) -> int:
        """Bytes of images stored."""
        return sum(size for _, size, _ in self.images())

    def trim(self) -> int:
        """Evict least recently used, unpinned images until the store fits its bound; returns
        the bytes evicted. One log line per eviction."""
        with self._locked():
            images = self.images()
            total = sum(size for _, size, _ in images)
            if total <= self.limit:
                return 0
            pinned = self.pinned()
            evicted = freed = 0
            for _, size, p in images:
                if total - freed <= self.limit:
                    break
                if p.name in pinned:
                    continue
                p.unlink(missing_ok=True)
                evicted += 1
                freed += size
        over = total - freed - self.limit
        log.info(
            "module cache: evicted %d image(s), %d bytes, least recently used first; %d bytes "
            "kept of %d allowed%s",
            evicted,
            freed,
            total - freed,
            self.limit,
            f" ({over} over: images in use are never evicted)" if over > 0 else "",
        )
        return freed
