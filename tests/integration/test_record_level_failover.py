"""ProduceRecords through a leader failover: the gateway's own retries and the client's
retries of a request id write every record exactly once, in order."""

from __future__ import annotations

import time

import grpc
import pytest

from protos.highwater.v1 import common_pb2, gateway_pb2
from tests.integration.helpers import create_topic, describe_partition, gateway_stub

pytestmark = pytest.mark.integration

REQUESTS = 60
RECORDS_PER_REQUEST = 50
# Short on purpose: calls that span the failover time out at the client, which retries
# them with the same request id while the gateway finishes the first attempt.
CLIENT_CALL_TIMEOUT_S = 2.0
RETRY_FOR_S = 60.0


def _produce_with_retries(
    gw, request: gateway_pb2.ProduceRecordsRequest
) -> tuple[gateway_pb2.ProduceRecordsResponse, int]:
    """The answer, and how many times the client had to resend the same request id."""
    deadline = time.monotonic() + RETRY_FOR_S
    resent = 0
    while True:
        try:
            return gw.ProduceRecords(request, timeout=CLIENT_CALL_TIMEOUT_S), resent
        except grpc.RpcError as exc:
            if (
                exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
                or time.monotonic() > deadline
            ):
                raise
            resent += 1


def test_a_leader_killed_mid_stream_leaves_no_duplicates_and_no_gaps(make_cluster):
    c = make_cluster(brokers=3)
    gw = gateway_stub(c.gateway_address)
    assert create_topic(gw, "rl-failover", partitions=1, configs={"min.insync.replicas": "2"}).error_code == 0
    leader = describe_partition(gw, "rl-failover", 0).leader
    sent: list[bytes] = []
    offsets: list[int] = []
    resent = 0
    for n in range(REQUESTS):
        values = [f"{n:03d}-{i:03d}".encode() for i in range(RECORDS_PER_REQUEST)]
        request = gateway_pb2.ProduceRecordsRequest(
            topic="rl-failover",
            request_id=f"req-{n}",
            timeout_ms=30_000,
            records=[gateway_pb2.ProducerRecord(key=b"k", value=v) for v in values],
        )
        answer, again = _produce_with_retries(gw, request)
        resent += again
        assert {r.error_code for r in answer.results} == {common_pb2.NONE}, answer.results[0].error_message
        offsets.extend(r.offset for r in answer.results)
        sent.extend(values)
        if n == REQUESTS // 3:
            c.kill_broker(leader)
    assert offsets == list(range(REQUESTS * RECORDS_PER_REQUEST)), "every record acknowledged once, no gaps"
    got = [
        r.value
        for m in gw.ConsumeRecords(
            gateway_pb2.ConsumeRecordsRequest(
                topic="rl-failover", default_start_offset=-2, max_records=len(sent)
            ),
            timeout=60,
        )
        for r in m.records
    ]
    assert got == sent, "the log holds every record once, in the order sent"
    print(f"client resends of a request id during the failover: {resent}")
