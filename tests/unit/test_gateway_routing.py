"""Splitting produce/fetch per leader and merging the answers (services/gateway/routing.py)."""

from __future__ import annotations

from protos.highwater.v1 import broker_pb2, common_pb2
from services.common.metadata_cache import MetadataCache
from services.gateway import routing


def cache() -> MetadataCache:
    c = MetadataCache()
    c.apply(
        broker_pb2.UpdateMetadataRequest(
            header=common_pb2.ControllerHeader(controller_id=1, controller_epoch=3),
            live_brokers=[
                common_pb2.BrokerNode(broker_id=b, host="127.0.0.1", port=9000 + b) for b in (1, 2)
            ],
            partitions=[
                common_pb2.PartitionState(topic="t", partition=p, leader=leader, replicas=[1, 2, 3])
                for p, leader in ((0, 1), (1, 2), (2, 3), (3, -1))
            ],
            full=True,
        )
    )
    return c


def test_produce_is_split_per_leader_and_unroutable_partitions_say_why():
    topics = [
        common_pb2.ProduceTopicData(
            topic="t",
            partitions=[common_pb2.ProducePartitionData(partition=p, records=b"x") for p in range(5)],
        ),
        common_pb2.ProduceTopicData(topic="nope", partitions=[common_pb2.ProducePartitionData(partition=0)]),
    ]
    split = routing.split_produce(cache(), topics)
    assert {a: [pd.partition for _, pd in items] for a, items in split.by_leader.items()} == {
        "127.0.0.1:9001": [0],
        "127.0.0.1:9002": [1],
    }
    codes = {tp: code for tp, (code, _) in split.unroutable.items()}
    assert codes == {
        ("t", 2): common_pb2.LEADER_NOT_AVAILABLE,  # leader 3 is not live
        ("t", 3): common_pb2.LEADER_NOT_AVAILABLE,  # offline
        ("t", 4): common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert "no partition 4" in split.unroutable[("t", 4)][1]


def test_merged_answers_follow_the_order_the_client_asked():
    order = [
        common_pb2.ProduceTopicData(
            topic="t", partitions=[common_pb2.ProducePartitionData(partition=p) for p in (2, 0, 1)]
        )
    ]
    results = {
        ("t", p): common_pb2.ProducePartitionResponse(partition=p, base_offset=10 * p) for p in range(3)
    }
    merged = routing.merge_produce(results, order)
    assert [p.partition for p in merged.topics[0].partitions] == [2, 0, 1]


def test_a_fetch_split_keeps_only_the_partitions_of_one_leader():
    template = common_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=100,
        min_bytes=1,
        max_bytes=1000,
        topics=[
            common_pb2.FetchTopic(
                topic="t", partitions=[common_pb2.FetchPartition(partition=p) for p in range(3)]
            )
        ],
    )
    by_leader, unroutable = routing.split_by_leader(cache(), routing.collect_partitions(template.topics))
    sub = routing.fetch_request_for(template, set(by_leader["127.0.0.1:9002"]))
    assert [(t.topic, [p.partition for p in t.partitions]) for t in sub.topics] == [("t", [1])]
    assert sub.max_wait_ms == 100 and sub.replica_id == -1
    assert set(unroutable) == {("t", 2)}


def test_the_topic_index_follows_every_change_of_the_partitions():
    """topics() and partitions_of() come from an index kept between changes: each change
    (an incremental update, a deleted topic, a full update, DescribeCluster) renews it."""
    c = cache()
    assert set(c.topics()) == {"t"} and [s.partition for s in c.partitions_of("t")] == [0, 1, 2, 3]
    header = common_pb2.ControllerHeader(controller_id=1, controller_epoch=3)
    c.apply(
        broker_pb2.UpdateMetadataRequest(
            header=header,
            partitions=[
                common_pb2.PartitionState(topic="u", partition=p, leader=1, replicas=[1]) for p in (1, 0)
            ],
        )
    )
    assert set(c.topics()) == {"t", "u"}
    assert [s.partition for s in c.partitions_of("u")] == [0, 1], "in partition order"
    c.partitions_of("u").clear()  # a caller's copy: the index is not changed through it
    assert len(c.partitions_of("u")) == 2
    c.apply(broker_pb2.UpdateMetadataRequest(header=header, deleted_topics=["t"]))
    assert set(c.topics()) == {"u"} and c.partitions_of("t") == []
    assert routing.route_error(c, ("t", 0)) == (
        common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
        "topic 't' does not exist",
    )
    c.apply(
        broker_pb2.UpdateMetadataRequest(
            header=header,
            partitions=[common_pb2.PartitionState(topic="v", partition=0, leader=1, replicas=[1])],
            full=True,
        )
    )
    assert set(c.topics()) == {"v"}
    c.apply_describe(
        common_pb2.DescribeClusterResponse(
            partitions=[common_pb2.PartitionState(topic="w", partition=0, leader=1, replicas=[1])]
        )
    )
    assert set(c.topics()) == {"w"} and len(c.partitions_of("w")) == 1
