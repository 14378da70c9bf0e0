"""``cudaGraphSetConditional``: a kernel sets the value a CUDA graph's conditional node tests.

Why here: the device runtime declares it ``extern`` (libcudadevrt serves it on a GPU, with no
PTX a simulated device could JIT), so the interpreter serves it itself. A conditional handle is
the device address of a 32-bit slot that the guest allocated with
``cuGraphConditionalHandleCreate`` (crane/interposer/h_graph.py); setting the condition is a
store of the value there, which the guest reads when the graph reaches the conditional node.
Racing calls are undefined behaviour in CUDA; here the highest lane's value wins.
"""

from __future__ import annotations

import numpy as np

from crane.backends.sim.memory import MemoryFault

__all__ = ["BUILTINS", "h_set_conditional"]


def h_set_conditional(st, ins, idx) -> None:
    handle_off, value_off, _ret = ins.x
    lanes = np.arange(st.n) if idx is None else idx
    pm = st.pm[ins.fid]
    handles = pm[lanes, handle_off : handle_off + 8].copy().view(np.uint64).reshape(-1)
    values = pm[lanes, value_off : value_off + 4].copy().view(np.uint32).reshape(-1)
    for h, v in zip(handles.tolist(), values.tolist(), strict=True):
        if h == 0:
            raise MemoryFault("cudaGraphSetConditional with a NULL handle", 0, "illegal")
        st.mem.write(h, np.uint32(v).tobytes())


#: PTX name -> (handler, number of arguments)
BUILTINS = {"cudaGraphSetConditional": (h_set_conditional, 2)}
