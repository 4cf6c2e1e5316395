"""Requests assembled from encodings (services/controller/wire.py) parse to the composed messages."""

from __future__ import annotations

import pytest

from protos.highwater.v1 import broker_pb2, common_pb2
from services.controller import wire


def states(n: int) -> list[common_pb2.PartitionState]:
    return [
        common_pb2.PartitionState(
            topic=f"t{i % 3}",
            partition=i,
            leader=i % 5,
            leader_epoch=i,
            isr=[i % 5, (i + 1) % 5],
            replicas=[i % 5, (i + 1) % 5],
            partition_epoch=2,
            topic_id="abc",
        )
        for i in range(n)
    ]


def encoded(messages: list[common_pb2.PartitionState]) -> list[bytes]:
    return [wire.length_prefixed(m.SerializeToString()) for m in messages]


@pytest.mark.parametrize("n", [0, 1, 300])
def test_update_metadata_with_each_targets_header(n: int) -> None:
    rest = broker_pb2.UpdateMetadataRequest(
        live_brokers=[common_pb2.BrokerNode(broker_id=1, host="h", port=1)],
        full=True,
        deleted_topics=["gone"],
        topic_configs={"t0": common_pb2.TopicConfig(retention_ms=5)},
        topic_ids={"t0": "abc"},
    )
    body = wire.update_metadata_body(rest, encoded(states(n)))
    for broker_epoch in (-1, 0, 7, 2**40):
        header = common_pb2.ControllerHeader(controller_id=2, controller_epoch=9, broker_epoch=broker_epoch)
        composed = broker_pb2.UpdateMetadataRequest()
        composed.CopyFrom(rest)
        composed.header.CopyFrom(header)
        composed.partitions.extend(states(n))
        sent = wire.with_header(body, header)
        assert sent.parse() == composed
        assert broker_pb2.UpdateMetadataRequest.FromString(sent.data) == composed


def test_leader_and_isr_partitions_with_and_without_is_new() -> None:
    config = common_pb2.TopicConfig(min_insync_replicas=2)
    config_wire = wire.length_prefixed(config.SerializeToString())
    all_states = states(40)
    parts = [
        wire.leader_and_isr_partition(e, config_wire, is_new=i % 2 == 0)
        for i, e in enumerate(encoded(all_states))
    ]
    leaders = [common_pb2.BrokerNode(broker_id=3, host="h", port=3)]
    header = common_pb2.ControllerHeader(controller_id=1, controller_epoch=4, broker_epoch=11)
    sent = wire.with_header(wire.leader_and_isr_body(parts, leaders), header)
    composed = broker_pb2.LeaderAndIsrRequest(
        header=header,
        partitions=[
            broker_pb2.LeaderAndIsrPartition(state=s, is_new=i % 2 == 0, config=config)
            for i, s in enumerate(all_states)
        ],
        live_leaders=leaders,
    )
    assert sent.parse() == composed


def test_describe_cluster() -> None:
    rest = common_pb2.DescribeClusterResponse(cluster_id="c", controller_id=2, controller_epoch=3)
    composed = common_pb2.DescribeClusterResponse()
    composed.CopyFrom(rest)
    composed.partitions.extend(states(50))
    assert wire.describe_cluster(rest, encoded(states(50))) == composed


def test_varint_matches_protobuf() -> None:
    assert wire.varint(0) == b"\x00"
    for n in (1, 127, 128, 300, 2**21, 2**35):
        as_proto = common_pb2.ControllerHeader(broker_epoch=n).SerializeToString()
        assert as_proto[1:] == wire.varint(n)  # field 3's key is one byte
    with pytest.raises(ValueError):
        wire.varint(-1)
