"""The guest side's session library, the Python API the interposer sits on.

This package's exports are Crane's public Python API (README.md's example uses them):
``GuestSession`` is a connection to craned and the guest-side state of one CUDA session (see
:mod:`crane.guest.session`); a failed driver operation raises ``CudaError``, whose ``code`` is
the ``CUresult`` the driver would have returned. ``Module``, ``Function`` and ``KernelLayout``
are what module loads and kernel look-ups return. The transport, handle ids, VA allocator and
the VMM API's records live in the modules beside it and are internal.
"""

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.guest.session import Function, GuestSession, KernelLayout, Module

__all__ = ["CUresult", "CudaError", "Function", "GuestSession", "KernelLayout", "Module"]
