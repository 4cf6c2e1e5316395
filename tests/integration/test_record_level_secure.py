"""The record-level calls with TLS, ACLs and request limits on: the gateway writes and reads
for its client's principal (Write on the topic to produce, Read to consume), gets its
producer id on the client's behalf, cuts its batches to the brokers' limits, and a refused
client has nothing written and nothing read."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protos.highwater.v1 import common_pb2, gateway_pb2
from tests.integration.conftest import TestCluster
from tests.integration.helpers import wait_for
from tests.integration.test_security import (
    CALL_TIMEOUT_S,
    acl_cluster,
    alice_writes_and_reads,
    create_topics_as_admin,
    gw,
    topics_seen,
)

pytestmark = pytest.mark.integration

TAF = common_pb2.TOPIC_AUTHORIZATION_FAILED
# Tight request limits, which the gateway's own batches must respect at the brokers.
MAX_BATCH_RECORDS = 100
MAX_REQUEST_BYTES = 256 * 1024


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = acl_cluster(
        tmp_path_factory.mktemp("secure-records"),
        "--max-batch-records",
        str(MAX_BATCH_RECORDS),
        "--max-request-bytes",
        str(MAX_REQUEST_BYTES),
    )
    c.start()
    try:
        for name in ("alice", "mallory"):
            c.issue_client_certificate(name)
        create_topics_as_admin(c, "rls-ok")
        alice_writes_and_reads(c, "rls-", "--prefixed")
        wait_for(
            lambda: "rls-ok" in topics_seen(c, "alice"),
            timeout_s=10,
            what="alice's ACLs to reach the gateway",
        )
        yield c
    finally:
        c.stop()


def test_a_client_with_write_and_read_produces_and_consumes_records(secure):
    records = [gateway_pb2.ProducerRecord(key=f"k{i}".encode(), value=b"v") for i in range(20)]
    resp = gw(secure, "alice").ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(topic="rls-ok", records=records, request_id="alice-1"),
        timeout=CALL_TIMEOUT_S,
    )
    assert [r.error_code for r in resp.results] == [common_pb2.NONE] * 20, resp.results[0].error_message
    got = [
        r
        for m in gw(secure, "alice").ConsumeRecords(
            gateway_pb2.ConsumeRecordsRequest(topic="rls-ok", default_start_offset=-2, max_records=20),
            timeout=CALL_TIMEOUT_S,
        )
        for r in m.records
    ]
    assert sorted(r.key for r in got) == sorted(r.key for r in records)


def test_a_client_without_acls_has_every_record_refused_and_reads_nothing(secure):
    resp = gw(secure, "mallory").ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(
            topic="rls-ok", records=[gateway_pb2.ProducerRecord(value=b"x")] * 3
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert [(r.error_code, r.offset) for r in resp.results] == [(TAF, -1)] * 3
    messages = list(
        gw(secure, "mallory").ConsumeRecords(
            gateway_pb2.ConsumeRecordsRequest(topic="rls-ok", default_start_offset=-2), timeout=CALL_TIMEOUT_S
        )
    )
    assert [(len(m.records), [e.error_code for e in m.errors]) for m in messages] == [(0, [TAF])]


def test_the_gateways_batches_stay_within_the_brokers_record_and_request_limits(secure):
    records = [gateway_pb2.ProducerRecord(value=bytes(200), partition=1) for _ in range(1000)]
    resp = gw(secure, "alice").ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(topic="rls-ok", records=records), timeout=CALL_TIMEOUT_S
    )
    assert {r.error_code for r in resp.results} == {common_pb2.NONE}, resp.results[0].error_message
    offsets = [r.offset for r in resp.results]
    assert offsets == list(range(offsets[0], offsets[0] + 1000))
