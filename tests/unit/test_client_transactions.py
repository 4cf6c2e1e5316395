"""The transactional producer's state (clients/transactions.py), driven through its seam to the
gateway: a scripted connection that answers each RPC as the coordinator would."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from clients.common.errors import ProducerFenced
from clients.config import ProducerConfig
from clients.errors import HighwaterError, RequestTimedOut, TransactionAbortRequired
from clients.idempotence import IdempotenceState
from clients.transactions import GroupMetadata, TransactionManager, TxnPhase
from clients.types import TopicPartition
from protos.highwater.v1 import common_pb2, gateway_pb2

A0, A1 = TopicPartition("a", 0), TopicPartition("a", 1)


class ScriptedGateway:
    """Answers every call with `answer(rpc, request)` (default: success) and keeps the calls."""

    def __init__(self, answer: Callable[[str, Any], Any] | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.answer = answer or (lambda rpc, request: None)
        self.epoch = 0

    async def call(self, rpc: str, request: Any, **_: Any) -> Any:
        self.calls.append((rpc, request))
        await asyncio.sleep(0)
        scripted = self.answer(rpc, request)
        if scripted is not None:
            return scripted
        if rpc == "InitProducerId":
            self.epoch += 1
            return common_pb2.InitProducerIdResponse(producer_id=7, producer_epoch=self.epoch)
        return getattr(gateway_pb2, f"{rpc}Response")()

    def rpcs(self) -> list[str]:
        return [rpc for rpc, _ in self.calls]


def manager(gateway: ScriptedGateway) -> tuple[TransactionManager, IdempotenceState]:
    config = ProducerConfig(bootstrap="127.0.0.1:1", transactional_id="t", request_timeout_ms=1_000)
    state = IdempotenceState()
    return TransactionManager(config, gateway, state), state  # type: ignore[arg-type]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_transaction_adds_each_partition_once_and_commits():
    gateway = ScriptedGateway()
    txn, state = manager(gateway)

    async def scenario() -> None:
        await txn.init(1_000)
        assert (state.producer_id, state.producer_epoch) == (7, 1)
        await txn.begin()
        # Two requests at once for overlapping partitions share one AddPartitionsToTxn.
        await asyncio.gather(txn.add_partitions([A0, A1], None), txn.add_partitions([A0], None))
        await txn.add_partitions([A1], None)
        txn.start_end(True)
        await txn.end(True, 1_000)

    run(scenario())
    assert gateway.rpcs() == ["InitProducerId", "AddPartitionsToTxn", "EndTxn"]
    added = gateway.calls[1][1]
    assert sorted((p.topic, p.partition) for p in added.partitions) == [("a", 0), ("a", 1)]
    assert gateway.calls[2][1].commit is True
    assert txn.phase is TxnPhase.READY


def test_calls_out_of_order_are_refused_naming_what_to_do():
    txn, _ = manager(ScriptedGateway())
    with pytest.raises(HighwaterError, match="init_transactions"):
        txn.check_send()
    run(txn.init(1_000))
    with pytest.raises(HighwaterError, match="begin_transaction"):
        txn.check_send()
    with pytest.raises(HighwaterError, match="commit_transaction is not allowed"):
        txn.start_end(True)
    with pytest.raises(HighwaterError, match="init_transactions is not allowed"):
        run(txn.init(1_000))


def test_a_failed_record_makes_the_commit_refuse_and_the_abort_bump_the_epoch():
    gateway = ScriptedGateway()
    txn, state = manager(gateway)

    async def scenario() -> None:
        await txn.init(1_000)
        await txn.begin()
        await txn.add_partitions([A0], None)
        txn.start_end(True)
        txn.on_batch_failed(HighwaterError("the leader refused the batch"))
        with pytest.raises(TransactionAbortRequired, match="must be aborted"):
            await txn.end(True, 1_000)
        txn.start_end(False)
        await txn.end(False, 1_000)

    run(scenario())
    assert gateway.rpcs() == ["InitProducerId", "AddPartitionsToTxn", "EndTxn", "InitProducerId"]
    assert gateway.calls[2][1].commit is False
    bump = gateway.calls[3][1]
    assert (bump.producer_id, bump.producer_epoch) == (7, 1), "KIP-360: the current id and epoch"
    assert state.producer_epoch == 2 and txn.phase is TxnPhase.READY


def test_a_fenced_producer_is_done():
    def fenced(rpc: str, request: Any) -> Any:
        if rpc == "EndTxn":
            return gateway_pb2.EndTxnResponse(
                error_code=common_pb2.PRODUCER_FENCED, error_message="epoch 2 is current"
            )
        return None

    txn, _ = manager(ScriptedGateway(fenced))

    async def scenario() -> None:
        await txn.init(1_000)
        await txn.begin()
        await txn.add_partitions([A0], None)
        txn.start_end(True)
        with pytest.raises(ProducerFenced):
            await txn.end(True, 1_000)
        with pytest.raises(ProducerFenced):
            await txn.begin()
        with pytest.raises(ProducerFenced):
            txn.check_send()

    run(scenario())
    assert txn.phase is TxnPhase.FATAL


def test_retriable_answers_are_retried_until_the_timeout_and_the_commit_resumes():
    busy = {"left": 3}

    def concurrent(rpc: str, request: Any) -> Any:
        if rpc == "EndTxn" and busy["left"] > 0:
            busy["left"] -= 1
            return gateway_pb2.EndTxnResponse(error_code=common_pb2.CONCURRENT_TRANSACTIONS)
        return None

    gateway = ScriptedGateway(concurrent)
    txn, _ = manager(gateway)

    async def scenario() -> None:
        await txn.init(1_000)
        await txn.begin()
        await txn.add_partitions([A0], None)
        txn.start_end(True)
        with pytest.raises(RequestTimedOut, match="did not succeed in time"):
            await txn.end(True, 30)  # too short for the back-off: still committing
        assert txn.phase is TxnPhase.COMMITTING
        txn.start_end(True)
        await txn.end(True, 5_000)

    run(scenario())
    assert txn.phase is TxnPhase.READY
    assert gateway.rpcs().count("EndTxn") == 4


def test_offsets_go_to_the_transaction_with_the_consumers_member():
    gateway = ScriptedGateway()
    txn, _ = manager(gateway)

    async def scenario() -> None:
        await txn.init(1_000)
        await txn.begin()
        await txn.send_offsets({A1: 9, A0: 4}, GroupMetadata("g", "member-1", 3), 1_000)
        txn.start_end(True)
        await txn.end(True, 1_000)

    run(scenario())
    assert gateway.rpcs() == ["InitProducerId", "AddOffsetsToTxn", "TxnOffsetCommit", "EndTxn"]
    commit = gateway.calls[2][1]
    assert (commit.group_id, commit.member_id, commit.member_epoch) == ("g", "member-1", 3)
    assert [(t.topic, p.partition, p.offset) for t in commit.topics for p in t.partitions] == [
        ("a", 0, 4),
        ("a", 1, 9),
    ]


def test_an_abort_of_a_transaction_that_added_nothing_sends_no_end():
    gateway = ScriptedGateway()
    txn, _ = manager(gateway)

    async def scenario() -> None:
        await txn.init(1_000)
        await txn.begin()
        txn.start_end(False)
        await txn.end(False, 1_000)
        await txn.begin()

    run(scenario())
    assert gateway.rpcs() == ["InitProducerId"]


A2, A3 = TopicPartition("a", 2), TopicPartition("a", 3)


def test_adds_wanted_while_one_is_in_flight_go_together_in_the_next():
    """One AddPartitionsToTxn at a time: requests for other partitions that arrive while one is
    in flight wait and share the next (concurrent adds would race one compare-and-swap)."""
    gateway = ScriptedGateway()
    txn, _ = manager(gateway)

    async def scenario() -> None:
        await txn.init(1_000)
        await txn.begin()
        await asyncio.gather(
            txn.add_partitions([A0], None, also=[A3]),
            txn.add_partitions([A1], None),
            txn.add_partitions([A2], None),
            txn.add_partitions([A3], None),
        )

    run(scenario())
    adds = [sorted(p.partition for p in request.partitions) for rpc, request in gateway.calls[1:]]
    # The first call names its own partition and the queued one riding along; the rest wait for it.
    assert adds == [[0, 3], [1, 2]]


def test_the_next_transaction_adds_the_last_ones_partitions_at_begin_and_its_end_waits_for_that():
    gateway = ScriptedGateway()
    txn, _ = manager(gateway)

    async def scenario() -> None:
        await txn.init(1_000)
        await txn.begin()
        await txn.add_partitions([A0, A1], None)
        txn.start_end(True)
        await txn.end(True, 1_000)
        await txn.begin()
        await asyncio.sleep(0)  # the early add of a0 and a1 is now in flight
        await txn.add_partitions([A2], None)  # waits for it, then adds a2 alone
        txn.start_end(True)
        await txn.end(True, 1_000)  # after both adds
        # A transaction committed before its early add ran adds nothing and sends no EndTxn.
        await txn.begin()
        txn.start_end(True)
        await txn.end(True, 1_000)
        # An aborted transaction's partitions are not carried on.
        await txn.begin()
        await txn.add_partitions([A3], None)
        txn.start_end(False)
        await txn.end(False, 1_000)
        await txn.begin()
        txn.start_end(True)
        await txn.end(True, 1_000)

    run(scenario())
    assert gateway.rpcs() == [
        "InitProducerId",
        "AddPartitionsToTxn",
        "EndTxn",
        "AddPartitionsToTxn",  # early: a0, a1
        "AddPartitionsToTxn",  # a2
        "EndTxn",
        "AddPartitionsToTxn",  # a3 (a0-a2 were carried, but the commit came before they were added)
        "EndTxn",
    ]
    added = [
        sorted(p.partition for p in r.partitions) for rpc, r in gateway.calls if rpc == "AddPartitionsToTxn"
    ]
    assert added == [[0, 1], [0, 1], [2], [3]]
