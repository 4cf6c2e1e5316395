"""The failover and leader-map rules both transports follow (clients/common/failover.py,
clients/common/leader_map.py): the asyncio client library and the Spark connector walk the
same gateways in the same order, give up at the same deadline and read the same leaders."""

from __future__ import annotations

import pytest

from clients.common.failover import BootstrapError, GatewayRotation, bootstrap_addresses
from clients.common.leader_map import LeaderMap, broker_addresses, partition_leaders
from protos.highwater.v1 import common_pb2


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("a:1,b:2", ["a:1", "b:2"]),
        (" a:1 , a:1 ,, b:2 ", ["a:1", "b:2"]),
        (["a:1", "b:65535"], ["a:1", "b:65535"]),
        ("[::1]:9092", ["[::1]:9092"]),
    ],
)
def test_bootstrap_addresses_keep_order_and_drop_repeats(given: str | list[str], expected: list[str]) -> None:
    assert bootstrap_addresses(given) == expected


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ("a", "'a'"),
        ("a:0", "'a:0'"),
        ("a:65536", "'a:65536'"),
        (":9", "':9'"),
        ("a:x", "'a:x'"),
        (" , ", "no "),
    ],
)
def test_a_bad_bootstrap_names_the_part_that_is_wrong(given: str, named: str) -> None:
    with pytest.raises(BootstrapError, match=named):
        bootstrap_addresses(given)


def test_a_walk_tries_every_address_then_pauses_then_gives_up_at_the_deadline() -> None:
    rotation = GatewayRotation(["a:1", "b:2", "c:3"])
    walk = rotation.walk(10.0, pause_s=0.5)
    assert rotation.current == "a:1"
    assert walk.failed("a:1", "connection failed", now=1.0) == 0.0
    assert rotation.current == "b:2"
    assert walk.failed("b:2", "UNAVAILABLE", now=2.0) == 0.0
    # The round is over: every address failed once, so the walk pauses before the next round.
    assert walk.failed("c:3", "connection failed", now=3.0) == 0.5
    assert rotation.current == "a:1"
    assert walk.failed("a:1", "connection failed", now=9.8) == 0.0
    assert walk.failed("b:2", "connection failed", now=9.9) == 0.0
    # A pause never passes the deadline; at the deadline the walk gives up.
    assert walk.failed("c:3", "connection failed", now=9.9) == pytest.approx(0.1)
    assert walk.failed("a:1", "connection failed", now=10.0) is None
    assert walk.tried() == "a:1 (connection failed), b:2 (connection failed), c:3 (connection failed)"


def test_the_rotation_keeps_a_working_gateway_and_learns_new_ones_after_the_known() -> None:
    rotation = GatewayRotation(["a:1"])
    rotation.learn(["b:2", "a:1", "c:3"])
    assert rotation.addresses == ["a:1", "b:2", "c:3"]
    walk = rotation.walk(5.0, pause_s=0.1)
    walk.failed("a:1", "UNAVAILABLE", now=0.0)
    # The next call, a new walk, starts where the last one moved to: the gateway that answered.
    assert rotation.current == "b:2"
    assert rotation.walk(5.0, pause_s=0.1).tried() == "a:1 (not tried), b:2 (not tried), c:3 (not tried)"


def _metadata() -> common_pb2.MetadataResponse:
    return common_pb2.MetadataResponse(
        brokers=[
            common_pb2.BrokerNode(broker_id=1, host="h1", port=10),
            common_pb2.BrokerNode(broker_id=2, host="h2", port=20),
            common_pb2.BrokerNode(broker_id=3, host="", port=0),  # registered, nowhere to reach it
        ],
        topics=[
            common_pb2.TopicMetadata(
                name="t",
                partitions=[
                    common_pb2.PartitionMetadata(partition=0, leader=1),
                    common_pb2.PartitionMetadata(partition=1, leader=2),
                    common_pb2.PartitionMetadata(partition=2, leader=3),
                    common_pb2.PartitionMetadata(partition=3, leader=-1),
                    common_pb2.PartitionMetadata(
                        partition=4, leader=1, error_code=common_pb2.LEADER_NOT_AVAILABLE
                    ),
                ],
            )
        ],
    )


def test_only_reachable_leaders_without_errors_are_addresses() -> None:
    assert broker_addresses(_metadata()) == {1: "h1:10", 2: "h2:20"}
    assert partition_leaders(_metadata()) == {("t", 0): "h1:10", ("t", 1): "h2:20"}


def test_a_leader_map_is_told_otherwise_by_hints_and_forgets_a_partition_that_moved() -> None:
    leaders = LeaderMap()
    leaders.remember(_metadata())
    leaders.hint(("t", 1), "h9:90")
    assert leaders.get(("t", 1)) == "h9:90"
    leaders.forget(("t", 1))
    assert leaders.get(("t", 1)) is None
    assert leaders.known() == {("t", 0): "h1:10"}
