"""Compiled kernels kept on disk across processes: a worker started again (or another worker
on the same host) loads a kernel's object file instead of compiling it (50-600 ms).

Why it is safe to load: the key hashes everything the machine code depends on — the module's
text (its SHA-256), the kernel's name, the source of the whole PTX package (lowering, decoder,
semantics: any change of the code makes new keys), the LLVM/llvmlite versions and the host CPU
with its features (:func:`.engine.host_signature`). An entry is an object file plus a JSON of
what the runner needs (entry points, access sites, save-area size, fault texts), each written
to a temporary name and renamed into place, so a reader sees a whole entry or none; anything
unreadable is a miss and is compiled again.

Where: ``CRANE_PTX_JIT_CACHE`` names the directory (the worker sets it to a directory beside
its module image cache); unset or ``0``, nothing is written. The directory is bounded
(:data:`MAX_ENTRIES`, oldest entries removed first).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

__all__ = ["MAX_ENTRIES", "cache_dir", "entry_key", "load", "store"]

log = logging.getLogger("crane.sim.ptx.jit")

#: entries kept (object files of 20-200 KB each); the oldest go first beyond this
MAX_ENTRIES = 2048

_code_digest: str | None = None
_host: str | None = None


def cache_dir() -> Path | None:
    """The configured directory, or None: not configured, or the package's sources are not
    there to hash (code of another version could not be told apart)."""
    v = os.environ.get("CRANE_PTX_JIT_CACHE", "").strip()
    if not v or v.lower() in ("0", "off", "no", "false") or not _package_digest():
        return None
    return Path(v)


def _package_digest() -> str:
    """SHA-256 over the PTX package's Python sources (read once per process); empty when
    there are none (installed as bytecode only)."""
    global _code_digest
    if _code_digest is None:
        root = Path(__file__).resolve().parent.parent
        h = hashlib.sha256()
        files = sorted(root.rglob("*.py"))
        for p in files:
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
        _code_digest = h.hexdigest() if files else ""
    return _code_digest


def entry_key(mod_hash: str, name: str) -> str:
    """The key of kernel ``name`` of the module hashed ``mod_hash`` on this host."""
    global _host
    if _host is None:
        from .engine import host_signature

        _host = host_signature()
    # the settings that change the code compiled (CRANE_PTX_JIT_SIMD) are part of the key
    simd = os.environ.get("CRANE_PTX_JIT_SIMD", "1").strip()
    h = hashlib.sha256("\0".join((mod_hash, name, _package_digest(), _host, simd)).encode())
    return h.hexdigest()


def load(root: Path, key: str) -> tuple[dict, bytes] | None:
    """The entry's metadata and object file, or None (missing or unreadable)."""
    try:
        meta = json.loads((root / f"{key}.json").read_text())
        obj = (root / f"{key}.o").read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("bytes") != len(obj):
        return None
    return meta, obj


def store(root: Path, key: str, meta: dict, obj: bytes) -> None:
    """Write an entry (object first, then the metadata that names its size); errors are
    logged and ignored: the cache only saves time."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        _write(root / f"{key}.o", obj)
        _write(root / f"{key}.json", json.dumps({**meta, "bytes": len(obj)}).encode())
        _trim(root)
    except OSError as e:
        log.debug("PTX compiler cache: cannot write %s: %s", root, e)


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _trim(root: Path) -> None:
    metas = list(root.glob("*.json"))
    if len(metas) <= MAX_ENTRIES:
        return
    metas.sort(key=lambda p: p.stat().st_mtime)
    for p in metas[: len(metas) - MAX_ENTRIES]:
        p.unlink(missing_ok=True)
        p.with_suffix(".o").unlink(missing_ok=True)
