"""Deterministic simulation: seeded runs of the real broker and controller logic under faults.

- `test_seed[N]`: `--sim-seeds` seeds (default 50) of the default fault mix must keep every
  rule of DESIGN.md section 8. A failure prints its seed, the end of its trace and the
  command that replays it. Failures the checker attributes to a known, reported bug
  (tests/sim/known_issues.py) are xfailed with that bug's tag.
- `test_*_off_is_caught`: with one safety mechanism switched off, the checker must find a
  violation within a small seed budget, on a seed that is green with the mechanism on.
- a bug found and not fixed at once gets an entry in tests/sim/known_issues.py and a
  regression seed here marked xfail(strict=True, raises=SimulationFailure), which starts
  passing, and so fails, the day the bug is fixed (none is open today).
- `test_seed_of_a_fixed_bug_stays_green`, `test_seed_of_a_scenario_defect_stays_green`:
  seeds that once failed by a bug since fixed.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.sim.config import PROFILES, Safety
from tests.sim.simulation import SimulationFailure, run_seed

# Mechanism-off experiments must find a violation within this many seeds.
MECHANISM_SEED_BUDGET = 12


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sim_seed" in metafunc.fixturenames:
        metafunc.parametrize("sim_seed", range(metafunc.config.getoption("sim_seeds")))


def test_seed(sim_seed: int) -> None:
    try:
        run_seed(sim_seed, PROFILES["default"])
    except SimulationFailure as failure:
        if failure.known_issue:
            pytest.xfail(f"seed {sim_seed}: {failure.known_issue.split(':')[0]} ({failure.reason})")
        raise


def test_a_seed_replays_exactly() -> None:
    first = run_seed(7, PROFILES["default"])
    second = run_seed(7, PROFILES["default"])
    assert (first.events, first.messages, first.trace_digest) == (
        second.events,
        second.messages,
        second.trace_digest,
    )


def _assert_caught_and_green_when_on(profile: str, mechanism_off: Safety, what: str) -> None:
    """Find, within the budget, a seed the checker fails with the mechanism off and passes with it on.

    Seeds that fail only by a known bug (either way) are skipped: they say nothing about
    this mechanism. A seed that fails with the mechanism on for a new reason fails the test.
    """
    config = PROFILES[profile]
    for seed in range(MECHANISM_SEED_BUDGET):
        try:
            run_seed(seed, dataclasses.replace(config, safety=mechanism_off))
            continue
        except SimulationFailure as failure:
            if failure.known_issue:
                continue
            caught = failure
        try:
            run_seed(seed, config)
        except SimulationFailure as failure:
            if not failure.known_issue:
                raise
            continue
        print(f"\n{what} off: seed {seed} caught it (green with it on): {caught.reason}")
        return
    pytest.fail(f"{what} off: no seed in {MECHANISM_SEED_BUDGET} of {profile} was caught off and green on")


def test_leader_epoch_truncation_off_is_caught() -> None:
    """Pre-KIP-101 truncation to the HW loses acknowledged records or lets replicas diverge."""
    _assert_caught_and_green_when_on(
        "no-power-loss", Safety(leader_epoch_truncation=False), "leader-epoch truncation"
    )


def test_controller_epoch_fence_off_is_caught() -> None:
    """Without the /controller_epoch compare, a deposed controller's writes commit."""
    _assert_caught_and_green_when_on(
        "controller-chaos", Safety(controller_epoch_fence=False), "controller-epoch fence"
    )


# Seeds that found bugs since fixed: they must stay green.
# 10 is KI-1's last regression seed: ISR [2, 5] stops at once, 2 losing power, and 2 led
# again on its return before brokers reported unclean shutdowns.
FIXED_ISSUE_SEEDS = [
    (10, "default"),
    (29, "default"),
    (65, "default"),
    (182, "default"),
    (340, "default"),
    (516, "default"),
    # Retention deleted an idempotent producer's only batch, the leader restarted and rebuilt
    # producer state from the rest of its log, and took the producer's retry as new: "record
    # written twice". Fixed by producer state snapshots (services/broker/producer_state.py).
    (1422, "default"),
]

# Seeds of the scenarios added with issue 16 (topic deletion with brokers bouncing,
# controller failover mid-reassignment, re-registration racing control requests,
# retention with a lagging follower, power loss of an ISR member). Each failed on the code
# before issue 16's controller fixes (46636f8, run with this simulation), with the line
# given; they must stay green.
DEFECT_SEEDS = [
    # Defect 1: a control request refused by a broker whose registration it raced (its epoch
    # not known yet, or a newer one) was counted as delivered: "t0-1: replica 5 does not
    # follow leader 4 in epoch 8 after the settle phase"; "t0-0: replica 1 does not follow
    # leader 3 in epoch 11"; "t0-1: broker 3 does not lead epoch 5 after the settle phase".
    (24, "default"),
    (57, "default"),
    (56, "default"),
    # Defect 2: the controller died once the targets joined the ISR and the new one never
    # finished the walk: "t0-1: reassignment to [4, 2, 5] still open after the settle phase".
    (5, "default"),
    (36, "default"),
    # Defect 3: a StopReplica answer from an incarnation that was gone: "illegal replica
    # transition ReplicaDeletionIneligible -> ReplicaDeletionSuccessful" (the controller halted).
    (7, "default"),
    (8, "default"),
    # KI-1: a broker back from a power loss led over an ISR member that kept every record:
    # "acknowledged record lost: t1-0 offset 23 should hold b'p2-77', leader 3 has None".
    (345, "default"),
    # A deletion never finished: "topic t0 was deleted but etcd still has [...]".
    (73, "default"),
    (86, "default"),
    # Found once the above were fixed (they failed first by defect 3 on the old code): a
    # controlled shutdown moved leadership of a topic being deleted, bringing back deleted
    # replicas; a replica left on disk by a deleted topic grafted onto the re-created one.
    (84, "default"),
    (197, "default"),
]


@pytest.mark.parametrize(("seed", "profile"), DEFECT_SEEDS, ids=[f"seed-{s}" for s, _ in DEFECT_SEEDS])
def test_seed_of_a_scenario_defect_stays_green(seed: int, profile: str) -> None:
    run_seed(seed, PROFILES[profile])


@pytest.mark.parametrize(
    ("seed", "profile"), FIXED_ISSUE_SEEDS, ids=[f"seed-{s}" for s, _ in FIXED_ISSUE_SEEDS]
)
def test_seed_of_a_fixed_bug_stays_green(seed: int, profile: str) -> None:
    run_seed(seed, PROFILES[profile])
