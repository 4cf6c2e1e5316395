"""Hostile input at a plaintext cluster (the default): named refusals, nothing written, no log flood.

The security layer (test_security.py) parses and checks requests itself; these are the
paths a plaintext cluster takes without it.
"""

from __future__ import annotations

import os
import struct
import time

import grpc
import pytest
from crc32c import crc32c

from clients.common.record_batch import (
    ATTRIBUTES_POS,
    CRC_POS,
    CRC_START_POS,
    LAST_OFFSET_DELTA_POS,
    RECORDS_COUNT_POS,
)
from clients.common.records import Record, decode_batches, encode_batch
from protos.highwater.v1 import common_pb2, gateway_pb2_grpc
from tests.integration.conftest import TestCluster
from tests.integration.helpers import (
    consumer_fetch,
    create_topic,
    gateway_stub,
    produce,
    produce_batch,
    wait_for,
)

pytestmark = pytest.mark.integration

CALL_TIMEOUT_S = 10.0
PRODUCE = "/highwater.v1.GatewayService/Produce"


def end_offset(cluster: TestCluster, topic: str) -> int:
    resp = gateway_stub(cluster.gateway_address).ListOffsets(
        common_pb2.ListOffsetsRequest(
            topics=[
                common_pb2.ListOffsetsTopic(
                    topic=topic,
                    partitions=[
                        common_pb2.ListOffsetsPartition(partition=0, timestamp=-1, current_leader_epoch=-1)
                    ],
                )
            ]
        ),
        timeout=CALL_TIMEOUT_S,
    )
    return resp.topics[0].partitions[0].offset


def test_a_client_fetch_whose_replica_id_is_not_minus_one_is_refused(cluster: TestCluster) -> None:
    gw = gateway_stub(cluster.gateway_address)
    create_topic(gw, "pt-fetch", partitions=1, replication_factor=1)
    request = common_pb2.FetchRequest(
        max_wait_ms=0,
        topics=[
            common_pb2.FetchTopic(  # replica_id left at 0
                topic="pt-fetch", partitions=[common_pb2.FetchPartition(partition=0, current_leader_epoch=-1)]
            )
        ],
    )
    with pytest.raises(grpc.RpcError) as err:
        gw.Fetch(request, timeout=CALL_TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "replica_id must be -1 for a consumer, got 0" in str(err.value.details())


def test_a_produce_naming_a_partition_twice_writes_nothing(cluster: TestCluster) -> None:
    gw = _topic_with_a_first_write(cluster, "pt-twice", b"first")
    before = end_offset(cluster, "pt-twice")
    entry = common_pb2.ProducePartitionData(partition=0, records=b"")
    request = common_pb2.ProduceRequest(
        acks=-1, topics=[common_pb2.ProduceTopicData(topic="pt-twice", partitions=[entry, entry])]
    )
    with pytest.raises(grpc.RpcError) as err:
        gw.Produce(request, timeout=CALL_TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "appears more than once" in str(
        err.value.details()
    )
    assert end_offset(cluster, "pt-twice") == before


def test_malformed_bytes_are_invalid_argument_and_do_not_flood_the_log(cluster: TestCluster) -> None:
    log_path = cluster.processes["gateway-1"].log_path
    size_before = log_path.stat().st_size
    with grpc.insecure_channel(cluster.gateway_address) as channel:
        call = channel.unary_unary(PRODUCE)
        codes = set()
        for _ in range(200):
            try:
                call(b"\xff\xff\xff\xff not a ProduceRequest", timeout=CALL_TIMEOUT_S)
            except grpc.RpcError as exc:
                codes.add(exc.code())
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT}
    added = log_path.read_bytes()[size_before:].decode(errors="replace")
    assert "Traceback" not in added
    assert len(added) < 2_000, f"200 malformed requests wrote {len(added)} bytes of log"
    # The gateway still serves.
    gateway_stub(cluster.gateway_address).Metadata(common_pb2.MetadataRequest(), timeout=CALL_TIMEOUT_S)


def _topic_with_a_first_write(
    cluster: TestCluster, topic: str, value: bytes
) -> gateway_pb2_grpc.GatewayServiceStub:
    """Create a one-partition topic and wait until a write of value to it succeeds; a gateway stub."""
    gw = gateway_stub(cluster.gateway_address)
    create_topic(gw, topic, partitions=1, replication_factor=1)
    wait_for(
        lambda: produce(gw, topic, 0, [value]).error_code == common_pb2.NONE,
        timeout_s=20,
        what=f"the first write to {topic}",
    )
    return gw


def _respoiled(batch: bytes, *, records_count: int | None = None, codec: int | None = None) -> bytes:
    """`batch` with a header field changed and its CRC recomputed: only a check of the contents refuses it."""
    spoiled = bytearray(batch)
    if records_count is not None:
        struct.pack_into(">i", spoiled, RECORDS_COUNT_POS, records_count)
        struct.pack_into(">i", spoiled, LAST_OFFSET_DELTA_POS, records_count - 1)
    if codec is not None:
        attributes = struct.unpack_from(">h", spoiled, ATTRIBUTES_POS)[0]
        struct.pack_into(">h", spoiled, ATTRIBUTES_POS, (attributes & ~0x07) | codec)
    struct.pack_into(">I", spoiled, CRC_POS, crc32c(bytes(spoiled[CRC_START_POS:])))
    return bytes(spoiled)


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_tiny_batches_claiming_two_billion_records_are_refused_and_open_no_files(
    cluster: TestCluster,
) -> None:
    """69 bytes claiming 2^31-1 records once passed the header check and rolled a segment each
    (three files); 7,000 of them took three brokers to 20,000 open files."""
    gw = _topic_with_a_first_write(cluster, "pt-count", b"first")
    leader = next(
        p.leader
        for p in gw.Metadata(common_pb2.MetadataRequest(topics=["pt-count"]), timeout=CALL_TIMEOUT_S)
        .topics[0]
        .partitions
    )
    pid = cluster.broker_pid(leader)
    assert pid is not None
    files_before, end_before = _open_files(pid), end_offset(cluster, "pt-count")
    liar = _respoiled(
        encode_batch([Record(None, b"x", [], int(time.time() * 1000))]), records_count=2**31 - 1
    )
    for _ in range(200):
        result = produce_batch(gw, "pt-count", 0, liar, acks=1, timeout_ms=5000, timeout=CALL_TIMEOUT_S)
        assert result.error_code == common_pb2.INVALID_RECORD, result
    assert "records_count" in result.error_message and "nothing" in result.error_message
    assert end_offset(cluster, "pt-count") == end_before
    assert _open_files(pid) - files_before <= 10, "no segment was rolled for a refused batch"


def test_a_batch_no_consumer_could_read_is_refused_and_the_records_before_it_stay_readable(
    cluster: TestCluster,
) -> None:
    gw = _topic_with_a_first_write(cluster, "pt-codec", b"valid")
    poison = _respoiled(encode_batch([Record(None, b"poison", [], int(time.time() * 1000))]), codec=7)
    result = produce_batch(gw, "pt-codec", 0, poison, acks=-1, timeout_ms=5000, timeout=CALL_TIMEOUT_S)
    assert result.error_code == common_pb2.CORRUPT_MESSAGE and "codec 7" in result.error_message, result
    assert produce(gw, "pt-codec", 0, [b"after"]).error_code == common_pb2.NONE
    fetched = (
        gw.Fetch(consumer_fetch("pt-codec", 0, 0, partition_max_bytes=1 << 20), timeout=CALL_TIMEOUT_S)
        .topics[0]
        .partitions[0]
    )
    assert [r.value for r in decode_batches(fetched.records)] == [b"valid", b"after"]
