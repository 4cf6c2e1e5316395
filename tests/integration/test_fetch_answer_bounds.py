"""Fetch answers are bounded by the broker's --fetch-max-bytes, whatever the client asks (issue 37).

A reviewer's Fetch v12 asking max_bytes = partition_max_bytes = 2^31-1 of a 100 MB partition got
100,119,825 bytes in one answer, and four at once took the leader from ~200 MiB to 1.1 GiB RSS.
Here one broker runs with --fetch-max-bytes 4 MiB over a partition of ~30 MB, and every way of
reading it asks for everything: a raw Kafka Fetch v12, a gRPC Fetch to the broker and to the
gateway, Subscribe and ConsumeRecords. Each answer (or pushed message) stays within the bound but
for one batch (the first, returned whole: KIP-74), and reading on gets every record.
"""

from __future__ import annotations

import datetime
import io
import os
import socket
import struct
import time
from functools import partial
from typing import Any

import grpc
import pytest

from clients.common.record_batch import iter_batch_headers
from clients.common.records import Record, encode_batch
from protos.highwater.v1 import broker_pb2_grpc, common_pb2, gateway_pb2, gateway_pb2_grpc
from services.kafka import protocol
from tests.integration.helpers import consumer_fetch, create_topic, gateway_stub, produce_batch, wait_for
from tests.integration.test_kafka_protocol import read_answer

pytestmark = pytest.mark.integration

FETCH_MAX_BYTES = 4 * 1024 * 1024  # the broker's --fetch-max-bytes here
ASK_EVERYTHING = 2**31 - 1
BATCH_BYTES = 1_000_000  # under the default max.message.bytes (1 MiB + 12)
BATCHES = 30  # ~30 MB in the partition
# An answer may pass the bound by its first batch at most (KIP-74), plus the answer's own framing.
ANSWER_BYTES_MAX = FETCH_MAX_BYTES + BATCH_BYTES + 64 * 1024
CALL_TIMEOUT_S = 30.0
RECEIVE_ANYTHING = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]
TOPIC = "bounded-fetch"


@pytest.fixture
def filled(make_cluster: Any) -> Any:
    """One broker with --fetch-max-bytes 4 MiB (and a Kafka listener), TOPIC-0 holding ~30 MB."""
    c = make_cluster(brokers=1, broker_args=["--fetch-max-bytes", str(FETCH_MAX_BYTES)])
    gw = gateway_stub(c.gateway_address)
    assert create_topic(gw, TOPIC, partitions=1, replication_factor=1).error_code == common_pb2.NONE
    for i in range(BATCHES):
        batch = encode_batch([Record(None, os.urandom(BATCH_BYTES - 100), [], int(time.time() * 1000))])
        result = wait_for(partial(_produced, gw, batch), timeout_s=CALL_TIMEOUT_S, what=f"batch {i} written")
        assert result is not None and result.error_code == common_pb2.NONE, result
    return c


def _produced(gw: Any, batch: bytes) -> common_pb2.ProducePartitionResponse | None:
    """The produce result, or None while the new topic's leader is not known yet (retry)."""
    result = produce_batch(gw, TOPIC, 0, batch, timeout=CALL_TIMEOUT_S)
    not_yet = (
        common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
        common_pb2.NOT_LEADER_OR_FOLLOWER,
        common_pb2.LEADER_NOT_AVAILABLE,
    )
    return None if result.error_code in not_yet else result


def batches_in(records: bytes) -> int:
    headers = list(iter_batch_headers(records))
    assert sum(h.size_bytes for h in headers) == len(records), "whole batches only"
    return len(headers)


def kafka_fetch_v12(address: tuple[str, int]) -> tuple[int, Any]:
    """A raw Kafka Fetch v12 asking everything from offset 0: (answer frame bytes, decoded answer)."""
    request_cls = protocol.request_class(protocol.FETCH, 12)
    mod = __import__(request_cls.__module__, fromlist=["x"])
    body = request_cls(
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=0,
        max_bytes=ASK_EVERYTHING,
        topics=(
            mod.FetchTopic(
                topic=TOPIC,
                partitions=(
                    mod.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=ASK_EVERYTHING),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_writer
    from kio.static.primitive import i16, i32

    buf = io.BytesIO()
    header = RequestHeader(
        request_api_key=i16(protocol.FETCH), request_api_version=i16(12), correlation_id=i32(7), client_id="t"
    )
    entity_writer(RequestHeader)(buf, header)
    entity_writer(request_cls)(buf, body)
    frame = buf.getvalue()
    with socket.create_connection(address, timeout=CALL_TIMEOUT_S) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", receive(s, 4))
        answer = receive(s, size)
    return size, read_answer(protocol.FETCH, 12, answer)


def receive(s: socket.socket, size: int) -> bytes:
    """Exactly size bytes (MSG_WAITALL returns early on a socket with a timeout)."""
    out = bytearray()
    while len(out) < size:
        chunk = s.recv(min(size - len(out), 1 << 20))
        assert chunk, "the broker closed the connection mid-answer"
        out += chunk
    return bytes(out)


def test_a_kafka_fetch_v12_asking_for_everything_gets_at_most_fetch_max_bytes(filled: Any) -> None:
    address = ("127.0.0.1", int(filled.processes["broker-1"].info["kafka_port"]))
    size, answer = kafka_fetch_v12(address)
    part = answer.responses[0].partitions[0]
    assert part.error_code == 0 and part.high_watermark == BATCHES
    assert size <= ANSWER_BYTES_MAX, f"a {size}-byte answer; the broker's bound is {FETCH_MAX_BYTES}"
    assert batches_in(bytes(part.records)) >= FETCH_MAX_BYTES // BATCH_BYTES


def test_a_grpc_fetch_to_the_broker_asking_for_everything_gets_at_most_fetch_max_bytes(filled: Any) -> None:
    info = filled.processes["broker-1"].info
    with grpc.insecure_channel(f"127.0.0.1:{info['port']}", options=RECEIVE_ANYTHING) as channel:
        answer = broker_pb2_grpc.BrokerServiceStub(channel).Fetch(  # type: ignore[no-untyped-call]
            consumer_fetch(TOPIC, 0, max_bytes=ASK_EVERYTHING, partition_max_bytes=ASK_EVERYTHING),
            timeout=CALL_TIMEOUT_S,
        )
    part = answer.topics[0].partitions[0]
    assert part.error_code == common_pb2.NONE and part.high_watermark == BATCHES
    assert answer.ByteSize() <= ANSWER_BYTES_MAX, answer.ByteSize()
    assert batches_in(part.records) >= FETCH_MAX_BYTES // BATCH_BYTES


def test_the_gateways_fetch_subscribe_and_consume_records_are_bounded_too(filled: Any) -> None:
    # A client that would take any answer (gRPC's default refuses above 4 MiB): the bound is the server's.
    with grpc.insecure_channel(filled.gateway_address.split(",")[0], options=RECEIVE_ANYTHING) as channel:
        read_everything_through_the_gateway(gateway_pb2_grpc.GatewayServiceStub(channel))  # type: ignore[no-untyped-call]


def read_everything_through_the_gateway(gw: gateway_pb2_grpc.GatewayServiceStub) -> None:
    answer = gw.Fetch(
        consumer_fetch(TOPIC, 0, max_bytes=ASK_EVERYTHING, partition_max_bytes=ASK_EVERYTHING),
        timeout=CALL_TIMEOUT_S,
    )
    assert answer.topics[0].partitions[0].error_code == common_pb2.NONE
    assert 0 < answer.ByteSize() <= ANSWER_BYTES_MAX, answer.ByteSize()

    # Subscribe: every pushed message within the bound, and the stream reaches the HW.
    pushed = gw.Subscribe(
        gateway_pb2.SubscribeRequest(
            partitions=[gateway_pb2.SubscribePartition(topic=TOPIC, partition=0, start_offset=0)],
            max_bytes=ASK_EVERYTHING,
        ),
        timeout=CALL_TIMEOUT_S,
    )
    sizes: list[int] = []
    try:
        for message in pushed:
            assert message.error_code == common_pb2.NONE, message.error_message
            sizes.append(message.ByteSize())
            if message.next_offset >= BATCHES:
                break
    finally:
        pushed.cancel()
    assert max(sizes) <= ANSWER_BYTES_MAX, sizes
    assert len(sizes) >= BATCHES * BATCH_BYTES // ANSWER_BYTES_MAX

    # ConsumeRecords: one record per batch here; each stream message within the bound.
    consumed = gw.ConsumeRecords(
        gateway_pb2.ConsumeRecordsRequest(
            topic=TOPIC, default_start_offset=0, max_records=BATCHES, partition_max_bytes=ASK_EVERYTHING
        ),
        timeout=CALL_TIMEOUT_S,
    )
    sizes = []
    offsets: list[int] = []
    for message in consumed:
        assert not message.errors, message.errors
        sizes.append(message.ByteSize())
        offsets.extend(r.offset for r in message.records)
    assert offsets == list(range(BATCHES))
    assert max(sizes) <= ANSWER_BYTES_MAX, sizes
