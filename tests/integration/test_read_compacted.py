"""Every reader reads a cleaned compacted topic whole (issue 39).

A broker's log cleaner (services/broker/log_cleaner.py) compacts a topic written with many
updates per key and tombstones: the log keeps each key's latest record at its offset and
has holes where the rest were, among them, once a tombstone is gone after
delete.retention.ms, a hole just before the log's last record. (The log never ends in a hole:
the cleaner leaves the segment holding the log's last batch alone, cleaner.py's plan_cleaning;
tests/unit/test_read_holes.py covers readers at a hole at the end, which a truncation can leave.)
Then our Consumer, the gateway's ConsumeRecords (stop_at_end),
`highwater consume` and the Spark reader (startingOffsets / endingOffsets inside holes,
ranges split across tasks) each read exactly the records kept, once, in offset order, and
each knows the log's end: none waits for records that are not there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from clients import Admin, Consumer, Producer
from clients.tools.cli import cli
from clients.types import ConsumerRecord, TopicPartition
from protos.highwater.v1 import gateway_pb2
from tests.integration.conftest import TestCluster
from tests.integration.helpers import gateway_stub, wait_for
from tests.integration.test_kafka_protocol import FAST
from tests.spark.conftest import spark  # noqa: F401  # the local SparkSession fixture
from tests.spark.helpers import read_options

pytestmark = pytest.mark.integration

TOPIC = "compacted-read"
TP = TopicPartition(TOPIC, 0)
KEYS = 12
UPDATES = 360
# The last key updated is then deleted: a tombstone the cleaner removes once
# delete.retention.ms has passed, leaving a hole before the one record written after it.
DELETE_RETENTION_MS = 200
SEGMENT_MS = 1000
CLEANED_WITHIN_S = 90.0  # generous: the machine is shared; the cleaner backs off 100 ms
RPC_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 30.0


def produce_updates(cluster: TestCluster) -> dict[int, tuple[bytes, bytes | None]]:
    """UPDATES updates over KEYS keys in many small batches, then a tombstone for the last key;
    {offset: (key, value)} of everything written. Not idempotent: a batch the cleaner empties is
    dropped, not kept as a producer's last batch."""
    written: dict[int, tuple[bytes, bytes | None]] = {}
    with Producer(cluster.gateway_address, linger_ms=0, enable_idempotence=False, acks=1, **FAST) as producer:
        sends: list[tuple[bytes, bytes | None, Any]] = []
        for i in range(UPDATES):
            key, value = f"k{i % KEYS}".encode(), f"v{i}".encode()
            sends.append((key, value, producer.send(TOPIC, value, key=key, partition=0)))
            if i % 7 == 6:
                producer.flush(timeout_ms=int(RPC_TIMEOUT_S * 1000))
        # The tombstone in a batch of its own: once it is gone the batch is empty and dropped.
        producer.flush(timeout_ms=int(RPC_TIMEOUT_S * 1000))
        last_key = f"k{(UPDATES - 1) % KEYS}".encode()
        sends.append((last_key, None, producer.send(TOPIC, None, key=last_key, partition=0)))
        producer.flush(timeout_ms=int(RPC_TIMEOUT_S * 1000))
        # A record of a new key, once segment.ms has passed: it starts a new segment, so the
        # tombstone's segment no longer holds the log's last batch and may be cleaned.
        time.sleep(SEGMENT_MS / 1000 + 0.2)
        sends.append((b"sentinel", b"last", producer.send(TOPIC, b"last", key=b"sentinel", partition=0)))
        producer.flush(timeout_ms=int(RPC_TIMEOUT_S * 1000))
        for sent_key, sent_value, future in sends:
            written[future.result(timeout=RPC_TIMEOUT_S).offset] = (sent_key, sent_value)
    return written


def consumer_read(cluster: TestCluster) -> tuple[list[ConsumerRecord], int]:
    """Every record below the HW through our Consumer, read until its position reaches the HW;
    (records, HW)."""
    with Consumer(bootstrap=cluster.gateway_address, enable_auto_commit=False, **FAST) as consumer:
        consumer.assign([TP])
        consumer.seek(TP, 0)
        end = consumer.end_offsets([TP])[TP]
        out: list[ConsumerRecord] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while consumer.position(TP) < end:
            assert time.monotonic() < deadline, f"position {consumer.position(TP)} never reached the HW {end}"
            out.extend(consumer.poll(timeout_ms=200, max_records=10_000))
        assert consumer.lag(TP) == 0
        return out, end


def wait_cleaned(cluster: TestCluster, written: dict[int, tuple[bytes, bytes | None]]) -> None:
    """Until the cleaner removed the tombstone and left at most a few records per key."""
    tombstone = max(written) - 1
    left: list[int] = []

    def cleaned() -> bool:
        records, _ = consumer_read(cluster)
        offsets = {r.offset for r in records}
        left[:] = [len(records), tombstone in offsets]
        return tombstone not in offsets and len(records) <= 3 * KEYS + 1

    wait_for(
        cleaned,
        timeout_s=CLEANED_WITHIN_S,
        interval_s=0.5,
        what=f"the cleaner (records left, tombstone kept: {left} of {len(written)})",
    )


def check_kept(records: list[Any], written: dict[int, tuple[bytes, bytes | None]], what: str) -> None:
    """Offsets increase; each record is what was written at its offset; each key's latest
    record is there (a tombstone's key has none, once cleaned)."""
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets)), f"{what}: offsets not increasing once each"
    for r in records:
        key, value = written[r.offset]
        assert (bytes(r.key), None if r.value is None else bytes(r.value)) == (key, value), (what, r.offset)
    latest: dict[bytes, int] = {}
    for offset in sorted(written):
        latest[written[offset][0]] = offset
    expected = {o for o in latest.values() if written[o][1] is not None}
    assert expected <= set(offsets), f"{what}: latest records missing: {sorted(expected - set(offsets))}"


def test_every_reader_reads_a_cleaned_compacted_topic_across_its_holes(
    make_cluster: Callable[..., TestCluster],
    spark: Any,  # noqa: F811
) -> None:
    cluster = make_cluster(brokers=1, broker_args=["--log-cleaner-backoff-ms", "100"])
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics(
            TOPIC,
            1,
            1,
            {
                "cleanup.policy": "compact",
                "segment.bytes": "1024",
                "segment.ms": str(SEGMENT_MS),
                "min.cleanable.dirty.ratio": "0.01",
                "delete.retention.ms": str(DELETE_RETENTION_MS),
            },
        )
    written = produce_updates(cluster)
    wait_cleaned(cluster, written)

    # Our Consumer: the kept records, and a position that reaches the HW across the holes.
    records, hw = consumer_read(cluster)
    check_kept(records, written, "Consumer")
    kept = [(r.offset, r.key, r.value) for r in records]
    assert hw == max(written) + 1 and kept[-1][0] == max(written), "the last record is kept"
    assert kept[-2][0] < max(written) - 1, "a hole (the tombstone) just before the last record"
    holes = sorted(set(range(hw)) - {o for o, _, _ in kept})
    assert len(kept) < len(written) and holes

    # ConsumeRecords with stop_at_end: the same records, and the stream ends by itself.
    gw = gateway_stub(cluster.gateway_address)
    streamed = [
        r
        for message in gw.ConsumeRecords(
            gateway_pb2.ConsumeRecordsRequest(topic=TOPIC, default_start_offset=-2, stop_at_end=True),
            timeout=RPC_TIMEOUT_S,
        )
        for r in message.records
    ]
    assert [(r.offset, r.key, r.value if r.HasField("value") else None) for r in streamed] == kept

    # `highwater consume`: --max-records counts records, not offsets; --timeout-ms ends it.
    runner = CliRunner()
    base = ["--bootstrap", cluster.gateway_address, "-o", "json", "consume", TOPIC, "--partition", "0"]
    for extra in (
        ["--offset", "0", "--max-records", str(len(kept))],
        ["--offset", "0", "--timeout-ms", "1500"],
    ):
        result = runner.invoke(cli, [*base, *extra])
        assert result.exit_code == 0, result.output
        lines = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
        assert [line["offset"] for line in lines] == [o for o, _, _ in kept], extra

    # Spark: ranges that start and end inside holes, and the whole log split across tasks.
    inner_start = holes[0]
    inner_end = holes[len(holes) // 2]
    for start, end, min_partitions in ((0, hw, 5), (inner_start, inner_end, 3), (inner_start, hw, 1)):
        df = (
            spark.read.format("highwater")
            .options(
                **read_options(
                    cluster.gateway_address,
                    subscribe=TOPIC,
                    startingOffsets=json.dumps({TOPIC: {"0": start}}),
                    endingOffsets=json.dumps({TOPIC: {"0": end}}),
                    minPartitions=min_partitions,
                )
            )
            .load()
        )
        rows = sorted(
            (r.offset, bytes(r.key), None if r.value is None else bytes(r.value)) for r in df.collect()
        )
        assert rows == [k for k in kept if start <= k[0] < end], (start, end)
