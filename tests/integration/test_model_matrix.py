"""Migration across GPU models in both directions, under a baseline model of the two.

For each pair among the simulated A100-40GB, A100-80GB, L4, H100-80GB and H200, in both
directions, a guest started on one under the baseline of the two (``crane.device.presented
.baseline``, written as a model file) moves mid-run to the other, presenting the same model,
and finishes with the result of an unmoved run. The workload keeps device pointers in device
memory (a table of buffers the kernel follows) and a module variable (``steps_done``).

To stay cheap, the daemons are shared by every case: one per physical model, with one device
per partner (``--backend sim:X@baseline(X,Y)`` for each Y), so 5 daemons serve all 20 moves.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.backends.sim.profiles import PROFILES
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from crane.device.model_file import model_to_toml
from crane.device.presented import baseline
from crane.guest.session import GuestSession
from tests.integration.workload import Workload

MODELS = ("a100-40gb", "a100-80gb", "l4", "h100-80gb", "h200")
PAIRS = list(itertools.permutations(MODELS, 2))
BEFORE, AFTER = 3, 3  # steps before and after the move


def _partners(key: str) -> list[str]:
    return [m for m in MODELS if m != key]


class Pool:
    """One daemon per physical model; device i of X's daemon presents baseline(X, partner i)."""

    def __init__(self, root: Path) -> None:
        self.daemons: dict[str, DaemonProcess] = {}
        files: dict[frozenset[str], Path] = {}
        for x, y in itertools.combinations(MODELS, 2):
            model = baseline([PROFILES[x], PROFILES[y]], f"base-{x}-{y}")
            path = root / f"{x}+{y}.toml"
            path.write_text(model_to_toml(model))
            files[frozenset((x, y))] = path
        try:
            for x in MODELS:
                specs = [f"sim:{x}@{files[frozenset((x, y))]}" for y in _partners(x)]
                self.daemons[x] = DaemonProcess(root / x, specs, prespawn=1)
        except BaseException:
            self.stop()
            raise

    def device(self, x: str, y: str) -> int:
        """X's device presenting the baseline of X and Y."""
        return _partners(x).index(y)

    def stop(self) -> None:
        for d in self.daemons.values():
            d.stop()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    p = Pool(tmp_path_factory.mktemp("matrix"))
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def unmoved(pool: Pool, image: bytes) -> tuple[bytes, bytes, int]:
    d = pool.daemons["h100-80gb"]
    with GuestSession(d.address, device=0, client="unmoved") as s:
        w = Workload(s, image)
        w.run(BEFORE + AFTER)
        return w.result()


@pytest.fixture(scope="module")
def image(cuda_build) -> bytes:  # type: ignore[no-untyped-def]
    from tests.integration.workload import SRC

    return cuda_build(
        SRC, "-fatbin", "-gencode", "arch=compute_80,code=compute_80", suffix=".fatbin"
    ).read_bytes()


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_move_under_the_pair_baseline(
    pool: Pool, image: bytes, unmoved: tuple[bytes, bytes, int], src: str, dst: str
) -> None:
    here, there = pool.daemons[src], pool.daemons[dst]
    started = time.monotonic()
    with GuestSession(here.address, device=pool.device(src, dst), client="matrix") as s:
        told = (s.device.profile, s.device.name, dict(s.attributes))
        assert s.device.profile == f"base-{'-'.join(m for m in MODELS if m in (src, dst))}"
        w = Workload(s, image)
        w.run(BEFORE)
        last = migrate(here.address, s.session_id, there.address, device=pool.device(dst, src))[-1]
        assert last.phase == "done", last.error
        w.run(AFTER)
        got = w.result()
        assert s._t.address == there.address
        # the guest's view did not change, and the session on the destination records it
        assert (s.device.profile, s.device.name, dict(s.attributes)) == told
    assert got == unmoved
    assert time.monotonic() - started < 30
