"""The session's object tables: guest handle → backend object, with ownership.

Handles are chosen by the guest (invariant 2), so every table validates them: an unknown handle
is CUDA_ERROR_INVALID_HANDLE (CUDA_ERROR_INVALID_CONTEXT for contexts), a reused one is
CUDA_ERROR_INVALID_VALUE. Objects remember the context that created them so destroying a context
destroys what lives in it, as the driver does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError

__all__ = ["HandleTable", "Owned"]

T = TypeVar("T")


@dataclass
class Owned(Generic[T]):
    """A backend object and the context handle that owns it."""

    ctx: int
    obj: T
    meta: Any = None


class HandleTable(Generic[T]):
    def __init__(self, kind: str, missing: CUresult = CUresult.CUDA_ERROR_INVALID_HANDLE) -> None:
        self.kind = kind
        self.missing = missing
        self._items: dict[int, Owned[T]] = {}

    def add(self, handle: int, ctx: int, obj: T, meta: Any = None) -> None:
        if handle == 0 or handle in self._items:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE, f"{self.kind} handle {handle:#x} already in use"
            )
        self._items[handle] = Owned(ctx, obj, meta)

    def get(self, handle: int) -> Owned[T]:
        try:
            return self._items[handle]
        except KeyError:
            raise CudaError(self.missing, f"unknown {self.kind} handle {handle:#x}") from None

    def pop(self, handle: int) -> Owned[T]:
        item = self.get(handle)
        del self._items[handle]
        return item

    def owned_by(self, ctx: int) -> list[int]:
        return [h for h, o in self._items.items() if o.ctx == ctx]

    def __contains__(self, handle: int) -> bool:
        return handle in self._items

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)
