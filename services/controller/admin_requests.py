"""Requests written by hand under /admin (Kafka's reassign_partitions, preferred_replica_election,
delete_topics znodes): parse, run as the matching admin call, log errors, remove the key.

Split from handlers.py because this is a translation layer, not a decision: the JSON an
operator writes is parsed into the same protobuf request the gRPC admin call takes, and
the handler that call uses decides (the JSON formats are in coordinator/values.py). A
malformed or refused request is logged and its key removed (`AdminKeyDelete`), so a bad
file never blocks the next one.
"""

from __future__ import annotations

import logging

from clients.common.errors import HighwaterError, InvalidRequest
from coordinator import values
from protos.highwater.v1 import common_pb2
from services.controller.context import ControllerContext
from services.controller.deletion import on_delete_topics
from services.controller.handlers import on_elect_leaders
from services.controller.reassignment import on_alter_reassignments
from services.controller.results import AdminKeyDelete, ControllerResult

log = logging.getLogger("highwater.controller")


def parse_admin_reassignment(raw: bytes) -> common_pb2.AlterPartitionReassignmentsRequest:
    """Kafka's reassignment JSON: {"version": 1, "partitions": [{"topic", "partition", "replicas"}]}."""
    try:
        by_topic: dict[str, list[common_pb2.ReassignablePartition]] = {}
        for topic, partition, replicas in values.decode_reassignment_request(raw):
            by_topic.setdefault(topic, []).append(
                common_pb2.ReassignablePartition(partition=partition, replicas=replicas)
            )
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest(
            f"malformed reassignment JSON ({exc}); expected "
            '{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2]}]}'
        ) from exc
    return common_pb2.AlterPartitionReassignmentsRequest(
        topics=[common_pb2.ReassignableTopic(name=t, partitions=ps) for t, ps in by_topic.items()]
    )


def parse_admin_preferred_election(raw: bytes) -> common_pb2.ElectLeadersRequest:
    """{"partitions": [{"topic": "t", "partition": 0}]} (an empty list: every partition)."""
    try:
        parts = [
            common_pb2.TopicPartition(topic=topic, partition=partition)
            for topic, partition in values.decode_preferred_election_request(raw)
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidRequest(
            f"malformed preferred election JSON ({exc}); expected "
            '{"partitions": [{"topic": "t", "partition": 0}]}'
        ) from exc
    return common_pb2.ElectLeadersRequest(election_type=common_pb2.PREFERRED, partitions=parts)


def on_admin_request(ctx: ControllerContext, kind: str, key: str, raw: bytes) -> ControllerResult:
    """A request written by hand under /admin: run it, log its errors, remove the key."""
    try:
        if kind == "reassign":
            result = on_alter_reassignments(ctx, parse_admin_reassignment(raw))
        elif kind == "preferred":
            result = on_elect_leaders(ctx, parse_admin_preferred_election(raw))
        else:
            raise InvalidRequest(f"unknown admin request {key}")
        for p in getattr(result.response, "partitions", []):
            if p.error_code:
                log.error(
                    "admin request %s: %s-%d: %s %s",
                    key,
                    p.topic,
                    p.partition,
                    common_pb2.ErrorCode.Name(p.error_code),
                    p.error_message,
                )
    except HighwaterError as exc:
        log.error("admin request %s refused: %s", key, exc)
        result = ControllerResult()
    result.writes.append(AdminKeyDelete(key))
    return result


def on_admin_delete_marker(
    ctx: ControllerContext, topic: str, key: str, *, deletion_enabled: bool
) -> ControllerResult:
    """A /admin/delete_topics/{topic} key: delete the topic, or log why not and remove the key."""
    if topic in ctx.topics_to_delete:
        return ControllerResult()  # our own mark, already being handled
    result = on_delete_topics(ctx, [topic], deletion_enabled=deletion_enabled)
    answer = result.response.topics[0]
    if answer.error_code:
        log.error(
            "deletion of %r requested under /admin refused: %s %s",
            topic,
            common_pb2.ErrorCode.Name(answer.error_code),
            answer.error_message,
        )
        result.writes.append(AdminKeyDelete(key))
    return result
