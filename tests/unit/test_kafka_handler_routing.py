"""KafkaHandler's routing (services/kafka/handler.py): each request's ACL decision belongs to that
request and its connection, never to whatever ran before it in the same task."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any, cast

from services.kafka import protocol
from services.kafka.handler import KafkaHandler
from tests.unit.test_kafka_acl_rules import TOPIC_AUTHORIZATION_FAILED, access
from tests.unit.test_kafka_protocol import FakeBackend, module_of, request_frame


def produce_request(topic: str) -> protocol.Request:
    cls = protocol.request_class(protocol.PRODUCE, 9)
    mod = module_of(cls)
    body = cls(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(
            mod.TopicProduceData(
                name=topic, partition_data=(mod.PartitionProduceData(index=0, records=b"b"),)
            ),
        ),
    )
    return protocol.decode_request(request_frame(protocol.PRODUCE, 9, body))


def test_a_refusal_on_one_connection_does_not_follow_the_next_request_in_the_same_task() -> None:
    backend = FakeBackend()
    broker_wide = KafkaHandler(cast(Any, backend))  # no ACLs: the listener's handler without --authorizer
    refused_connection = broker_wide.for_connection(access())  # may write nothing

    async def both() -> tuple[Any, Any]:
        # Awaited in turn in one task: nothing of the first request's decision may linger.
        return await refused_connection.handle(produce_request("t")), await broker_wide.handle(
            produce_request("t")
        )

    refused, written = asyncio.run(both())
    assert refused.responses[0].partition_responses[0].error_code == TOPIC_AUTHORIZATION_FAILED
    assert written.responses[0].partition_responses[0].error_code != TOPIC_AUTHORIZATION_FAILED
    (sent,) = backend.produced
    assert [t.topic for t in sent.topics] == ["t"], "the request without ACLs reached the log"
