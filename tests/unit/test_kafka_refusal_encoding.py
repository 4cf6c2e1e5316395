"""Every refusal the Kafka handler answers must encode, at every version it serves.

A refusal is built by hand in each API's method (fields left at "no value"), and a field that is
nullable in one version may not be in another: JoinGroup's protocol_name was None in every
refusal, which v2-v6 cannot carry, so the answer never left the broker and the client hung.
This walks every API key at every version in protocol.SUPPORTED_VERSIONS through the refusal
paths (a group this broker does not coordinate, ids that cannot name a group or a topic, topics
that do not exist, a principal the ACLs refuse everything) with the real KafkaHandler and a fake
backend, and checks each answer encodes and reads back with kio's schema.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import types
import typing
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from kio.serial import entity_reader

from protos.highwater.v1 import broker_pb2, common_pb2
from services.kafka import protocol
from services.kafka.classic_groups import coordinator_of
from services.kafka.handler import BackendUnavailable, KafkaHandler
from services.security import authz
from tests.unit.test_kafka_protocol import FakeBackend, request_frame

BROKER_IDS = (1, 2)  # FakeBackend's brokers; the handler is broker 1


def _group_on(broker_id: int) -> str:
    """A valid group id that `broker_id` coordinates."""
    return next(g for i in range(100) if coordinator_of(g := f"group-{i}", BROKER_IDS) == broker_id)


@dataclass(frozen=True)
class Refusal:
    """One way to be refused: the names the request carries and whether ACLs refuse everything."""

    name: str
    group_id: str
    topic: str
    acls_refuse_all: bool = False


REFUSALS = (
    Refusal("not coordinator, unknown topic", _group_on(2), "missing"),
    Refusal("invalid group id and topic name", "", "bad/topic"),
    Refusal("not authorized", _group_on(1), "t", acls_refuse_all=True),
)


class RefusingAccess:
    """A connection whose principal no ACL allows anything."""

    principal = "User:mallory"

    def allowed(self, operation: authz.Operation, resource: authz.Resource) -> bool:
        return False

    def allowed_any(self, operation: authz.Operation, resource_type: authz.ResourceType) -> bool:
        return False


class RefusingBackend(FakeBackend):
    """FakeBackend whose partition and controller calls refuse, as a broker without the partition
    or without a reachable controller does."""

    def list_offsets(self, req: common_pb2.ListOffsetsRequest) -> common_pb2.ListOffsetsResponse:
        return common_pb2.ListOffsetsResponse(
            topics=[
                common_pb2.ListOffsetsTopicResponse(
                    topic=t.topic,
                    partitions=[
                        common_pb2.ListOffsetsPartitionResponse(
                            partition=p.partition, error_code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION
                        )
                        for p in t.partitions
                    ],
                )
                for t in req.topics
            ]
        )

    async def delete_records(self, req: common_pb2.DeleteRecordsRequest) -> common_pb2.DeleteRecordsResponse:
        return common_pb2.DeleteRecordsResponse(
            topics=[
                common_pb2.DeleteRecordsTopicResponse(
                    topic=t.topic,
                    partitions=[
                        common_pb2.DeleteRecordsPartitionResponse(
                            partition=p.partition,
                            error_code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                            low_watermark=-1,
                            error_message="no such partition here",
                        )
                        for p in t.partitions
                    ],
                )
                for t in req.topics
            ]
        )

    def offsets_for_leader_epoch(
        self, req: broker_pb2.OffsetsForLeaderEpochRequest
    ) -> broker_pb2.OffsetsForLeaderEpochResponse:
        return broker_pb2.OffsetsForLeaderEpochResponse(
            topics=[
                broker_pb2.OffsetsForLeaderEpochTopicResult(
                    topic=t.topic,
                    partitions=[
                        broker_pb2.EpochEndOffset(
                            partition=p.partition,
                            error_code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                            leader_epoch=-1,
                            end_offset=-1,
                        )
                        for p in t.partitions
                    ],
                )
                for t in req.topics
            ]
        )

    async def call_controller(self, rpc: str, request: Any) -> Any:
        raise BackendUnavailable("no controller")


# ---- request bodies filled from kio's schema ---------------------------------------------------

_GROUP_FIELDS = frozenset({"group_id", "key", "groups", "coordinator_keys"})
_TOPIC_FIELDS = frozenset({"name", "topic", "topics", "topic_name", "resource_name"})
_INT_FIELDS = {
    "acks": -1,
    "resource_type": 2,  # a topic (DescribeConfigs)
    "key_type": 0,  # a group (FindCoordinator)
    "count": 2,
    "num_partitions": 1,
    "replication_factor": 1,
    "timestamp": -1,
    "generation_id": -1,
    "leader_epoch": -1,
    "current_leader_epoch": -1,
    "producer_id": -1,
    "producer_epoch": -1,
}


def _string(name: str, nullable: bool, refusal: Refusal) -> str | None:
    if name in _GROUP_FIELDS:
        return refusal.group_id
    if name in _TOPIC_FIELDS:
        return refusal.topic
    if name == "protocol_type":
        return "consumer"
    return None if nullable else "x"


def _primitive(kafka_type: str, name: str, nullable: bool, refusal: Refusal) -> Any:
    if kafka_type == "string":
        return _string(name, nullable, refusal)
    if kafka_type == "bool":
        return False
    if kafka_type.startswith("int") or kafka_type.startswith("uint"):
        return _INT_FIELDS.get(name, 0)
    if kafka_type.startswith("timedelta"):
        return datetime.timedelta(seconds=1)
    if kafka_type == "float64":
        return 0.0
    if kafka_type == "uuid":
        return None if nullable else uuid.UUID(int=0)
    if kafka_type in ("bytes", "records"):
        return None if nullable else b""
    raise AssertionError(f"no test value for kio's {kafka_type} (field {name})")


def _without_none(hint: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        return rest[0], len(rest) < len(typing.get_args(hint))
    return hint, False


def filled(cls: type[Any], refusal: Refusal) -> Any:
    """An instance of a kio class with every field given a value (one element per array)."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        hint, nullable = _without_none(hints[field.name])
        kafka_type = str(field.metadata.get("kafka_type", ""))
        if typing.get_origin(hint) is tuple:
            element = typing.get_args(hint)[0]
            if dataclasses.is_dataclass(element):
                values[field.name] = (filled(typing.cast(type[Any], element), refusal),)
            else:
                values[field.name] = (_primitive(kafka_type, field.name, False, refusal),)
        elif dataclasses.is_dataclass(hint):
            values[field.name] = filled(typing.cast(type[Any], hint), refusal)
        else:
            values[field.name] = _primitive(kafka_type, field.name, nullable, refusal)
    return cls(**values)


def _served() -> list[tuple[int, int]]:
    return [
        (key, version)
        for key, (low, high) in sorted(protocol.SUPPORTED_VERSIONS.items())
        for version in range(low, high + 1)
    ]


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda r: r.name)
def test_every_refusal_encodes_and_reads_back_at_every_served_version(refusal: Refusal) -> None:
    handler = KafkaHandler(RefusingBackend())
    if refusal.acls_refuse_all:
        handler = handler.for_connection(RefusingAccess())
    failures: list[str] = []

    async def answer(key: int, version: int) -> Any:
        body = filled(protocol.request_class(key, version), refusal)
        request = protocol.decode_request(request_frame(key, version, body, correlation_id=7))
        # A fresh task per request, as the listener runs each: the ACL decision is per task.
        return await asyncio.create_task(handler.handle(request))

    async def walk() -> None:
        for key, version in _served():
            where = f"api key {key} v{version}"
            response = await answer(key, version)
            if response is None:  # Produce with acks=0 is never answered
                failures.append(f"{where}: no answer")
                continue
            try:
                frame = protocol.encode_response(key, 7, response)
            except Exception as exc:
                failures.append(f"{where}: does not encode: {exc!r}")
                continue
            header_bytes = 4 + 4 + (1 if response.__flexible__ and key != protocol.API_VERSIONS else 0)
            decoded, size = entity_reader(type(response))(frame, header_bytes)
            # Compared as bytes: kio reads the all-zero topic id back as None, its null.
            if header_bytes + size != len(frame) or protocol.encode_response(key, 7, decoded) != frame:
                failures.append(f"{where}: reads back as {decoded!r}")

    asyncio.run(walk())
    assert not failures, "\n".join(failures)


def test_the_walk_covers_every_served_api() -> None:
    assert {key for key, _ in _served()} == set(protocol.SUPPORTED_VERSIONS)
    assert len(_served()) == sum(high - low + 1 for low, high in protocol.SUPPORTED_VERSIONS.values())
