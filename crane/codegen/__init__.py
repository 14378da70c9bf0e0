"""Code generators that turn NVIDIA's headers into Python modules.

Crane mirrors many numeric constants of the CUDA driver API (result codes, attribute
numbers, flag bits).  Copying them by hand invites silent drift when the toolkit moves on,
so they are generated from the header itself and the generated files are checked in; each
generator has a ``--check`` mode that CI can run to prove the checked-in copy is current.
"""

__all__: list[str] = []
