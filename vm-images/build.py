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
#: Crane's files that end up in the guest (the package, the library's sources and build).
GUEST_SOURCES = ("crane/**/*.py", "interposer/build_interposer.py", "interposer/src/*",
                 "interposer/generated/*", "pyproject.toml")  # fmt: skip
#: Where Crane lives in the guest: the package, its dependencies, the programs.
GUEST_LIB = "/opt/crane/lib"
GUEST_SITE = "/opt/crane/site"
GUEST_PROGRAMS = "/opt/crane/programs"
MULTIARCH = "x86_64-linux-gnu"
#: The guest's ``crane run``: the library first on LD_PRELOAD, as crane/cli/run.py does on a
#: host, without a Python start-up (seconds under TCG) before the program. Preloading matters:
#: cudart dlopens libcuda.so.1 with local scope, where the libpython it brings would not serve
#: the symbols of the extension modules its Python side imports.
CRANE_RUN = """#!/bin/sh
# crane-run PROGRAM ARGS...: run a CUDA program with Crane's guest library as its driver.
export LD_PRELOAD="{lib}${{LD_PRELOAD:+:$LD_PRELOAD}}"
exec "$@"
"""
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
        for field in ("debian", "build_debian"):
            names += [str(n) for n in section.get(field, [])]  # type: ignore[attr-defined]
    return names


def interposer_build() -> Any:
    """interposer/build_interposer.py: the guest library's own build, used with the guest's
    interpreter facts so the image's library is made exactly as Crane's is."""
    if str(ROOT / "interposer") not in sys.path:
        sys.path.insert(0, str(ROOT / "interposer"))
    import build_interposer

    return build_interposer


def find_nvcc() -> str | None:
    """The CUDA compiler the tests use (crane.cli.demo.find_nvcc: PATH, else PyPI's)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from crane.cli.demo import find_nvcc as find

    return find()


def nvcc_version() -> str:
    """The compiler's version line (part of the key: it makes the programs), "none" without."""
    nvcc = find_nvcc()
    if nvcc is None:
        return "none"
    return _run([nvcc, "--version"]).strip().splitlines()[-1]


def image_key(recipe: dict[str, dict[str, object]] | None = None) -> tuple[str, dict[str, str]]:
    """The image's content key and the Debian versions it was computed from."""
    recipe = recipe or load_recipe()
    versions = apt_candidates(_debian_names(recipe))
    h = hashlib.sha256(f"crane-vm-image {FORMAT}\n".encode())
    h.update(json.dumps(versions, sort_keys=True).encode())
    _tree_digest(h, HERE, ["*.py", "*.toml", "*.sh", "programs/*"])
    _tree_digest(h, ROOT, GUEST_SOURCES)
    h.update(f"nvcc: {nvcc_version()}".encode())
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

    # -- Python, Crane, its library --------------------------------------------------------
    def python(self) -> Any:
        """Debian's Python into the rootfs and its headers into the work area; the facts a
        library build for it needs (it cannot be probed: it is not this host's interpreter).

        The guest library embeds libpython, so it is compiled against exactly the headers and
        the libpython of the interpreter the guest runs (Debian's 3.11 here), never the host's:
        a library built for another Python would load a second, mismatched libpython."""
        sec = self.recipe["python"]
        ver = str(sec["version"])
        self.extract(sec["debian"], self.rootfs)  # type: ignore[arg-type]
        dev = self.work / "pydev"
        self.extract(sec["build_debian"], dev)  # type: ignore[arg-type]
        # Debian's pyconfig.h includes the multiarch one by a path relative to /usr/include:
        # give the compiler one directory that holds the real one.
        include = self.work / "include" / f"python{ver}"
        shutil.copytree(dev / "usr/include" / f"python{ver}", include, symlinks=True)
        (include / "pyconfig.h").unlink()
        shutil.copyfile(dev / "usr/include" / MULTIARCH / f"python{ver}" / "pyconfig.h",
                        include / "pyconfig.h")  # fmt: skip
        libpython = self.rootfs / "usr/lib" / MULTIARCH / f"libpython{ver}.so.1.0"
        if not libpython.is_file():
            raise RuntimeError(f"{libpython.name} is not in the recipe's Debian packages")
        bindir = self.rootfs / "usr/bin"
        if not (bindir / "python3").exists():
            (bindir / "python3").symlink_to(f"python{ver}")
        return interposer_build().Interpreter(
            f"/usr/bin/python{ver}", ver, str(include), str(libpython)
        )

    def wheels(self) -> None:
        """The pinned wheels into the guest's site directory, after checking each pin against
        Crane's own requirement for it."""
        sec = self.recipe["pypi"]
        pins = [str(p) for p in sec["pins"]]  # type: ignore[attr-defined]
        check_pins(pins)
        site = self.rootfs / GUEST_SITE.lstrip("/")
        platforms = [a for p in sec["platforms"] for a in ("--platform", p)]  # type: ignore[attr-defined]
        ver = str(self.recipe["python"]["version"])
        _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "--target", str(site), "--only-binary=:all:", "--no-deps", "--no-compile",
              "--python-version", ver, "--implementation", "cp",
              "--abi", "cp" + ver.replace(".", ""), *platforms, *pins])  # fmt: skip
        for pattern in sec.get("prune", []):  # type: ignore[attr-defined]
            for path in sorted(site.glob(pattern)):
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
        shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts for the host's Python

    def crane(self, interp: Any) -> Path:
        """Crane's package into the guest and its library built for the guest's Python, linked
        from where a driver lives (``/usr/lib/<multiarch>/libcuda.so.1``)."""
        dest = self.rootfs / GUEST_LIB.lstrip("/") / "crane"
        shutil.copytree(ROOT / "crane", dest, ignore=shutil.ignore_patterns(
            "__pycache__", "_lib", "_build", "*.so", "*.pyc"))  # fmt: skip
        lib = interposer_build().build(
            dest / "interposer" / "_lib",
            python=interp.executable,
            private_paths=[GUEST_LIB, GUEST_SITE],  # the library finds Crane only here
            interpreter=interp,
            rpath=f"/usr/lib/{MULTIARCH}",
        )
        driver = self.rootfs / "usr/lib" / MULTIARCH / "libcuda.so.1"
        driver.symlink_to(Path(GUEST_LIB) / lib.relative_to(self.rootfs / GUEST_LIB.lstrip("/")))
        bindir = self.rootfs / "opt/crane/bin"
        bindir.mkdir(parents=True, exist_ok=True)
        run = bindir / "crane-run"
        run.write_text(CRANE_RUN.format(lib=f"/usr/lib/{MULTIARCH}/libcuda.so.1"))
        run.chmod(0o755)
        profile = self.rootfs / "etc/crane/profile"
        profile.write_text(f"export PATH=/opt/crane/bin:$PATH\n"
                           f"export PYTHONPATH={GUEST_LIB}:{GUEST_SITE}\n")  # fmt: skip
        return lib

    def programs(self, lib: Path) -> list[str]:
        """vm-images/programs/*.cu built with nvcc and linked against the guest library;
        none (and a note in the manifest) on a host without a CUDA compiler."""
        nvcc = find_nvcc()
        if nvcc is None:
            return []
        flags = [str(f) for f in self.recipe["programs"]["nvcc_flags"]]  # type: ignore[attr-defined]
        linkdir = self.work / "link"
        linkdir.mkdir()
        (linkdir / "libcuda.so").symlink_to(lib)
        out = self.rootfs / GUEST_PROGRAMS.lstrip("/")
        out.mkdir(parents=True, exist_ok=True)
        libdirs = [self.rootfs / "usr/lib" / MULTIARCH, self.rootfs / "lib" / MULTIARCH]
        built = []
        for src in sorted((HERE / "programs").glob("*.cu")):
            _run([nvcc, *flags, "-o", str(out / src.stem), str(src), f"-L{linkdir}", "-lcuda",
                  *(f"-Xlinker=-rpath-link={d}" for d in libdirs)])  # fmt: skip
            built.append(src.stem)
        return built

    def guest_python(self, *args: str) -> str:
        """Run the guest's Python here, through the guest's own dynamic loader and libraries,
        with the guest's paths mapped into the rootfs (byte-compiling, checking imports)."""
        libdirs = [self.rootfs / "lib" / MULTIARCH, self.rootfs / "usr/lib" / MULTIARCH]
        ld = self.rootfs / "lib" / MULTIARCH / "ld-linux-x86-64.so.2"
        ver = str(self.recipe["python"]["version"])
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONHOME": str(self.rootfs / "usr"),
            "PYTHONPATH": os.pathsep.join(
                str(self.rootfs / p.lstrip("/")) for p in (GUEST_LIB, GUEST_SITE)),
            "PYTHONDONTWRITEBYTECODE": "1",
        }  # fmt: skip
        py = self.rootfs / "usr/bin" / f"python{ver}"
        return _run([str(ld), "--library-path", os.pathsep.join(map(str, libdirs)), str(py),
                     *args], env=env)  # fmt: skip

    def compile_python(self) -> None:
        """Byte-compile every module the guest may import, with the guest's Python (its magic
        number) and hash-checked pycs recorded under their guest paths: the initramfs is
        unpacked afresh at each boot, so pycs written at run time would be rebuilt every
        boot, and under TCG compiling is slow."""
        ver = str(self.recipe["python"]["version"])
        dirs = [self.rootfs / f"usr/lib/python{ver}", self.rootfs / GUEST_LIB.lstrip("/"),
                self.rootfs / GUEST_SITE.lstrip("/")]  # fmt: skip
        self.guest_python("-m", "compileall", "-q", "-s", str(self.rootfs), "-p", "/",
                          "--invalidation-mode", "unchecked-hash", "-x", r"/(test|tests|idlelib|"
                          r"tkinter|turtledemo|lib2to3)/", *map(str, dirs))  # fmt: skip

    def check_imports(self) -> None:
        """The guest side's imports under the guest's Python, here: a missing shared library
        or a wheel for the wrong Python fails the build, not a test in the VM."""
        self.guest_python("-c", "import grpc, numpy, google.protobuf, cffi, zstandard, lz4; "
                          "import crane.interposer.bind, crane.guest.transport")  # fmt: skip


def check_pins(pins: list[str]) -> None:
    """Refuse pins outside pyproject.toml's requirements for Crane's guest dependencies, and a
    guest dependency without a pin (the recipe must follow the package's own needs)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from crane.interposer.guest_env import parse_requirement, satisfies

    pinned = {}
    for pin in pins:
        name, _, version = pin.partition("==")
        pinned[name.lower().replace("_", "-")] = version
    for text in interposer_build().guest_requirements():
        req = parse_requirement(text)
        version = pinned.get(req.name.lower())
        if version is None:
            raise RuntimeError(f"vm-images/packages.toml pins no version of {req.name}")
        if not satisfies(version, req):
            raise RuntimeError(f"vm-images/packages.toml pins {req.name}=={version}, outside "
                               f"Crane's requirement {req}")  # fmt: skip


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
        interp = b.python()
        b.wheels()
        lib = b.crane(interp)
        programs = b.programs(lib)
        b.compile_python()
        b.check_imports()
        entries = write_initramfs(b.rootfs, out / "initrd.gz")
        manifest = {
            "key": key,
            "format": FORMAT,
            "kernel_release": release,
            "python": interp.version,
            "pypi": recipe["pypi"]["pins"],
            "programs": {p: f"{GUEST_PROGRAMS}/{p}" for p in programs},
            "nvcc": nvcc_version(),
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
