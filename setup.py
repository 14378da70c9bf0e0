"""Build hook: generate the gRPC/protobuf modules and build the guest library (libcuda.so.1,
interposer/build_interposer.py) before the package is built or installed."""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).parent))


class BuildWithProtos(build_py):
    """Runs crane.codegen.protos first, so installed and editable trees both get crane/v1."""

    def run(self) -> None:
        from crane.codegen.protos import generate

        generate(Path(__file__).parent)
        _build_interposer()
        super().run()


def _build_interposer() -> None:
    """The guest library needs a C compiler and libpython; without them the daemon side still
    installs, and ``crane run`` explains how to build the library later."""
    import importlib.util

    path = Path(__file__).parent / "interposer" / "build_interposer.py"
    spec = importlib.util.spec_from_file_location("build_interposer", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    try:
        # record no site dirs: this may be an isolated build environment that will not exist at
        # run time; the library finds its install root itself (scripts/setup.sh rebuilds it with
        # the venv's site-packages recorded for editable installs)
        mod.build(site_dirs=[])
    except Exception as e:  # reported, not fatal for the host side
        print(f"warning: guest library not built: {e}", file=sys.stderr)


setup(cmdclass={"build_py": BuildWithProtos})
