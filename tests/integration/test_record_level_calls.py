"""The record-level calls (ProduceRecords, ConsumeRecords) and what a stub user of another
language relies on: reflection v1 and v1alpha, the cluster id in Metadata (docs/GRPC.md).

Everything here goes through gRPC only; the reflection tests build their stubs from
descriptors the gateway sends, in a descriptor pool of their own, as grpcurl does.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2

from clients.common.partitioner import partition_for_key
from protos.highwater.v1 import common_pb2, gateway_pb2
from tests.integration.helpers import create_topic, gateway_stub

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 30.0


def _consume(gw, topic: str, count: int, **kwargs) -> list[gateway_pb2.ConsumedRecord]:
    request = gateway_pb2.ConsumeRecordsRequest(topic=topic, max_records=count, **kwargs)
    out: list[gateway_pb2.ConsumedRecord] = []
    for message in gw.ConsumeRecords(request, timeout=RPC_TIMEOUT_S):
        assert not message.errors, message.errors
        out.extend(message.records)
    return out


def test_keyed_records_land_where_the_python_producer_puts_them_and_come_back_whole(cluster):
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "rl-keyed", partitions=5).error_code == 0
    records = [
        gateway_pb2.ProducerRecord(
            key=f"user-{i}".encode(),
            value=f"v{i}".encode(),
            timestamp_ms=1_000 + i,
            headers=[gateway_pb2.RecordHeader(key="i", value=str(i).encode())],
        )
        for i in range(200)
    ]
    resp = gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(topic="rl-keyed", records=records), timeout=RPC_TIMEOUT_S
    )
    assert [r.error_code for r in resp.results] == [0] * 200
    assert [r.partition for r in resp.results] == [
        partition_for_key(f"user-{i}".encode(), 5) for i in range(200)
    ]
    got = _consume(gw, "rl-keyed", 200, default_start_offset=-2)
    by_key = {r.key: r for r in got}
    assert len(by_key) == 200
    for i, result in enumerate(resp.results):
        r = by_key[f"user-{i}".encode()]
        assert (r.partition, r.offset, r.value, r.timestamp_ms) == (
            result.partition,
            result.offset,
            f"v{i}".encode(),
            1_000 + i,
        )
        assert [(h.key, h.value) for h in r.headers] == [("i", str(i).encode())]


def test_null_keys_and_values_stay_null_and_an_explicit_partition_is_kept(cluster):
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "rl-nulls", partitions=3).error_code == 0
    records = [
        gateway_pb2.ProducerRecord(value=b"no key", partition=2),
        gateway_pb2.ProducerRecord(key=b"", partition=2),
        gateway_pb2.ProducerRecord(key=b"k", value=b"", partition=2),
    ]
    resp = gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(topic="rl-nulls", records=records), timeout=RPC_TIMEOUT_S
    )
    assert [(r.error_code, r.partition, r.offset) for r in resp.results] == [(0, 2, 0), (0, 2, 1), (0, 2, 2)]
    got = _consume(gw, "rl-nulls", 3, partitions=[gateway_pb2.ConsumePartition(partition=2, start_offset=0)])
    assert [(r.HasField("key"), r.key, r.HasField("value"), r.value) for r in got] == [
        (False, b"", True, b"no key"),
        (True, b"", False, b""),
        (True, b"k", True, b""),
    ]


def test_keyless_records_stick_to_one_partition_per_batch_size(cluster):
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "rl-sticky", partitions=4).error_code == 0
    resp = gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(
            topic="rl-sticky", records=[gateway_pb2.ProducerRecord(value=b"x" * 100) for _ in range(50)]
        ),
        timeout=RPC_TIMEOUT_S,
    )
    # 50 records of ~130 bytes stay under the Producer's 16 KiB batch size: one partition.
    assert len({r.partition for r in resp.results}) == 1
    assert all(r.error_code == 0 for r in resp.results)


def test_a_retry_with_the_same_request_id_writes_nothing_twice(cluster):
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "rl-retry", partitions=1).error_code == 0
    request = gateway_pb2.ProduceRecordsRequest(
        topic="rl-retry",
        request_id="order-42",
        records=[gateway_pb2.ProducerRecord(key=b"k", value=f"v{i}".encode()) for i in range(10)],
    )
    first = gw.ProduceRecords(request, timeout=RPC_TIMEOUT_S)
    again = gw.ProduceRecords(request, timeout=RPC_TIMEOUT_S)
    assert first == again
    other = gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(
            topic="rl-retry", request_id="order-43", records=[gateway_pb2.ProducerRecord(value=b"next")]
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert other.results[0].offset == 10, "the retry wrote nothing: the next record is the 11th"


def test_records_for_a_missing_topic_or_partition_fail_one_by_one_with_a_sentence(cluster):
    gw = gateway_stub(cluster.gateway_address)
    resp = gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(
            topic="rl-nowhere", records=[gateway_pb2.ProducerRecord(value=b"x")]
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert resp.results[0].error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
    assert "does not exist" in resp.results[0].error_message
    assert create_topic(gw, "rl-range", partitions=2).error_code == 0
    resp = gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(
            topic="rl-range",
            records=[
                gateway_pb2.ProducerRecord(value=b"ok", partition=1),
                gateway_pb2.ProducerRecord(value=b"no", partition=7),
            ],
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert [r.error_code for r in resp.results] == [common_pb2.NONE, common_pb2.UNKNOWN_TOPIC_OR_PARTITION]
    assert "there is no partition 7" in resp.results[1].error_message
    with pytest.raises(grpc.RpcError) as refused:
        gw.ProduceRecords(gateway_pb2.ProduceRecordsRequest(topic="rl-range"), timeout=RPC_TIMEOUT_S)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    errors = [
        e
        for m in gw.ConsumeRecords(
            gateway_pb2.ConsumeRecordsRequest(topic="rl-nowhere"), timeout=RPC_TIMEOUT_S
        )
        for e in m.errors
    ]
    assert [e.error_code for e in errors] == [common_pb2.UNKNOWN_TOPIC_OR_PARTITION]


def test_consuming_resumes_from_any_offset_and_from_a_groups_commit(cluster):
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "rl-resume", partitions=1).error_code == 0
    gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(
            topic="rl-resume", records=[gateway_pb2.ProducerRecord(value=str(i).encode()) for i in range(30)]
        ),
        timeout=RPC_TIMEOUT_S,
    )
    got = _consume(
        gw, "rl-resume", 5, partitions=[gateway_pb2.ConsumePartition(partition=0, start_offset=17)]
    )
    assert [r.offset for r in got] == [17, 18, 19, 20, 21]
    gw.CommitOffsets(
        gateway_pb2.CommitOffsetsRequest(
            group_id="rl-group",
            topics=[
                gateway_pb2.OffsetCommitTopic(
                    topic="rl-resume", partitions=[gateway_pb2.OffsetCommitPartition(partition=0, offset=25)]
                )
            ],
        )
    )
    got = _consume(gw, "rl-resume", 5, group_id="rl-group", default_start_offset=-2)
    assert [r.value for r in got] == [b"25", b"26", b"27", b"28", b"29"]


def test_metadata_answers_the_cluster_id_describe_cluster_has(cluster):
    gw = gateway_stub(cluster.gateway_address)
    described = gw.DescribeCluster(common_pb2.DescribeClusterRequest()).cluster_id
    assert described
    assert gw.Metadata(common_pb2.MetadataRequest()).cluster_id == described


# ---- a stub from reflection only (grpcurl's way) --------------------------------------------


def _reflect(
    channel: grpc.Channel, service: str, requests: list[reflection_pb2.ServerReflectionRequest]
) -> list[reflection_pb2.ServerReflectionResponse]:
    # v1 and v1alpha messages are the same bytes under two package names.
    call = channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    return list(call(iter(requests), timeout=RPC_TIMEOUT_S))


def _pool_from_reflection(channel: grpc.Channel, service: str, symbol: str) -> descriptor_pool.DescriptorPool:
    """A fresh pool holding `symbol`'s file and every file it imports, all asked by reflection."""
    pool = descriptor_pool.DescriptorPool()
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    answers = _reflect(
        channel, service, [reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)]
    )
    pending = list(answers[0].file_descriptor_response.file_descriptor_proto)
    while pending:
        proto = descriptor_pb2.FileDescriptorProto.FromString(pending.pop())
        if proto.name in files:
            continue
        files[proto.name] = proto
        missing = [d for d in proto.dependency if d not in files]
        if missing:
            for answer in _reflect(
                channel,
                service,
                [reflection_pb2.ServerReflectionRequest(file_by_filename=d) for d in missing],
            ):
                pending.extend(answer.file_descriptor_response.file_descriptor_proto)
    added: set[str] = set()

    def add(name: str) -> None:
        if name in added:
            return
        for dep in files[name].dependency:
            add(dep)
        pool.Add(files[name])
        added.add(name)

    for name in files:
        add(name)
    return pool


@pytest.mark.parametrize(
    "service", ["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"]
)
def test_a_stub_built_from_reflection_alone_produces_records(cluster, service):
    topic = f"rl-reflect-{service.split('.')[2]}"
    assert create_topic(gateway_stub(cluster.gateway_address), topic, partitions=2).error_code == 0
    channel = grpc.insecure_channel(cluster.gateway_address.split(",")[0])
    listed = _reflect(channel, service, [reflection_pb2.ServerReflectionRequest(list_services="")])
    names = {s.name for s in listed[0].list_services_response.service}
    assert {
        "highwater.v1.GatewayService",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names
    pool = _pool_from_reflection(channel, service, "highwater.v1.GatewayService")
    assert "highwater/v1/gateway.proto" in {pool.FindFileContainingSymbol("highwater.v1.GatewayService").name}
    method = pool.FindServiceByName("highwater.v1.GatewayService").methods_by_name["ProduceRecords"]
    request_cls = message_factory.GetMessageClass(method.input_type)
    response_cls = message_factory.GetMessageClass(method.output_type)
    assert request_cls is not gateway_pb2.ProduceRecordsRequest
    request = request_cls(topic=topic)
    record = request.records.add(key=b"reflected", value=b"hello")
    record.headers.add(key="from", value=b"reflection")
    call = channel.unary_unary(
        "/highwater.v1.GatewayService/ProduceRecords",
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )
    answer = call(request, timeout=RPC_TIMEOUT_S)
    assert answer.results[0].error_code == 0
    assert answer.results[0].partition == partition_for_key(b"reflected", 2)
    described = _reflect(
        channel,
        service,
        [
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="grpc.reflection.v1.ServerReflection"
            )
        ],
    )
    assert described[0].WhichOneof("message_response") == "file_descriptor_response"
