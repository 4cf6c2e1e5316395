"""Every bound and rate of a simulation run in one place, with units in the names and why.

Service timings are scaled down from services/common/limits.py where the real value
would only make a run longer without exercising anything new: a 2 s lease TTL (the
real minimum) and a 3 s replica.lag.time.max.ms make failovers and ISR shrinks happen
every few simulated seconds instead of every ten. Fetch long-poll, back-off, ISR check
interval and RPC timeouts keep their real values. `SimConfig.check()` applies the same
relation checks the services apply at start-up.

`Safety` holds the test-only switches that turn one safety mechanism off (both on by
default). They exist to prove that the checker notices when a mechanism is missing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from services.common import limits

# Simulated wall-clock time starts here (log timestamps look like real ones; retention
# of 7 days never triggers).
WALL_CLOCK_BASE_MS = 1_700_000_000_000


@dataclass(frozen=True)
class Safety:
    """Safety mechanisms the simulation can switch off, one at a time, to test the checker."""

    # KIP-101/279: a follower truncates to the leader's end offset for its latest epoch.
    # Off: the pre-KIP-101 rule, truncate to the follower's own high watermark.
    leader_epoch_truncation: bool = True
    # Every controller write compares /controller_epoch with the writer's epoch.
    # Off: the simulated etcd drops that compare, so a deposed controller's writes commit.
    controller_epoch_fence: bool = True


@dataclass(frozen=True)
class SimConfig:
    # ---- cluster shape (None: the seed chooses) ----
    brokers: int | None = None  # 3..5
    controllers: int | None = None  # 1..2 candidates
    partitions_per_topic: int = 2
    replication_factor: int = 3
    min_insync_replicas: int = 2
    # ---- phases ----
    # Faults and workload run for fault_phase_ms; then faults stop, everything heals and
    # restarts, producers stop, and the cluster gets settle_ms to converge before the
    # final history check.
    fault_phase_ms: int = 40_000
    settle_ms: int = 20_000
    # ---- service timings ----
    lease_ttl_s: int = limits.LEASE_TTL_S_MIN
    replica_lag_time_max_ms: int = 3_000
    replica_fetch_wait_max_ms: int = limits.REPLICA_FETCH_WAIT_MAX_MS
    replica_fetch_backoff_ms: int = limits.REPLICA_FETCH_BACKOFF_MS
    isr_check_interval_ms: int = limits.ISR_CHECK_INTERVAL_MS
    control_rpc_timeout_ms: int = int(limits.CONTROL_RPC_TIMEOUT_S * 1000)
    # The active controller revokes the lease of a broker incarnation whose liveness stream
    # ended and was not reopened within this long (services/controller/liveness.py; the real
    # default). 0: no liveness streams are modelled (failure detection by the lease only).
    broker_connection_grace_ms: int = limits.BROKER_CONNECTION_GRACE_MS
    # A restarting broker whose old registration is still alive retries this often
    # (the real process exits with BrokerIdInUse and its supervisor starts it again).
    register_retry_ms: int = 500
    # A controller candidate re-checks /controller this often besides its watch.
    campaign_retry_ms: int = 500
    # Auto leader rebalance runs this often (Kafka's leader.imbalance.check.interval: 300 s,
    # too rare to happen in a run).
    leader_imbalance_check_interval_ms: int = 10_000
    # ---- workload ----
    producers: int = 3  # p0 acks=all, p1 acks=1, p2 acks=all and idempotent (then the cycle repeats)
    consumers: int = 1
    produce_interval_ms_max: int = 200  # a producer sends its next batch within this
    records_per_batch_max: int = 3
    produce_timeout_ms: int = 2_000
    consumer_fetch_wait_ms: int = 500
    # ---- faults (mean time between injections, per kind; 0 disables) ----
    crash_every_ms: int = 6_000
    power_loss_fraction: float = 0.3  # of broker crashes, how many lose unflushed bytes
    pause_every_ms: int = 7_000
    partition_every_ms: int = 9_000
    controller_fault_every_ms: int = 8_000
    link_storm_every_ms: int = 10_000
    slow_disk_every_ms: int = 15_000
    lease_expiry_every_ms: int = 15_000
    admin_every_ms: int = 5_000  # preferred elections, controlled shutdowns, topic creation
    # ---- scenarios: admin actions and targeted faults (mean interval or share; 0 disables) ----
    # The operator deletes a topic (re-creating it under the same name once the deletion is
    # done) and one of its replicas bounces while the StopReplicas are on their way.
    topic_deletion_every_ms: int = 15_000
    # Share of runs whose second topic keeps little (retention.bytes over small segments), so
    # the leader's log start passes a paused or partitioned follower's fetch offset.
    retention_topic_fraction: float = 0.5
    # A broker's session expires (it re-registers) while a control request is on its way to it.
    reregistration_race_every_ms: int = 8_000
    # Share of registrations whose answer reaches the broker late (it commits, the controller
    # sees it, and the broker learns its new broker epoch a few ms after).
    late_registration_answer_fraction: float = 0.5
    # Share of reassignments whose targets joining the ISR is the moment the active controller
    # crashes: the next one must finish the walk from etcd.
    failover_mid_reassignment_fraction: float = 0.5
    # Share of runs with one more reassignment in the (otherwise quiet) settle phase, the active
    # controller crashing once its targets are in the ISR: no later event finishes it for the
    # new controller.
    settle_reassignment_fraction: float = 0.3
    # Every member of a partition's ISR stops at once (one by power loss) and the one that lost
    # unflushed data comes back first (KI-1).
    isr_power_loss_every_ms: int = 25_000
    # A live broker's link to the active controller alone is cut (it still serves clients and
    # followers and reaches etcd), mostly for longer than the connection grace period: the
    # controller revokes the lease of a broker that is alive (issue 24).
    controller_link_cut_every_ms: int = 8_000
    # Every broker is asked to stop cleanly at once (a whole-cluster restart); they come back.
    cluster_stop_every_ms: int = 60_000
    # ---- the mechanisms under test ----
    safety: Safety = field(default_factory=Safety)

    def check(self) -> None:
        """The relations services/common/limits.check_relations enforces at start-up, plus ours."""
        limits.check_relations(
            lease_ttl_s=self.lease_ttl_s,
            keepalive_interval_s=self.lease_ttl_s / 4,
            replica_lag_time_max_ms=self.replica_lag_time_max_ms,
            replica_fetch_wait_max_ms=self.replica_fetch_wait_max_ms,
        )
        if self.broker_connection_grace_ms:
            limits.check_connection_grace(
                grace_ms=self.broker_connection_grace_ms, lease_ttl_s=self.lease_ttl_s
            )
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError("min_insync_replicas above replication_factor: acks=all could never succeed")


@dataclass(frozen=True)
class ClusterShape:
    """What the seed chose for this run."""

    brokers: int
    controllers: int

    @classmethod
    def choose(cls, config: SimConfig, rng: random.Random) -> ClusterShape:
        brokers = config.brokers if config.brokers is not None else rng.randint(3, 5)
        controllers = config.controllers if config.controllers is not None else rng.randint(1, 2)
        return cls(brokers, controllers)


# Named fault mixes for the CLI and the tests.
PROFILES: dict[str, SimConfig] = {
    # Everything, power losses included.
    "default": SimConfig(),
    # Crashes keep what was written (kill -9, not a power cut): rules out data loss that
    # only missing fsyncs explain, so a failure points at replication or election logic.
    "no-power-loss": SimConfig(power_loss_fraction=0.0),
    # Two controller candidates under frequent crashes, pauses and session expiries, with
    # more admin work: a deposed controller acting before it notices is likely here.
    "controller-chaos": SimConfig(
        controllers=2,
        power_loss_fraction=0.0,
        fault_phase_ms=30_000,
        settle_ms=10_000,
        controller_fault_every_ms=1_500,
        lease_expiry_every_ms=3_000,
        admin_every_ms=2_000,
    ),
    # Transactions (tests/sim/txn_simulation.py: run with run_txn_seed): transactional producers
    # and read_committed consumers instead of the plain ones; no topic deletion or retention (a
    # transaction's history spans the run); kill -9 only (power loss is KI-1's ground).
    "transactions": SimConfig(
        producers=0,
        consumers=0,
        fault_phase_ms=20_000,
        settle_ms=10_000,
        power_loss_fraction=0.0,
        isr_power_loss_every_ms=0,
        topic_deletion_every_ms=0,
        retention_topic_fraction=0.0,
    ),
}
