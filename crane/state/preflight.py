"""Pre-flight: every reason a device cannot take a recorded session, before anything moves.

Restore and live migration ask the same question of the same facts, so one function answers
it: what the destination's device *reports* (its compute capability, its attributes, its free
memory; whichever backend drives it) against what the record needs (the limits its guest was
told, the memory it commits, code for this architecture in each of its modules).

Why every reason rather than the first: an operator choosing a destination wants to know all
that is wrong with it at once (a model with no code for the module *and* too little memory).
The rules are pure (values in, sentences out) so the destination daemon and the source worker
(for images the destination lacks) run the very same ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from crane.device.limits import check_limits
from crane.modules.arch import format_cc
from crane.modules.errors import ImageError, NoCompatibleCode
from crane.modules.image import inspect_image

__all__ = ["Destination", "check_code", "check_memory", "refusals"]


@dataclass(frozen=True)
class Destination:
    """What a destination device reports, and how to name it in a refusal."""

    where: str  # e.g. "device 0 (h200, sm_90)"
    cc: tuple[int, int]
    attributes: Mapping[int, int]
    free_mem: int


def check_memory(needed: int, free: int, where: str) -> list[str]:
    if needed > free:
        return [
            f"too little free device memory: the session holds {needed >> 20} MiB, {where} has "
            f"{free >> 20} MiB free"
        ]
    return []


def check_code(digest: bytes, image: bytes, cc: tuple[int, int], where: str) -> list[str]:
    """Whether ``image`` has code (cubin for this architecture, or PTX to JIT) for ``cc``."""
    try:
        inspect_image(image, cc)
    except NoCompatibleCode as e:
        return [f"module {digest.hex()[:16]}: no usable code for {where} ({format_cc(cc)}): {e}"]
    except ImageError as e:
        return [f"module {digest.hex()[:16]}: image unusable on {where}: {e}"]
    return []


def refusals(
    dest: Destination,
    *,
    told: Mapping[int, int],
    mem_needed: int,
    images: Iterable[tuple[bytes, bytes]] = (),
) -> list[str]:
    """Every reason ``dest`` cannot take the session: code for each of ``images`` (digest,
    bytes), free memory for ``mem_needed``, and no limit below what the guest was ``told``."""
    out: list[str] = []
    for digest, image in images:
        out += check_code(digest, image, dest.cc, dest.where)
    out += check_memory(mem_needed, dest.free_mem, dest.where)
    out += check_limits(told, dest.attributes, dest.where)
    return out
