"""Device models known by name: what ``sim:KEY`` (and a format 1 checkpoint's source) means.

The daemon resolves its ``--backend`` settings and reads old checkpoints through this one
front, not through the simulator's modules: the built-in models are the simulator's profiles
today, and the lookup stays the same wherever models come from.
"""

from __future__ import annotations

from crane.backends.sim.profiles import DEFAULT_PROFILE_KEY, PROFILES, UnknownProfileError
from crane.device.model import DeviceModel

__all__ = ["DEFAULT_MODEL_KEY", "UnknownModelError", "builtin_model", "builtin_model_keys"]

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
