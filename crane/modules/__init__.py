"""Module images: fatbinaries, cubins and PTX, read without a GPU.

Why a package: the guest needs only the fatbin header arithmetic, the daemon needs the
whole picture (which code suits its device, kernel parameter layouts, globals), and the
PTX interpreter needs the declaration scan; each lives in its own small module, and
:func:`inspect_image` is the single entry point that ties them together.
"""

from crane.modules.errors import (
    CubinError,
    FatbinError,
    ImageError,
    NoCompatibleCode,
    PtxImageError,
)
from crane.modules.image import GlobalInfo, KernelInfo, ModuleImage, inspect_image, inspect_images

__all__ = [
    "CubinError",
    "FatbinError",
    "GlobalInfo",
    "ImageError",
    "KernelInfo",
    "ModuleImage",
    "NoCompatibleCode",
    "PtxImageError",
    "inspect_image",
    "inspect_images",
]
