"""The checkpoint directory's confinement (crane.host.checkpoint_dir), file system included."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from crane.host.checkpoint_dir import CheckpointDir, PathRefused


@pytest.fixture
def where(tmp_path: Path) -> CheckpointDir:
    d = CheckpointDir(tmp_path / "ckpt")
    d.ensure()
    return d


@pytest.mark.parametrize(
    "name",
    ["", "/etc/passwd", "..", "../x", "a/../../x", "./../x", "/", ".", "x\0y"],
)
def test_outside_names_are_refused_lexically(where: CheckpointDir, name: str) -> None:
    with pytest.raises(PathRefused, match="is not a file inside the checkpoint directory"):
        where.relative(name)


def test_inside_names(where: CheckpointDir) -> None:
    assert str(where.relative("x.ckpt")) == "x.ckpt"
    assert str(where.relative("./sub//x.ckpt")) == "sub/x.ckpt"
    assert str(where.relative(str(where.root / "x.ckpt"))) == "x.ckpt"
    with pytest.raises(PathRefused):  # a sibling whose name starts like the directory's
        where.relative(str(where.root) + "-other/x.ckpt")


def test_written_atomically_0600_in_a_0700_directory(where: CheckpointDir) -> None:
    assert stat.S_IMODE(where.root.stat().st_mode) == 0o700
    with where.open_write("x.ckpt") as f:
        f.write(b"abc")
        assert not (where.root / "x.ckpt").exists()  # absent until complete
    assert (where.root / "x.ckpt").read_bytes() == b"abc"
    assert stat.S_IMODE((where.root / "x.ckpt").stat().st_mode) == 0o600
    with pytest.raises(RuntimeError), where.open_write("x.ckpt") as f:
        f.write(b"torn")
        raise RuntimeError("the writer failed")
    assert (where.root / "x.ckpt").read_bytes() == b"abc"  # the old file stands
    assert sorted(p.name for p in where.root.iterdir()) == ["x.ckpt"]
    with where.open_read("x.ckpt") as f:
        assert f.read() == b"abc"


def test_links_lead_nowhere(where: CheckpointDir, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "secret").write_bytes(b"secret")
    (where.root / "file").symlink_to(out / "secret")
    (where.root / "dir").symlink_to(out)
    for name in ("file", "dir/secret", "dir/new"):
        with pytest.raises(PathRefused), where.open_read(name) as f:
            f.read()
        with pytest.raises(PathRefused), where.open_write(name) as f:
            f.write(b"x")
    assert (out / "secret").read_bytes() == b"secret"
    assert sorted(p.name for p in out.iterdir()) == ["secret"]


def test_no_directory_is_never_the_current_one() -> None:
    with pytest.raises(ValueError, match="no checkpoint directory"):
        CheckpointDir("")
