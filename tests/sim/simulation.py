"""One simulation run from one seed: build the cluster, run faults and workload, heal, settle, check.

Everything random in a run comes from one random.Random(seed), handed to every part
that draws, in a fixed order; nothing reads real time. So `run_seed(seed)` is a pure
function of (seed, config): a failure reproduces exactly, trace included.

Phases:
1. start etcd, controller candidates, brokers; the operator creates topic t0;
   producers and consumers start;
2. fault phase: faults and admin operations for `fault_phase_ms`; topic t1 is created
   at a random moment (in some runs with little retention); topics are deleted, a
   replica bouncing as the deletion runs, and created again under the same name;
   reassignments, some with the active controller crashing once their targets are in
   the ISR;
3. heal: every fault ends, everything down restarts, producers stop;
4. settle for `settle_ms` (in some runs with one more reassignment and a controller
   crash in it), waiting a bounded extra while the cluster has not converged, then the
   final history and liveness check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
from dataclasses import dataclass

from clients.common.errors import InvariantViolation
from tests.sim.checker import Checker, InvariantBroken
from tests.sim.clock import TRACE_LINES_DEFAULT, EventLoop
from tests.sim.config import PROFILES, ClusterShape, Safety, SimConfig
from tests.sim.faults import FaultInjector
from tests.sim.known_issues import known_issue
from tests.sim.liveness import LivenessModel
from tests.sim.network import Network
from tests.sim.sim_broker import SimBroker
from tests.sim.sim_controller import SimController
from tests.sim.sim_etcd import SimEtcd
from tests.sim.workload import Consumer, Operator, Producer

# The operator's first topic is created this long after start: brokers have registered.
FIRST_TOPIC_AT_MS = 1_000
# After the settle phase, wait in steps of this long, at most this many times, for the
# controller's last requests to arrive (their retries take up to 5 x 5 s) and the cluster
# to converge.
SETTLE_EXTRA_STEP_MS = 1_000
SETTLE_EXTRA_STEPS_MAX = 30
# The retention topic: segments of the smallest size topic configs allow (about 4 s of a
# partition's traffic here), none kept but the active one (retention deletes whole inactive
# segments below the HW), so a follower paused, cut off or down for a few seconds falls below
# the leader's log start.
RETENTION_SEGMENT_BYTES = 1_024
RETENTION_BYTES = 1  # 0 is "not set" on the wire (TopicConfig), so the smallest real limit
# A replica of a topic being deleted bounces within this long of the DeleteTopics request,
# while the StopReplicas are on their way (a message takes 1..4 ms each way).
DELETION_BOUNCE_AFTER_MS = (0, 20)
# A deleted topic is created again this long after its deletion finished.
RECREATE_AFTER_MS = (500, 5_000)
# The settle phase's reassignment starts this far into it: brokers have restarted.
SETTLE_REASSIGNMENT_AT_FRACTION = 0.25


def repro_command(seed: int, config: SimConfig) -> str:
    """The command line that runs this seed with this config again."""
    flags = []
    if not config.safety.leader_epoch_truncation:
        flags.append("--no-epoch-truncation")
    if not config.safety.controller_epoch_fence:
        flags.append("--no-controller-fence")
    plain = dataclasses.replace(config, safety=Safety())
    names = [name for name, profile in PROFILES.items() if profile == plain]
    profile = f"--profile {names[0]} " if names else "(a custom SimConfig) "
    return f"python -m tests.sim.run --seed {seed} {profile}{' '.join(flags)}".rstrip()


class SimulationFailure(AssertionError):
    """A run broke a rule. Carries the seed that reproduces it and the end of the trace."""

    def __init__(
        self,
        seed: int,
        reason: str,
        at_ms: int,
        trace: list[str],
        detail: str = "",
        known_issue: str | None = None,
        config: SimConfig | None = None,
    ) -> None:
        self.seed = seed
        self.reason = reason
        self.at_ms = at_ms
        self.trace = trace
        self.known_issue = known_issue
        lines = [
            f"simulation seed {seed} failed at {at_ms} ms: {reason}",
            f"reproduce: {repro_command(seed, config or SimConfig())}",
        ]
        if known_issue:
            lines.append(f"known issue: {known_issue}")
        if detail:
            lines.append(detail)
        lines.append(f"last {len(trace)} events:")
        lines.extend(trace)
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class SimResult:
    seed: int
    shape: ClusterShape
    simulated_ms: int
    wall_s: float
    events: int
    messages: int
    faults: int
    acks_all: int
    acks_one: int
    records_consumed: int
    truncations_checked: int
    topics_deleted: int
    # Followers that restarted at the leader's log start, consumers that reset to it (retention).
    log_start_resets: int
    # Leases the controller's liveness fast path revoked, and how many of them a live broker held.
    liveness_revocations: int
    liveness_revocations_alive: int
    # sha256 of the trace's last lines: equal digests (with equal event counts) mean the same run.
    trace_digest: str


class Simulation:
    """The whole cluster of one run. Build with a seed, then run()."""

    def __init__(
        self, seed: int, config: SimConfig | None = None, *, trace_lines_max: int = TRACE_LINES_DEFAULT
    ) -> None:
        self.seed = seed
        self.config = config or SimConfig()
        self.config.check()
        self.rng = random.Random(seed)
        self.shape = ClusterShape.choose(self.config, self.rng)
        self.loop = EventLoop(trace_lines_max=trace_lines_max)
        self.network = Network(self.loop, self.rng)
        self.etcd = SimEtcd(
            self.loop, self.network, fence_controller_epoch=self.config.safety.controller_epoch_fence
        )
        self.checker = Checker(self.loop, self.etcd)
        self.controllers = [
            SimController(i, self.loop, self.network, self.etcd, self.config, self.checker)
            for i in range(1, self.shape.controllers + 1)
        ]
        self.brokers = [
            SimBroker(i, self.loop, self.network, self.etcd, self.config, self.rng, self.checker)
            for i in range(1, self.shape.brokers + 1)
        ]
        self.checker.watch_brokers(self.brokers)
        self.checker.controllers = {c.controller_id: c for c in self.controllers}
        broker_ids = [b.broker_id for b in self.brokers]
        controller_ids = [c.controller_id for c in self.controllers]
        # Producer 0: acks=all; 1: acks=1; 2: acks=all, idempotent; then again.
        self.producers = [
            Producer(
                i,
                1 if i % 3 == 1 else -1,
                i % 3 == 2,
                self.loop,
                self.network,
                self.rng,
                self.config,
                self.checker,
                broker_ids,
                controller_ids,
            )
            for i in range(self.config.producers)
        ]
        self.consumers = [
            Consumer(i, self.loop, self.network, self.rng, self.config, self.checker, broker_ids)
            for i in range(self.config.consumers)
        ]
        self.checker.consumers = self.consumers
        self.operator = Operator(
            self.loop,
            self.network,
            self.rng,
            self.config,
            [c.controller_id for c in self.controllers],
            self._topic_created,
        )
        self.faults = FaultInjector(
            self.loop,
            self.network,
            self.etcd,
            self.rng,
            self.config,
            self.brokers,
            self.controllers,
            self.checker,
        )
        # The brokers' liveness streams to the active controller and its fast failure path.
        self.liveness = LivenessModel(
            self.loop,
            self.network,
            self.rng,
            self.config.broker_connection_grace_ms,
            self.brokers,
            self.controllers,
        )
        self.faults.on_storm = self.liveness.on_storm
        self.loop.on_time = self.etcd.advance
        self.loop.after_step = self._after_step
        # Partitions whose reassignment crashes the active controller once its targets are in the ISR.
        self._failover_when_due: set[tuple[str, int]] = set()
        self.topics_deleted = 0

    def _after_step(self, node: object) -> None:
        self.etcd.notify_watchers()
        self.checker.after_step(node)  # type: ignore[arg-type]
        if self.checker.registrations:
            registered, self.checker.registrations = self.checker.registrations, []
            for broker_id, broker_epoch in registered:
                self.faults.on_registered(broker_id, broker_epoch)
        if self.checker.reassignments_due:
            due, self.checker.reassignments_due = self.checker.reassignments_due, []
            if any(tp in self._failover_when_due for tp in due):
                # The controller committed the step that put the targets in the ISR and has
                # not finished the walk yet: it dies here, before its next event.
                self._failover_when_due.difference_update(due)
                self.loop.trace("sim", "targets of %s in the ISR: the active controller fails", (due,))
                self.faults.fail_over_controller()
        # Last: a late registration answer (on_registered above) decides which epoch a stream names.
        self.liveness.reconcile()

    def _topic_created(self, name: str) -> None:
        for client in [*self.producers, *self.consumers]:
            client.topics.append(name)

    # ---- the operator's schedule ---------------------------------------------------------

    def _admin_step(self) -> None:
        if not self.faults.active:
            return
        choice = self.rng.random()
        if choice < 0.35:
            self.operator.preferred_election()
        elif choice < 0.6 and self.operator.created:
            self._reassign(self.rng.random() < self.config.failover_mid_reassignment_fraction)
        else:
            up = [b for b in self.brokers if b.up and not b.shutting_down and not b.paused]
            if len(up) == len(self.brokers):  # one rolling restart at a time, on a healthy cluster
                broker = self.rng.choice(up)
                self.operator.rolling_restart(broker, self.rng.randint(500, 4_000), lambda: None)
        self.loop.call_at(
            self.loop.now_ms + int(self.rng.expovariate(1 / self.config.admin_every_ms)), self._admin_step
        )

    def _reassign(self, fail_over_when_due: bool) -> None:
        """Move a random partition to random brokers;
        maybe crash the controller once the targets are in the ISR.
        """
        if not self.operator.created:
            return
        topic = self.rng.choice(sorted(self.operator.created))
        tp = (topic, self.rng.randrange(self.config.partitions_per_topic))
        replicas = self.rng.sample([b.broker_id for b in self.brokers], self.config.replication_factor)
        if fail_over_when_due:
            self._failover_when_due.add(tp)
        self.operator.reassign(tp, replicas)

    def _settle_reassignment(self) -> None:
        if self.rng.random() < self.config.settle_reassignment_fraction:
            self._reassign(True)

    def _deletion_step(self) -> None:
        """Delete a topic; one of its replicas bounces while the deletion runs; create it again later."""
        if not self.faults.active:
            return
        topics = sorted(self.operator.created)
        if topics:
            topic = self.rng.choice(topics)
            self.topics_deleted += 1
            self.checker.on_topic_deletion_requested(topic)
            for client in [*self.producers, *self.consumers]:
                client.topic_deleted(topic)
            self.operator.delete_topic(topic, self._topic_deleted)
            holders = sorted(
                {r for tp, replicas in self.checker.assignments.items() if tp[0] == topic for r in replicas}
            )
            if holders:
                broker = {b.broker_id: b for b in self.brokers}[self.rng.choice(holders)]
                self.loop.call_at(
                    self.loop.now_ms + self.rng.randint(*DELETION_BOUNCE_AFTER_MS),
                    self.faults.bounce_broker,
                    broker,
                )
        self.loop.call_at(
            self.loop.now_ms + int(self.rng.expovariate(1 / self.config.topic_deletion_every_ms)),
            self._deletion_step,
        )

    def _topic_deleted(self, topic: str) -> None:
        self.loop.call_at(
            self.loop.now_ms + self.rng.randint(*RECREATE_AFTER_MS), self.operator.recreate_topic, topic
        )

    def _cluster_stop_step(self) -> None:
        """Every broker is asked to stop cleanly at once; each comes back a little later."""
        if not self.faults.active:
            return
        up = [b for b in self.brokers if b.up and not b.shutting_down and not b.paused]
        if len(up) == len(self.brokers):
            self.loop.trace("sim", "every broker stops cleanly at once", ())
            for broker in up:
                self.operator.rolling_restart(broker, self.rng.randint(500, 4_000), lambda: None)
        self.loop.call_at(
            self.loop.now_ms + int(self.rng.expovariate(1 / self.config.cluster_stop_every_ms)),
            self._cluster_stop_step,
        )

    # ---- running ---------------------------------------------------------------------------

    def run(self) -> SimResult:
        started = time.perf_counter()
        config = self.config
        fault_end_ms = FIRST_TOPIC_AT_MS + config.fault_phase_ms
        try:
            self.loop.call_at(FIRST_TOPIC_AT_MS, self.operator.create_topic, "t0")
            second_topic_at = self.rng.randint(FIRST_TOPIC_AT_MS + 1_000, fault_end_ms)
            retention = self.rng.random() < config.retention_topic_fraction
            self.loop.call_at(
                second_topic_at,
                self.operator.create_topic,
                "t1",
                {"segment.bytes": str(RETENTION_SEGMENT_BYTES), "retention.bytes": str(RETENTION_BYTES)}
                if retention
                else None,
            )
            self.loop.call_at(FIRST_TOPIC_AT_MS + 2_000, self.faults.start, fault_end_ms)
            if config.admin_every_ms > 0:
                self.loop.call_at(FIRST_TOPIC_AT_MS + 3_000, self._admin_step)
            for mean_ms, step in (
                (config.topic_deletion_every_ms, self._deletion_step),
                (config.cluster_stop_every_ms, self._cluster_stop_step),
            ):
                if mean_ms > 0:
                    self.loop.call_at(
                        FIRST_TOPIC_AT_MS + 3_000 + int(self.rng.expovariate(1 / mean_ms)), step
                    )
            self.loop.run_until(fault_end_ms)
            self.faults.heal_all()
            for producer in self.producers:
                producer.stopped = True
            for controller in self.controllers:
                controller.quiet = True
            self.loop.call_at(
                fault_end_ms + int(config.settle_ms * SETTLE_REASSIGNMENT_AT_FRACTION),
                self._settle_reassignment,
            )
            self.loop.run_until(fault_end_ms + config.settle_ms)
            self._settle_until_converged()
            self.checker.final_check()
        except (InvariantBroken, InvariantViolation) as exc:
            kind = (
                "invariant broken"
                if isinstance(exc, InvariantBroken)
                else "InvariantViolation in the pure logic"
            )
            raise SimulationFailure(
                self.seed,
                f"{kind}: {exc}",
                self.loop.now_ms,
                self.loop.trace_lines(),
                self.cluster_state(),
                known_issue(str(exc), self.checker),
                self.config,
            ) from exc
        wall_s = time.perf_counter() - started
        return SimResult(
            seed=self.seed,
            shape=self.shape,
            simulated_ms=self.loop.now_ms,
            wall_s=wall_s,
            events=self.loop.events_run,
            messages=self.network.messages_sent,
            faults=self.faults.faults_injected,
            acks_all=self.checker.acks_all_total,
            acks_one=self.checker.acks_one_total,
            records_consumed=self.checker.records_consumed,
            truncations_checked=self.checker.truncations_checked,
            topics_deleted=self.topics_deleted,
            log_start_resets=self.checker.log_start_resets + self.checker.consumer_resets,
            liveness_revocations=self.liveness.revocations,
            liveness_revocations_alive=self.liveness.revocations_alive,
            trace_digest=hashlib.sha256("\n".join(self.loop.trace_lines()).encode()).hexdigest()[:16],
        )

    def _settle_until_converged(self) -> None:
        """Let control requests still on their way land, and the cluster converge, before the final check.

        Bounded: a cluster that has not converged by then fails the liveness check. Brokers a
        rolling restart or whole-cluster stop started before the heal still has down are waited
        for too (their controlled shutdown can outlast the settle phase: one ControlledShutdown
        sent to a controller that then paused and crashed waits out its 10 s timeout).
        """
        for _ in range(SETTLE_EXTRA_STEPS_MAX):
            if (
                all(c.active is None or c.active.idle() for c in self.controllers)
                and all(b.up and not b.shutting_down for b in self.brokers)
                and self.checker.liveness_problem() is None
            ):
                return
            self.loop.run_until(self.loop.now_ms + SETTLE_EXTRA_STEP_MS)

    def cluster_state(self) -> str:
        lines = []
        if self.checker.suspect_leaders:
            lines.append(
                "suspect leaders (lost data in a power loss, then led while intact replicas were in the ISR):"
            )
            lines.extend("  " + line for line in self.checker.suspect_leaders[-5:])
        lines.append("cluster state:")
        for b in self.brokers:
            lines.append("  " + b.describe())
        for c in self.controllers:
            lines.append(
                f"  {c.name} {'up' if c.up else 'down'} "
                f"{'active at epoch ' + str(c.epoch) if c.active is not None else 'standby'}"
            )
        for tp, s in sorted(self.checker.states.items()):
            lines.append(
                f"  etcd {tp[0]}-{tp[1]}: leader {s.leader} epoch {s.leader_epoch} isr {list(s.isr)} "
                f"partition epoch {s.partition_epoch} controller epoch {s.controller_epoch}"
            )
        return "\n".join(lines)


def run_seed(
    seed: int, config: SimConfig | None = None, *, trace_lines_max: int = TRACE_LINES_DEFAULT
) -> SimResult:
    """Run one seed; raises SimulationFailure with the seed and the trace when a rule breaks."""
    return Simulation(seed, config, trace_lines_max=trace_lines_max).run()
