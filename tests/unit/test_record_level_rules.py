"""Who may call the record-level calls: Write on the topic to produce, Read on it (and on the
group, when one is named) to consume. A refusal writes nothing and reads nothing."""

from __future__ import annotations

import pytest

from protos.highwater.v1 import common_pb2, gateway_pb2
from services.security import rules
from services.security.authz import AclBinding, Authorizer
from services.security.identity import Caller

ALICE = Caller("User:alice", authenticated_by="certificate")
AUTHZ = Authorizer(
    [
        AclBinding.of("User:alice", op, rtype, name)  # type: ignore[arg-type]
        for op, rtype, name in (("Write", "Topic", "ok"), ("Read", "Topic", "ok"), ("Read", "Group", "g"))
    ]
)


def access() -> rules.Access:
    return rules.Access(ALICE, AUTHZ, identities_checked=True)


def test_produce_records_to_a_writable_topic_reaches_the_servicer_untouched() -> None:
    req = gateway_pb2.ProduceRecordsRequest(topic="ok", records=[gateway_pb2.ProducerRecord(value=b"v")])
    admission = rules.produce_records(req, access(), rules.Limits())
    assert admission.request is req and admission.answer is None


def test_produce_records_without_write_answers_every_record_and_writes_nothing() -> None:
    req = gateway_pb2.ProduceRecordsRequest(
        topic="no", records=[gateway_pb2.ProducerRecord() for _ in range(3)]
    )
    admission = rules.produce_records(req, access(), rules.Limits())
    assert [(r.error_code, r.offset) for r in admission.answer.results] == [
        (common_pb2.TOPIC_AUTHORIZATION_FAILED, -1)
    ] * 3
    assert "may not Write topic 'no'" in admission.answer.results[0].error_message


def test_consume_records_needs_read_on_the_topic_and_on_a_named_group() -> None:
    ok = gateway_pb2.ConsumeRecordsRequest(topic="ok", group_id="g")
    assert rules.consume_records(ok, access(), rules.Limits()).answer is None
    refused = rules.consume_records(gateway_pb2.ConsumeRecordsRequest(topic="no"), access(), rules.Limits())
    assert [e.error_code for m in refused.answer for e in m.errors] == [common_pb2.TOPIC_AUTHORIZATION_FAILED]
    with pytest.raises(rules.Denied) as denied:
        rules.consume_records(
            gateway_pb2.ConsumeRecordsRequest(topic="ok", group_id="other"), access(), rules.Limits()
        )
    assert denied.value.code == "PERMISSION_DENIED"


def test_record_level_calls_count_against_the_produce_and_fetch_quotas() -> None:
    assert "/highwater.v1.GatewayService/ProduceRecords" in rules.PRODUCE_METHODS
    assert "/highwater.v1.GatewayService/ConsumeRecords" in rules.FETCH_METHODS
