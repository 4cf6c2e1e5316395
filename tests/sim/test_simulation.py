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
import logging
from collections.abc import Iterator

import pytest

from tests.sim.config import PROFILES, Safety
from tests.sim.simulation import SimulationFailure, run_seed

# Mechanism-off experiments must find a violation within this many seeds.
MECHANISM_SEED_BUDGET = 12


@pytest.fixture(autouse=True)
def _quiet_service_logs() -> Iterator[None]:
    """The services log every failover at WARNING; in a simulation those are the point, not news."""
    logger = logging.getLogger("highwater")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


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
    assert (first.events, first.messages, first.trace_digest) == (second.events, second.messages,
                                                                  second.trace_digest)


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
    _assert_caught_and_green_when_on("no-power-loss", Safety(leader_epoch_truncation=False),
                                     "leader-epoch truncation")


def test_controller_epoch_fence_off_is_caught() -> None:
    """Without the /controller_epoch compare, a deposed controller's writes commit."""
    _assert_caught_and_green_when_on("controller-chaos", Safety(controller_epoch_fence=False),
                                     "controller-epoch fence")


# Seeds that found bugs since fixed: they must stay green.
# 10 is KI-1's last regression seed: ISR [2, 5] stops at once, 2 losing power, and 2 led
# again on its return before brokers reported unclean shutdowns.
FIXED_ISSUE_SEEDS = [(10, "default"), (29, "default"), (65, "default"), (182, "default"), (340, "default"),
                     (516, "default")]

# Seeds of the scenarios added for topic deletion, reassignment failover, re-registration
# races, retention and ISR power loss: each failed on the code before the fixes they check,
# with the line given; they must stay green.
DEFECT_SEEDS = [
    # (a) a restarted broker refused the LeaderAndIsr that raced its registration (its epoch
    # not known yet) and the controller took the refusal as delivered: "t0-0: replica 2 does
    # not follow leader 1 in epoch 1 after the settle phase".
    (55, "default"),
    # (a) likewise, a re-registered broker: "t1-0: broker 2 does not lead epoch 3 after the
    # settle phase (b2 up be78 )".
    (113, "default"),
    # (b) the controller crashed once the targets joined the ISR; the new one never finished
    # the walk: "t1-0: reassignment to [4, 3, 1] still open after the settle phase".
    (75, "default"),
    # (c) a StopReplica answer handled after its broker left: "illegal replica transition
    # ReplicaDeletionIneligible -> ReplicaDeletionSuccessful for (('t0', 0), 2)".
    (49, "default"),
    (18, "default"),
    # KI-1, on the code before the broker reported unclean shutdowns: a broker that lost
    # unflushed data led again over intact ISR members: "broker 5 cuts committed record
    # b'p1-193' (leader epoch 7) at offset 213 of t0-1".
    (69, "default"),
    (260, "default"),
]


@pytest.mark.parametrize(("seed", "profile"), DEFECT_SEEDS, ids=[f"seed-{s}" for s, _ in DEFECT_SEEDS])
def test_seed_of_a_scenario_defect_stays_green(seed: int, profile: str) -> None:
    run_seed(seed, PROFILES[profile])


@pytest.mark.parametrize(("seed", "profile"), FIXED_ISSUE_SEEDS, ids=[f"seed-{s}" for s, _ in FIXED_ISSUE_SEEDS])
def test_seed_of_a_fixed_bug_stays_green(seed: int, profile: str) -> None:
    run_seed(seed, PROFILES[profile])
