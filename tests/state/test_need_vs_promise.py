"""The pre-flight's pure rules: what a session uses is a hard refusal wherever the destination
has less, what it was merely told is a lower limit the operator may accept, and the refusal of
unaccepted lower limits names both ways out. Device attributes are the simulator's profiles
(the same numbers the real A100 and H100 report)."""

from __future__ import annotations

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.backends.sim.profiles import get_profile
from crane.state.preflight import Destination, Lower, Use, assess, check_use, refusals

OPTIN = int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
H100 = dict(get_profile("h100-80gb").attributes)
A100 = dict(get_profile("a100-80gb").attributes)
DEST = Destination("device 0 (a100-80gb, sm_80)", (8, 0), A100, 80 << 30)


def test_the_profiles_differ_where_the_issue_says() -> None:
    assert (H100[OPTIN], A100[OPTIN]) == (232448, 166912)


def test_told_more_is_a_lower_limit_listed_by_attribute() -> None:
    verdict = assess(DEST, told=H100, mem_needed=1 << 20, use=Use(shared_per_block=1024))
    assert verdict.hard == []
    assert Lower(OPTIN, "max shared memory per block (opt-in)", 232448, 166912) in verdict.lower
    assert all(x.offered < x.told for x in verdict.lower)
    (why,) = verdict.refusals(False, DEST.where)
    assert "max shared memory per block (opt-in) (told 232448, offered 166912)" in why
    assert "--accept-lower-limits" in why and "crane baseline" in why
    assert verdict.refusals(True, DEST.where) == []


def test_told_no_more_than_offered_is_nothing() -> None:
    assert refusals(Destination("h", (9, 0), H100, 80 << 30), told=A100, mem_needed=0) == []


def test_using_more_shared_memory_is_refused_whatever_the_flag() -> None:
    use = Use(shared_per_block=200_000, shared_by="big")
    why = refusals(DEST, told=H100, mem_needed=0, use=use, accept_lower=True)
    assert why == [
        "the session uses 200000 bytes of shared memory per block (big), "
        "device 0 (a100-80gb, sm_80) has 166912"
    ]


def test_every_use_is_weighed() -> None:
    no_coop = {**A100, int(A.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH): 0}
    use = Use(
        threads_per_block=2048,
        registers_per_block=1 << 20,
        cluster_size=2,
        cooperative=True,
    )
    why = check_use(use, no_coop, "there")
    assert "the session uses 2048 threads per block, there has 1024" in why
    assert "the session uses 1048576 registers per block, there has 65536" in why
    assert "the session uses cooperative launches, there has none" in why
    assert "the session uses thread-block clusters of 2, there has none" in why
    assert check_use(Use(cluster_size=2, cooperative=True), H100, "h100") == []


def test_memory_is_a_need() -> None:
    why = refusals(DEST, told=A100, mem_needed=81 << 30, accept_lower=True)
    assert why and "too little free device memory" in why[0]


def test_use_round_trips_and_old_records_carry_none() -> None:
    use = Use(shared_per_block=5, threads_per_block=6, cluster_size=2, shared_by="k")
    assert Use.from_json(use.to_json()) == use
    assert Use.from_json(None) is None and Use.from_json({}) is None
    assert Use.from_json({**use.to_json(), "later_field": 1}) == use  # a newer writer's extra
