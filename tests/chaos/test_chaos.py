"""Chaos on real processes: Kafka's replication system-test scenarios plus process faults.

Three brokers, replication factor 3, min.insync.replicas 2, two controller
candidates, acks=all writers and a reader running the whole time. Faults come
from outside (SIGTERM, SIGKILL, SIGSTOP/SIGCONT of brokers, controllers, the
gateway and the etcd server); after each, the test waits (bounded) for every
partition to have a leader and a full ISR before the next. At the end the
history checker (history.py) reads every partition back and checks that no
acknowledged record was lost or moved, none stored twice, and the reader saw
offsets in order without skipping an acknowledged one. Each run prints what
it injected and what the checker found.

The rest of the chaos suite: network partitions between real brokers, in
network namespaces the tests make themselves (test_partition_chaos.py, with
netns.py and partition_scenarios.py), and a partition reassignment under load
with bounces in its old and new replica sets (test_reassignment_chaos.py).
The load, the read-back and the bounded waits all share workload.py; see
docs/ARCHITECTURE.md (Departures, chaos tests).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import pytest

from protos.highwater.v1 import common_pb2
from tests.chaos import workload
from tests.chaos.history import History, check
from tests.integration.conftest import TestCluster
from tests.integration.helpers import create_topic, gateway_stub

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "chaos"
PARTITIONS = 3
LEASE_TTL_S = 3
RECOVERY_TIMEOUT_S = workload.RECOVERY_TIMEOUT_S
BOUNCES = 5
# Fault durations (the faults themselves, not waits for a condition).
ETCD_PAUSE_S = 1.0
FOLLOWER_PAUSE_S = LEASE_TTL_S + 1  # longer than the lease, so the controller shrinks the ISR


@pytest.fixture
def chaos_cluster(tmp_path) -> Iterator[TestCluster]:
    c = TestCluster(tmp_path / "cluster", brokers=3, controllers=2, lease_ttl_s=LEASE_TTL_S)
    c.start()
    try:
        gw = gateway_stub(c.gateway_address)
        assert (
            create_topic(gw, TOPIC, partitions=PARTITIONS, configs={"min.insync.replicas": "2"}).error_code
            == 0
        )
        yield c
    finally:
        c.stop()


def cluster_state(c: TestCluster) -> dict[int, common_pb2.PartitionState] | None:
    return workload.cluster_state(c, TOPIC)


def wait_healthy(c: TestCluster, what: str) -> None:
    """Every partition led by a live broker with a full ISR (bounded)."""
    workload.wait_healthy(c, TOPIC, PARTITIONS, what, timeout_s=RECOVERY_TIMEOUT_S)


def leader_of(c: TestCluster, partition: int) -> int:
    state = cluster_state(c)
    assert state is not None
    return state[partition].leader


def active_controller(c: TestCluster) -> str:
    resp = gateway_stub(c.gateway_address).DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=5)
    return f"controller-{resp.controller_id}"


def run_scenario(c: TestCluster, faults: list[tuple[str, Callable[[], None]]]) -> History:
    history = History()
    wait_healthy(c, "start-up")
    with workload.Workload(c, history, TOPIC, PARTITIONS):
        deadline = time.monotonic() + 10
        while history.acked_count < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        for name, inject in faults:
            before = history.acked_count
            inject()
            history.fault(name)
            wait_healthy(c, name)
            deadline = time.monotonic() + 20
            while history.acked_count < before + 10 and time.monotonic() < deadline:
                time.sleep(0.05)
    logs = workload.read_logs(c, TOPIC, PARTITIONS)
    problems = check(history, logs)
    print(
        f"\nchaos: injected {len(history.faults)} faults ({', '.join(history.faults)}); "
        f"{history.acked_count} acknowledged acks=all writes checked, {history.failed_writes} failed writes; "
        f"reader saw {sum(len(v) for v in history.consumed['reader'].values())} records; "
        f"checker found {len(problems)} problems"
    )
    assert problems == [], problems
    assert history.acked_count > 0
    return history


def test_clean_and_hard_bounce_of_the_leader_five_times_each(chaos_cluster):
    c = chaos_cluster

    def bounce(hard: bool) -> Callable[[], None]:
        def inject() -> None:
            leader = leader_of(c, 0)
            if hard:
                c.kill_broker(leader)
            else:
                assert c.terminate(f"broker-{leader}") == 0
            c.start_broker(leader)

        return inject

    run_scenario(
        c,
        [("clean bounce of the leader", bounce(False))] * BOUNCES
        + [("hard bounce of the leader", bounce(True))] * BOUNCES,
    )


def test_clean_and_hard_bounce_of_the_controller_five_times(chaos_cluster):
    c = chaos_cluster

    def bounce(hard: bool) -> Callable[[], None]:
        def inject() -> None:
            name = active_controller(c)
            if hard:
                c.kill(name)
            else:
                c.terminate(name)
            c.start_process(name)

        return inject

    run_scenario(
        c,
        [
            (f"{'hard' if i % 2 else 'clean'} bounce of the controller", bounce(bool(i % 2)))
            for i in range(BOUNCES)
        ],
    )


def test_follower_pause_etcd_pause_and_gateway_kill(chaos_cluster):
    c = chaos_cluster
    rng = random.Random(7)

    def pause_follower() -> None:
        state = cluster_state(c)
        assert state is not None
        follower = next(r for r in state[0].replicas if r != state[0].leader)
        c.pause(f"broker-{follower}")
        time.sleep(FOLLOWER_PAUSE_S)
        c.resume(f"broker-{follower}")

    def pause_etcd() -> None:
        c.etcd.pause()
        time.sleep(ETCD_PAUSE_S)
        c.etcd.resume()

    def kill_gateway() -> None:
        c.kill_gateway()
        c.start_gateway()

    def hard_bounce_random_broker() -> None:
        victim = rng.choice(c.broker_ids)
        c.kill_broker(victim)
        c.start_broker(victim)

    run_scenario(
        c,
        [
            ("pause a follower past its lease", pause_follower),
            ("pause etcd", pause_etcd),
            ("kill the gateway", kill_gateway),
            ("hard bounce of a random broker", hard_bounce_random_broker),
            ("pause a follower past its lease", pause_follower),
        ],
    )
