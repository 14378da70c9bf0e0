"""The guest side's session library, the Python API the interposer sits on.

``GuestSession`` is a connection to craned and the guest-side state of one CUDA session (see
:mod:`crane.guest.session`); the transport, handle ids, VA allocator and the VMM API's records
live in the modules beside it.
"""

from crane.guest.session import Function, GuestSession, KernelLayout, Module

__all__ = ["Function", "GuestSession", "KernelLayout", "Module"]
