"""The simulated GPU's kernel executor: a vectorized PTX interpreter in NumPy.

Interface (what the sim backend calls)::

    from crane.backends.sim.ptx import load_ptx, PtxProgram, PtxError, PtxUnsupported, KernelFault

    prog = load_ptx(ptx_text)      # parse + decode every function once. Raises PtxUnsupported
                                   # (a PtxError; message names the instruction and PTX line)
                                   # or PtxError for malformed PTX -- at load, never at run time.
                                   # (the backend loads modules over 4 MiB with lazy.py's
                                   # load_program instead: each kernel decoded at its first
                                   # launch, which then fails with INVALID_PTX if it must)
    prog.kernels: dict[str, PtxKernel]   # .params ((offset, size), ...), .param_bytes,
                                         # .static_shared_bytes, .local_bytes, .maxntid, .reqntid
    prog.variables: list[ModuleVariable] # module .global/.const data: name, space, size, align,
                                         # init bytes (None = zero), relocs; the backend places
                                         # them and passes their addresses as ``symbols``
    prog.launch(name, grid=(gx, gy, gz), block=(bx, by, bz), dynamic_shared=0, params=b"...",
                memory=SimMemory, symbols={var_name: device_addr}, profile=DeviceProfile,
                printf=callable_taking_str, max_dynamic_shared=None,
                cluster=None, non_portable_cluster=False)   # cluster: (cx, cy, cz) CTAs

``launch`` runs the kernel to completion or raises :class:`KernelFault` with ``code`` the
CUresult: 700 illegal address / 716 misaligned address (naming the address, the instruction
and its PTX line), 719 ``trap``, 710 a failed device ``assert`` (whose message is printed
through ``printf`` first, as on a GPU), and the launch-configuration errors of
:mod:`crane.api.launch_check` (1 INVALID_VALUE, 701 LAUNCH_OUT_OF_RESOURCES, 912
INVALID_CLUSTER_SIZE). ``params`` is the
packed parameter buffer laid out per ``PtxKernel.params``. Device ``printf`` output goes to
``printf`` one formatted string per call and thread.

How it works — modules by role:

* :mod:`.lexer`, :mod:`.parser`: PTX text → functions with scoped instruction lists;
* :mod:`.decode` + :mod:`.opcodes` (the one opcode table) + ``ops_*`` (decoders/handlers by
  class: ``ops_int``, ``ops_float``, ``ops_move``, ``ops_sfu``, ``ops_mem``, ``ops_control``,
  ``ops_warp``, ``ops_bits``; helpers :mod:`.fp` rounding, :mod:`.atomics`, :mod:`.printf`): each
  instruction is decoded once into an :class:`~.instr.Ins` with pre-resolved operands;
* :mod:`.state`, :mod:`.memspace`: registers per function as (registers x lanes) arrays,
  memory spaces and the generic-address windows;
* :mod:`.executor`: min-PC SIMT scheduling over groups of lanes, barriers, faults;
* :mod:`.program`: layouts, launch checks, batching of blocks.
"""

from __future__ import annotations

from .errors import KernelFault, PtxError, PtxUnsupported
from .program import ModuleVariable, PtxKernel, PtxProgram, load_ptx

__all__ = [
    "KernelFault",
    "ModuleVariable",
    "PtxError",
    "PtxKernel",
    "PtxProgram",
    "PtxUnsupported",
    "load_ptx",
]
