"""The phases of a live migration out, as the source worker moves through them.

``preflight → precopy → stopping → done``, or ``failed`` from any of them; ``preflight →
stopping`` is a true stop-and-copy. The guest is quiesced only in ``stopping``; until ``done``
the source stays authoritative (invariant 6). The source worker reports the phase in its
progress file and the daemons (``crane migrate``, a guest's Resume waiting for a switchover)
read it there, so both ends use this one table.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["TRANSITIONS", "Phase", "advance"]


class Phase(Enum):
    PREFLIGHT = "preflight"
    PRECOPY = "precopy"
    STOPPING = "stopping"
    HELD = "held"  # two-phase switchover: frozen here, ready there, until Commit or Abort
    DONE = "done"
    FAILED = "failed"

    @property
    def over(self) -> bool:
        return self in (Phase.DONE, Phase.FAILED)

    @property
    def switching(self) -> bool:
        """The guest is stopped or already moved: a Resume waits for the redirect."""
        return self in (Phase.STOPPING, Phase.HELD, Phase.DONE)


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PREFLIGHT: frozenset({Phase.PRECOPY, Phase.STOPPING, Phase.FAILED}),
    Phase.PRECOPY: frozenset({Phase.STOPPING, Phase.FAILED}),
    Phase.STOPPING: frozenset({Phase.HELD, Phase.DONE, Phase.FAILED}),
    Phase.HELD: frozenset({Phase.DONE, Phase.FAILED}),
    Phase.DONE: frozenset(),
    Phase.FAILED: frozenset(),
}


def advance(current: Phase, to: Phase) -> Phase:
    """``to``, if the table allows it from ``current``; a skipped step is a bug."""
    if to is not current and to not in TRANSITIONS[current]:
        raise RuntimeError(f"migration phase {current.value} cannot become {to.value}")
    return to
