"""The Kafka listener's transaction calls (services/kafka/txn_calls.py) over the real coordinator
host (services/transactions/hosting.py: driver, rules, state) on the project's in-memory etcd,
with a recording marker writer and producer id source as seams."""

from __future__ import annotations

import asyncio
import datetime
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode as K

from clients.common.record_batch import parse_header
from coordinator import consumer_offsets
from protos.highwater.v1 import common_pb2
from services.kafka import acl_rules, protocol
from services.kafka.handler import KafkaBroker, KafkaHandler
from tests.unit.test_kafka_protocol import FakeBackend

TID = "orders-app-0"
SECOND = datetime.timedelta(seconds=1)
MINUTE = datetime.timedelta(seconds=60)


class TxnBackend(FakeBackend):
    """The fake backend with one Kafka broker (1, so it coordinates every id), whose appends
    keep the leader's producer state of transactions."""

    async def kafka_brokers(self) -> list[KafkaBroker]:
        return [KafkaBroker(1, "127.0.0.1", 19092, "")]

    async def produce(
        self, req: common_pb2.ProduceRequest, *, transactional: bool = False
    ) -> common_pb2.ProduceResponse:
        """The fake's append, and the leader's producer state: a transactional batch opens its
        producer's transaction on the partition (only from a verified transactional request)."""
        assert transactional, "a transactional batch reached the log unverified"
        answer = await super().produce(req)
        for t in req.topics:
            for p in t.partitions:
                header = parse_header(p.records)
                if header.is_transactional:
                    self.open_txn[((t.topic, p.partition), header.producer_id)] = header.producer_epoch
        return answer


def body(api_key: int, version: int, **fields: Any) -> Any:
    return protocol.build(protocol.request_class(api_key, version), **fields)


def request(api_key: int, version: int, payload: Any) -> protocol.Request:
    from tests.unit.test_kafka_protocol import request_frame

    return protocol.decode_request(request_frame(api_key, version, payload))


def run(scenario: Callable[[TxnBackend, KafkaHandler], Awaitable[None]]) -> None:
    async def main() -> None:
        backend = TxnBackend()
        await backend.transactions.refresh_ownership()
        await scenario(backend, KafkaHandler(backend))
        await backend.transactions.driver.drain()

    asyncio.run(main())


async def call(handler: KafkaHandler, api_key: int, version: int, **fields: Any) -> Any:
    return await handler.handle(request(api_key, version, body(api_key, version, **fields)))


async def init(handler: KafkaHandler, version: int = 4) -> tuple[int, int]:
    answer = await call(
        handler, protocol.INIT_PRODUCER_ID, version, transactional_id=TID, transaction_timeout=MINUTE
    )
    assert answer.error_code == K.none, answer
    return answer.producer_id, answer.producer_epoch


def transactional_batch(producer_id: int, epoch: int, sequence: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, 1, producer_id, epoch, sequence, 1 << 20)
    builder.append(0, timestamp=1, key=b"k", value=b"v", headers=[])
    return bytes(builder.build())


async def produce(handler: KafkaHandler, records: bytes, transactional_id: str | None = TID) -> Any:
    mod = sys.modules[protocol.request_class(protocol.PRODUCE, 9).__module__]
    answer = await call(
        handler,
        protocol.PRODUCE,
        9,
        transactional_id=transactional_id,
        acks=-1,
        timeout=SECOND,
        topic_data=(
            mod.TopicProduceData(
                name="t", partition_data=(mod.PartitionProduceData(index=0, records=records),)
            ),
        ),
    )
    return answer.responses[0].partition_responses[0]


async def add_partitions(
    handler: KafkaHandler, pid: int, epoch: int, *tps: tuple[str, int], version: int = 3
) -> Any:
    mod = sys.modules[protocol.request_class(protocol.ADD_PARTITIONS_TO_TXN, version).__module__]
    topics: dict[str, list[int]] = {}
    for topic, partition in tps:
        topics.setdefault(topic, []).append(partition)
    answer = await call(
        handler,
        protocol.ADD_PARTITIONS_TO_TXN,
        version,
        v3_and_below_transactional_id=TID,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=tuple(
            mod.AddPartitionsToTxnTopic(name=t, partitions=tuple(ps)) for t, ps in topics.items()
        ),
    )
    return {
        (t.name, p.partition_index): p.partition_error_code
        for t in answer.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


def test_find_coordinator_names_the_transaction_coordinator() -> None:
    async def scenario(backend: TxnBackend, handler: KafkaHandler) -> None:
        answer = await call(handler, protocol.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=(TID,))
        (found,) = answer.coordinators
        assert (found.error_code, found.node_id, found.port) == (K.none, 1, 19092)
        answer = await call(handler, protocol.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("",))
        assert answer.coordinators[0].error_code == K.invalid_request
        answer = await call(handler, protocol.FIND_COORDINATOR, 4, key_type=2, coordinator_keys=(TID,))
        assert answer.coordinators[0].error_code == K.invalid_request

    run(scenario)


def test_a_commit_end_to_end_writes_markers_and_publishes_offsets_with_it() -> None:
    async def scenario(backend: TxnBackend, handler: KafkaHandler) -> None:
        pid, epoch = await init(handler)
        assert (pid, epoch) == (5000, 0)
        # KIP-890: a batch for a partition the coordinator has not added is refused, unwritten.
        refused = await produce(handler, transactional_batch(pid, epoch))
        assert refused.error_code == K.invalid_txn_state and not backend.produced
        assert await add_partitions(handler, pid, epoch, ("t", 0)) == {("t", 0): K.none}
        assert (await produce(handler, transactional_batch(pid, epoch))).error_code != K.invalid_txn_state
        assert len(backend.produced) == 1
        # Further batches need no etcd read: the leader's producer state has the transaction open.
        answer = await call(
            handler,
            protocol.ADD_OFFSETS_TO_TXN,
            3,
            transactional_id=TID,
            producer_id=pid,
            producer_epoch=epoch,
            group_id="g",
        )
        assert answer.error_code == K.none
        mod = sys.modules[protocol.request_class(protocol.TXN_OFFSET_COMMIT, 3).__module__]
        answer = await call(
            handler,
            protocol.TXN_OFFSET_COMMIT,
            3,
            transactional_id=TID,
            group_id="g",
            producer_id=pid,
            producer_epoch=epoch,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=(
                mod.TxnOffsetCommitRequestTopic(
                    name="t",
                    partitions=(
                        mod.TxnOffsetCommitRequestPartition(
                            partition_index=0,
                            committed_offset=41,
                            committed_leader_epoch=3,
                            committed_metadata=None,
                        ),
                    ),
                ),
            ),
        )
        assert answer.topics[0].partitions[0].error_code == K.none
        assert await consumer_offsets.committed_offsets(backend.store, "g") == {}, "not before the commit"
        answer = await call(
            handler,
            protocol.END_TXN,
            3,
            transactional_id=TID,
            producer_id=pid,
            producer_epoch=epoch,
            committed=True,
        )
        assert answer.error_code == K.none
        await backend.transactions.driver.drain()
        assert backend.markers.marked() == {(pid, epoch, True, ("t", 0))}
        committed = await consumer_offsets.committed_offsets(backend.store, "g")
        assert committed[("t", 0)]["offset"] == 41

    run(scenario)


def test_a_fenced_producer_gets_the_code_its_version_knows() -> None:
    async def scenario(backend: TxnBackend, handler: KafkaHandler) -> None:
        old_pid, old_epoch = await init(handler)
        pid, epoch = await init(handler)
        assert (pid, epoch) == (old_pid, old_epoch + 1)
        for version, code in ((1, K.invalid_producer_epoch), (2, K.producer_fenced), (3, K.producer_fenced)):
            codes = await add_partitions(handler, old_pid, old_epoch, ("t", 0), version=version)
            assert codes == {("t", 0): code}, version
        # The zombie's batches are refused by the leader too (it never added the partition).
        answer = await produce(handler, transactional_batch(old_pid, old_epoch))
        assert answer.error_code == K.invalid_producer_epoch and not backend.produced

    run(scenario)


def test_add_partitions_refuses_the_whole_request_for_one_unknown_partition() -> None:
    async def scenario(backend: TxnBackend, handler: KafkaHandler) -> None:
        pid, epoch = await init(handler)
        codes = await add_partitions(handler, pid, epoch, ("t", 0), ("nope", 0))
        assert codes == {("t", 0): K.operation_not_attempted, ("nope", 0): K.unknown_topic_or_partition}
        answer = await call(
            handler,
            protocol.END_TXN,
            3,
            transactional_id=TID,
            producer_id=pid,
            producer_epoch=epoch,
            committed=True,
        )
        assert answer.error_code == K.invalid_txn_state, "nothing was begun"

    run(scenario)


def test_describe_and_list_show_the_open_transaction() -> None:
    async def scenario(backend: TxnBackend, handler: KafkaHandler) -> None:
        pid, epoch = await init(handler)
        await add_partitions(handler, pid, epoch, ("t", 0))
        answer = await call(handler, protocol.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(TID, "unknown"))
        found, missing = answer.transaction_states
        assert (found.error_code, found.transaction_state, found.producer_id) == (K.none, "Ongoing", pid)
        assert [(t.topic, t.partitions) for t in found.topics] == [("t", (0,))]
        assert missing.error_code == K.transactional_id_not_found
        answer = await call(
            handler,
            protocol.LIST_TRANSACTIONS,
            1,
            state_filters=("Ongoing", "Bogus"),
            producer_id_filters=(),
            duration_filter=-1,
        )
        assert [(t.transactional_id, t.transaction_state) for t in answer.transaction_states] == [
            (TID, "Ongoing")
        ]
        assert answer.unknown_state_filters == ("Bogus",)
        answer = await call(
            handler,
            protocol.END_TXN,
            3,
            transactional_id=TID,
            producer_id=pid,
            producer_epoch=epoch,
            committed=False,
        )
        assert answer.error_code == K.none
        await backend.transactions.driver.drain()
        assert backend.markers.marked() == {(pid, epoch, False, ("t", 0))}

    run(scenario)


def test_transactional_ids_are_refused_without_write_rights() -> None:
    def deny_writes(operation: Any, resource: Any) -> bool:
        return operation.value not in ("Write",)

    for api_key, version, fields in (
        (protocol.INIT_PRODUCER_ID, 4, {"transactional_id": TID, "transaction_timeout": MINUTE}),
        (
            protocol.END_TXN,
            3,
            {"transactional_id": TID, "producer_id": 1, "producer_epoch": 0, "committed": True},
        ),
        (protocol.FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": (TID,)}),
    ):
        decision = acl_rules.decide(
            api_key, body(api_key, version, **fields), deny_writes, lambda o, t: False
        )
        assert decision.transactional_refused, api_key
    listing = body(
        protocol.LIST_TRANSACTIONS, 1, state_filters=(), producer_id_filters=(), duration_filter=-1
    )
    assert not acl_rules.decide(
        protocol.LIST_TRANSACTIONS, listing, deny_writes, lambda o, t: False
    ).transactional_refused
    group_find = body(protocol.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=("g",))
    assert not acl_rules.decide(
        protocol.FIND_COORDINATOR, group_find, deny_writes, lambda o, t: False
    ).transactional_refused


def test_ids_no_producer_can_have_are_answered_not_raised() -> None:
    """Found by the Kafka fuzz test: an empty transactional id reached etcd's key builder."""

    async def scenario(backend: TxnBackend, handler: KafkaHandler) -> None:
        answer = await call(handler, protocol.DESCRIBE_TRANSACTIONS, 0, transactional_ids=("", "x" * 2_000))
        assert [s.error_code for s in answer.transaction_states] == [K.transactional_id_not_found] * 2
        refused = await produce(handler, transactional_batch(5000, 0), transactional_id="")
        assert refused.error_code == K.invalid_request and not backend.produced

    run(scenario)
