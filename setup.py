"""Build hook: generate the gRPC/protobuf modules, build the guest library (libcuda.so.1,
interposer/build_interposer.py) and ship its sources, so that a wheel or an sdist installed
without this source tree gives a working ``crane``/``craned``.

Why each step sits where it does:

* The gRPC modules (``crane.v1``) are generated before ``setup()`` runs: setuptools fixes the
  package list from the tree when it reads pyproject.toml, so a package generated later (in
  ``build_py``) would be left out of the wheel.
* The guest library is built in ``build_py`` (it needs cffi and a C compiler, both build
  requirements in pyproject.toml) and goes into the wheel as package data. It embeds the build
  interpreter's Python version (it links that libpython), so the wheel is tagged for that
  interpreter and platform, not ``py3-none-any``.
* The library's C sources and their build script are copied into the package
  (``crane/interposer/_build/``), so an installed Crane can build the library again for any
  interpreter (``crane guest-lib --build`` / ``--python``).
"""

import os
import shutil
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: What of interposer/ the package ships (the rest is the library's build output).
_GUEST_SOURCES = ("build_interposer.py", "src", "generated")


def _generate_protos() -> None:
    from crane.codegen.protos import generate

    generate(HERE)


class BuildWithGuestLibrary(build_py):
    """Builds the guest library into the package, then copies the library's sources in."""

    def run(self) -> None:
        _build_interposer()  # into crane/interposer/_lib: package data (pyproject.toml)
        _build_ring()  # into crane/wire: package data
        super().run()
        if not self.editable_mode:
            dest = Path(self.build_lib) / "crane" / "interposer" / "_build"
            shutil.rmtree(dest, ignore_errors=True)
            for name in _GUEST_SOURCES:
                src = HERE / "interposer" / name
                if src.is_dir():
                    shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    dest.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dest / name)


class PlatformDistribution(Distribution):
    """The guest library is a compiled, Python-version-specific file: tag the wheel so."""

    def has_ext_modules(self) -> bool:
        return True


def _build_interposer() -> Path | None:
    """The guest library needs a C compiler and a shared libpython; without them the daemon
    side still installs, and ``crane run`` says how to build the library later
    (``crane guest-lib --build``). ``CRANE_REQUIRE_GUEST_LIB=1`` makes its absence fatal."""
    import importlib.util

    path = HERE / "interposer" / "build_interposer.py"
    spec = importlib.util.spec_from_file_location("build_interposer", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    try:
        # record no site dirs: this may be an isolated build environment that will not exist at
        # run time; the library finds its install root itself (scripts/setup.sh rebuilds it with
        # the venv's site-packages recorded for editable installs)
        return mod.build(site_dirs=[])
    except Exception as e:  # reported, not fatal for the host side unless asked
        if os.environ.get("CRANE_REQUIRE_GUEST_LIB") == "1":
            raise
        print(
            f"warning: guest library not built ({e}); after installing, run "
            "`crane guest-lib --build` on a machine with a C compiler",
            file=sys.stderr,
        )
        return None


def _build_ring() -> None:
    """The call ring's C cores and the simulator's fill loop (crane/wire/shm_build.py). Without
    them guests on this host use the worker's gRPC socket (the transport says why) and the
    simulator fills one memset at a time, so a missing compiler is not fatal."""
    import importlib.util

    try:
        path = HERE / "crane" / "wire" / "shm_build.py"  # the ring, and its bulk area
        spec = importlib.util.spec_from_file_location("shm_build", path)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["shm_build"] = mod  # its dataclass looks its module up there
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        mod.build()
    except Exception as e:
        if os.environ.get("CRANE_REQUIRE_GUEST_LIB") == "1":
            raise
        print(f"warning: call ring not built ({e}); guests use the gRPC socket", file=sys.stderr)


_generate_protos()
setup(cmdclass={"build_py": BuildWithGuestLibrary}, distclass=PlatformDistribution)
