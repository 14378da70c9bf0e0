"""The limits a guest plans its launches around, and "offers at least what it was told".

A guest caches its device's identity and limits once, at open (invariant 3), and sizes its
launches by them (shared memory per block, threads per block, grid limits, ...). Wherever its
session resumes, the device must offer at least as much of each, or launches the guest already
planned would fail there. Pure rules: values in, sentences out, so that a restore, a migration's
destination and its source all apply the very same ones.
"""

from __future__ import annotations

from collections.abc import Mapping

from crane.api.generated.cuda_enums import CUdevice_attribute as A

__all__ = ["LIMITS_CHECKED", "check_limits"]

#: Limits a guest may have planned its launches around: the destination must offer at least
#: as much of each.
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
    """Limits the guest was told that ``where`` (offering ``offered``) does not offer."""
    out = []
    for attr, name in LIMITS_CHECKED.items():
        if attr in told and offered.get(attr, 0) < told[attr]:
            out.append(
                f"{name}: the guest was told {told[attr]}, {where} offers {offered.get(attr, 0)}"
            )
    return out
