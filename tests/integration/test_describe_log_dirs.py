"""`highwater topic describe` on a real cluster shows a compacted topic's cleaner state (issue 39).

A compacted topic with small segments takes a wave of updates; the cleaner (every 200 ms) cleans
it. With min.cleanable.dirty.ratio raised to 1.0 a second wave stays dirty: describe shows the
dirty ratio above 0 and a lag that grows while nobody cleans. Lowered again, the cleaner runs:
the dirty ratio falls, the cleaned point moves past the second wave. A delete-policy topic shows
its log but no cleaner fields. A Kafka admin client's DescribeLogDirs (API 35) sees each
broker's replicas and their sizes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient  # type: ignore[import-untyped]

from clients.common.records import Record, encode_batch
from clients.tools.cli import cli
from protos.highwater.v1 import common_pb2

from .conftest import TestCluster
from .helpers import gateway_stub, produce_batch, wait_for

pytestmark = [pytest.mark.integration]

KEYS = 20
SEGMENT_BYTES = 4_096


def run(cluster: TestCluster, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--bootstrap", cluster.gateway_address, *args])
    assert result.exit_code == 0, result.output
    return result.output


def describe(cluster: TestCluster, topic: str) -> dict[str, Any]:
    (described,) = json.loads(run(cluster, "-o", "json", "topic", "describe", topic))
    assert isinstance(described, dict)
    return described


def log_of(cluster: TestCluster, topic: str) -> dict[str, Any]:
    log: dict[str, Any] = describe(cluster, topic)["partitions"][0]["log"]
    return log


def wait_log(
    cluster: TestCluster, condition: Callable[[dict[str, Any]], bool], what: str, timeout_s: float = 30
) -> dict[str, Any]:
    """The compacted partition's log as describe shows it, once `condition` holds."""

    def check() -> dict[str, Any] | None:
        log = log_of(cluster, "state")
        return log if condition(log) else None

    found = wait_for(check, timeout_s=timeout_s, what=what)
    assert found is not None
    return found


def write_updates(cluster: TestCluster, topic: str, rounds: int, start: int = 0) -> None:
    """`rounds` updates of every key, one acknowledged batch a round (several segments in all)."""
    gw = gateway_stub(cluster.gateway_address)
    for r in range(start, start + rounds):
        now = int(time.time() * 1000)
        batch = encode_batch(
            [Record(b"k%02d" % k, b"v%04d-%s" % (r, b"x" * 60), [], now) for k in range(KEYS)]
        )
        result = produce_batch(gw, topic, 0, batch, timeout_ms=10_000, timeout=15)
        assert result.error_code == common_pb2.NONE, result.error_message


def test_describe_shows_a_compacted_partitions_dirty_ratio_and_lag_as_the_cleaner_works(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(brokers=2, broker_args=["--log-cleaner-backoff-ms", "200"])
    run(
        cluster,
        "topic",
        "create",
        "state",
        "-p",
        "1",
        "-r",
        "2",
        "--config",
        "cleanup.policy=compact",
        "--config",
        f"segment.bytes={SEGMENT_BYTES}",
        "--config",
        "min.cleanable.dirty.ratio=0.5",
    )
    run(
        cluster,
        "topic",
        "create",
        "events",
        "-p",
        "1",
        "-r",
        "2",
        "--config",
        f"segment.bytes={SEGMENT_BYTES}",
    )

    # Wave 1: everything dirty, so the cleaner takes it (again as it grows, at 0.5 dirty).
    write_updates(cluster, "state", rounds=30)
    cleaned = wait_log(
        cluster,
        lambda log: log["last_cleaned_ms"] is not None and log["dirty_ratio"] < 0.5,
        "the cleaner's passes over the compacted topic",
    )
    assert describe(cluster, "state")["cleanup_policy"] == "compact"
    assert 0 < cleaned["first_dirty_offset"] < cleaned["log_end_offset"] and not cleaned["uncleanable"]

    # Wave 2, with the threshold at 1.0: dirty, and left dirty (some clean bytes stay below the
    # cleaned point: each key's latest record there).
    run(cluster, "topic", "alter-config", "state", "--set", "min.cleanable.dirty.ratio=1.0")
    write_updates(cluster, "state", rounds=30, start=30)
    dirty = wait_log(cluster, lambda log: log["dirty_ratio"] > 0.5, "the second wave's dirty ratio")
    assert dirty["dirty_ratio"] < 1.0 and dirty["cleaner_lag_ms"] is not None
    assert dirty["first_dirty_offset"] < dirty["log_end_offset"] == cleaned["log_end_offset"] + 30 * KEYS
    waited = wait_log(
        cluster,
        lambda log: log["cleaner_lag_ms"] >= dirty["cleaner_lag_ms"] + 1_000,
        "the cleaner lag to grow while nothing cleans",
        timeout_s=10,
    )
    assert waited["first_dirty_offset"] == dirty["first_dirty_offset"]  # not cleaned meanwhile
    assert waited["dirty_ratio"] == dirty["dirty_ratio"]

    # The threshold lowered: the cleaner runs again, past the second wave.
    run(cluster, "topic", "alter-config", "state", "--set", "min.cleanable.dirty.ratio=0.01")
    after = wait_log(
        cluster,
        lambda log: log["first_dirty_offset"] > dirty["first_dirty_offset"],
        "the cleaner's pass over the second wave",
    )
    assert after["dirty_ratio"] < dirty["dirty_ratio"] and after["size_bytes"] < waited["size_bytes"]
    assert after["last_cleaned_ms"] > cleaned["last_cleaned_ms"]

    table = run(cluster, "topic", "describe", "state")
    assert "cleanup.policy compact" in table and "clean to" in table

    # A delete-policy topic: its log, no cleaner fields.
    write_updates(cluster, "events", rounds=5)
    events = describe(cluster, "events")
    assert events["cleanup_policy"] == "delete"
    log = events["partitions"][0]["log"]
    assert log["cleanup_policy"] == "delete" and log["log_end_offset"] == 5 * KEYS and log["size_bytes"] > 0
    assert "dirty_ratio" not in log and "cleaner_lag_ms" not in log
    table = run(cluster, "topic", "describe", "events")
    assert "cleanup.policy delete" in table and "clean to" not in table

    # Kafka's DescribeLogDirs (API 35) from a Kafka admin client: every broker holds a replica of
    # both topics (RF 2), each with its size on that broker.
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap(), request_timeout_ms=10_000)
    try:
        answers = admin.describe_log_dirs({"state": [0], "events": [0]})
    finally:
        admin.close()
    assert sorted(a["broker"] for a in answers) == [1, 2]
    for answer in answers:
        (log_dir,) = answer["log_dirs"]
        assert log_dir["error_code"] == 0 and log_dir["log_dir"].endswith(f"broker-{answer['broker']}")
        sizes = {
            (t["name"], p["partition_index"]): p["partition_size"]
            for t in log_dir["topics"]
            for p in t["partitions"]
        }
        assert set(sizes) == {("state", 0), ("events", 0)} and all(size > 0 for size in sizes.values())
