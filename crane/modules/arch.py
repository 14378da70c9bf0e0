"""GPU architecture names and the rules for which code runs on which device.

Why: the same three questions come up for a fatbin entry, a bare cubin and bare PTX —
"what architecture is this code for", "does a device of compute capability (major, minor)
run it", and "how do I say that to a user". Keeping the rules here means the fatbin
selector and the image inspector cannot disagree.

Rules (NVIDIA's documented compatibility model, CUDA 12.9+ naming):

* cubin ``sm_XY``: runs on devices X.Z with Z >= Y (same major).
* cubin ``sm_XYa`` (architecture-specific features): runs only on exactly X.Y.
* cubin ``sm_XYf`` (family-specific features): runs on the family, which for every family
  CUDA 13.0 knows is "same major, minor >= Y" (sm_100f: 10.0 and 10.3; sm_120f: 12.0, 12.1).
* PTX ``compute_XY``: JIT-compiles for any device with (major, minor) >= (X, Y).
* PTX ``compute_XYa``: only exactly X.Y; ``compute_XYf``: the family, as for cubins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "Arch",
    "cc_to_sm",
    "format_cc",
    "parse_arch",
]

_ARCH_RE = re.compile(r"^(?:sm|compute|lto)_(\d+)([af]?)$")


def cc_to_sm(cc: tuple[int, int]) -> int:
    """``(8, 6)`` -> 86. Minor numbers are single digits on every CUDA architecture."""
    major, minor = cc
    if major < 1 or not 0 <= minor <= 9:
        raise ValueError(f"compute capability {cc!r} is not a (major >= 1, minor 0..9) pair")
    return major * 10 + minor


def format_cc(cc: tuple[int, int]) -> str:
    """``(8, 0)`` -> ``"sm_80"``."""
    return f"sm_{cc_to_sm(cc)}"


@dataclass(frozen=True, slots=True)
class Arch:
    """One target architecture: ``sm`` number (e.g. 90) and suffix ``""``, ``"a"`` or ``"f"``."""

    sm: int
    suffix: str = ""

    @property
    def major(self) -> int:
        return self.sm // 10

    @property
    def minor(self) -> int:
        return self.sm % 10

    def cubin_name(self) -> str:
        return f"sm_{self.sm}{self.suffix}"

    def ptx_name(self) -> str:
        return f"compute_{self.sm}{self.suffix}"

    def cubin_runs_on(self, cc: tuple[int, int]) -> bool:
        """Whether machine code for this architecture runs on a device of ``cc``."""
        major, minor = cc
        if self.suffix == "a":
            return (self.major, self.minor) == (major, minor)
        return self.major == major and self.minor <= minor

    def ptx_runs_on(self, cc: tuple[int, int]) -> bool:
        """Whether PTX for this virtual architecture can be JIT-compiled for ``cc``."""
        major, minor = cc
        if self.suffix == "a":
            return (self.major, self.minor) == (major, minor)
        if self.suffix == "f":
            return self.major == major and self.minor <= minor
        return (self.major, self.minor) <= (major, minor)

    def specificity(self) -> int:
        """Tie-break between equal sm numbers: ``a`` code beats ``f`` code beats plain code."""
        return {"a": 2, "f": 1}.get(self.suffix, 0)


def parse_arch(name: str) -> Arch:
    """Parse ``sm_90a`` / ``compute_100f`` / ``sm_80`` into an :class:`Arch`."""
    m = _ARCH_RE.match(name.strip())
    if m is None:
        raise ValueError(f"not an architecture name: {name!r} (expected e.g. sm_80, sm_90a)")
    return Arch(int(m.group(1)), m.group(2))
