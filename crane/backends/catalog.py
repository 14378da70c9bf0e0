"""What the backends offer a daemon choosing its devices: models by name, and whether the cuda
backend can run here.

The daemon resolves its ``--backend`` settings and reads old checkpoints through this one
front, not through the backends' own modules: ``sim:KEY`` names a built-in model (the
simulator's profiles today; the lookup stays the same wherever models come from), and
:func:`cuda_unavailable` says why ``cuda:N`` cannot be served.
"""

from __future__ import annotations

from crane.backends.sim.profiles import DEFAULT_PROFILE_KEY, PROFILES, UnknownProfileError
from crane.device.model import DeviceModel

__all__ = [
    "DEFAULT_MODEL_KEY",
    "UnknownModelError",
    "builtin_model",
    "builtin_model_keys",
    "cuda_unavailable",
]

DEFAULT_MODEL_KEY = DEFAULT_PROFILE_KEY

#: No built-in model has the requested key (a ``KeyError`` whose text lists the known keys).
UnknownModelError = UnknownProfileError


def builtin_model(key: str) -> DeviceModel:
    """The built-in model ``key``; :class:`UnknownModelError` lists the known keys."""
    try:
        return PROFILES[key]
    except KeyError:
        raise UnknownModelError(key, builtin_model_keys()) from None


def builtin_model_keys() -> list[str]:
    return sorted(PROFILES)


def cuda_unavailable() -> str:
    """Why the cuda backend cannot run sessions here ("" when it can): cuda-python missing or
    broken. (Whether a GPU is there is the inventory's question.)"""
    try:
        from crane.backends.cuda import driver

        driver.load()
    except Exception as e:  # DriverUnavailable, or a broken cuda-python install
        return str(e)
    return ""
