"""The destination's pre-flight check: every reason it cannot take a session, before anything moves.

Why every reason rather than the first: an operator choosing a destination wants to know all that
is wrong with it at once (a model with no code for the module *and* too little memory). The check
is pure (values in, sentences out) so that the destination daemon and the source worker (for
images the destination lacks) run the very same rules.
"""

from __future__ import annotations

from collections.abc import Mapping

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.modules.arch import format_cc
from crane.modules.errors import ImageError, NoCompatibleCode
from crane.modules.image import inspect_image

__all__ = ["LIMITS_CHECKED", "check_code", "check_limits", "check_memory"]

#: Limits a guest may have planned its launches around (cached at open): the destination must
#: offer at least as much of each.
LIMITS_CHECKED: dict[int, str] = {
    int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN): "max shared memory per block "
    "(opt-in)",
    int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK): "max shared memory per block",
    int(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK): "max threads per block",
    int(A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X): "max block dim x",
    int(A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y): "max block dim y",
    int(A.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z): "max block dim z",
    int(A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X): "max grid dim x",
    int(A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y): "max grid dim y",
    int(A.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z): "max grid dim z",
    int(A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK): "max registers per block",
}


def check_limits(told: Mapping[int, int], offered: Mapping[int, int], where: str) -> list[str]:
    """Limits the guest was told that ``where`` does not offer."""
    out = []
    for attr, name in LIMITS_CHECKED.items():
        if attr in told and offered.get(attr, 0) < told[attr]:
            out.append(
                f"{name}: the guest was told {told[attr]}, {where} offers {offered.get(attr, 0)}"
            )
    return out


def check_memory(needed: int, free: int, where: str) -> list[str]:
    if needed > free:
        return [
            f"too little free device memory: the session holds {needed >> 20} MiB, {where} has "
            f"{free >> 20} MiB free"
        ]
    return []


def check_code(digest: bytes, image: bytes, cc: tuple[int, int], where: str) -> list[str]:
    """Whether ``image`` has code (cubin for this architecture, or PTX to JIT) for ``cc``."""
    try:
        inspect_image(image, cc)
    except NoCompatibleCode as e:
        return [f"module {digest.hex()[:16]}: no usable code for {where} ({format_cc(cc)}): {e}"]
    except ImageError as e:
        return [f"module {digest.hex()[:16]}: image unusable on {where}: {e}"]
    return []
