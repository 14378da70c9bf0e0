"""The backend interface: what a session's worker needs from a GPU, real or simulated.

A backend executes *resolved* operations: the worker has already turned guest handles into
backend objects and validated what can be validated without the device. Backends raise
:class:`crane.api.results.CudaError` with the CUresult the application should see; anything else
escaping a backend is a bug and is reported as CUDA_ERROR_UNKNOWN with the traceback logged.

Two implementations: ``crane.backends.sim`` (a simulated GPU on the CPU, for GPU-less hosts and
CI; architecture invariant 8) and ``crane.backends.cuda`` (cuda-python on a real GPU). One
conformance suite (tests/conformance) runs against both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.device.identity import DeviceSnapshot
from crane.modules.image import ModuleImage

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Backend", "GlobalVar", "LoadedModule", "StagedSource"]


class StagedSource(Protocol):
    """The bytes of a staged host-to-device copy (``crane.engine.staged.StagedIn``)."""

    def __len__(self) -> int: ...

    def read_into(self, dst: Any) -> None:
        """Fill the writable buffer ``dst`` with the next bytes."""


@dataclass(frozen=True)
class GlobalVar:
    name: str
    addr: int
    size: int


@dataclass
class LoadedModule:
    """A module as the worker keeps it: the backend's object plus what the guest is told."""

    image: ModuleImage
    native: Any
    globals: dict[str, GlobalVar] = field(default_factory=dict)


class Backend(ABC):
    """One device, as seen by one session's worker process."""

    #: The device the guest is told about.
    snapshot: DeviceSnapshot
    #: Launches and copies return before the device is done with them (a real GPU): a call's
    #: execution time is not its GPU time, the backend times the work itself and reports it
    #: to :meth:`report_work`'s sink. False: the work is done when the call returns (sim).
    async_work: bool = False
    #: :meth:`memcpy_dtoh`'s views stay valid across later calls (the simulator's: views of
    #: its one mapping), so a stopped migration round sends them from several threads without
    #: a copy. False: valid until the next call only (the cuda backend's staging buffers).
    stable_views: bool = False

    def report_work(self, sink: Callable[[str, str, int, int], None]) -> None:
        """Where an ``async_work`` backend reports completed work: ``sink(kind, kernel name,
        ns, completed at (time.monotonic_ns))``, kind ``"launch"`` or a copy direction. A
        backend whose work is done inside the call has nothing to report."""
        del sink  # its calls' own times are the work's (crane.engine.meter, inline)

    def settle_work(self) -> None:  # noqa: B027 - optional: only async_work backends report
        """Report the work that completed since the last time (an ``async_work`` backend; the
        worker calls this after each batch and before publishing its accounting)."""

    # ---- memory -------------------------------------------------------------------------------
    @abstractmethod
    def map_chunk(self, addr: int, size: int) -> None:
        """Commit device memory at exactly ``addr`` (raise OUT_OF_MEMORY when it cannot)."""

    @abstractmethod
    def unmap_chunk(self, addr: int) -> None: ...

    @abstractmethod
    def mem_alloc(self, addr: int, size: int) -> None:
        """Record an allocation inside a mapped chunk (for validation and the state record)."""

    @abstractmethod
    def mem_free(self, addr: int) -> None: ...

    @abstractmethod
    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device, as cuMemGetInfo reports."""

    @abstractmethod
    def memcpy_htod(self, dst: int, data: bytes, stream: Any) -> None: ...

    def memcpy_htod_staged(self, dst: int, src: StagedSource, stream: Any) -> None:
        """A host-to-device copy whose bytes arrive from the call ring's bulk area
        (crane.engine.staged). This default gathers them in host memory and uploads them
        with :meth:`memcpy_htod` (one copy more than needed, always correct); a backend that
        can write device memory from any host address reads them straight there."""
        buf = bytearray(len(src))
        src.read_into(buf)
        self.memcpy_htod(dst, buf, stream)  # type: ignore[arg-type]

    @abstractmethod
    def memcpy_dtoh(self, src: int, size: int, stream: Any) -> bytes | memoryview:
        """Device bytes; a memoryview must stay valid until the next backend call."""

    @abstractmethod
    def memcpy_dtod(self, dst: int, src: int, size: int, stream: Any) -> None: ...

    @abstractmethod
    def memset(self, dst: int, value: int, elem_size: int, count: int, stream: Any) -> None: ...

    #: :meth:`memset_run` is served: the worker hands it a batch's packed memsets at once
    #: (crane.engine.runs). False: each goes through :meth:`memset`.
    memset_runs: bool = False

    def memset_run(
        self,
        dst: np.ndarray,
        value: np.ndarray,
        elem_size: np.ndarray,
        count: np.ndarray,
        stream: Any,
    ) -> int:
        """Memsets in call order on one stream, one row per call (columns), up to the first
        one :meth:`memset` would refuse: how many ran. Only where :attr:`memset_runs`."""
        raise NotImplementedError

    # ---- streams and events -----------------------------------------------------------------
    @abstractmethod
    def stream_create(self, flags: int, priority: int) -> Any: ...

    @abstractmethod
    def stream_destroy(self, stream: Any) -> None: ...

    @abstractmethod
    def stream_synchronize(self, stream: Any) -> None: ...

    @abstractmethod
    def stream_query(self, stream: Any) -> bool:
        """True when all work in the stream has completed."""

    @abstractmethod
    def stream_wait_event(self, stream: Any, event: Any, flags: int) -> None: ...

    @abstractmethod
    def event_create(self, flags: int) -> Any: ...

    @abstractmethod
    def event_destroy(self, event: Any) -> None: ...

    @abstractmethod
    def event_record(self, event: Any, stream: Any) -> None: ...

    @abstractmethod
    def event_synchronize(self, event: Any) -> None: ...

    @abstractmethod
    def event_query(self, event: Any) -> bool: ...

    @abstractmethod
    def event_elapsed(self, start: Any, end: Any) -> float:
        """Milliseconds between two completed records (CUDA_ERROR_NOT_READY otherwise)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for all work on the device."""

    # ---- modules and launches ---------------------------------------------------------------
    @abstractmethod
    def module_load(
        self, image: ModuleImage, place_global: Callable[[int], int], *, data: bytes = b""
    ) -> LoadedModule:
        """Load a module; ``place_global(size)`` returns the address for a module variable.

        ``data`` is the image as the guest sent it (a whole fatbin, say): a real driver given
        it picks the code for its device by its own rules, as it would for the program run
        natively; ``image`` is Crane's reading of it (the chosen code, layouts, variables)."""

    @abstractmethod
    def module_unload(self, module: LoadedModule) -> None: ...

    @abstractmethod
    def launch(
        self,
        module: LoadedModule,
        kernel: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: int,
        stream: Any,
        params: bytes,
        *,
        max_dynamic_shared: int | None = None,
        cooperative: bool = False,
        cluster: tuple[int, int, int] | None = None,
        non_portable_cluster: bool = False,
    ) -> None:
        """Run a kernel in stream order; ``max_dynamic_shared`` is the limit raised by
        cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) (None: the default 48 KiB rule).

        ``cooperative`` is cuLaunchCooperativeKernel: all blocks resident at once and the
        grid-sync workspace provided (the backend's own memory, as the driver's); a grid the
        device cannot keep resident raises CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE.

        ``cluster`` is the launch's thread-block cluster dimensions (cuLaunchKernelEx's
        CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; None: the kernel's compiled ones, if any) and
        ``non_portable_cluster`` the function's NON_PORTABLE_CLUSTER_SIZE_ALLOWED; the backend
        refuses what the driver refuses (CUDA_ERROR_INVALID_CLUSTER_SIZE ...)."""

    def set_device_runtime_limits(self, heap_bytes: int, pending_launches: int) -> None:
        """CU_LIMIT_MALLOC_HEAP_SIZE and CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT for later
        launches (device malloc/free, dynamic parallelism)."""
        raise CudaError(
            CUresult.CUDA_ERROR_NOT_SUPPORTED, "this backend cannot set device-runtime limits"
        )

    def code_versions(self, module: LoadedModule, kernel: str) -> tuple[int, int]:
        """cuFuncGetAttribute's (PTX_VERSION, BINARY_VERSION) of ``kernel`` as this device runs
        it: the virtual architecture its code was compiled from and the architecture of the
        code that runs (CUB checks both against what it was built for). By default what the
        module image says of the code chosen for this device; a backend whose driver chooses
        for itself (the cuda backend) asks the driver."""
        return module.image.ptx_version, module.image.binary_version

    def alias_global(self, told: int, real: int, size: int) -> None:
        """A restored module variable the guest knows at ``told`` was placed at ``real``.

        Only a backend whose driver places module variables itself (the cuda backend) can end
        up here; it translates copies and memsets on ``told`` from now on. The simulator places
        them where asked, so a mismatch there is a bug."""
        raise CudaError(
            CUresult.CUDA_ERROR_NOT_SUPPORTED,
            f"module variable at {told:#x} was placed at {real:#x}; this backend cannot alias it",
        )

    # ---- handing the session's memory to another worker on this host ------------------------
    def memory_handle(self) -> int | None:
        """A descriptor of all of the session's device memory that another worker on this
        host can map (a same-host migration passes it with ``SCM_RIGHTS`` instead of copying
        the memory; the descriptor stays the backend's), or None where the backend has none:
        the migration then copies. The cuda backend has none: a same-GPU hand-over would need
        every allocation exported (``cuMemExportToShareableHandle``, POSIX fds) and imported
        and mapped by the destination (docs/design.md, the migration data plane)."""
        return None

    def adopt_memory(self, fd: int) -> None:
        """Map the memory of another worker's :meth:`memory_handle` over this session's, at
        the same addresses (taking ``fd`` over, closed here if refused); until
        :meth:`claim_memory` nothing of it is released from here (the source still owns it:
        an abort hands it back untouched)."""
        raise CudaError(
            CUresult.CUDA_ERROR_NOT_SUPPORTED, "this backend cannot map another worker's memory"
        )

    def claim_memory(self) -> None:  # noqa: B027 - only backends that adopt memory need it
        """The session is served here now: memory it frees is released again."""

    def disown_memory(self) -> None:  # noqa: B027 - only backends that hand memory over
        """The memory was handed over and the receiver took the session: release none of it
        from here (unmapping at exit only)."""

    def take_stdout(self) -> bytes:
        """Device printf output produced since the last call (delivered to the guest)."""
        return b""

    @abstractmethod
    def close(self) -> None:
        """Free everything; the worker exits afterwards."""
