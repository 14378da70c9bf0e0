"""The image recipe's pure parts (no QEMU needed): the initramfs archive, the kernel's
extraction from a vmlinuz, the check of the wheel pins against Crane's requirements."""

from __future__ import annotations

import lzma
import stat
from pathlib import Path

import pytest

from tests.vm.image import build_module

build = build_module()


def _parse_newc(data: bytes) -> list[tuple[str, int, bytes, tuple[int, int]]]:
    """(name, mode, data, rdev) of every entry of a cpio newc archive, in order."""
    out, i = [], 0
    while True:
        assert data[i : i + 6] == b"070701"
        f = [int(data[i + 6 + 8 * k : i + 14 + 8 * k], 16) for k in range(13)]
        mode, size, rdev, namesize = f[1], f[6], (f[9], f[10]), f[11]
        name = data[i + 110 : i + 110 + namesize - 1].decode()
        j = i + 110 + namesize
        j += -j % 4
        body = data[j : j + size]
        j += size
        i = j + (-j % 4)
        if name == "TRAILER!!!":
            return out
        out.append((name, mode, body, rdev))


def test_initramfs_is_deterministic_with_nodes_and_sentinel_last(tmp_path: Path) -> None:
    import cpio  # vm-images/ is on sys.path once build.py is loaded

    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin/busybox").write_bytes(b"\x7fELF-ish")
    (root / "bin/busybox").chmod(0o755)
    (root / "bin/sh").symlink_to("busybox")
    (root / "dev").mkdir()
    (root / "init").write_text("#!/bin/sh\n")
    a, b = tmp_path / "a.cpio", tmp_path / "b.cpio"
    cpio.write_initramfs(root, a)
    (root / "init").touch()  # another time stamp: same archive
    cpio.write_initramfs(root, b)
    assert a.read_bytes() == b.read_bytes()
    entries = _parse_newc(a.read_bytes())
    names = [e[0] for e in entries]
    assert names[:4] == ["bin", "bin/busybox", "bin/sh", "dev"]
    assert names[-1] == cpio.SENTINEL
    by_name = {e[0]: e for e in entries}
    assert stat.S_ISLNK(by_name["bin/sh"][1]) and by_name["bin/sh"][2] == b"busybox"
    assert stat.S_IMODE(by_name["bin/busybox"][1]) == 0o755
    assert stat.S_ISCHR(by_name["dev/console"][1]) and by_name["dev/console"][3] == (5, 1)

    z = tmp_path / "z.cpio"
    cpio.write_initramfs(root, z, "zstd")
    import zstandard

    assert zstandard.ZstdDecompressor().stream_reader(z.open("rb")).read() == a.read_bytes()
    with pytest.raises(ValueError, match="compression"):
        cpio.write_initramfs(root, z, "lzo")


def test_vmlinux_is_the_xz_stream_holding_an_elf() -> None:
    decoy = lzma.compress(b"not a kernel", format=lzma.FORMAT_XZ)
    kernel = b"\x7fELF" + bytes(range(256)) * 8
    vmlinuz = b"MZ setup code" + decoy + b"decompressor" + lzma.compress(kernel) + b"\0" * 9
    assert build.extract_vmlinux(vmlinuz) == kernel
    with pytest.raises(RuntimeError, match="no xz-compressed ELF"):
        build.extract_vmlinux(b"MZ" + decoy)


def test_pins_must_meet_cranes_requirements() -> None:
    pins = [str(p) for p in build.load_recipe()["pypi"]["pins"]]
    build.check_pins(pins)
    without_numpy = [p for p in pins if not p.startswith("numpy==")]
    with pytest.raises(RuntimeError, match="pins no version of numpy"):
        build.check_pins(without_numpy)
    with pytest.raises(RuntimeError, match="outside Crane's requirement"):
        build.check_pins([*without_numpy, "numpy==1.0"])
