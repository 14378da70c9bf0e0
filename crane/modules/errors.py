"""Exception hierarchy for the module-image layer.

Why a separate module: the fatbin, cubin, PTX and image readers all raise errors a daemon
must turn into one CUDA error code (CUDA_ERROR_INVALID_IMAGE / NO_BINARY_FOR_GPU), and the
image layer must catch all of them without importing every reader's internals. Every
error is a ``ValueError`` (malformed input), and ``ImageError`` is the one base class a
caller catches; nothing else may escape a reader, whatever bytes it is given.
"""

from __future__ import annotations

__all__ = [
    "CubinError",
    "FatbinError",
    "ImageError",
    "NoCompatibleCode",
    "PtxImageError",
]


class ImageError(ValueError):
    """A module image is malformed, unsupported, or unusable on the requested device."""


class FatbinError(ImageError):
    """A fatbinary (wrapper, header or entry) is malformed; the message gives the offset."""


class NoCompatibleCode(FatbinError):
    """The image holds no cubin or PTX that a device of the requested compute capability runs.

    The message names what the image contains and what the device would need.
    """


class CubinError(ImageError):
    """A CUDA ELF (cubin) is malformed or is not a CUDA ELF."""


class PtxImageError(ImageError):
    """PTX text cannot be scanned at the declaration level; the message gives the line."""
