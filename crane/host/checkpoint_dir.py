"""The one directory checkpoint files live in, and the only way craned and its workers open them.

Why: the daemon and its workers may run as root and a checkpoint holds a session's resume token
and all of its device memory, so an operator's path must never reach an arbitrary file (issue
13, "Paths"). A checkpoint is named relative to the configured directory (``x.ckpt``,
``team/x.ckpt``); an absolute path is accepted only when it lies inside it. The check is
lexical first, so a path outside is refused by name before anything touches the file system
(the refusal says nothing about whether such a file exists). Inside, every component is opened
relative to the directory with ``O_NOFOLLOW`` (a symbolic link anywhere, or a ``..``, cannot
lead out), a checkpoint is written to an ``O_EXCL`` temporary file in the same directory and
renamed over its name (complete or absent), files are mode 0600 and the directory 0700.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

__all__ = ["CheckpointDir", "PathRefused"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PathRefused(Exception):
    """A checkpoint name that does not name a file inside the directory; says which and why."""


class CheckpointDir:
    """``root``: the configured checkpoint directory (created 0700 when missing)."""

    def __init__(self, root: str | Path) -> None:
        if not str(root):  # never "the current directory" by accident
            raise ValueError("no checkpoint directory given")
        self.root = Path(os.path.abspath(root))

    def ensure(self) -> None:
        """Create the directory (0700) if missing; tighten its mode if it is ours."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = self.root.stat()
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o700:
            self.root.chmod(0o700)

    def refusal(self, name: str) -> PathRefused:
        """The one refusal for every name that is not a file inside the directory."""
        return PathRefused(
            f"checkpoint path {name!r} is not a file inside the checkpoint directory "
            f"{self.root} (checkpoints are written and read only there: a name relative to it, "
            "or an absolute path inside it; no '..', no symbolic links)"
        )

    def relative(self, name: str) -> PurePosixPath:
        """``name`` as a path relative to the directory, checked lexically (no file system
        access): raises :class:`PathRefused` for anything that is not inside it."""
        if not name or "\0" in name:
            raise self.refusal(name)
        p = PurePosixPath(name)
        if p.is_absolute():
            try:
                p = p.relative_to(PurePosixPath(self.root))
            except ValueError:
                raise self.refusal(name) from None
        parts = [x for x in p.parts if x not in ("", ".")]
        if not parts or any(x == ".." for x in parts):
            raise self.refusal(name)
        return PurePosixPath(*parts)

    def path(self, name: str) -> Path:
        """The absolute path ``name`` stands for (checked lexically, see :meth:`relative`)."""
        return self.root / self.relative(name)

    # ---- opening, relative to the directory, following no link ------------------------------
    @contextlib.contextmanager
    def _parent(self, name: str) -> Iterator[tuple[int, str]]:
        """An fd of the directory holding ``name``'s file and the file's last component."""
        rel = self.relative(name)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in rel.parts[:-1]:
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:  # a link (ELOOP, ENOTDIR) or a missing directory
                    raise self._refused_or(name, e) from None
                os.close(fd)
                fd = nxt
            yield fd, rel.parts[-1]
        finally:
            os.close(fd)

    def _refused_or(self, name: str, e: OSError) -> Exception:
        import errno

        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
            return self.refusal(name)
        return e

    @contextlib.contextmanager
    def open_read(self, name: str) -> Iterator[BinaryIO]:
        """The checkpoint ``name`` for reading (``O_NOFOLLOW``; a link is refused)."""
        with self._parent(name) as (dfd, last):
            try:
                fd = os.open(last, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as e:
                raise self._refused_or(name, e) from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise self.refusal(name)
            with os.fdopen(fd, "rb", buffering=1 << 20) as f:
                yield f

    def check_writable(self, name: str) -> None:
        """Refuse a name whose file exists as something a checkpoint may not replace (a link,
        a directory); raises :class:`PathRefused`."""
        with self._parent(name) as (dfd, last):
            try:
                st = os.stat(last, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if not stat.S_ISREG(st.st_mode):
                raise self.refusal(name)

    @contextlib.contextmanager
    def open_write(self, name: str) -> Iterator[BinaryIO]:
        """A new file that becomes ``name`` (mode 0600) only if the block completes: written to
        an ``O_EXCL`` temporary file beside it, synced, renamed over the name."""
        self.check_writable(name)
        with self._parent(name) as (dfd, last):
            tmp = f".{last}.{os.getpid()}.partial"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
            except FileExistsError:  # a crashed writer's leftover with our pid: replace it
                os.unlink(tmp, dir_fd=dfd)
                fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
            done = False
            try:
                os.fchmod(fd, 0o600)  # whatever the umask
                with os.fdopen(fd, "wb", buffering=1 << 20) as f:
                    yield f
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(tmp, last, src_dir_fd=dfd, dst_dir_fd=dfd)
                done = True
            finally:
                if not done:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=dfd)
