"""Deterministic simulation: seeded runs of the real broker and controller logic under faults.

- `test_seed[N]`: `--sim-seeds` seeds (default 50) of the default fault mix must keep every
  rule of DESIGN.md section 8. A failure prints its seed, the end of its trace and the
  command that replays it. Failures the checker attributes to a known, reported bug
  (tests/sim/known_issues.py) are xfailed with that bug's tag.
- `test_*_off_is_caught`: with one safety mechanism switched off, the checker must find a
  violation within a small seed budget, on a seed that is green with the mechanism on.
- `test_known_issue_seed`: one regression seed per known bug, xfail(strict=True): they
  start passing, and so fail, the day the bug is fixed; then drop the mark
  (tests/sim/test_known_issues.py has the same bugs as scripted scenarios).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import pytest

from tests.sim.config import PROFILES, Safety
from tests.sim.known_issues import KNOWN_ISSUES
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


def _known_issue_seed(tag: str, seed: int, profile: str) -> object:
    return pytest.param(tag, seed, profile, id=f"{tag}-seed-{seed}-{profile}", marks=pytest.mark.xfail(
        strict=True, raises=SimulationFailure, reason=f"{tag}: {KNOWN_ISSUES[tag]}"))


# One seed per known bug that still reproduces it (tests/sim/known_issues.py). A seed whose
# run changes for an unrelated reason (the simulation or the code moved on) stops failing
# and shows up as XPASS: pick a new one with `python -m tests.sim.run -q`.
KNOWN_ISSUE_SEEDS = [
    _known_issue_seed("KI-1", 162, "default"),
]


# Seeds that found bugs since fixed: they must stay green.
FIXED_ISSUE_SEEDS = [(29, "default"), (65, "default"), (182, "default"), (340, "default"), (516, "default")]


@pytest.mark.parametrize(("seed", "profile"), FIXED_ISSUE_SEEDS, ids=[f"seed-{s}" for s, _ in FIXED_ISSUE_SEEDS])
def test_seed_of_a_fixed_bug_stays_green(seed: int, profile: str) -> None:
    run_seed(seed, PROFILES[profile])


@pytest.mark.parametrize(("tag", "seed", "profile"), KNOWN_ISSUE_SEEDS)
def test_known_issue_seed(tag: str, seed: int, profile: str) -> None:
    try:
        run_seed(seed, PROFILES[profile])
    except SimulationFailure as failure:
        if not (failure.known_issue or "").startswith(tag + ":"):
            pytest.fail(f"seed {seed} no longer fails by {tag} but by something else:\n{failure}")
        raise
