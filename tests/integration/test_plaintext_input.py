"""Hostile input at a plaintext cluster (the default): named refusals, nothing written, no log flood.

The security layer (test_security.py) parses and checks requests itself; these are the
paths a plaintext cluster takes without it.
"""

from __future__ import annotations

import grpc
import pytest

from protos.highwater.v1 import common_pb2
from tests.integration.conftest import TestCluster
from tests.integration.helpers import create_topic, gateway_stub, produce, wait_for

pytestmark = pytest.mark.integration

CALL_TIMEOUT_S = 10.0
PRODUCE = "/highwater.v1.GatewayService/Produce"


def end_offset(cluster: TestCluster, topic: str) -> int:
    resp = gateway_stub(cluster.gateway_address).ListOffsets(common_pb2.ListOffsetsRequest(topics=[
        common_pb2.ListOffsetsTopic(topic=topic, partitions=[
            common_pb2.ListOffsetsPartition(partition=0, timestamp=-1, current_leader_epoch=-1)])]),
        timeout=CALL_TIMEOUT_S)
    return resp.topics[0].partitions[0].offset


def test_a_client_fetch_whose_replica_id_is_not_minus_one_is_refused(cluster: TestCluster) -> None:
    gw = gateway_stub(cluster.gateway_address)
    create_topic(gw, "pt-fetch", partitions=1, replication_factor=1)
    request = common_pb2.FetchRequest(max_wait_ms=0, topics=[common_pb2.FetchTopic(  # replica_id left at 0
        topic="pt-fetch", partitions=[common_pb2.FetchPartition(partition=0, current_leader_epoch=-1)])])
    with pytest.raises(grpc.RpcError) as err:
        gw.Fetch(request, timeout=CALL_TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "replica_id must be -1 for a consumer, got 0" in str(err.value.details())


def test_a_produce_naming_a_partition_twice_writes_nothing(cluster: TestCluster) -> None:
    gw = gateway_stub(cluster.gateway_address)
    create_topic(gw, "pt-twice", partitions=1, replication_factor=1)
    wait_for(lambda: produce(gw, "pt-twice", 0, [b"first"]).error_code == common_pb2.NONE, timeout_s=20,
             what="the first write to pt-twice")
    before = end_offset(cluster, "pt-twice")
    entry = common_pb2.ProducePartitionData(partition=0, records=b"")
    request = common_pb2.ProduceRequest(acks=-1, topics=[common_pb2.ProduceTopicData(
        topic="pt-twice", partitions=[entry, entry])])
    with pytest.raises(grpc.RpcError) as err:
        gw.Produce(request, timeout=CALL_TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "appears more than once" in str(
        err.value.details())
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
