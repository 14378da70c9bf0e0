"""A deterministic initramfs archive (cpio ``newc``, gzip) written from a staging directory.

Written here rather than with ``cpio``/``find`` because the result must not depend on the host
(file order, owners, time stamps, inode numbers) and must hold a ``/dev/console`` device node
without root: the kernel opens it for PID 1's first output, before /init mounts devtmpfs.
Every entry is owned by root with mtime 0, in sorted path order; hard links are stored as
separate files (the guest only reads them).
"""

from __future__ import annotations

import gzip
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["SENTINEL", "write_initramfs"]

_TRAILER = "TRAILER!!!"
#: The archive's last entry (init.sh checks for it).
SENTINEL = "etc/crane/unpacked"
#: Device nodes the archive always holds (path, mode, major, minor).
_NODES = (("dev/console", stat.S_IFCHR | 0o600, 5, 1), ("dev/null", stat.S_IFCHR | 0o666, 1, 3))


def _header(name: str, mode: int, size: int, ino: int, rdev: tuple[int, int] = (0, 0)) -> bytes:
    raw = name.encode() + b"\0"
    fields = (ino, mode, 0, 0, 1, 0, size, 0, 0, rdev[0], rdev[1], len(raw), 0)
    head = b"070701" + b"".join(b"%08X" % f for f in fields) + raw
    return head + b"\0" * (-len(head) % 4)


def _entries(root: Path, base: Path | None = None) -> Iterator[tuple[str, Path]]:
    """Every path under ``root`` (relative), depth first in name order: each directory right
    before its contents."""
    base = base or root
    for path in sorted(root.iterdir(), key=lambda p: p.name):
        yield path.relative_to(base).as_posix(), path
        if path.is_dir() and not path.is_symlink():
            yield from _entries(path, base)


def _write(out: BinaryIO, root: Path) -> int:
    ino = 0
    names: set[str] = set()
    for rel, path in _entries(root):
        ino += 1
        names.add(rel)
        st = path.lstat()
        perm = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            data = os.readlink(path).encode()
            out.write(_header(rel, stat.S_IFLNK | 0o777, len(data), ino) + data)
            out.write(b"\0" * (-len(data) % 4))
        elif stat.S_ISDIR(st.st_mode):
            out.write(_header(rel, stat.S_IFDIR | perm, 0, ino))
        elif stat.S_ISREG(st.st_mode):
            out.write(_header(rel, stat.S_IFREG | perm, st.st_size, ino))
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    out.write(chunk)
            out.write(b"\0" * (-st.st_size % 4))
        else:
            raise ValueError(f"initramfs: {path} is neither a file, a directory nor a link")
    for rel, mode, major, minor in _NODES:
        if rel not in names:
            ino += 1
            out.write(_header(rel, mode, 0, ino, (major, minor)))
    # Last: the kernel stops unpacking at the first error (a full rootfs says only "write
    # error"), so /init can tell a complete root from a truncated one by this file.
    ino += 1
    out.write(_header(SENTINEL, stat.S_IFREG | 0o644, 0, ino))
    out.write(_header(_TRAILER, 0, 0, 0))
    return ino


#: Compressions the guest kernel unpacks (Debian's has CONFIG_RD_GZIP and CONFIG_RD_ZSTD).
COMPRESSIONS = ("none", "gzip", "zstd")


def write_initramfs(root: Path, dest: Path, compression: str = "none") -> int:
    """Archive ``root`` into the cpio ``dest``, compressed or not; returns the entry count.

    Under TCG the guest kernel's decompression dominates boot time (measured for a 167 MB
    archive: 2.5 s to /init uncompressed, 3.6 s zstd level 9, 4.7 s gzip level 6); zstd
    level 9 compresses as well as gzip -9 in a fraction of its time (19 takes 40 s here)."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"initramfs compression {compression!r}: one of {COMPRESSIONS}")
    with dest.open("wb") as raw:
        if compression == "gzip":
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as out:
                return _write(out, root)  # type: ignore[arg-type]
        if compression == "zstd":
            import zstandard  # a dependency of Crane itself

            with zstandard.ZstdCompressor(level=9).stream_writer(raw, closefd=False) as out:
                return _write(out, root)  # type: ignore[arg-type]
        return _write(raw, root)
