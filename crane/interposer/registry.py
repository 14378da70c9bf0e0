"""Handler registry: Python functions keyed by the spec's ``"name@version"``.

Handlers take the C arguments as cffi values and return None (success) or raise
:class:`crane.api.results.CudaError`; :mod:`crane.interposer.bind` turns that into the CUresult.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["HANDLERS", "handles"]

HANDLERS: dict[str, Callable[..., object]] = {}


def handles(*keys: str) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Register the decorated function for each ``"cuName@version"`` key."""

    def deco(fn: Callable[..., object]) -> Callable[..., object]:
        for k in keys:
            if k in HANDLERS:
                raise RuntimeError(f"two handlers for {k}")
            HANDLERS[k] = fn
        return fn

    return deco
