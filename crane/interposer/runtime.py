"""Process-wide guest state behind the entry points: the lazily opened session and the tables
that map driver-API handles to session objects.

One :data:`RT` per process. The session opens at the first call that needs it (address from
``$CRANE_DAEMON``); a failure to open is remembered and every later call reports it, so a
program without a reachable daemon fails like one without a GPU (CUDA_ERROR_NO_DEVICE) and says
why once. Handle mapping:

* contexts: the app sees the C side's primary-context object for device 0 (``lib``) or the
  session's own handle for a created context;
* streams: session handles, with NULL/legacy/per-thread passed through (a NULL stream inside a
  ``_ptds`` entry point means the per-thread stream);
* libraries/modules are both session modules; kernels/functions both session functions.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import STICKY, CudaError
from crane.guest.session import Function, GuestSession, Module
from crane.interposer.fastlane import FAST

__all__ = ["RT", "Runtime", "StreamInfo"]

_STREAM_PER_THREAD = 2


@dataclass
class StreamInfo:
    ctx: int
    flags: int
    priority: int


@dataclass
class Runtime:
    ffi: Any = None
    lib: Any = None
    initialized: bool = False
    _session: GuestSession | None = None
    _open_error: CudaError | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)
    modules: dict[int, Module] = field(default_factory=dict)
    kernels: dict[tuple[int, str], Function] = field(default_factory=dict)
    functions: dict[int, Function] = field(default_factory=dict)
    func_attrs: dict[int, dict[int, int]] = field(default_factory=dict)
    created_contexts: set[int] = field(default_factory=set)
    streams: dict[int, StreamInfo] = field(default_factory=dict)
    sticky: CudaError | None = None

    def attach(self, ffi: Any, lib: Any) -> None:
        self.ffi, self.lib = ffi, lib

    # ---- session ------------------------------------------------------------------------------
    def session(self) -> GuestSession:
        s = self._session
        if s is not None:
            return s
        with self._lock:
            if self._session is None:
                if self._open_error is not None:
                    raise self._open_error
                try:
                    self._session = GuestSession(os.environ.get("CRANE_DAEMON"), client=_client())
                except CudaError as e:
                    print(f"crane: no GPU: cannot open a session: {e}", file=sys.stderr)
                    self._open_error = CudaError(CUresult.CUDA_ERROR_NO_DEVICE, str(e))
                    raise self._open_error from None
                base, size = self._session.va_window
                reserved = self.lib.crane_reserve_window(base, size) == 0
                self._session.window_reserved = reserved
                if not reserved:
                    print(
                        f"crane: warning: cannot reserve the device address window "
                        f"{base:#x}+{size:#x}; host memory there would alias device memory",
                        file=sys.stderr,
                    )
            return self._session

    @property
    def has_session(self) -> bool:
        """A session with the daemon was opened (something remote exists)."""
        return self._session is not None

    def require_init(self) -> GuestSession:
        if not self.initialized:
            raise CudaError(CUresult.CUDA_ERROR_NOT_INITIALIZED, "cuInit has not been called")
        return self.session()

    def note_error(self, name: str, e: CudaError) -> None:
        """Remember a hardware fault: the context is unusable until it is reset."""
        if e.code in STICKY:
            self.sticky = e
            FAST.forget()  # (every call must now answer the fault: the Python side's work)

    # ---- handles ------------------------------------------------------------------------------
    def ptr(self, cdata: Any) -> int:
        return int(self.ffi.cast("uintptr_t", cdata))

    def ctx(self, app_ctx: Any = None) -> int:
        """GuestSession context for an app CUcontext (NULL: the calling thread's current one)."""
        value = self.ptr(app_ctx) if app_ctx is not None else 0
        if value == 0:
            value = self.ptr(self.lib.crane_ctx_current())
            if value == 0:
                raise CudaError(CUresult.CUDA_ERROR_INVALID_CONTEXT, "no current context")
        s = self.session()
        if self.lib.crane_primary_dev(self.ffi.cast("void *", value)) >= 0:
            return s.primary_context
        if value not in self.created_contexts:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_CONTEXT, f"unknown context {value:#x}")
        return value

    def stream(self, app_stream: Any) -> int:
        value = self.ptr(app_stream)
        if value == 0 and self.lib.crane_in_ptds():
            return _STREAM_PER_THREAD
        return value

    def function(self, handle: Any) -> Function:
        fn = self.functions.get(self.ptr(handle))
        if fn is None:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, "unknown function or kernel")
        return fn

    def module(self, handle: Any) -> Module:
        mod = self.modules.get(self.ptr(handle))
        if mod is None:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, "unknown module or library")
        return mod

    def kernel(self, module: Module, name: str) -> Function:
        key = (module.handle, name)
        fn = self.kernels.get(key)
        if fn is None:
            with self._lock:
                fn = self.kernels.get(key)
                if fn is None:
                    fn = self.session().module_get_function(module, name)
                    self.kernels[key] = fn
                    self.functions[fn.handle] = fn
        return fn

    def forget_module(self, handle: int) -> None:
        self.modules.pop(handle, None)
        for key in [k for k in self.kernels if k[0] == handle]:
            fn = self.kernels.pop(key)
            self.functions.pop(fn.handle, None)
            self.func_attrs.pop(fn.handle, None)

    def out(self, cdata: Any, value: object) -> None:
        """Write an output parameter, refusing NULL as the driver does."""
        if cdata == self.ffi.NULL:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL output pointer")
        cdata[0] = value


def _client() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv0 = os.path.basename(f.read().split(b"\0")[0].decode(errors="replace"))
    except OSError:
        argv0 = ""
    return f"interposer pid {os.getpid()} {argv0}".strip()


RT = Runtime()
