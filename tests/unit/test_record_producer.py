"""The gateway as an idempotent producer (services/gateway/record_producer.py), against a fake
leader that checks sequence numbers as a broker does: numbering in order, concurrent requests
sharing a send, a fresh producer id after a failure, a request id's retry writing nothing."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from clients.common.record_batch import BatchHeader, iter_batch_headers
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.broker.producer_state import ProducerStateManager
from services.common.metadata_cache import MetadataCache
from services.gateway.record_producer import RecordProducer

TOPIC = "t"


class FakeLeader:
    """Appends what it is sent, one partition log per partition, with the broker's producer-state check."""

    def __init__(self, fail_next: int = 0) -> None:
        self.logs: dict[int, int] = {}
        self.state: dict[int, ProducerStateManager] = {}
        self.sends = 0
        self.fail_next = fail_next
        self.next_producer_id = 1000
        self.release = asyncio.Event()
        self.release.set()

    async def produce(self, request: common_pb2.ProduceRequest) -> common_pb2.ProduceResponse:
        await self.release.wait()
        self.sends += 1
        pd = request.topics[0].partitions[0]
        headers = list(iter_batch_headers(pd.records))
        if self.fail_next:
            self.fail_next -= 1
            return _answer(pd.partition, common_pb2.REQUEST_TIMED_OUT, -1)
        state = self.state.setdefault(pd.partition, ProducerStateManager())
        duplicate = state.check(headers)
        if duplicate is not None:
            return _answer(pd.partition, common_pb2.NONE, duplicate.first_offset)
        base = self.logs.get(pd.partition, 0)
        state.update(_with_offsets(headers, base))
        self.logs[pd.partition] = base + sum(h.records_count for h in headers)
        return _answer(pd.partition, common_pb2.NONE, base)

    async def init_producer_id(
        self, request: common_pb2.InitProducerIdRequest
    ) -> common_pb2.InitProducerIdResponse:
        self.next_producer_id += 1
        return common_pb2.InitProducerIdResponse(producer_id=self.next_producer_id, producer_epoch=0)


def _with_offsets(headers: list[BatchHeader], base: int) -> list[BatchHeader]:
    """The headers as the leader stores them: offsets assigned from `base`."""
    out, offset = [], base
    for h in headers:
        out.append(dataclasses.replace(h, base_offset=offset))
        offset += h.records_count
    return out


def _answer(partition: int, code: int, base_offset: int) -> common_pb2.ProduceResponse:
    return common_pb2.ProduceResponse(
        topics=[
            common_pb2.ProduceTopicResponse(
                topic=TOPIC,
                partitions=[
                    common_pb2.ProducePartitionResponse(
                        partition=partition,
                        error_code=code,
                        base_offset=base_offset,
                        log_append_time_ms=-1,
                        error_message="" if not code else "timed out",
                    )
                ],
            )
        ]
    )


def _producer(leader: FakeLeader, partitions: int = 2) -> RecordProducer:
    cache = MetadataCache(
        brokers={1: common_pb2.BrokerNode(broker_id=1, host="h", port=1)},
        partitions={
            (TOPIC, p): common_pb2.PartitionState(topic=TOPIC, partition=p, leader=1)
            for p in range(partitions)
        },
    )

    async def refresh() -> None:
        return None

    return RecordProducer(cache, leader.produce, leader.init_producer_id, refresh)


def _request(count: int, *, partition: int = 0, request_id: str = "") -> gateway_pb2.ProduceRecordsRequest:
    return gateway_pb2.ProduceRecordsRequest(
        topic=TOPIC,
        request_id=request_id,
        records=[gateway_pb2.ProducerRecord(value=b"v", partition=partition) for _ in range(count)],
    )


@pytest.mark.asyncio
async def test_requests_to_one_partition_are_numbered_in_order_and_get_consecutive_offsets():
    leader = FakeLeader()
    producer = _producer(leader)
    first = await producer.produce(_request(3))
    second = await producer.produce(_request(2))
    assert [r.offset for r in first.results] + [r.offset for r in second.results] == [0, 1, 2, 3, 4]


@pytest.mark.asyncio
async def test_requests_arriving_during_a_send_share_the_next_one():
    leader = FakeLeader()
    producer = _producer(leader)
    leader.release.clear()
    tasks = [asyncio.ensure_future(producer.produce(_request(2)))]
    await asyncio.sleep(0.01)  # the first send is in flight, held by the leader
    tasks += [asyncio.ensure_future(producer.produce(_request(2))) for _ in range(3)]
    await asyncio.sleep(0.01)
    leader.release.set()
    answers = await asyncio.gather(*tasks)
    assert sorted(r.offset for a in answers for r in a.results) == list(range(8))
    assert leader.sends == 2, "the first request went alone, the three that queued behind it together"


@pytest.mark.asyncio
async def test_after_a_failed_send_the_partition_writes_under_a_fresh_producer_id():
    leader = FakeLeader(fail_next=1)
    producer = _producer(leader)
    failed = await producer.produce(_request(2))
    assert {r.error_code for r in failed.results} == {common_pb2.REQUEST_TIMED_OUT}
    assert {r.offset for r in failed.results} == {-1}
    written = await producer.produce(_request(2))
    assert [r.offset for r in written.results] == [0, 1]
    assert leader.next_producer_id == 1002, "one id at first, a fresh one after the failure"


@pytest.mark.asyncio
async def test_a_retry_with_the_same_request_id_gets_the_first_answer_and_writes_nothing():
    leader = FakeLeader()
    producer = _producer(leader)
    first = await producer.produce(_request(3, request_id="r1"))
    again = await producer.produce(_request(3, request_id="r1"))
    assert first == again
    assert leader.logs == {0: 3}
    other = await producer.produce(_request(1, request_id="r2"))
    assert other.results[0].offset == 3


@pytest.mark.asyncio
async def test_a_retry_while_the_first_is_still_running_waits_for_it():
    leader = FakeLeader()
    producer = _producer(leader)
    leader.release.clear()
    first = asyncio.ensure_future(producer.produce(_request(2, request_id="r")))
    again = asyncio.ensure_future(producer.produce(_request(2, request_id="r")))
    await asyncio.sleep(0.01)
    leader.release.set()
    assert await first == await again
    assert leader.logs == {0: 2}
