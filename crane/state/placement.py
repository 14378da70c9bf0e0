"""Whether a reloaded module's variables sit where the guest was told they are.

Why it matters: a guest keeps the address of every module variable (``cuModuleGetGlobal``,
``cudaGetSymbolAddress``) and may store it in device memory or pass it to kernels; a copy of
device memory moves those stored pointers verbatim. The simulator places module variables
where the record says (deterministically, whatever the model); the cuda backend cannot choose:
the driver places them when it loads the module, so after a move to another GPU (or another
context) they may sit elsewhere, and every stored pointer to them would be stale. Translating
host-side copies (an alias) would not fix a pointer the program keeps in device memory, so the
restore refuses instead, naming each variable, before the session switches over (a migration
fails and the session stays on its source; a restore leaves the session parked). Pure: the
recorded and placed addresses in, the reasons out, so it is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crane.backends.base import GlobalVar

__all__ = ["Moved", "moved_globals", "placement_refusal"]


@dataclass(frozen=True)
class Moved:
    """A module variable the device placed at another address than the guest was told."""

    name: str
    told: int
    placed: int


def moved_globals(
    recorded: Iterable[Sequence[Any]], placed: Mapping[str, GlobalVar]
) -> list[Moved]:
    """The variables of ``recorded`` ([name, addr, size] as the state record keeps them) that
    ``placed`` (the reloaded module's) holds at another address. A variable the reloaded image
    lacks is not "moved": the image is the same (its digest), so that cannot happen here."""
    out = []
    for name, addr, _size in recorded:
        got = placed.get(str(name))
        if got is not None and got.addr != int(addr):
            out.append(Moved(str(name), int(addr), got.addr))
    return out


def placement_refusal(module: str, moved: Sequence[Moved]) -> str:
    """Why the session cannot run here, naming the module and each variable."""
    each = ", ".join(f"{m.name} (told {m.told:#x}, placed at {m.placed:#x})" for m in moved)
    return (
        f"module {module}: the driver placed module variables elsewhere than the guest was "
        f"told: {each}; pointers to them the program stored in device memory would be stale, "
        "and the cuda backend cannot choose where the driver places module variables"
    )
