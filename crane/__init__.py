"""Crane: CUDA remoting and live migration of GPU state."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """``crane.__version__``, read from the installed distribution when first asked for.

    Why lazily: ``importlib.metadata`` costs 60-180 ms to import on this project's 2-core
    machines, and every process crane starts (the daemon, each session's worker, the guest
    library, the CLI) imports this package; only the CLI's ``--version``, the daemon's first
    log line and the wheel's metadata ask for the version."""
    if name != "__version__":
        raise AttributeError(f"module 'crane' has no attribute {name!r}")
    from importlib import metadata

    try:  # the installed distribution's version (setuptools-scm: from git tags)
        version = metadata.version("crane")
    except metadata.PackageNotFoundError:  # imported from a tree that was never installed
        version = "0.0.0+unknown"
    globals()["__version__"] = version
    return version
