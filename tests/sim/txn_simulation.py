"""One transactional simulation run (issue 41): the cluster of simulation.py plus the transaction
coordinator (tests/sim/txn_coordinator.py), transactional producers, zombies and read_committed
consumers (tests/sim/txn_workload.py), checked by tests/sim/txn_checker.py.

The cluster's own fault mix runs as in every profile (broker crashes, pauses, partitions,
controller faults, ...). On top: the coordinator dies at each step of a commit (`CommitFaults`),
leaders being written to crash with their marker on the way, and successors are started for
transactional ids so that the old instance becomes a zombie. At the heal the producers stop and
the commit faults end; after the settle phase the run waits (bounded) until the coordinator holds
no open transaction and every consumer has read up to its leader's last stable offset, then runs
the history's final check besides the cluster checker's.

Deterministic from the seed, as every run: the asyncio loops of the coordinator are pumped by the
simulation on its clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from services.transactions.coordinator import IN_TRANSACTION
from services.transactions.state import read_transactions
from tests.sim.clock import TRACE_LINES_DEFAULT
from tests.sim.config import PROFILES, SimConfig
from tests.sim.sim_etcd import run_sync
from tests.sim.simulation import FIRST_TOPIC_AT_MS, SimResult, Simulation, SimulationFailure
from tests.sim.txn_checker import OFFSETS_CHECK_MS, TxnCounts, TxnHistory, TxnInvariantBroken, leaders_of
from tests.sim.txn_coordinator import CommitFaults, SimTxnCoordinator
from tests.sim.txn_workload import TxnConsumer, TxnProducer

TXN_PROFILE = "transactions"
# A successor instance of a random transactional id starts this often (mean, ms): its
# predecessor becomes a zombie.
SUCCESSOR_EVERY_MS = 6_000
# After the settle phase, wait in steps of this long, at most this many, for every transaction
# to end and every consumer to catch up.
CATCH_UP_STEP_MS = 500
CATCH_UP_STEPS_MAX = 60


@dataclass(frozen=True)
class TxnConfig:
    producers: int = 3
    consumers: int = 2
    faults: CommitFaults = field(
        default_factory=lambda: CommitFaults(
            before_markers=0.04, between_markers=0.04, before_complete=0.04, leader_crash=0.02
        )
    )


@dataclass(frozen=True)
class TxnResult:
    sim: SimResult
    counts: TxnCounts
    coordinator_deaths: dict[str, int]


class TxnSimulation(Simulation):
    def __init__(
        self,
        seed: int,
        config: SimConfig | None = None,
        txn: TxnConfig | None = None,
        *,
        trace_lines_max: int = TRACE_LINES_DEFAULT,
    ) -> None:
        super().__init__(seed, config or PROFILES[TXN_PROFILE], trace_lines_max=trace_lines_max)
        self.txn_config = txn or TxnConfig()
        broker_ids = [b.broker_id for b in self.brokers]
        self.history = TxnHistory(self.etcd, self._groups)
        self.coordinator = SimTxnCoordinator(
            self.loop,
            self.network,
            self.etcd,
            self.rng,
            broker_ids,
            dataclasses.replace(self.txn_config.faults),
            self._crash_leader,
        )
        self.txn_producers = [
            TxnProducer(f"x{i}", f"tx{i}", self.loop, self.network, self.rng, self.history, broker_ids)
            for i in range(self.txn_config.producers)
        ]
        for producer in self.txn_producers:
            producer.start(self.rng.randint(FIRST_TOPIC_AT_MS, FIRST_TOPIC_AT_MS + 1_000))
        self.txn_consumers = [
            TxnConsumer(f"r{i}", self.loop, self.network, self.rng, self.history, broker_ids)
            for i in range(self.txn_config.consumers)
        ]
        self.successors = 0

    def _groups(self) -> list[tuple[str, str]]:
        return sorted({(p.group, p.transactional_id) for p in self.txn_producers})

    def _topic_created(self, name: str) -> None:
        super()._topic_created(name)
        for client in [*getattr(self, "txn_producers", []), *getattr(self, "txn_consumers", [])]:
            if name not in client.topics:
                client.topics.append(name)

    def _crash_leader(self, broker_id: int) -> None:
        broker = {b.broker_id: b for b in self.brokers}[broker_id]
        if self.faults.active:
            self.loop.trace("sim", "leader b%d crashes with a marker on its way", (broker_id,))
            self.faults.bounce_broker(broker)

    def _successor_step(self) -> None:
        """Start a new instance of a live transactional id; the old one is a zombie from now on."""
        if not self.faults.active:
            return
        live = [p for p in self.txn_producers if not p.zombie and not p.stopped and p.producer_id >= 0]
        if live:
            old = self.rng.choice(live)
            old.zombie = True
            self.successors += 1
            new = TxnProducer(
                f"{old.name}s{self.successors}",
                old.transactional_id,
                self.loop,
                self.network,
                self.rng,
                self.history,
                old.metadata.broker_ids,
            )
            new.topics = list(old.topics)
            self.txn_producers.append(new)
            self.loop.trace(
                "sim", "%s takes over %s: %s is a zombie", (new.name, old.transactional_id, old.name)
            )
            new.start()
        self.loop.call_at(
            self.loop.now_ms + int(self.rng.expovariate(1 / SUCCESSOR_EVERY_MS)), self._successor_step
        )

    def _offsets_step(self) -> None:
        self.history.check_offsets()
        self.loop.call_at(self.loop.now_ms + OFFSETS_CHECK_MS, self._offsets_step)

    def _fault_phase_ends(self) -> None:
        self.coordinator.faults_active = False
        for producer in self.txn_producers:
            producer.stopped = True

    def run_txn(self) -> TxnResult:
        fault_end_ms = FIRST_TOPIC_AT_MS + self.config.fault_phase_ms
        self.loop.call_at(FIRST_TOPIC_AT_MS + 3_000, self._successor_step)
        self.loop.call_at(FIRST_TOPIC_AT_MS, self._offsets_step)
        self.loop.call_at(fault_end_ms, self._fault_phase_ends)
        try:
            result = self.run()
            self._catch_up()
            self.history.final_check(
                [c.name for c in self.txn_consumers],
                leaders_of(p for b in self.brokers for p in b.partitions.values()),
            )
        except TxnInvariantBroken as exc:
            raise SimulationFailure(
                self.seed,
                f"transactional invariant broken: {exc}",
                self.loop.now_ms,
                self.loop.trace_lines(),
                self.cluster_state(),
                None,
                self.config,
            ) from exc
        finally:
            self.coordinator.stop()
        return TxnResult(result, self.history.counts, dict(self.coordinator.deaths))

    def _catch_up(self) -> None:
        """Bounded wait for no open transaction and every consumer at its leader's LSO; a run
        that never gets there fails (a hanging transaction, or an LSO that never moves)."""
        for _ in range(CATCH_UP_STEPS_MAX):
            problem = self._not_caught_up()
            if problem is None:
                return
            self.loop.run_until(self.loop.now_ms + CATCH_UP_STEP_MS)
        raise TxnInvariantBroken(
            f"liveness: still not caught up after the settle phase: {self._not_caught_up()}"
        )

    def _not_caught_up(self) -> str | None:
        stored = run_sync(read_transactions(self.etcd.store))
        open_ids = sorted(tid for tid, (meta, _) in stored.items() if meta.state in IN_TRANSACTION)
        if open_ids:
            return f"transactions still open in etcd: {open_ids}"
        for p in leaders_of(p for b in self.brokers if b.up for p in b.partitions.values()):
            tp = (p.topic, p.partition)
            if p.last_stable_offset != p.high_watermark:
                return f"{tp[0]}-{tp[1]}: LSO {p.last_stable_offset} below the HW {p.high_watermark}"
            for consumer in self.txn_consumers:
                if consumer.positions.get(tp, 0) < p.last_stable_offset:
                    return (
                        f"{consumer.name} at {consumer.positions.get(tp, 0)} on {tp[0]}-{tp[1]}, "
                        f"LSO {p.last_stable_offset}"
                    )
        return None


def run_txn_seed(
    seed: int,
    config: SimConfig | None = None,
    txn: TxnConfig | None = None,
    *,
    trace_lines_max: int = TRACE_LINES_DEFAULT,
) -> TxnResult:
    """Run one transactional seed; raises SimulationFailure with the seed and the trace."""
    return TxnSimulation(seed, config, txn, trace_lines_max=trace_lines_max).run_txn()
