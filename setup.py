"""Build hook: generate the gRPC/protobuf modules before the package is built or installed."""

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
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})
