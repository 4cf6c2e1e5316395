"""A deleted topic's labelled metric series go with it (issue 43: a broker under topic churn
kept one series per topic it ever had). Driven through the broker core's seams, no I/O."""

from __future__ import annotations

from clients.common.records import Record, encode_batch
from protos.highwater.v1 import broker_pb2
from services.broker import metrics
from tests.unit.broker_seams import lone_leader


def series(topic: str) -> set[str]:
    """Names of the broker metrics that have a series labelled with `topic`."""
    return {
        family.name
        for metric in (metrics.BYTES_IN, metrics.BYTES_OUT)
        for family in metric.collect()
        for sample in family.samples
        if sample.labels.get("topic") == topic
    }


def test_update_metadata_deleting_a_topic_drops_its_byte_counters() -> None:
    b = lone_leader()
    (answer,) = b.produce(encode_batch([Record(b"k", b"v", [], 1_000)]), acks=1)
    assert answer.topics[0].partitions[0].error_code == 0
    assert "highwater_bytes_in" in series("t")
    b.core.update_metadata(broker_pb2.UpdateMetadataRequest(header=b.header(), deleted_topics=["t"]))
    assert series("t") == set()
    # A topic that never passed through this broker is no error.
    b.core.update_metadata(broker_pb2.UpdateMetadataRequest(header=b.header(), deleted_topics=["never"]))
