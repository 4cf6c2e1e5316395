"""Whole-request checks (services/common/request_checks.py) and consumer group ids."""

from __future__ import annotations

import pytest

from clients.common.topics import group_id_problem
from clients.config import check_group_id
from clients.errors import InvalidArgument
from protos.highwater.v1 import common_pb2
from services.common.request_checks import consumer_fetch_problem, produce_request_problem


def produce(
    acks: int = -1, timeout_ms: int = 0, partitions: tuple[int, ...] = (0,)
) -> common_pb2.ProduceRequest:
    return common_pb2.ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        topics=[
            common_pb2.ProduceTopicData(
                topic="t",
                partitions=[common_pb2.ProducePartitionData(partition=p, records=b"x") for p in partitions],
            )
        ],
    )


def test_a_well_formed_produce_passes() -> None:
    assert produce_request_problem(produce(partitions=(0, 1))) is None


@pytest.mark.parametrize(
    "request_,says",
    [
        (produce(acks=2), "acks must be 0, 1 or -1"),
        (produce(timeout_ms=-1), "timeout_ms must be >= 0"),
        (produce(partitions=(0, 0)), "partition t-0 appears more than once"),
    ],
)
def test_a_produce_that_cannot_be_answered_whole_is_named(
    request_: common_pb2.ProduceRequest, says: str
) -> None:
    problem = produce_request_problem(request_)
    assert problem is not None and says in problem


def test_a_consumer_fetch_must_say_replica_id_minus_one() -> None:
    assert consumer_fetch_problem(common_pb2.FetchRequest(replica_id=-1)) is None
    problem = consumer_fetch_problem(common_pb2.FetchRequest())  # proto3's default 0 is broker 0
    assert problem is not None and "replica_id must be -1 for a consumer, got 0" in problem
    assert consumer_fetch_problem(common_pb2.FetchRequest(replica_id=-1, max_wait_ms=-1)) is not None


@pytest.mark.parametrize("group_id", ["", "a/b", "g\x00", "line\n", "x" * 256])
def test_group_ids_that_cannot_name_an_etcd_key_segment_are_refused(group_id: str) -> None:
    assert group_id_problem(group_id) is not None
    with pytest.raises(InvalidArgument):
        check_group_id(group_id)


def test_ordinary_group_ids_pass() -> None:
    for group_id in ("billing", "team.a-b_c", "x" * 255, "caf\u00e9"):
        assert group_id_problem(group_id) is None
