"""The Kafka listener's pure parts: framing (services/kafka/protocol.py) and the request mapping
(services/kafka/handler.py) driven by a fake backend."""

from __future__ import annotations

import asyncio
import datetime
import io
import struct
import sys
from typing import Any

import pytest
from kio.schema.request_header.v1.header import RequestHeader as V1
from kio.schema.request_header.v2.header import RequestHeader as V2
from kio.serial import entity_reader, entity_writer

from coordinator.memory_store import MemoryStore
from protos.highwater.v1 import broker_pb2, common_pb2
from services.common.metadata_cache import MetadataCache
from services.groups.errors import GroupError
from services.kafka import protocol
from services.kafka.group_driver import ClassicGroupDriver
from services.kafka.handler import (
    BackendUnavailable,
    KafkaBroker,
    KafkaHandler,
    LogDirDescription,
    ReplicaLogSize,
)
from services.transactions.hosting import TransactionHost
from tests.unit.test_transaction_driver import Markers, ProducerIds


def request_frame(api_key: int, version: int, body: Any, correlation_id: int = 42) -> bytes:
    buf = io.BytesIO()
    header_cls = V2 if body.__flexible__ else V1
    header = header_cls(
        request_api_key=api_key, request_api_version=version, correlation_id=correlation_id, client_id="c"
    )
    entity_writer(header_cls)(buf, header)
    entity_writer(type(body))(buf, body)
    return buf.getvalue()


def module_of(cls: type[Any]) -> Any:
    return sys.modules[cls.__module__]


def test_request_round_trip_with_header_v1_and_v2():
    for version in (0, 3):  # v0: header v1; v3: flexible, header v2 with tagged fields
        cls = protocol.request_class(protocol.API_VERSIONS, version)
        body = protocol.build(cls, client_software_name="x", client_software_version="1")
        request = protocol.decode_request(request_frame(protocol.API_VERSIONS, version, body))
        assert (request.api_key, request.api_version, request.correlation_id) == (18, version, 42)
        assert request.client_id == "c"
        assert request.body == body


def test_unreadable_frames_are_protocol_errors():
    body = protocol.build(
        protocol.request_class(protocol.API_VERSIONS, 3),
        client_software_name="x",
        client_software_version="1",
    )
    frame = request_frame(protocol.API_VERSIONS, 3, body)
    with pytest.raises(protocol.KafkaProtocolError, match="bytes left"):
        protocol.decode_request(frame + b"\0")
    with pytest.raises(protocol.KafkaProtocolError):
        protocol.decode_request(frame[:-2])
    with pytest.raises(protocol.KafkaProtocolError, match="shorter than a request header"):
        protocol.decode_request(b"\0\x12")
    with pytest.raises(protocol.KafkaProtocolError, match="negative"):
        protocol.frame_size(struct.pack(">i", -1))


def test_unsupported_api_or_version_keeps_the_correlation_id():
    frame = struct.pack(">hhi", protocol.FETCH, 99, 1234) + b"\0\0"
    with pytest.raises(protocol.UnsupportedVersion) as info:
        protocol.decode_request(frame)
    assert (info.value.api_key, info.value.api_version, info.value.correlation_id) == (1, 99, 1234)
    with pytest.raises(protocol.UnsupportedVersion):
        protocol.decode_request(struct.pack(">hhi", 57, 0, 1) + b"\0\0")  # UpdateFeatures: not served


def test_response_header_v0_for_api_versions_and_v1_for_other_flexible_answers():
    from kio.schema.errors import ErrorCode

    from services.kafka.handler import api_versions_response

    frame = protocol.encode_response(protocol.API_VERSIONS, 5, api_versions_response(3, ErrorCode.none))
    (size, correlation_id) = struct.unpack_from(">ii", frame)
    assert size == len(frame) - 4 and correlation_id == 5
    body, _ = entity_reader(protocol.response_class(protocol.API_VERSIONS, 3))(frame, 8)  # no tag byte
    assert {k.api_key for k in body.api_keys} == set(protocol.SUPPORTED_VERSIONS)

    cls = protocol.response_class(protocol.INIT_PRODUCER_ID, 4)
    answer = protocol.build(
        cls, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, producer_id=1, producer_epoch=0
    )
    frame = protocol.encode_response(protocol.INIT_PRODUCER_ID, 6, answer)
    assert frame[8] == 0, "response header v1: empty tagged fields"
    assert entity_reader(cls)(frame, 9)[0] == answer


def test_every_error_code_has_its_kafka_number():
    for name, number in common_pb2.ErrorCode.items():
        assert protocol.kafka_error(number) is not None, name
    assert protocol.kafka_error(common_pb2.NOT_LEADER_OR_FOLLOWER) == 6
    assert protocol.kafka_error(common_pb2.OUT_OF_ORDER_SEQUENCE_NUMBER) == 45
    assert protocol.kafka_error(common_pb2.INVALID_TOPIC) == 17
    assert protocol.kafka_error(common_pb2.NONE) == 0


def test_every_advertised_version_has_classes_and_build_drops_missing_fields():
    for key, (low, high) in protocol.SUPPORTED_VERSIONS.items():
        for version in range(low, high + 1):
            assert protocol.request_class(key, version).__name__.endswith("Request")
            assert protocol.response_class(key, version).__name__.endswith("Response")
    v0 = protocol.response_class(protocol.METADATA, 0)
    broker = protocol.build(
        protocol.nested(v0, "MetadataResponseBroker"), node_id=1, host="h", port=2, rack="r"
    )
    assert not protocol.has_field(type(broker), "rack"), "Metadata v0 has no rack: dropped"


# ---- the mapping, with a fake backend -------------------------------------------------------


class FakeBackend:
    def __init__(self) -> None:
        self.cache = MetadataCache(
            partitions={
                ("t", 0): common_pb2.PartitionState(
                    topic="t", partition=0, leader=2, leader_epoch=3, isr=[2, 1], replicas=[2, 1]
                )
            }
        )
        self.cache.topic_ids["t"] = "fb06033b-a886-43b1-bdb5-e8d4da399f07"
        self.produced: list[common_pb2.ProduceRequest] = []
        self.fetched: list[common_pb2.FetchRequest] = []
        self.controller_down = False
        self.commits: list[tuple[str, list[Any]]] = []
        self.groups = ClassicGroupDriver(1)
        # The real transaction coordinator host on an in-memory etcd, its markers and producer
        # ids recorded (tests/unit/test_kafka_transactions.py drives it).
        self.store = MemoryStore()
        self.markers = Markers()
        self.pids = ProducerIds(5000)
        self.transactions = TransactionHost(1, self.store, self.markers, self.pids, self._kafka_broker_ids)
        # The leader's producer state: (partition, producer id) -> epoch of its open transaction.
        self.open_txn: dict[tuple[tuple[str, int], int], int] = {}

    async def _kafka_broker_ids(self) -> list[int]:
        return [b.broker_id for b in await self.kafka_brokers()]

    def open_transaction_epoch(self, tp: tuple[str, int], producer_id: int) -> int | None:
        return self.open_txn.get((tp, producer_id))

    async def consumer_group_member_check(self, group: str, member_id: str, member_epoch: int) -> GroupError:
        return GroupError.UNKNOWN_MEMBER_ID

    @property
    def broker_id(self) -> int:
        return 1

    @property
    def metadata(self) -> MetadataCache:
        return self.cache

    @property
    def classic_groups(self) -> ClassicGroupDriver:
        return self.groups

    async def produce(
        self, req: common_pb2.ProduceRequest, *, transactional: bool = False
    ) -> common_pb2.ProduceResponse:
        self.produced.append(req)
        return common_pb2.ProduceResponse(
            topics=[
                common_pb2.ProduceTopicResponse(
                    topic=t.topic,
                    partitions=[
                        common_pb2.ProducePartitionResponse(
                            partition=p.partition,
                            error_code=common_pb2.NOT_LEADER_OR_FOLLOWER,
                            base_offset=-1,
                            log_append_time_ms=-1,
                        )
                        for p in t.partitions
                    ],
                )
                for t in req.topics
            ]
        )

    async def fetch(self, req: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        self.fetched.append(req)
        return common_pb2.FetchResponse(
            topics=[
                common_pb2.FetchTopicResponse(
                    topic="t",
                    partitions=[
                        common_pb2.FetchPartitionResponse(partition=0, high_watermark=5, records=b"batches"),
                        common_pb2.FetchPartitionResponse(
                            partition=1, error_code=common_pb2.NOT_LEADER_OR_FOLLOWER, high_watermark=-1
                        ),
                    ],
                )
            ]
        )

    def log_dirs(self, wanted: Any) -> list[LogDirDescription]:
        replicas = (ReplicaLogSize("t", 0, 4_096, 0), ReplicaLogSize("t", 1, 512, 2))
        return [
            LogDirDescription(
                "/data/broker-1",
                10_000_000,
                4_000_000,
                tuple(r for r in replicas if wanted is None or (r.topic, r.partition) in wanted),
            )
        ]

    def list_offsets(self, req: common_pb2.ListOffsetsRequest) -> common_pb2.ListOffsetsResponse:
        raise NotImplementedError

    def offsets_for_leader_epoch(
        self, req: broker_pb2.OffsetsForLeaderEpochRequest
    ) -> broker_pb2.OffsetsForLeaderEpochResponse:
        raise NotImplementedError

    async def kafka_brokers(self) -> list[KafkaBroker]:
        return [KafkaBroker(1, "127.0.0.1", 19092, ""), KafkaBroker(2, "127.0.0.1", 19093, "r2")]

    async def cluster_id(self) -> str:
        return "cluster-x"

    async def commit_offsets(self, group: str, offsets: list[Any]) -> tuple[int, str]:
        self.commits.append((group, offsets))
        return common_pb2.NONE, ""

    async def committed_offsets(self, group: str) -> dict[tuple[str, int], Any]:
        return {}

    async def stored_groups(self, group: str | None = None) -> list[Any]:
        return []

    async def delete_group(self, group: str) -> tuple[Any, str]:
        return GroupError.GROUP_ID_NOT_FOUND, "no such group"

    async def delete_offsets(
        self, group: str, partitions: list[tuple[str, int]]
    ) -> tuple[Any, str, dict[Any, Any]]:
        return GroupError.GROUP_ID_NOT_FOUND, "no such group", {}

    async def call_controller(self, rpc: str, request: Any) -> Any:
        if self.controller_down:
            raise BackendUnavailable("no controller")
        assert rpc == "InitProducerId"
        return common_pb2.InitProducerIdResponse(producer_id=7000, producer_epoch=0)


def handle(backend: FakeBackend, api_key: int, version: int, body: Any) -> Any:
    request = protocol.decode_request(request_frame(api_key, version, body))
    return asyncio.run(KafkaHandler(backend).handle(request))


def test_metadata_names_brokers_by_kafka_port_and_this_broker_as_controller():
    cls = protocol.request_class(protocol.METADATA, 12)
    body = protocol.build(
        cls, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    answer = handle(FakeBackend(), protocol.METADATA, 12, body)
    assert [(b.node_id, b.port, b.rack) for b in answer.brokers] == [(1, 19092, None), (2, 19093, "r2")]
    assert answer.controller_id == 1 and answer.cluster_id == "cluster-x"
    (topic,) = answer.topics
    (p,) = topic.partitions
    assert (topic.name, p.leader_id, p.leader_epoch, p.isr_nodes) == ("t", 2, 3, (2, 1))
    assert str(topic.topic_id) == "fb06033b-a886-43b1-bdb5-e8d4da399f07"

    mod = module_of(cls)
    body = protocol.build(
        cls,
        topics=(mod.MetadataRequestTopic(topic_id=None, name="missing"),),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    (missing,) = handle(FakeBackend(), protocol.METADATA, 12, body).topics
    assert missing.error_code == 3, "UNKNOWN_TOPIC_OR_PARTITION: topics are never created by Metadata"


def test_produce_maps_to_the_broker_call_and_acks_zero_gets_no_answer():
    cls = protocol.request_class(protocol.PRODUCE, 9)
    mod = module_of(cls)
    for acks in (-1, 0):
        backend = FakeBackend()
        body = cls(
            transactional_id=None,
            acks=acks,
            timeout=datetime.timedelta(seconds=1),
            topic_data=(
                mod.TopicProduceData(
                    name="t", partition_data=(mod.PartitionProduceData(index=0, records=b"b"),)
                ),
            ),
        )
        answer = handle(backend, protocol.PRODUCE, 9, body)
        (sent,) = backend.produced
        assert (sent.acks, sent.timeout_ms, sent.topics[0].partitions[0].records) == (acks, 1000, b"b")
        if acks == 0:
            assert answer is None
        else:
            assert answer.responses[0].partition_responses[0].error_code == 6


def test_init_producer_id_from_the_controller_and_controller_loss_is_retriable():
    backend = FakeBackend()
    init = protocol.request_class(protocol.INIT_PRODUCER_ID, 4)
    body = init(transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60))
    assert handle(backend, protocol.INIT_PRODUCER_ID, 4, body).producer_id == 7000
    backend.controller_down = True
    answer = handle(backend, protocol.INIT_PRODUCER_ID, 4, body)
    assert answer.error_code == 15, "COORDINATOR_NOT_AVAILABLE: Kafka clients retry it"


def test_fetch_passes_records_through_and_names_the_leader_on_not_leader():
    cls = protocol.request_class(protocol.FETCH, 12)
    mod = module_of(cls)
    backend = FakeBackend()
    body = cls(
        max_wait=datetime.timedelta(milliseconds=99_000),
        min_bytes=1,
        topics=(
            mod.FetchTopic(
                topic="t",
                partitions=(
                    mod.FetchPartition(
                        partition=0, current_leader_epoch=3, fetch_offset=2, partition_max_bytes=10
                    ),
                    mod.FetchPartition(partition=1, fetch_offset=0, partition_max_bytes=10),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    answer = handle(backend, protocol.FETCH, 12, body)
    (sent,) = backend.fetched
    assert sent.max_wait_ms == 30_000, "bounded by FETCH_MAX_WAIT_MS_MAX"
    assert sent.topics[0].partitions[0].current_leader_epoch == 3
    ok, moved = answer.responses[0].partitions
    assert (ok.records, ok.high_watermark, ok.last_stable_offset) == (b"batches", 5, 5)
    assert moved.error_code == 6 and moved.records == b"", (
        "empty, not null: librdkafka refuses a null record set"
    )
    assert answer.session_id == 0, "no fetch sessions"


def test_find_coordinator_names_each_groups_coordinator():
    backend = FakeBackend()
    v4 = protocol.request_class(protocol.FIND_COORDINATOR, 4)
    answer = handle(backend, protocol.FIND_COORDINATOR, 4, v4(key_type=0, coordinator_keys=("g", "g1", "")))
    one, two, bad = answer.coordinators
    assert (one.key, one.node_id, one.port, one.error_code) == ("g", 1, 19092, 0)
    assert (two.key, two.node_id, two.port) == ("g1", 2, 19093), "each group's own coordinator"
    assert bad.error_code == 24, "INVALID_GROUP_ID"
    v3 = protocol.request_class(protocol.FIND_COORDINATOR, 3)
    tx = handle(backend, protocol.FIND_COORDINATOR, 3, v3(key="tx", key_type=1))
    assert (tx.error_code, tx.node_id) == (0, 2), "a transactional id is placed as a group is"


def test_offset_commit_takes_simple_commits_and_refuses_classic_members():
    cls = protocol.request_class(protocol.OFFSET_COMMIT, 8)
    mod = module_of(cls)
    topics = (
        mod.OffsetCommitRequestTopic(
            name="t",
            partitions=(
                mod.OffsetCommitRequestPartition(
                    partition_index=0, committed_offset=5, committed_metadata="m"
                ),
                mod.OffsetCommitRequestPartition(
                    partition_index=9, committed_offset=5, committed_metadata=None
                ),
            ),
        ),
    )
    backend = FakeBackend()
    body = cls(group_id="g", generation_id_or_member_epoch=-1, member_id="", topics=topics)
    answer = handle(backend, protocol.OFFSET_COMMIT, 8, body)
    assert [p.error_code for p in answer.topics[0].partitions] == [0, 3], "t-9 does not exist"
    ((group, (commit,)),) = backend.commits
    assert (group, commit.topic, commit.partition, commit.offset, commit.metadata) == ("g", "t", 0, 5, "m")

    member = cls(group_id="g", generation_id_or_member_epoch=4, member_id="m-1", topics=topics)
    answer = handle(FakeBackend(), protocol.OFFSET_COMMIT, 8, member)
    assert {p.error_code for p in answer.topics[0].partitions} == {25}, "UNKNOWN_MEMBER_ID: not a member"

    elsewhere = cls(group_id="g1", generation_id_or_member_epoch=-1, member_id="", topics=topics)
    answer = handle(FakeBackend(), protocol.OFFSET_COMMIT, 8, elsewhere)
    assert {p.error_code for p in answer.topics[0].partitions} == {16}, "NOT_COORDINATOR: broker 2 is"


def test_broker_registrations_with_and_without_a_kafka_port_read():
    from coordinator import values

    old = values.decode_broker_registration(b'{"broker_id": 1, "host": "h", "port": 9001}')
    assert old["kafka_port"] == 0, "written before the field existed: no Kafka listener"
    new = values.decode_broker_registration(
        values.encode_registration({"broker_id": 2, "host": "h", "port": 9002, "kafka_port": 19093})
    )
    assert new["kafka_port"] == 19093


def test_batches_over_max_batch_records_are_refused_as_the_grpc_listeners_refuse_them():
    from clients.common.records import encode_batch

    cls = protocol.request_class(protocol.PRODUCE, 9)
    mod = module_of(cls)
    small = encode_batch([(None, b"v", [], 1)])
    large = encode_batch([(None, b"v", [], 1)] * 3)
    body = cls(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(
            mod.TopicProduceData(
                name="t",
                partition_data=(
                    mod.PartitionProduceData(index=0, records=small),
                    mod.PartitionProduceData(index=1, records=large),
                ),
            ),
        ),
    )
    backend = FakeBackend()
    request = protocol.decode_request(request_frame(protocol.PRODUCE, 9, body))
    answer = asyncio.run(KafkaHandler(backend, max_batch_records=2).handle(request))
    (sent,) = backend.produced
    assert [p.partition for t in sent.topics for p in t.partitions] == [0], (
        "the large batch never reached the log"
    )
    codes = {p.index: p.error_code for t in answer.responses for p in t.partition_responses}
    assert codes == {0: 6, 1: 42}, "the fake answers NOT_LEADER; the refused one INVALID_REQUEST"


def test_a_broker_opens_the_kafka_listener_with_tls_but_refuses_acls_or_quotas_without_a_principal(tmp_path):
    from services.broker.server import BrokerConfig
    from services.security.config import SecurityConfig

    def config(security: SecurityConfig) -> BrokerConfig:
        return BrokerConfig(
            broker_id=1, data_dir=tmp_path, etcd_endpoints=["127.0.0.1:2379"], kafka_port=0, security=security
        )

    config(SecurityConfig()).check()
    config(SecurityConfig(tls_dir=tmp_path, name="broker-1")).check()
    config(SecurityConfig(tls_dir=tmp_path, name="broker-1", authorizer="acl")).check()
    with pytest.raises(SystemExit, match="needs --tls-dir"):
        config(SecurityConfig(authorizer="acl")).check()
    with pytest.raises(SystemExit, match="does not charge quotas"):
        config(SecurityConfig(tls_dir=tmp_path, name="broker-1", producer_byte_rate=1000)).check()


def test_a_tagged_field_kio_does_not_know_is_a_protocol_error():
    """kio raises KeyError for an unknown tag; the listener must see KafkaProtocolError (the
    connection closed quietly, not a traceback: tests/integration/test_kafka_fuzz.py found it)."""
    body = protocol.build(
        protocol.request_class(protocol.API_VERSIONS, 3),
        client_software_name="x",
        client_software_version="1",
    )
    frame = request_frame(protocol.API_VERSIONS, 3, body)
    # Header v2: api key, version, correlation id (8 bytes), client id "c" (2 + 1), then its
    # tagged fields: one field, tag 45, one byte long.
    assert frame[11] == 0, "no tagged fields in the header as written"
    tagged = frame[:11] + bytes([1, 45, 1, 7]) + frame[12:]
    with pytest.raises(protocol.KafkaProtocolError, match="cannot decode"):
        protocol.decode_request(tagged)


class NoGroupKeysBackend(FakeBackend):
    """A backend whose etcd refuses group ids that cannot be a key, as consumer_offsets does."""

    async def stored_groups(self, group: str | None = None) -> list[Any]:
        if group is not None and (not group or "/" in group):
            raise ValueError(f"group id {group!r} cannot be used in an etcd key")
        return []


def test_describe_groups_answers_an_invalid_group_id_without_asking_the_backend():
    cls = protocol.request_class(protocol.DESCRIBE_GROUPS, 5)
    body = cls(groups=("", "a/b"), include_authorized_operations=False)
    answer = handle(NoGroupKeysBackend(), protocol.DESCRIBE_GROUPS, 5, body)
    assert [(g.group_id, g.error_code) for g in answer.groups] == [("", 24), ("a/b", 24)], "INVALID_GROUP_ID"
