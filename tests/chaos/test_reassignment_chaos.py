"""A partition reassignment under load while brokers of the old and new replica sets bounce.

Four brokers; topic `moving` has three partitions on brokers 1-3 (replication
factor 3, min.insync.replicas 2) and is moved to brokers 2-4: broker 1 is only
in the old replica sets, broker 4 only in the new ones, brokers 2 and 3 in
both. Broker 4 is paused (SIGSTOP) just before the reassignment starts, so the
reassignment cannot finish until it comes back: every bounce below happens
while it runs. Then: a clean bounce (SIGTERM) of broker 1, a hard bounce
(SIGKILL) of broker 2, a hard bounce of the active controller (the standby
finds the half-done walk in etcd), a clean bounce of broker 3, and a hard
bounce of the paused broker 4, after which the reassignment must finish
(bounded). Two acks=all writers and a reader run throughout; at the end the
history checker reads every partition back, the removed replicas must be
deleted from broker 1, and the replicas' segment files (read once the
cluster is stopped) must agree with each other and hold every committed
record (history.check_replicas).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from protos.highwater.v1 import common_pb2
from tests.chaos import workload
from tests.chaos.history import History, check, check_replicas
from tests.integration.conftest import TestCluster
from tests.integration.helpers import gateway_stub, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "moving"
PARTITIONS = 3
LEASE_TTL_S = 3
OLD_ASSIGNMENT = {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]}
NEW_ASSIGNMENT = {0: [4, 2, 3], 1: [2, 3, 4], 2: [3, 4, 2]}
ACKS_BEFORE_FAULTS = 30
ACKS_PER_PARTITION_AFTER_BOUNCE = 5
# Catching broker 4 up on three small partitions, the ISR expansions and the final walk.
REASSIGNMENT_TIMEOUT_S = 60.0
# StopReplica(delete) to broker 1 follows the walk's last etcd write.
REPLICA_DELETION_TIMEOUT_S = 30.0


@pytest.fixture
def moving_cluster(tmp_path) -> Iterator[TestCluster]:
    c = TestCluster(tmp_path / "cluster", brokers=4, controllers=2, lease_ttl_s=LEASE_TTL_S)
    c.start()
    try:
        gw = gateway_stub(c.gateway_address)
        resp = gw.CreateTopics(
            common_pb2.CreateTopicsRequest(
                topics=[
                    common_pb2.CreatableTopic(
                        name=TOPIC,
                        num_partitions=-1,
                        replication_factor=-1,
                        assignments={
                            p: common_pb2.ReplicaList(replicas=r) for p, r in OLD_ASSIGNMENT.items()
                        },
                        configs={"min.insync.replicas": "2"},
                    )
                ]
            )
        )
        assert resp.topics[0].error_code == 0, resp.topics[0].error_message
        yield c
    finally:
        c.stop()


def ongoing(c: TestCluster) -> int:
    """How many partitions of the topic are being reassigned."""
    resp = gateway_stub(c.gateway_address).ListPartitionReassignments(
        common_pb2.ListPartitionReassignmentsRequest(), timeout=10
    )
    return sum(1 for r in resp.reassignments if r.topic == TOPIC)


def test_reassignment_with_bounces_in_the_old_and_new_replica_sets(moving_cluster):
    c = moving_cluster
    gw = gateway_stub(c.gateway_address)
    history = History()
    up = set(c.broker_ids)  # brokers running and not paused
    started_s = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started_s:6.1f} s] {message}", flush=True)

    def acks_resume(since: float, what: str) -> None:
        """Wait (bounded) for ACKS_PER_PARTITION_AFTER_BOUNCE acknowledged writes on every partition since."""
        wait_for(
            lambda: (
                min(
                    workload.acks_per_partition(
                        history, {(TOPIC, p) for p in range(PARTITIONS)}, since, time.monotonic()
                    ).values()
                )
                >= ACKS_PER_PARTITION_AFTER_BOUNCE
            ),
            timeout_s=workload.RECOVERY_TIMEOUT_S,
            what=what,
        )

    def settle(what: str) -> None:
        """Every partition led by a running broker, every running replica in the ISR, writes going on."""
        state = workload.wait_for_state(
            c,
            TOPIC,
            PARTITIONS,
            f"a running leader and every running replica in the ISR after {what}",
            lambda p: p.leader in up and set(p.replicas) & up <= set(p.isr),
        )
        since = time.monotonic()
        acks_resume(since, f"acknowledged writes on every partition after {what}")
        say(f"settled after {what}: {workload.describe_state(state)}")

    def bounce(what: str, inject: Callable[[], None]) -> None:
        moving = ongoing(c)
        inject()
        history.fault(what)
        say(f"fault: {what} (while {moving} of {PARTITIONS} partitions were being reassigned)")
        bounces_during_reassignment.append(moving > 0)
        settle(what)

    def broker_bounce(broker: int, hard: bool) -> Callable[[], None]:
        def inject() -> None:
            up.discard(broker)
            if hard:
                c.kill_broker(broker)
            else:
                assert c.terminate(f"broker-{broker}") == 0, f"broker {broker}'s clean stop failed"
            c.start_broker(broker)
            up.add(broker)

        return inject

    def controller_bounce() -> None:
        resp = gw.DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=5)
        name = f"controller-{resp.controller_id}"
        c.kill(name)
        c.start_process(name)

    bounces_during_reassignment: list[bool] = []
    workload.wait_healthy(c, TOPIC, PARTITIONS, "start-up")
    with workload.Workload(c, history, TOPIC, PARTITIONS):
        assert workload.wait_for_acks(history, ACKS_BEFORE_FAULTS, workload.RECOVERY_TIMEOUT_S)
        # Paused, not killed: a reassignment may only name registered brokers, and broker 4 stays
        # registered until its lease runs out; paused, it cannot catch up, so the walk waits for it.
        c.pause("broker-4")
        up.discard(4)
        history.fault("pause broker 4 (new replica sets only)")
        resp = gw.AlterPartitionReassignments(
            common_pb2.AlterPartitionReassignmentsRequest(
                topics=[
                    common_pb2.ReassignableTopic(
                        name=TOPIC,
                        partitions=[
                            common_pb2.ReassignablePartition(partition=p, replicas=r)
                            for p, r in NEW_ASSIGNMENT.items()
                        ],
                    )
                ]
            ),
            timeout=30,
        )
        assert [r.error_code for r in resp.partitions] == [0] * PARTITIONS, resp
        say(
            f"reassignment started: {OLD_ASSIGNMENT} -> {NEW_ASSIGNMENT}, broker 4 paused; "
            f"{ongoing(c)} partitions being reassigned"
        )
        bounce("clean bounce of broker 1 (old replica sets only)", broker_bounce(1, hard=False))
        bounce("hard bounce of broker 2 (old and new replica sets)", broker_bounce(2, hard=True))
        bounce("hard bounce of the active controller", controller_bounce)
        bounce("clean bounce of broker 3 (old and new replica sets)", broker_bounce(3, hard=False))
        bounce(
            "hard bounce of broker 4 (new replica sets only, paused until now)", broker_bounce(4, hard=True)
        )
        moved = workload.wait_for_state(
            c,
            TOPIC,
            PARTITIONS,
            "the reassignment to finish",
            lambda p: (
                list(p.replicas) == NEW_ASSIGNMENT[p.partition]
                and set(p.isr) == set(p.replicas)
                and p.leader in p.replicas
                and not p.adding_replicas
                and not p.removing_replicas
            ),
            REASSIGNMENT_TIMEOUT_S,
        )
        assert ongoing(c) == 0
        say(f"reassignment finished: {workload.describe_state(moved)}")
        since = time.monotonic()
        acks_resume(since, "acknowledged writes after the reassignment")
    final = workload.wait_healthy(c, TOPIC, PARTITIONS, "the writers stopped")
    logs = workload.read_logs(c, TOPIC, PARTITIONS)
    problems = check(history, logs)
    wait_for(
        lambda: not any((c.base_dir / "broker-1" / f"{TOPIC}-{p}").exists() for p in range(PARTITIONS)),
        timeout_s=REPLICA_DELETION_TIMEOUT_S,
        what="broker 1's removed replicas to be deleted",
    )
    c.stop()
    replicas = workload.read_replica_logs(c, TOPIC, PARTITIONS)
    replica_problems = check_replicas(logs, replicas, {(TOPIC, p): set(s.isr) for p, s in final.items()})
    print(
        f"\nreassignment chaos: injected {len(history.faults)} faults ({', '.join(history.faults)}); "
        f"{sum(bounces_during_reassignment)} of {len(bounces_during_reassignment)} bounces while the "
        f"reassignment ran; {history.acked_count} acknowledged acks=all writes checked, "
        f"{history.failed_writes} failed writes; reader saw "
        f"{sum(len(v) for v in history.consumed['reader'].values())} records; history checker found "
        f"{len(problems)} problems; replica checker compared "
        f"{sum(len(r) for by_tp in replicas.values() for r in by_tp.values())} records on "
        f"{sum(len(by_tp) for by_tp in replicas.values())} replicas and found {len(replica_problems)} "
        f"problems; took {time.monotonic() - started_s:.0f} s"
    )
    assert problems == [], problems
    assert replica_problems == [], replica_problems
    assert all(bounces_during_reassignment), "every bounce was meant to happen while the reassignment ran"
    assert history.acked_count > 0
