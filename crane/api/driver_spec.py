"""The driver-API spec: which CUDA driver entry points the interposer serves, and how.

One table, edited by people, drives the generator (:mod:`crane.codegen.gen_interposer`), which
emits the interposer's C entry points, the cffi ``embedding_api`` text and the
``cuGetProcAddress`` table. Signatures are not written here: they come from the generated
:mod:`crane.api.generated.driver_protos` (one row per ABI variant in ``cudaTypedefs.h``), so the
spec only says, per (name, ABI version), *who* answers:

* ``PY``: the generated C entry calls a Python handler (``crane.interposer.handlers_*``,
  registered under ``"name@version"``). Used for everything that needs the session.
* ``C``: hand-written C in ``interposer/src`` named ``crane_c_<name>_<version>``. Used for what
  must never cross the wire or needs no Python (architecture invariant 3): proc-address look-ups,
  export tables, current context, primary-context reference counts, host memory.

Every other driver symbol is still exported and returns CUDA_ERROR_NOT_SUPPORTED with one log
line naming it. Entries marked with :func:`teardown` still run after a sticky fault (every other
call then fails with the fault, as on a GPU): they name the wire ops they may send, each of which
the call table (:mod:`crane.api.ops`) must mark ``teardown`` too, so the guest and the worker
agree on what a faulted context may still do (tests/unit/api checks it). ``_ptds``/``_ptsz``
variants follow their base entry automatically (the generator maps a NULL stream to
CU_STREAM_PER_THREAD). The ``local`` flag documents calls answered in the
guest without a round trip (from the session's snapshot or local tables).

:data:`FAST` names the entries whose calls the library's own C may queue as packed records
without entering Python (interposer/src/fastlane.c), once the Python side has served such a
call itself and taught the C side what it checked (crane/interposer/fastlane.py); the call goes
the Python way whenever the C side does not know.

Rules: entries are keyed by name and version, so adding one never renumbers anything; the
wire-level op ids live in :mod:`crane.api.ops` (append-only).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["FAST", "SPEC", "Entry", "Fast", "How", "spec_key", "teardown"]


class How(Enum):
    PY = "py"
    C = "c"


@dataclass(frozen=True)
class Entry:
    name: str
    version: int
    how: How
    local: bool = False  # answered in the guest, never a round trip
    #: Still served after a sticky fault (tearing down is always allowed).
    teardown: bool = False
    #: For teardown entries: the wire ops (crane.api.ops names) the call may send.
    sends: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fast:
    """An entry's fast form: ``fn`` (interposer/src/fastlane.c) called with ``args``, C
    expressions over the entry's parameter names (a stream parameter gets the ``_ptsz``
    mapping as in the Python call; ``NULL`` for an entry without a stream). It answers
    CUDA_SUCCESS when it queued the call, or -1: the Python handler serves it."""

    fn: str
    args: tuple[str, ...]


def _memsets() -> dict[str, Fast]:
    out = {}
    for bits, value in ((8, "uc"), (16, "us"), (32, "ui")):
        elem = str(bits // 8)
        for name, stream in ((f"cuMemsetD{bits}", "NULL"), (f"cuMemsetD{bits}Async", "hStream")):
            out[f"{name}@3020"] = Fast("crane_fast_memset", ("dstDevice", value, elem, "N", stream))
    return out


#: Entries with a fast form, by ``name@version`` (each must be a Python entry of :data:`SPEC`).
FAST: dict[str, Fast] = {
    **_memsets(),
    "cuEventRecord@2000": Fast("crane_fast_event_record", ("hEvent", "hStream")),
    "cuEventRecordWithFlags@11010": Fast(
        "crane_fast_event_record_flags", ("hEvent", "hStream", "flags")
    ),
    "cuStreamWaitEvent@3020": Fast("crane_fast_stream_wait", ("hStream", "hEvent", "Flags")),
    # the unified copies go this way only when both ends are device allocations it was taught
    "cuMemcpy@4000": Fast("crane_fast_memcpy_dtod", ("dst", "src", "ByteCount", "NULL")),
    "cuMemcpyAsync@4000": Fast("crane_fast_memcpy_dtod", ("dst", "src", "ByteCount", "hStream")),
    "cuMemcpyDtoD@3020": Fast(
        "crane_fast_memcpy_dtod", ("dstDevice", "srcDevice", "ByteCount", "NULL")
    ),
    "cuMemcpyDtoDAsync@3020": Fast(
        "crane_fast_memcpy_dtod", ("dstDevice", "srcDevice", "ByteCount", "hStream")
    ),
}


@dataclass(frozen=True)
class _Teardown:
    item: str
    sends: tuple[str, ...]


def teardown(item: str, sends: str = "") -> _Teardown:
    """Mark ``item`` (``name@versions``) as served after a sticky fault; ``sends`` names the
    wire ops it may send (space-separated), which must be teardown ops of the call table."""
    return _Teardown(item, tuple(sends.split()))


def spec_key(name: str, version: int) -> str:
    return f"{name}@{version}"


def _e(how: How, local: bool, *items: str | _Teardown) -> list[Entry]:
    out = []
    for item in items:
        mark = item if isinstance(item, _Teardown) else None
        name, _, versions = (mark.item if mark else item).partition("@")  # type: ignore[union-attr]
        out += [
            Entry(name, int(v), how, local, mark is not None, mark.sends if mark else ())
            for v in versions.split(",")
        ]
    return out


PY, C = How.PY, How.C

# fmt: off
SPEC: tuple[Entry, ...] = tuple(
    # -- hand-written C: look-ups, tables, thread-local context, primary-context refcounts ------
    _e(C, True,
       "cuGetProcAddress@11030,12000", "cuGetExportTable@3000",
       "cuCtxGetCurrent@4000", "cuCtxSetCurrent@4000", "cuCtxPushCurrent@4000",
       "cuCtxPopCurrent@4000", "cuCtxGetDevice@2000,13000", "cuCtxGetApiVersion@3020",
       "cuCtxGetFlags@7000", "cuCtxGetId@12000",
       "cuDevicePrimaryCtxRetain@7000", "cuDevicePrimaryCtxRelease@7000,11000",
       "cuDevicePrimaryCtxReset@7000,11000", "cuDevicePrimaryCtxGetState@7000",
       "cuDevicePrimaryCtxSetFlags@7000,11000",
       "cuMemAllocHost@3020", "cuMemHostGetFlags@2030",
       # by-value CUmemLocation: C turns it into the device ordinal of the older forms
       "cuMemPrefetchAsync@12020", "cuMemAdvise@12020")
    # -- Python, answered locally from the session's snapshot or guest tables ------------------
    + _e(PY, True,
         "cuInit@2000", "cuDriverGetVersion@2020", "cuDeviceGet@2000", "cuDeviceGetCount@2000",
         "cuDeviceCanAccessPeer@4000", "cuDeviceGetP2PAttribute@8000",
         "cuCtxEnablePeerAccess@4000", "cuCtxDisablePeerAccess@4000",
         "cuDeviceGetName@2000", "cuDeviceTotalMem@3020", "cuDeviceGetAttribute@2000",
         "cuDeviceGetUuid@9020,11040", "cuDeviceGetPCIBusId@4010",
         "cuDeviceComputeCapability@2000", "cuDeviceGetByPCIBusId@4010",
         "cuGetErrorString@6000", "cuGetErrorName@6000", "cuModuleGetLoadingMode@11070",
         "cuCtxGetStreamPriorityRange@5050", "cuCtxGetLimit@3010", "cuCtxSetLimit@3010",
         "cuCtxGetCacheConfig@3020", "cuCtxSetCacheConfig@3020",
         "cuLibraryGetKernel@12000", "cuLibraryGetModule@12000", "cuLibraryGetGlobal@12000",
         "cuModuleGetFunctionCount@12040", "cuModuleEnumerateFunctions@12040",
         "cuLibraryGetKernelCount@12040", "cuLibraryEnumerateKernels@12040",
         "cuModuleGetFunction@2000", "cuModuleGetGlobal@3020", "cuKernelGetFunction@12000",
         "cuKernelGetAttribute@12000", "cuKernelSetAttribute@12000", "cuKernelGetName@12030",
         "cuKernelGetParamInfo@12040", "cuKernelSetCacheConfig@12000",
         "cuFuncGetAttribute@2020", "cuFuncSetAttribute@9000", "cuFuncGetParamInfo@12040",
         "cuFuncSetCacheConfig@3000", "cuFuncGetName@12030",
         "cuOccupancyMaxActiveBlocksPerMultiprocessor@6050",
         "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags@7000",
         "cuOccupancyAvailableDynamicSMemPerBlock@10020",
         "cuOccupancyMaxActiveClusters@11070", "cuOccupancyMaxPotentialClusterSize@11070",
         "cuPointerGetAttribute@4000", "cuPointerGetAttributes@7000",
         "cuMemGetAddressRange@3020", "cuStreamGetFlags@5050", "cuStreamGetPriority@5050",
         "cuStreamGetCtx@9020", "cuStreamGetId@12000",
         "cuStreamSetAttribute@11000", "cuStreamGetAttribute@11000",
         "cuStreamCopyAttributes@11000", "cuCtxResetPersistingL2Cache@11000",
         "cuProfilerStart@4000", "cuProfilerStop@4000",
         "cuOccupancyMaxPotentialBlockSize@6050",
         "cuOccupancyMaxPotentialBlockSizeWithFlags@7000")
    # -- Python, through the session (batched unless the call must wait) -----------------------
    + _e(PY, False,
         "cuCtxCreate@3020,12050",
         teardown("cuCtxDestroy@4000", sends="CTX_DESTROY MEM_FREE MEM_UNMAP_CHUNK"),
         "cuCtxSynchronize@2000,13000",
         "cuMemAlloc@3020", "cuMemFree@3020", "cuMemGetInfo@3020", "cuMemAllocPitch@3020",
         "cuMemAllocAsync@11020", "cuMemFreeAsync@11020", "cuMemAllocFromPoolAsync@11020",
         "cuDeviceGetDefaultMemPool@11020", "cuDeviceGetMemPool@11020",
         "cuDeviceSetMemPool@11020", "cuMemPoolCreate@11020",
         teardown("cuMemPoolDestroy@11020", sends="MEM_FREE"), "cuMemPoolTrimTo@11020",
         "cuMemPoolSetAttribute@11020", "cuMemPoolGetAttribute@11020",
         "cuMemPoolSetAccess@11020", "cuMemPoolGetAccess@11020",
         "cuMemcpy@4000", "cuMemcpyAsync@4000", "cuMemcpyHtoD@3020", "cuMemcpyDtoH@3020",
         "cuMemcpyDtoD@3020", "cuMemcpyHtoDAsync@3020", "cuMemcpyDtoHAsync@3020",
         "cuMemcpyDtoDAsync@3020", "cuMemcpy2D@3020", "cuMemcpy2DAsync@3020",
         "cuMemcpy2DUnaligned@3020",
         "cuMemsetD8@3020", "cuMemsetD16@3020", "cuMemsetD32@3020", "cuMemsetD8Async@3020",
         "cuMemsetD16Async@3020", "cuMemsetD32Async@3020",
         "cuMemcpyPeer@4000", "cuMemcpyPeerAsync@4000",
         "cuMemsetD2D8@3020", "cuMemsetD2D16@3020", "cuMemsetD2D32@3020",
         "cuMemsetD2D8Async@3020", "cuMemsetD2D16Async@3020", "cuMemsetD2D32Async@3020",
         "cuModuleLoad@2000", "cuModuleLoadData@2000", "cuModuleLoadDataEx@2010",
         "cuModuleLoadFatBinary@2000",
         teardown("cuModuleUnload@2000", sends="MODULE_UNLOAD"),
         "cuLibraryLoadData@12000", "cuLibraryLoadFromFile@12000",
         teardown("cuLibraryUnload@12000", sends="MODULE_UNLOAD"),
         "cuLaunchKernel@4000", "cuLaunchKernelEx@11060", "cuLaunchCooperativeKernel@9000",
         "cuLaunchHostFunc@10000", "cuStreamAddCallback@5000",
         "cuStreamCreate@2000", "cuStreamCreateWithPriority@5050",
         teardown("cuStreamDestroy@4000", sends="STREAM_DESTROY"),
         "cuStreamSynchronize@2000", "cuStreamQuery@2000", "cuStreamWaitEvent@3020",
         "cuEventCreate@2000", teardown("cuEventDestroy@4000", sends="EVENT_DESTROY"),
         "cuEventRecord@2000",
         "cuEventRecordWithFlags@11010", "cuEventSynchronize@2000", "cuEventQuery@2000",
         "cuEventElapsedTime@2000,12080")
    # -- Python, host memory kernels reach and managed memory (h_hostmap, crane.guest.mirror);
    #    the plain pinned paths stay in C (interposer/src/hostmem.c) ----------------------------
    + _e(PY, False,
         "cuMemHostAlloc@2020", teardown("cuMemFreeHost@2000", sends="MEM_FREE"),
         "cuMemHostRegister@6050", teardown("cuMemHostUnregister@4000", sends="MEM_FREE"),
         "cuMemHostGetDevicePointer@3020", "cuMemAllocManaged@6000",
         "cuMemPrefetchAsync@8000", "cuMemAdvise@8000", "cuMemRangeGetAttribute@8000",
         "cuMemRangeGetAttributes@8000", "cuStreamAttachMemAsync@6000")
    # -- Python, virtual memory management (h_vmm, crane.guest.vmm): reservations and handles
    #    are guest records; a mapping commits memory at its address through the session --------
    + _e(PY, True,
         "cuMemGetAllocationGranularity@10020", "cuMemAddressReserve@10020",
         "cuMemSetAccess@10020", "cuMemGetAccess@10020",
         "cuMemGetAllocationPropertiesFromHandle@10020", "cuMemRetainAllocationHandle@11000",
         "cuMemExportToShareableHandle@10020", "cuMemImportFromShareableHandle@10020")
    + _e(PY, False,
         "cuMemAddressFree@10020", "cuMemCreate@10020", "cuMemRelease@10020", "cuMemMap@10020",
         "cuMemUnmap@10020")
    # -- Python, stream capture and graphs: recorded and replayed in the guest (h_graph) -------
    + _e(PY, False,
         "cuStreamBeginCapture@10000,10010", "cuStreamBeginCaptureToGraph@12030",
         "cuStreamEndCapture@10000", "cuStreamIsCapturing@10000",
         "cuStreamGetCaptureInfo@10010,11030,12030",
         "cuStreamUpdateCaptureDependencies@11030,12030",
         "cuThreadExchangeStreamCaptureMode@10010",
         "cuGraphCreate@10000", teardown("cuGraphDestroy@10000"),
         "cuGraphAddKernelNode@10000,12000",
         "cuGraphAddMemcpyNode@10000", "cuGraphAddMemsetNode@10000", "cuGraphAddHostNode@10000",
         "cuGraphAddEmptyNode@10000", "cuGraphAddEventRecordNode@11010",
         "cuGraphAddEventWaitNode@11010", "cuGraphAddDependencies@10000,12030",
         "cuGraphRemoveDependencies@10000,12030", "cuGraphGetNodes@10000",
         "cuGraphGetRootNodes@10000", "cuGraphGetEdges@10000,12030", "cuGraphNodeGetType@10000",
         "cuGraphNodeGetDependencies@10000", "cuGraphNodeGetDependentNodes@10000",
         "cuGraphDestroyNode@10000", "cuGraphKernelNodeGetParams@10000,12000",
         "cuGraphKernelNodeSetParams@10000,12000", "cuGraphMemsetNodeSetParams@10000",
         "cuGraphKernelNodeGetAttribute@11000", "cuGraphKernelNodeSetAttribute@11000",
         "cuGraphKernelNodeCopyAttributes@11000",
         "cuGraphMemcpyNodeSetParams@10000", "cuGraphHostNodeGetParams@10000",
         "cuGraphHostNodeSetParams@10000", "cuGraphInstantiate@10000,11000",
         "cuGraphInstantiateWithFlags@11040", "cuGraphInstantiateWithParams@12000",
         teardown("cuGraphExecDestroy@10000"), "cuGraphExecGetFlags@12000", "cuGraphUpload@11010",
         "cuGraphLaunch@10000", "cuGraphExecKernelNodeSetParams@10010,12000",
         "cuGraphExecUpdate@10020,12000",
         "cuGraphAddChildGraphNode@10000", "cuGraphChildGraphNodeGetGraph@10000",
         "cuGraphClone@10000", "cuGraphNodeFindInClone@10000",
         "cuGraphAddMemAllocNode@11040", "cuGraphMemAllocNodeGetParams@11040",
         "cuGraphAddMemFreeNode@11040", "cuGraphMemFreeNodeGetParams@11040",
         "cuDeviceGetGraphMemAttribute@11040", "cuDeviceSetGraphMemAttribute@11040",
         "cuDeviceGraphMemTrim@11040",
         "cuGraphExecMemcpyNodeSetParams@10020", "cuGraphExecMemsetNodeSetParams@10020",
         "cuGraphExecHostNodeSetParams@10020", "cuGraphExecEventRecordNodeSetEvent@11010",
         "cuGraphExecEventWaitNodeSetEvent@11010", "cuGraphExecChildGraphNodeSetParams@11010",
         "cuGraphNodeSetEnabled@11060", "cuGraphNodeGetEnabled@11060",
         "cuGraphEventRecordNodeGetEvent@11010", "cuGraphEventWaitNodeGetEvent@11010",
         "cuGraphEventRecordNodeSetEvent@11010", "cuGraphEventWaitNodeSetEvent@11010",
         "cuGraphMemsetNodeGetParams@10000",
         "cuGraphAddNode@12020,12030", "cuGraphNodeSetParams@12020",
         "cuGraphExecNodeSetParams@12020", "cuGraphConditionalHandleCreate@12030")
    # -- Python, CUDA arrays, 2D/3D copies, texture and surface objects (h_array, h_copy,
    #    h_texture): arrays are allocations with a guest record, objects descriptors in memory -
    + _e(PY, False,
         "cuArrayCreate@3020", "cuArray3DCreate@3020", "cuArrayGetDescriptor@3020",
         "cuArray3DGetDescriptor@3020", "cuArrayDestroy@2000",
         "cuArrayGetMemoryRequirements@11060", "cuMipmappedArrayCreate@5000",
         "cuMipmappedArrayGetLevel@5000", "cuMipmappedArrayDestroy@5000",
         "cuMipmappedArrayGetMemoryRequirements@11060",
         "cuMemcpyAtoH@3020", "cuMemcpyAtoHAsync@3020", "cuMemcpyHtoA@3020",
         "cuMemcpyHtoAAsync@3020", "cuMemcpyAtoD@3020", "cuMemcpyDtoA@3020", "cuMemcpyAtoA@3020",
         "cuMemcpy3D@3020", "cuMemcpy3DAsync@3020",
         "cuTexObjectCreate@5000", "cuTexObjectDestroy@5000", "cuTexObjectGetResourceDesc@5000",
         "cuTexObjectGetTextureDesc@5000", "cuSurfObjectCreate@5000", "cuSurfObjectDestroy@5000",
         "cuSurfObjectGetResourceDesc@5000")
    # -- Python, JIT linking in the guest (h_link): inputs to one linked PTX image -------------
    + _e(PY, True,
         "cuLinkCreate@5050,6050", "cuLinkAddData@5050,6050", "cuLinkAddFile@5050,6050",
         "cuLinkComplete@5050", "cuLinkDestroy@5050")
)
# fmt: on
