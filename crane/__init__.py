"""Crane: CUDA remoting and live migration of GPU state."""

from importlib import metadata

try:  # the installed distribution's version (setuptools-scm: from git tags)
    __version__ = metadata.version("crane")
except metadata.PackageNotFoundError:  # imported from a tree that was never installed
    __version__ = "0.0.0+unknown"
