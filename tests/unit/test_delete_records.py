"""DeleteRecords (Kafka's API 21) on the broker core: the leader's log start offset moves, whole
segments below it go, the answer waits for the ISR, and the new start survives a restart and a
leader change. Driven through the core's seams (tests/unit/broker_seams.py), no I/O."""

from __future__ import annotations

from types import SimpleNamespace

from clients.common.records import Record, encode_batch
from protos.highwater.v1 import common_pb2
from services.broker.fetcher_core import FetcherCore
from services.broker.log.config import LogConfig
from services.common import limits
from services.gateway import routing
from services.kafka import acl_rules, protocol
from services.security import rules
from services.security.authz import Authorizer, Operation, Resource
from services.security.identity import Caller
from tests.unit.broker_seams import Broker, lone_leader
from tests.unit.test_authz import acl
from tests.unit.test_broker_core import consumer_fetch
from tests.unit.test_fetcher_core import T0, one_round, pair, values_in


def batch(*values: str) -> bytes:
    return encode_batch([Record(None, v.encode(), [], 1_000) for v in values])


def delete_records(
    b: Broker, offset: int, *, topic: str = "t", partition: int = 0, timeout_ms: int = 30_000
) -> list[common_pb2.DeleteRecordsResponse]:
    """Ask b to delete below `offset`; the list receives the answer when the core gives it."""
    answers: list[common_pb2.DeleteRecordsResponse] = []
    b.core.delete_records(
        common_pb2.DeleteRecordsRequest(
            timeout_ms=timeout_ms,
            topics=[
                common_pb2.DeleteRecordsTopic(
                    topic=topic,
                    partitions=[common_pb2.DeleteRecordsPartition(partition=partition, offset=offset)],
                )
            ],
        ),
        answers.append,
    )
    return answers


def only(answers: list[common_pb2.DeleteRecordsResponse]) -> common_pb2.DeleteRecordsPartitionResponse:
    (answer,) = answers
    (topic,) = answer.topics
    (part,) = topic.partitions
    return part


def earliest_and_latest(b: Broker) -> tuple[int, int]:
    resp = b.core.list_offsets(
        common_pb2.ListOffsetsRequest(
            replica_id=-1,
            topics=[
                common_pb2.ListOffsetsTopic(
                    topic="t",
                    partitions=[
                        common_pb2.ListOffsetsPartition(partition=0, timestamp=ts, current_leader_epoch=-1)
                        for ts in (-2, -1)
                    ],
                )
            ],
        )
    )
    earliest, latest = resp.topics[0].partitions
    assert earliest.error_code == latest.error_code == common_pb2.NONE
    return earliest.offset, latest.offset


def three_segments(b: Broker) -> None:
    """Offsets [0, 2), [2, 4) and [4, 5) in three segments of t-0, all committed."""
    log = b.core.partitions[T0].log
    for values in (("a", "b"), ("c", "d"), ("e",)):
        assert only_produce_ok(b.produce(batch(*values), acks=1))
        log.roll(b.clock.wall_ms())
    assert log.segment_base_offsets == [0, 2, 4, 5]


def only_produce_ok(answers: list[common_pb2.ProduceResponse]) -> bool:
    (answer,) = answers
    return answer.topics[0].partitions[0].error_code == common_pb2.NONE


# ---- on a leader alone -----------------------------------------------------------------------------


def test_the_leaders_log_start_moves_to_the_offset_and_whole_segments_below_it_are_deleted() -> None:
    b = lone_leader()
    three_segments(b)
    log = b.core.partitions[T0].log
    part = only(delete_records(b, 3))
    assert part.error_code == common_pb2.NONE and part.low_watermark == 3
    assert log.log_start_offset == 3
    assert log.segment_base_offsets[0] == 2, "the segment [0, 2) is gone, [2, 4) holds offset 3"
    assert not any(name.startswith("00000000000000000000.") for name in b.storage.list_dir(log.directory))
    assert earliest_and_latest(b) == (3, 5)
    # A consumer below the new start is told so, as after retention, and resets.
    fetched = b.fetch_now(consumer_fetch(0)).topics[0].partitions[0]
    assert fetched.error_code == common_pb2.OFFSET_OUT_OF_RANGE


def test_minus_one_deletes_everything_below_the_high_watermark() -> None:
    b = lone_leader()
    three_segments(b)
    part = only(delete_records(b, -1))
    assert part.error_code == common_pb2.NONE and part.low_watermark == 5
    assert earliest_and_latest(b) == (5, 5)


def test_an_offset_above_the_high_watermark_or_below_minus_one_is_out_of_range_and_changes_nothing() -> None:
    b = lone_leader()
    three_segments(b)
    for offset in (6, -2):
        part = only(delete_records(b, offset))
        assert part.error_code == common_pb2.OFFSET_OUT_OF_RANGE and part.low_watermark == -1
        assert str(offset) in part.error_message
    assert b.core.partitions[T0].log.log_start_offset == 0


def test_an_offset_below_the_current_log_start_is_a_no_op_answering_the_current_low_watermark() -> None:
    b = lone_leader()
    three_segments(b)
    assert only(delete_records(b, 4)).low_watermark == 4
    part = only(delete_records(b, 1))
    assert part.error_code == common_pb2.NONE and part.low_watermark == 4
    assert b.core.partitions[T0].log.log_start_offset == 4


def test_a_compacted_only_topic_refuses_with_policy_violation_and_compact_delete_allows_it() -> None:
    b = lone_leader()
    three_segments(b)
    log = b.core.partitions[T0].log
    log.set_config(LogConfig(cleanup_policy="compact"))
    part = only(delete_records(b, 3))
    assert part.error_code == common_pb2.POLICY_VIOLATION and part.low_watermark == -1
    assert "cleanup.policy" in part.error_message and "compact,delete" in part.error_message
    assert log.log_start_offset == 0, "nothing deleted"
    assert protocol.kafka_error(common_pb2.POLICY_VIOLATION).value == 44, "Kafka's POLICY_VIOLATION"
    log.set_config(LogConfig(cleanup_policy="compact,delete"))
    part = only(delete_records(b, 3))
    assert part.error_code == common_pb2.NONE and log.log_start_offset == 3


def test_a_broker_that_does_not_lead_the_partition_refuses_as_kafka_does() -> None:
    leader, follower, _ = pair()
    assert only(delete_records(follower, 0)).error_code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert only(delete_records(leader, 0, topic="nope")).error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION


def test_the_new_log_start_survives_a_crash() -> None:
    b = lone_leader()
    three_segments(b)
    assert only(delete_records(b, 3)).low_watermark == 3
    b.core.crash()  # no clean close
    again = lone_leader(b.storage, broker_epoch=11, leader_epoch=1, partition_epoch=2)
    assert again.core.partitions[T0].log.log_start_offset == 3
    assert earliest_and_latest(again) == (3, 5)


# ---- with a follower ---------------------------------------------------------------------------------


def replicated_pair() -> tuple[Broker, Broker, FetcherCore]:
    """Leader 1 and follower 2 of t-0, both holding [0, 5) in three segments, HW 5 on both."""
    leader, follower, fetcher = pair()
    three_segments(leader)
    for _ in range(6):  # a fetch reads one segment; the last rounds carry the HW
        one_round(fetcher, leader)
        follower.core.partitions[T0].log.roll(follower.clock.wall_ms())  # segments as the leader's
    assert leader.core.partitions[T0].high_watermark == 5
    assert follower.core.partitions[T0].high_watermark == 5
    return leader, follower, fetcher


def test_the_answer_waits_until_the_follower_in_the_isr_took_the_new_log_start_and_deleted_its_segments() -> (
    None
):
    leader, follower, fetcher = replicated_pair()
    answers = delete_records(leader, 3)
    assert not answers, "answered before the ISR member had the new log start"
    one_round(fetcher, leader)  # the follower takes the leader's log start from the answer
    follower_log = follower.core.partitions[T0].log
    assert follower_log.log_start_offset == 3
    assert follower_log.segment_base_offsets[0] == 2, "the follower deletes whole segments below it too"
    assert not answers
    one_round(fetcher, leader)  # ... and reports it in its next Fetch
    part = only(answers)
    assert part.error_code == common_pb2.NONE and part.low_watermark == 3
    assert values_in(follower) == [b"c", b"d", b"e"], "read from 3: the batch holding it, whole"


def test_an_isr_member_that_does_not_fetch_times_the_partition_out_the_leaders_start_has_moved() -> None:
    leader, _, _ = replicated_pair()
    answers = delete_records(leader, 3, timeout_ms=1_000)
    leader.clock.now_ms += 1_000
    leader.io.fire_due()
    part = only(answers)
    assert part.error_code == common_pb2.REQUEST_TIMED_OUT and part.low_watermark == -1
    assert "1000 ms" in part.error_message
    assert leader.core.partitions[T0].log.log_start_offset == 3


def test_a_timeout_of_zero_means_the_default_and_a_huge_one_is_capped() -> None:
    leader, _, _ = replicated_pair()
    delete_records(leader, 1, timeout_ms=0)
    delete_records(leader, 2, timeout_ms=2**31 - 1)
    delays = sorted(at for at, _ in leader.io.timers)
    assert delays == [limits.DELETE_RECORDS_TIMEOUT_MS_DEFAULT, limits.DELETE_RECORDS_TIMEOUT_MS_MAX]


def test_leadership_moving_while_waiting_answers_not_leader() -> None:
    leader, follower, _ = replicated_pair()
    answers = delete_records(leader, 3)
    leader.leader_and_isr(
        leader=2,
        leader_epoch=1,
        isr=(1, 2),
        replicas=(1, 2),
        live=[leader.node, follower.node],
        partition_epoch=2,
    )
    part = only(answers)
    assert part.error_code == common_pb2.NOT_LEADER_OR_FOLLOWER and part.low_watermark == -1


def test_the_new_leader_after_a_failover_starts_at_the_advanced_log_start() -> None:
    leader, follower, fetcher = replicated_pair()
    answers = delete_records(leader, 3)
    one_round(fetcher, leader)
    one_round(fetcher, leader)
    assert only(answers).low_watermark == 3
    follower.leader_and_isr(
        leader=2, leader_epoch=1, isr=(2,), replicas=(1, 2), live=[follower.node], partition_epoch=2
    )
    assert earliest_and_latest(follower) == (3, 5)


def test_a_restarted_leader_whose_hw_checkpoint_lags_never_answers_latest_below_earliest() -> None:
    leader, _, fetcher = replicated_pair()
    answers = delete_records(leader, 5)
    one_round(fetcher, leader)
    one_round(fetcher, leader)
    assert only(answers).low_watermark == 5
    leader.core.crash()  # the HW checkpoint (periodic) was never written: it says 0
    again = Broker(1, storage=leader.storage)
    again.register(12)
    again.leader_and_isr(
        leader=1, leader_epoch=1, isr=(1, 2), replicas=(1, 2), live=[again.node], partition_epoch=2
    )
    # The follower has not fetched from the new leader yet, so the HW cannot move on its own.
    assert earliest_and_latest(again) == (5, 5)


# ---- Kafka's ACL rule --------------------------------------------------------------------------------


def test_kafka_delete_records_needs_delete_on_each_topic() -> None:
    body = SimpleNamespace(topics=[SimpleNamespace(name="a"), SimpleNamespace(name="b")])

    def allowed(operation: Operation, resource: Resource) -> bool:
        return operation is Operation.DELETE and resource.name == "a"

    decision = acl_rules.decide(protocol.DELETE_RECORDS, body, allowed, lambda operation, kind: False)
    assert decision.topics_refused == frozenset({"b"})


# ---- the gRPC rule and the gateway's split --------------------------------------------------------


def two_topic_request() -> common_pb2.DeleteRecordsRequest:
    return common_pb2.DeleteRecordsRequest(
        timeout_ms=1_234,
        topics=[
            common_pb2.DeleteRecordsTopic(
                topic=name,
                partitions=[common_pb2.DeleteRecordsPartition(partition=p, offset=7) for p in (0, 1)],
            )
            for name in ("mine", "theirs")
        ],
    )


def test_grpc_delete_records_needs_delete_on_the_topic_and_answers_the_refused_ones_per_partition() -> None:
    alice = Caller("User:alice", authenticated_by="certificate")
    authorizer = Authorizer(
        [acl("User:alice", "Delete", "Topic", "mine"), acl("User:alice", "Read", "Topic", "theirs")]
    )
    admission = rules.delete_records(
        two_topic_request(), rules.Access(alice, authorizer, identities_checked=True), rules.Limits()
    )
    assert [t.topic for t in admission.request.topics] == ["mine"] and admission.request.timeout_ms == 1_234
    assert admission.respond is not None
    answer = admission.respond(common_pb2.DeleteRecordsResponse())
    (refused,) = answer.topics
    assert refused.topic == "theirs"
    assert [(p.partition, p.error_code, p.low_watermark) for p in refused.partitions] == [
        (0, common_pb2.TOPIC_AUTHORIZATION_FAILED, -1),
        (1, common_pb2.TOPIC_AUTHORIZATION_FAILED, -1),
    ]
    for service in ("/highwater.v1.GatewayService/", "/highwater.v1.BrokerService/"):
        assert rules.rule_for(service + "DeleteRecords") is rules.delete_records
    assert "/highwater.v1.BrokerService/DeleteRecords" in rules.FORWARDED_METHODS, "the client's principal"


def test_the_gateway_sends_each_leader_only_its_partitions_with_the_timeout() -> None:
    req = routing.delete_records_request_for(two_topic_request(), {("mine", 1), ("theirs", 0)})
    assert req.timeout_ms == 1_234
    assert [(t.topic, [p.partition for p in t.partitions]) for t in req.topics] == [
        ("mine", [1]),
        ("theirs", [0]),
    ]
