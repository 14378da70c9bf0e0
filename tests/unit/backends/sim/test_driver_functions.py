"""The guest's linker and the simulated GPU agree on the functions the driver provides.

The guest library resolves a module's ``.extern .func`` against ``DRIVER_FUNCTIONS`` before it
sends the image (crane/modules/ptx_link.py); the simulator serves them (printf, assert, the
device heap, the device runtime's dynamic-parallelism entry points, graph conditions). A name
served by one and missing from the other drifted once: device-created streams were served by
the simulator but their modules were refused at the guest with CUDA_ERROR_INVALID_IMAGE.
"""

from __future__ import annotations

from crane.backends.sim.ptx.device_launch import BUILTINS as DEVICE_RUNTIME
from crane.backends.sim.ptx.graph_conditional import BUILTINS as GRAPH_RUNTIME
from crane.modules.ptx_link import DRIVER_FUNCTIONS

#: served by dedicated handlers in ops_control rather than through a BUILTINS table
_LIBC = {"vprintf", "__assertfail", "malloc", "free"}


def test_the_linker_knows_every_function_the_simulator_serves() -> None:
    served = set(DEVICE_RUNTIME) | set(GRAPH_RUNTIME) | _LIBC
    assert served == set(DRIVER_FUNCTIONS)
