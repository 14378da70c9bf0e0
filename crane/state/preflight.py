"""Pre-flight: every reason a device cannot take a recorded session, before anything moves.

Restore and live migration ask the same question of the same facts, so one function answers
it: what the destination's device *reports* (its compute capability, its attributes, its free
memory; whichever backend drives it) against what the record needs.

Need against promise. What the session *uses* (:class:`Use`: memory it commits, the shared
memory, threads, registers and cluster size its loaded functions were configured for or
launched with, cooperative or cluster launches, code for this architecture in each module) is
a hard refusal wherever the destination has less: the guest's next launch would fail there
although it worked here. What the guest was merely *told* at open (it read every attribute,
as every cudart program does) and the destination offers less of is a lower limit
(:class:`Lower`): the operator may accept those (``--accept-lower-limits``), after which the
guest keeps the values it cached and a launch beyond the new device's limits fails with the
error a GPU gives for it; without acceptance the move is refused, naming both ways out.

Why every reason rather than the first: an operator choosing a destination wants to know all
that is wrong with it at once (a model with no code for the module *and* too little memory).
The rules are pure (values in, sentences out) so the destination daemon and the source worker
(for images the destination lacks) run the very same ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.device.limits import LIMITS_CHECKED
from crane.modules.arch import format_cc
from crane.modules.errors import ImageError, NoCompatibleCode
from crane.modules.image import inspect_image

__all__ = [
    "Destination",
    "Lower",
    "Use",
    "Verdict",
    "assess",
    "check_code",
    "check_memory",
    "check_use",
    "lower_limits",
    "refusals",
]

#: How a refusal of unaccepted lower limits names the two ways out.
WAYS_OUT = (
    "the session uses none of it: accept the lower limits with --accept-lower-limits (the "
    "guest keeps the values it was told; a launch beyond the new device's limits fails as it "
    "would on that GPU), or start guests under a baseline model every device of the pool "
    "honours (crane baseline)"
)


@dataclass(frozen=True)
class Destination:
    """What a destination device reports, and how to name it in a refusal."""

    where: str  # e.g. "device 0 (h200, sm_90)"
    cc: tuple[int, int]
    attributes: Mapping[int, int]
    free_mem: int


@dataclass(frozen=True)
class Use:
    """What a session needs of any device it runs on, as opposed to what it was told.

    Cheap to compute at pre-flight time from the loaded functions and the launch peaks the
    worker keeps (:func:`crane.state.usage.use_of`), and small on the wire (JSON)."""

    #: static + the larger of configured (cuFuncSetAttribute) and launched dynamic shared
    #: memory, the largest over the loaded functions
    shared_per_block: int = 0
    #: the largest block launched, or a kernel's required block size (.reqntid)
    threads_per_block: int = 0
    #: registers per thread x threads, the largest launch (when the code says its count)
    registers_per_block: int = 0
    #: CTAs per cluster, the largest cluster launched or compiled
    cluster_size: int = 0
    cooperative: bool = False
    #: the function that needs the most shared memory, to name it in a refusal
    shared_by: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Use | None:
        """``None`` for a record that carries none (an older source or checkpoint file)."""
        if not d:
            return None
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


@dataclass(frozen=True)
class Lower:
    """One attribute the destination offers less of than the guest was told."""

    attribute: int
    name: str
    told: int
    offered: int

    def __str__(self) -> str:
        return f"{self.name} (told {self.told}, offered {self.offered})"


@dataclass(frozen=True)
class Verdict:
    """Hard refusals (whatever the operator says) and lower limits (the operator's call)."""

    hard: list[str]
    lower: list[Lower]

    def refusals(self, accept_lower: bool, where: str) -> list[str]:
        """What refuses the move: the hard reasons, and the lower limits unless accepted."""
        if self.lower and not accept_lower:
            told = ", ".join(str(x) for x in self.lower)
            return [*self.hard, f"{where} offers less than the guest was told: {told}; {WAYS_OUT}"]
        return list(self.hard)


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


def check_use(use: Use, offered: Mapping[int, int], where: str) -> list[str]:
    """What the session uses that ``where`` does not have: hard refusals."""
    out: list[str] = []

    def short(what: str, used: int, attr: int) -> None:
        have = offered.get(int(attr), 0)
        if used > have:
            out.append(f"the session uses {used} {what}, {where} has {have}")

    by = f" ({use.shared_by})" if use.shared_by else ""
    short(f"bytes of shared memory per block{by}", use.shared_per_block,
          A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)  # fmt: skip
    short("threads per block", use.threads_per_block, A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
    short("registers per block", use.registers_per_block,
          A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK)  # fmt: skip
    if use.cooperative and not offered.get(int(A.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH), 0):
        out.append(f"the session uses cooperative launches, {where} has none")
    if use.cluster_size > 1 and not offered.get(int(A.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH), 0):
        n = use.cluster_size
        out.append(f"the session uses thread-block clusters of {n}, {where} has none")
    return out


def lower_limits(told: Mapping[int, int], offered: Mapping[int, int]) -> list[Lower]:
    """Limits the guest was told that the destination offers less of."""
    return [
        Lower(attr, name, told[attr], offered.get(attr, 0))
        for attr, name in LIMITS_CHECKED.items()
        if attr in told and offered.get(attr, 0) < told[attr]
    ]


def assess(
    dest: Destination,
    *,
    told: Mapping[int, int],
    mem_needed: int,
    use: Use | None = None,
    images: Iterable[tuple[bytes, bytes]] = (),
) -> Verdict:
    """Weigh what the session needs (code for each of ``images`` (digest, bytes), free memory
    for ``mem_needed``, ``use``) and what it was ``told`` against ``dest``."""
    hard: list[str] = []
    for digest, image in images:
        hard += check_code(digest, image, dest.cc, dest.where)
    hard += check_memory(mem_needed, dest.free_mem, dest.where)
    if use is not None:
        hard += check_use(use, dest.attributes, dest.where)
    return Verdict(hard, lower_limits(told, dest.attributes))


def refusals(
    dest: Destination,
    *,
    told: Mapping[int, int],
    mem_needed: int,
    use: Use | None = None,
    images: Iterable[tuple[bytes, bytes]] = (),
    accept_lower: bool = False,
) -> list[str]:
    """Every reason ``dest`` cannot take the session (:func:`assess`), lower limits than the
    guest was told among them unless ``accept_lower``."""
    verdict = assess(dest, told=told, mem_needed=mem_needed, use=use, images=images)
    return verdict.refusals(accept_lower, dest.where)
