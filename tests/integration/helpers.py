"""Small helpers for integration tests: raw gateway calls and bounded waits.

The tests here talk gRPC directly (the protos are the contract); the client
library has its own tests in test_clients.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from clients.common.records import Record, decode_batches, encode_batch
from coordinator.store import EtcdStore
from protos.highwater.v1 import common_pb2, gateway_pb2_grpc

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T], *, timeout_s: float, interval_s: float = 0.05, what: str = "condition"
) -> T:
    """Poll until condition() is truthy; fail the test with `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last: T = condition()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
        last = condition()
    return last


def gateway_stub(address: str) -> gateway_pb2_grpc.GatewayServiceStub:
    channel = grpc.insecure_channel(address.split(",")[0])
    return gateway_pb2_grpc.GatewayServiceStub(channel)


def create_topic(
    gw: gateway_pb2_grpc.GatewayServiceStub,
    name: str,
    *,
    partitions: int = 3,
    replication_factor: int = 3,
    configs: dict[str, str] | None = None,
) -> common_pb2.TopicResult:
    resp = gw.CreateTopics(
        common_pb2.CreateTopicsRequest(
            topics=[
                common_pb2.CreatableTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=replication_factor,
                    configs=configs or {},
                )
            ]
        )
    )
    return resp.topics[0]


def produce(
    gw: gateway_pb2_grpc.GatewayServiceStub,
    topic: str,
    partition: int,
    values: list[bytes],
    *,
    acks: int = -1,
    timeout_ms: int = 10_000,
    key: bytes | None = None,
) -> common_pb2.ProducePartitionResponse:
    now = int(time.time() * 1000)
    batch = encode_batch([Record(key, v, [], now) for v in values])
    return produce_batch(gw, topic, partition, batch, acks=acks, timeout_ms=timeout_ms)


def produce_batch(
    gw: gateway_pb2_grpc.GatewayServiceStub,
    topic: str,
    partition: int,
    batch: bytes,
    *,
    acks: int = -1,
    timeout_ms: int = 10_000,
    timeout: float | None = None,
) -> common_pb2.ProducePartitionResponse:
    """Produce one encoded batch (as it is, valid or not) to one partition; that partition's result."""
    resp = gw.Produce(
        common_pb2.ProduceRequest(
            acks=acks,
            timeout_ms=timeout_ms,
            topics=[
                common_pb2.ProduceTopicData(
                    topic=topic,
                    partitions=[common_pb2.ProducePartitionData(partition=partition, records=batch)],
                )
            ],
        ),
        timeout=timeout,
    )
    return resp.topics[0].partitions[0]


def consumer_fetch(
    topic: str,
    partition: int,
    offset: int = 0,
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
    max_bytes: int = 0,
    partition_max_bytes: int = 0,
) -> common_pb2.FetchRequest:
    """A consumer's Fetch (replica_id -1, current_leader_epoch -1) of one partition from offset."""
    return common_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        topics=[
            common_pb2.FetchTopic(
                topic=topic,
                partitions=[
                    common_pb2.FetchPartition(
                        partition=partition,
                        fetch_offset=offset,
                        partition_max_bytes=partition_max_bytes,
                        current_leader_epoch=-1,
                    )
                ],
            )
        ],
    )


def fetch_all(
    gw: gateway_pb2_grpc.GatewayServiceStub,
    topic: str,
    partition: int,
    *,
    start: int = 0,
    timeout_s: float = 10.0,
) -> list[Record]:
    """Every record below the HW, from start on."""
    out: list[Record] = []
    offset = start
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sizes = {"max_bytes": 8 << 20, "partition_max_bytes": 4 << 20}
        resp = gw.Fetch(consumer_fetch(topic, partition, offset, min_bytes=1, **sizes))
        pr = resp.topics[0].partitions[0]
        if pr.error_code != common_pb2.NONE:
            time.sleep(0.1)
            continue
        records = [r for r in decode_batches(pr.records) if r.offset >= offset]
        out.extend(records)
        if records:
            offset = records[-1].offset + 1
        if offset >= pr.high_watermark:
            return out
    raise AssertionError(f"could not read {topic}-{partition} up to its high watermark within {timeout_s} s")


def partition_metadata(
    gw: gateway_pb2_grpc.GatewayServiceStub, topic: str, partition: int
) -> common_pb2.PartitionMetadata:
    md = gw.Metadata(common_pb2.MetadataRequest(topics=[topic]))
    return next(p for p in md.topics[0].partitions if p.partition == partition)


def describe_partition(
    gw: gateway_pb2_grpc.GatewayServiceStub, topic: str, partition: int
) -> common_pb2.PartitionState:
    resp = gw.DescribeCluster(common_pb2.DescribeClusterRequest())
    return next(p for p in resp.partitions if p.topic == topic and p.partition == partition)


def etcd_value(endpoint: str, key: str) -> bytes | None:
    """The value of one etcd key (None when absent), read with a short-lived store."""

    async def get() -> bytes | None:
        store = await EtcdStore.connect(endpoint)
        try:
            kv = await store.get(key)
            return kv.value if kv is not None else None
        finally:
            await store.close()

    return asyncio.run(get())
