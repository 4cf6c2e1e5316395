"""Transactions in the deterministic simulation (issue 41): the real coordinator driver and broker
rules under coordinator deaths at every step of a commit, leader crashes and zombies, checked by
the transactional history checker (tests/sim/txn_checker.py); and the checker catching broken
rules (a marker writer that skips a partition, a last stable offset blind to open transactions)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

from services.broker.partition import Partition
from tests.sim.simulation import SimulationFailure
from tests.sim.txn_coordinator import CommitFaults
from tests.sim.txn_simulation import TxnConfig, run_txn_seed

# Seeds of each mechanism-off experiment: every one of them (all but one for the LSO, below) must
# fail the checker.
MECHANISM_OFF_SEEDS = 5


@pytest.fixture(autouse=True)
def _quiet_services() -> Iterator[None]:
    """The services log every failover at WARNING; here those are the point, not news."""
    logger = logging.getLogger("highwater")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def test_txn_seeds_keep_every_transactional_property(sim_seeds: int) -> None:
    """`--sim-seeds` seeds (50 by default, about 0.3 s each)."""
    committed = aborted = seen = 0
    deaths: dict[str, int] = {}
    for seed in range(sim_seeds):
        result = run_txn_seed(seed)
        committed += result.counts.committed
        aborted += result.counts.aborted
        seen += result.counts.records_seen
        for step, count in result.coordinator_deaths.items():
            deaths[step] = deaths.get(step, 0) + count
    # The runs exercised what the properties are about, not an idle cluster.
    assert committed > sim_seeds and aborted > sim_seeds // 2 and seen > 0
    assert set(deaths) == {
        "PrepareX stored, before any marker",
        "between markers",
        "markers written, before complete",
    }, deaths


def test_txn_run_is_a_function_of_its_seed() -> None:
    first, second = run_txn_seed(7), run_txn_seed(7)
    assert first.sim.trace_digest == second.sim.trace_digest
    assert first.counts == second.counts


def test_txn_checker_catches_a_marker_writer_that_skips_a_partition() -> None:
    """Mechanism off: one partition of each multi-partition transaction is reported written
    without its marker. Its records stay open (the LSO stops there) or are ended by the next
    transaction's marker of the other outcome: the checker must fail the run."""
    broken = TxnConfig(faults=CommitFaults(skip_one_marker=True))
    for seed in range(MECHANISM_OFF_SEEDS):
        with pytest.raises(SimulationFailure, match="transactional invariant broken"):
            run_txn_seed(seed, txn=broken)


def test_txn_checker_catches_an_lso_that_ignores_open_transactions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mechanism off: the leaders' last stable offset is the HW, open transactions or not, so
    read_committed consumers read into open transactions: the checker must fail the run."""
    monkeypatch.setattr(Partition, "last_stable_offset", property(lambda p: p.high_watermark))
    # Caught only where a read_committed read meets an open transaction's records, which a
    # schedule need not contain: seed 0's stopped containing one when followers began fetching in
    # sessions (its answers come at other moments). Seeds 1-11 all catch it.
    caught = []
    for seed in range(MECHANISM_OFF_SEEDS):
        try:
            run_txn_seed(seed)
        except SimulationFailure as failure:
            assert re.search(r"transactional invariant broken: (LSO|aborted)", str(failure)), failure
            caught.append(seed)
    assert len(caught) >= MECHANISM_OFF_SEEDS - 1, f"the broken LSO was caught in seeds {caught} only"
