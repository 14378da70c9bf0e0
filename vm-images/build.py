"""Build Crane's test guest: Debian's kernel (a PVH ``vmlinux``) and an initramfs.

The guest is made only of Debian bookworm packages (``apt-get download`` + ``dpkg-deb -x``:
nothing is installed on the host), PyPI wheels (``pip install --target --only-binary=:all:``
for the guest's Python), Crane's guest sources and the CUDA programs of vm-images/programs.
What goes in is declared in vm-images/packages.toml; vm-images/init.sh is its /init.

Images are cached by content: the key hashes the recipe (this directory), the Debian versions
apt would fetch now, the pinned wheels, Crane's guest sources and the compiler's version, so a
test calls :func:`ensure` and only the first call after a change builds (under a lock, so two
test sessions never build the same image twice). The cache is ``$CRANE_VM_IMAGE_CACHE`` or
``~/.cache/crane/vm-images``; each image is ``<cache>/<key>/{vmlinux,initrd.gz,manifest.json}``
and downloaded ``.deb`` files are kept in ``<cache>/debs`` for the next key.

Why a PVH ``vmlinux`` rather than the ``bzImage``: QEMU boots it directly without the
decompressor, which under TCG (the only accelerator on the project's machines) halves the time
to /init (vm-lab-facts.md).

    python vm-images/build.py [--out DIR] [--rebuild] [--print-key]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from cpio import write_initramfs  # noqa: E402  (vm-images/ is a directory of scripts)

__all__ = ["Image", "cache_root", "ensure", "image_key", "main"]

#: Bumped when the layout of an image directory changes (part of the key).
FORMAT = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Image:
    """A built guest: boot it with ``-kernel kernel -initrd initrd``."""

    dir: Path
    key: str
    kernel: Path
    initrd: Path
    manifest: dict[str, object]


def cache_root() -> Path:
    """Where images live: ``$CRANE_VM_IMAGE_CACHE`` or ``~/.cache/crane/vm-images``."""
    env = os.environ.get("CRANE_VM_IMAGE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "crane" / "vm-images"


def load_recipe() -> dict[str, dict[str, object]]:
    return tomllib.loads((HERE / "packages.toml").read_text())


def _run(cmd: list[str], **kw: object) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def apt_candidates(names: Iterable[str]) -> dict[str, str]:
    """The version apt would download for each package (its candidate), from the local lists:
    no network, so computing a key is cheap and works offline."""
    names = sorted(set(names))
    out = _run(["apt-cache", "policy", *names], env={**os.environ, "LC_ALL": "C"})
    found: dict[str, str] = {}
    current = None
    for line in out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1].split(":")[0]
        elif current and line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            if version != "(none)":
                found[current] = version
    missing = [n for n in names if n not in found]
    if missing:
        raise RuntimeError(
            f"apt has no candidate for {', '.join(missing)}: run `apt-get update` "
            "(scripts/vm_deps.sh does) on a Debian bookworm host"
        )
    return found


def kernel_package(meta: str) -> str:
    """The versioned image package the meta-package depends on (linux-image-6.1.0-N-amd64)."""
    out = _run(["apt-cache", "depends", meta], env={**os.environ, "LC_ALL": "C"})
    for line in out.splitlines():
        dep = line.strip().removeprefix("Depends:").strip()
        if line.strip().startswith("Depends:") and dep.startswith("linux-image-"):
            return dep
    raise RuntimeError(f"{meta} names no linux-image package in its Depends")


def _tree_digest(h: Any, root: Path, patterns: Iterable[str]) -> None:
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
                h.update(path.read_bytes())


def _debian_names(recipe: dict[str, dict[str, object]]) -> list[str]:
    names = [kernel_package(str(recipe["kernel"]["package"]))]
    for section in recipe.values():
        names += [str(n) for n in section.get("debian", [])]  # type: ignore[attr-defined]
    return names


def image_key(recipe: dict[str, dict[str, object]] | None = None) -> tuple[str, dict[str, str]]:
    """The image's content key and the Debian versions it was computed from."""
    recipe = recipe or load_recipe()
    versions = apt_candidates(_debian_names(recipe))
    h = hashlib.sha256(f"crane-vm-image {FORMAT}\n".encode())
    h.update(json.dumps(versions, sort_keys=True).encode())
    _tree_digest(h, HERE, ["*.py", "*.toml", "*.sh", "programs/*"])
    return h.hexdigest()[:16], versions


class Builder:
    """One build into a fresh directory; ``debs`` is the shared download cache."""

    def __init__(self, recipe: dict[str, dict[str, object]], versions: dict[str, str],
                 work: Path, debs: Path) -> None:  # fmt: skip
        self.recipe = recipe
        self.versions = versions
        self.work = work
        self.debs = debs
        self.rootfs = work / "rootfs"
        self.log: list[str] = []

    # -- Debian packages ----------------------------------------------------------------
    def fetch(self, name: str) -> Path:
        """``name``'s .deb at the keyed version (downloaded once into the shared cache)."""
        version = self.versions[name]
        pattern = f"{name}_{version.replace(':', '%3a')}_*.deb"
        found = sorted(self.debs.glob(pattern))
        if not found:
            self.debs.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=self.debs) as tmp:
                _run(["apt-get", "download", "-q", f"{name}={version}"], cwd=tmp)
                for deb in Path(tmp).glob("*.deb"):
                    deb.replace(self.debs / deb.name)
            found = sorted(self.debs.glob(pattern))
            if not found:
                raise RuntimeError(f"apt-get download {name}={version} produced no {pattern}")
        return found[0]

    def extract(self, names: Iterable[str], dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for name in names:
            _run(["dpkg-deb", "-x", str(self.fetch(name)), str(dest)])

    # -- stages ---------------------------------------------------------------------------
    def kernel(self, out: Path) -> str:
        """Write the PVH vmlinux to ``out`` and copy the listed modules; returns the release."""
        pkg = kernel_package(str(self.recipe["kernel"]["package"]))
        kdir = self.work / "kernel"
        self.extract([pkg], kdir)
        (vmlinuz,) = sorted((kdir / "boot").glob("vmlinuz-*"))
        release = vmlinuz.name.removeprefix("vmlinuz-")
        out.write_bytes(extract_vmlinux(vmlinuz.read_bytes()))
        moddir = kdir / "lib" / "modules" / release / "kernel"
        order = []
        for mod in self.recipe["kernel"]["modules"]:  # type: ignore[attr-defined]
            matches = sorted(moddir.rglob(f"{mod}.ko"))
            if len(matches) != 1:
                raise RuntimeError(f"kernel {release}: module {mod}.ko found {len(matches)} times")
            rel = matches[0].relative_to(moddir.parent)
            (self.rootfs / "lib/modules" / release / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(matches[0], self.rootfs / "lib/modules" / release / rel)
            order.append(rel.as_posix())
        (self.rootfs / "etc/crane").mkdir(parents=True, exist_ok=True)
        (self.rootfs / "etc/crane/modules").write_text("\n".join(order) + "\n")
        return release

    def base(self) -> None:
        """busybox with its applets as links, the directories /init mounts on, and /init."""
        self.extract(self.recipe["base"]["debian"], self.rootfs)  # type: ignore[arg-type]
        busybox = self.rootfs / "bin" / "busybox"
        applets = _run([str(busybox), "--list-full"]).split()
        for applet in applets:
            link = self.rootfs / applet
            if not link.exists() and not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(os.path.relpath("/bin/busybox", "/" + str(Path(applet).parent)))
        for d in ("dev", "proc", "sys", "tmp", "run", "root", "etc", "opt/crane"):
            (self.rootfs / d).mkdir(parents=True, exist_ok=True)
        (self.rootfs / "tmp").chmod(0o1777)
        (self.rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (self.rootfs / "etc/group").write_text("root:x:0:\n")
        init = self.rootfs / "init"
        shutil.copyfile(HERE / "init.sh", init)
        init.chmod(0o755)


def extract_vmlinux(vmlinuz: bytes) -> bytes:
    """The uncompressed kernel inside a bzImage: Debian's is xz-compressed after the setup and
    decompressor code, so the first xz stream that decodes to an ELF file is it."""
    magic = b"\xfd7zXZ\x00"
    at = vmlinuz.find(magic)
    while at >= 0:
        dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        with contextlib.suppress(lzma.LZMAError):
            data = dec.decompress(vmlinuz[at:])
            if data[:4] == b"\x7fELF":
                return data
        at = vmlinuz.find(magic, at + 1)
    raise RuntimeError("no xz-compressed ELF kernel found in the vmlinuz")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load(d: Path) -> Image | None:
    man = d / MANIFEST
    if not man.is_file():
        return None
    manifest = json.loads(man.read_text())
    return Image(d, manifest["key"], d / "vmlinux", d / "initrd.gz", manifest)


def build_image(dest: Path, key: str, versions: dict[str, str],
                recipe: dict[str, dict[str, object]], debs: Path) -> Image:  # fmt: skip
    """Build into ``dest`` (made fresh; renamed into place only when complete)."""
    start = time.monotonic()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{key}-", dir=dest.parent) as tmp:
        work = Path(tmp)
        out = work / "image"
        out.mkdir()
        b = Builder(recipe, versions, work, debs)
        b.base()
        release = b.kernel(out / "vmlinux")
        entries = write_initramfs(b.rootfs, out / "initrd.gz")
        manifest = {
            "key": key,
            "format": FORMAT,
            "kernel_release": release,
            "debian": versions,
            "initramfs_entries": entries,
            "initrd_bytes": (out / "initrd.gz").stat().st_size,
            "kernel_bytes": (out / "vmlinux").stat().st_size,
            "build_seconds": round(time.monotonic() - start, 1),
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        out.replace(dest)
    image = _load(dest)
    assert image is not None
    return image


def ensure(out: Path | None = None, rebuild: bool = False) -> Image:
    """The current image, built first when the cache has none for its key. ``out`` puts it
    in that directory instead of the cache (``--out``)."""
    recipe = load_recipe()
    key, versions = image_key(recipe)
    root = cache_root()
    dest = out if out is not None else root / key
    with _locked(root / ".lock"):
        image = None if rebuild else _load(dest)
        if image is not None and image.key == key:
            return image
        return build_image(dest, key, versions, recipe, root / "debs")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="build into DIR instead of the cache")
    ap.add_argument("--rebuild", action="store_true", help="build even when cached")
    ap.add_argument("--print-key", action="store_true", help="print the content key and exit")
    a = ap.parse_args(argv)
    if a.print_key:
        print(image_key()[0])
        return 0
    image = ensure(a.out, a.rebuild)
    print(json.dumps({"dir": str(image.dir), **image.manifest}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
