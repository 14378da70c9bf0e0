"""The CUDA driver as the cuda backend calls it: cuda-python, every result checked.

cuda-python returns ``(CUresult, *values)`` from every call. :func:`unwrap` turns a failure into
the :class:`~crane.api.results.CudaError` the guest should see, naming the driver call, and
unwraps the values, so the backend reads like the driver API instead of tuple juggling.

Importing this module does not touch a GPU: :func:`load` imports ``cuda.bindings.driver`` (which
only ``dlopen``s libcuda.so.1 on the first call) and raises :class:`DriverUnavailable` with the
reason when cuda-python is missing, so a host without it gets a message instead of a traceback.
"""

from __future__ import annotations

from typing import Any

from crane.api.results import CudaError

__all__ = ["DriverUnavailable", "load", "unwrap"]


class DriverUnavailable(RuntimeError):
    """cuda-python (or the NVIDIA driver it loads) is not usable on this host."""


_driver: Any = None


def load() -> Any:
    """``cuda.bindings.driver``, imported once."""
    global _driver
    if _driver is None:
        try:
            from cuda.bindings import driver  # type: ignore[import-not-found]
        except ImportError as e:
            raise DriverUnavailable(
                f"cuda-python is not installed ({e}); install crane[host] on GPU hosts"
            ) from None
        _driver = driver
    return _driver


def unwrap(what: str, ret: Any) -> Any:
    """Unwrap one cuda-python result: None, the single value, or a tuple of values."""
    if isinstance(ret, tuple):
        err, values = ret[0], ret[1:]
    else:
        err, values = ret, ()
    if int(err) != 0:
        name = getattr(err, "name", None) or str(int(err))
        raise CudaError(int(err), f"{what} failed: {name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values
