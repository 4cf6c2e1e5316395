"""The /metrics endpoints of a real cluster tell the truth about replication.

Each process's ready file names its metrics port (cluster.processes[name].info
['metrics_port']); the tests scrape it over HTTP the way Prometheus does and
parse the text format with prometheus_client's own parser.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from clients.tools.status import status_command
from coordinator.etcd_server import free_port
from protos.highwater.v1 import common_pb2
from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster
from tests.integration.helpers import create_topic, describe_partition, gateway_stub, produce, wait_for

pytestmark = pytest.mark.integration

SCRAPE_TIMEOUT_S = 5.0
# A replica lag limit short enough that a dead follower leaves the ISR quickly
# even if the controller's own reaction (lease expiry) were slow; the CLI's minimum is 1000 ms.
REPLICA_LAG_TIME_MAX_MS = 2_000
# The follower is dropped from the ISR after its lease expires (TEST_LEASE_TTL_S)
# or after REPLICA_LAG_TIME_MAX_MS, whichever comes first; then the leader's
# gauge is refreshed at its next ISR check. Generous slack for a loaded machine.
URP_RISE_TIMEOUT_S = TEST_LEASE_TTL_S + REPLICA_LAG_TIME_MAX_MS / 1000 + 20
# Restart, registration, LeaderAndIsr, catch-up fetches, AlterPartition (expand).
URP_FALL_TIMEOUT_S = 45.0
SETTLE_TIMEOUT_S = 20.0


def scrape(cluster: TestCluster, process: str) -> dict[str, float]:
    """Every sample of one process's /metrics as {'name{label="v",...}': value}; {} if unreachable."""
    port = cluster.processes[process].info["metrics_port"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def metric(cluster: TestCluster, process: str, name: str) -> float | None:
    return scrape(cluster, process).get(name)


def test_every_process_exports_its_metrics(cluster: TestCluster) -> None:
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "metrics-export", partitions=3).error_code == common_pb2.NONE
    assert produce(gw, "metrics-export", 0, [b"x" * 100]).error_code == common_pb2.NONE

    wait_for(
        lambda: metric(cluster, "controller-1", "highwater_active_controller_count") == 1,
        timeout_s=SETTLE_TIMEOUT_S,
        what="controller-1 reporting itself active",
    )
    controller = scrape(cluster, "controller-1")
    assert controller["highwater_offline_partitions_count"] == 0
    assert controller["highwater_global_partition_count"] >= 3

    leader = describe_partition(gw, "metrics-export", 0).leader
    wait_for(
        lambda: (
            (metric(cluster, f"broker-{leader}", 'highwater_bytes_in_total{topic="metrics-export"}') or 0) > 0
        ),
        timeout_s=SETTLE_TIMEOUT_S,
        what="bytes in counted on the leader",
    )
    wait_for(
        lambda: (
            sum(metric(cluster, f"broker-{b}", "highwater_leader_count") or 0 for b in cluster.broker_ids)
            >= 3
        ),
        timeout_s=SETTLE_TIMEOUT_S,
        what="leader counts covering the topic's 3 partitions",
    )
    replicas = sum(
        metric(cluster, f"broker-{b}", "highwater_partition_count") or 0 for b in cluster.broker_ids
    )
    assert replicas >= 9, replicas  # 3 partitions x 3 replicas, plus other tests' topics
    broker = scrape(cluster, f"broker-{leader}")
    assert broker['highwater_request_latency_seconds_count{rpc="Produce"}'] >= 1
    gateway = scrape(cluster, "gateway-1")
    assert gateway['highwater_gateway_request_latency_seconds_count{rpc="Produce"}'] >= 1


def test_under_replicated_partitions_rise_when_a_follower_dies_and_fall_when_it_returns(make_cluster) -> None:
    cluster: TestCluster = make_cluster(brokers=3, replica_lag_time_max_ms=REPLICA_LAG_TIME_MAX_MS)
    gw = gateway_stub(cluster.gateway_address)
    topic = "metrics-urp"
    assert create_topic(gw, topic, partitions=1, replication_factor=3).error_code == common_pb2.NONE
    state = wait_for(
        lambda: (s := describe_partition(gw, topic, 0)) and len(s.isr) == 3 and s,
        timeout_s=SETTLE_TIMEOUT_S,
        what="a full ISR",
    )
    leader = f"broker-{state.leader}"
    follower_id = next(b for b in state.replicas if b != state.leader)
    assert produce(gw, topic, 0, [b"before"] * 10).error_code == common_pb2.NONE
    wait_for(
        lambda: metric(cluster, leader, "highwater_leader_count") == 1,
        timeout_s=SETTLE_TIMEOUT_S,
        what=f"{leader} reporting the leadership",
    )
    assert metric(cluster, leader, "highwater_under_replicated_partitions") == 0

    cluster.kill_broker(follower_id)  # SIGKILL: no controlled shutdown, the lease runs out
    wait_for(
        lambda: metric(cluster, leader, "highwater_under_replicated_partitions") == 1,
        timeout_s=URP_RISE_TIMEOUT_S,
        interval_s=0.2,
        what=f"under_replicated_partitions = 1 on {leader} after broker {follower_id} died",
    )
    # The leader keeps accepting writes meanwhile (min.insync.replicas is 1 by default).
    assert produce(gw, topic, 0, [b"during"] * 10).error_code == common_pb2.NONE
    status = cluster_status(cluster)
    assert status["partitions"]["under_replicated"] == 1
    assert [p["partition"] for p in status["under_replicated_partitions"]] == [0]
    assert {b["id"]: b["alive"] for b in status["brokers"]}[follower_id] is False

    cluster.start_broker(follower_id)
    wait_for(
        lambda: metric(cluster, leader, "highwater_under_replicated_partitions") == 0,
        timeout_s=URP_FALL_TIMEOUT_S,
        interval_s=0.2,
        what=f"under_replicated_partitions back to 0 on {leader} after broker {follower_id} returned",
    )
    state = describe_partition(gw, topic, 0)
    assert sorted(state.isr) == sorted(state.replicas)
    # Taking the follower back is the leader's own AlterPartition (the shrink may
    # have been the controller's, on the lease expiry, so it is not checked).
    assert (metric(cluster, leader, "highwater_isr_expands_total") or 0) >= 1


def cluster_status(cluster: TestCluster) -> dict:
    """`highwater cluster status --output json` against the cluster's gateway."""
    result = CliRunner().invoke(status_command, ["--bootstrap", cluster.gateway_address, "--output", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_cluster_status_shows_brokers_racks_and_lag(make_cluster) -> None:
    cluster: TestCluster = make_cluster(brokers=3, racks=["rack-a", "rack-b", "rack-c"])
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "status-topic", partitions=2).error_code == common_pb2.NONE
    status = wait_for(
        lambda: (s := cluster_status(cluster)) and s["partitions"]["total"] == 2 and s,
        timeout_s=SETTLE_TIMEOUT_S,
        what="status listing the new topic's partitions",
    )
    assert status["controller"]["id"] == 1
    assert status["partitions"] == {"total": 2, "under_replicated": 0, "offline": 0}
    brokers = {b["id"]: b for b in status["brokers"]}
    assert {i: (b["rack"], b["alive"]) for i, b in brokers.items()} == {
        1: ("rack-a", True),
        2: ("rack-b", True),
        3: ("rack-c", True),
    }
    assert sum(b["partitions"] for b in brokers.values()) == 6
    assert sum(b["leaders"] for b in brokers.values()) == 2
    assert all(b["metrics_error"] is None and b["max_lag"] is not None for b in brokers.values()), brokers

    table = CliRunner().invoke(status_command, ["--bootstrap", cluster.gateway_address])
    assert table.exit_code == 0, table.output
    assert "rack-b" in table.output and "under-replicated: 0" in table.output


def test_cluster_status_says_in_one_line_when_no_gateway_answers() -> None:
    port = free_port()  # nothing listens there
    result = CliRunner().invoke(status_command, ["--bootstrap", f"127.0.0.1:{port}"])
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0, result.output
    assert f"cannot reach a gateway (127.0.0.1:{port}: UNAVAILABLE)" in result.output
