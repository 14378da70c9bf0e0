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

__all__ = ["write_initramfs"]

_TRAILER = "TRAILER!!!"
#: Device nodes the archive always holds (path, mode, major, minor).
_NODES = (("dev/console", stat.S_IFCHR | 0o600, 5, 1), ("dev/null", stat.S_IFCHR | 0o666, 1, 3))


def _header(name: str, mode: int, size: int, ino: int, rdev: tuple[int, int] = (0, 0)) -> bytes:
    raw = name.encode() + b"\0"
    fields = (ino, mode, 0, 0, 1, 0, size, 0, 0, rdev[0], rdev[1], len(raw), 0)
    head = b"070701" + b"".join(b"%08X" % f for f in fields) + raw
    return head + b"\0" * (-len(head) % 4)


def _entries(root: Path) -> Iterator[tuple[str, Path]]:
    """Every path under ``root`` (relative, sorted, parents first)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(dirnames + filenames):
            path = base / name
            yield path.relative_to(root).as_posix(), path


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
    out.write(_header(_TRAILER, 0, 0, 0))
    return ino


def write_initramfs(root: Path, dest: Path, level: int = 6) -> int:
    """Archive ``root`` into the gzip-compressed cpio ``dest``; returns the entry count."""
    with dest.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=level,
                                                mtime=0) as out:  # fmt: skip
        return _write(out, root)  # type: ignore[arg-type]
