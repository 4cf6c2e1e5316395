"""The exactly-once writer (deliveryGuarantee=exactly-once; issue 41; docs/SPARK.md, Guarantees):
each task writes its rows in one Highwater transaction, and the driver commits every task's
transaction once Spark commits the write, so readers at read_committed see a micro-batch (or a
batch job) whole or not at all, and a replayed micro-batch never twice.

Identity. A streaming task's transactional id is

    {prefix}:{query id}:{Spark partition id}

the same for every micro-batch of the query (a bounded number of ids in etcd, one per Spark
partition), so a task's InitProducerId fences every earlier attempt with its partition id: a
retried or speculative attempt, or a task of a run that died. A batch job's id holds the job's
own id, drawn at planning, instead of the query's.

Replays. Spark replays a micro-batch whose sink commit it did not record (the driver died after
the sink committed and before Spark wrote its commit log). To know, each streaming task's
transaction also commits an offset: `batch id + 1` for partition 0 of the first topic it writes
to, in the consumer group `{prefix}:{query id}:{Spark partition id}` (a group with no members,
shown by `highwater groups list`). The offset becomes visible exactly when the task's records do
(TxnOffsetCommit), so a replayed task that finds its batch's offset committed writes nothing, and
one that does not find it writes, its earlier attempt's open transaction aborted by its
InitProducerId. A replay must see the same rows as the first run, which Spark gives for
replayable sources (this connector's reader, Kafka, files) and deterministic plans.

The driver's part (commit: EndTxn(commit) for every task's transaction; abort: EndTxn(abort))
takes the producer id and epoch each task's commit message carries; a task that was fenced since
(its message is stale) makes the commit fail, and Spark runs the micro-batch again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protos.highwater.v1 import common_pb2, gateway_pb2
from spark_connector.gateway import RETRIABLE_CODES, GatewayClient, HighwaterSparkError, code_name

log = logging.getLogger("highwater.spark")

# The answers a transaction call waits out (the coordinator completing the previous transaction,
# etcd unreachable a moment) besides the connector's retriable codes.
TXN_RETRIABLE_CODES = RETRIABLE_CODES | {
    common_pb2.CONCURRENT_TRANSACTIONS,
    common_pb2.COORDINATOR_NOT_AVAILABLE,
}


def transactional_id(prefix: str, scope: str, partition_id: int) -> str:
    """A task's transactional id (see the module docstring); also its marker group's name."""
    return f"{prefix}:{scope}:{partition_id}"


@dataclass(frozen=True)
class TaskTransaction:
    """What the driver needs to end one task's transaction (carried in its commit message)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


def call_transaction(client: GatewayClient, method: str, request: Any, what: str) -> Any:
    """`method` with retriable answers retried within highwater.retry.timeout.ms;
    HighwaterSparkError naming the code for anything else."""
    answers: list[Any] = []

    def attempt() -> Any | None:
        response = client.call(method, request)
        if response.error_code == common_pb2.NONE:
            return response
        if response.error_code not in TXN_RETRIABLE_CODES:
            raise HighwaterSparkError(f"{what}: {code_name(response.error_code)} {response.error_message}")
        answers.append(response)
        return None

    try:
        return client.retry(what, attempt)
    except HighwaterSparkError as error:
        if answers:
            last = answers[-1]
            raise HighwaterSparkError(
                f"{error} (last answer {code_name(last.error_code)} {last.error_message})"
            ) from None
        raise


def init_transaction(client: GatewayClient, tid: str, timeout_ms: int) -> TaskTransaction:
    """InitProducerId for the task's id: fences every earlier attempt and aborts its transaction."""
    response = call_transaction(
        client,
        "InitProducerId",
        common_pb2.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=timeout_ms, producer_id=-1, producer_epoch=-1
        ),
        f"starting transaction {tid!r}",
    )
    return TaskTransaction(tid, response.producer_id, response.producer_epoch)


def batch_committed(client: GatewayClient, tid: str, marker: tuple[str, int], batch_id: int) -> bool:
    """Whether this task's transaction of micro-batch `batch_id` committed already (its marker
    offset is past the batch)."""
    response = client.call(
        "FetchCommittedOffsets",
        gateway_pb2.FetchCommittedOffsetsRequest(
            group_id=tid, partitions=[common_pb2.TopicPartition(topic=marker[0], partition=marker[1])]
        ),
    )
    if response.error_code != common_pb2.NONE:
        raise HighwaterSparkError(
            f"reading the commit marker of {tid!r}: {code_name(response.error_code)} {response.error_message}"
        )
    return any(o.offset > batch_id for o in response.offsets)


class TransactionalNumbering:
    """BatchNumbering's role for a transactional task: its one producer id and epoch, sequences per
    partition from 0, and each partition added to the transaction before its first batch."""

    def __init__(
        self, txn: TaskTransaction, task: int, add_partition: Callable[[tuple[str, int]], None]
    ) -> None:
        self.txn = txn
        self.task = task
        self._add_partition = add_partition
        self._next: dict[tuple[str, int], int] = {}

    def number(self, tp: tuple[str, int], record_count: int) -> tuple[int, int, int]:
        base = self._next.get(tp)
        if base is None:
            self._add_partition(tp)
            base = 0
        self._next[tp] = base + record_count
        return self.txn.producer_id, self.txn.producer_epoch, base

    @property
    def partitions(self) -> list[tuple[str, int]]:
        return sorted(self._next)


def add_partition(client: GatewayClient, txn: TaskTransaction, tp: tuple[str, int]) -> None:
    call_transaction(
        client,
        "AddPartitionsToTxn",
        gateway_pb2.AddPartitionsToTxnRequest(
            transactional_id=txn.transactional_id,
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            partitions=[common_pb2.TopicPartition(topic=tp[0], partition=tp[1])],
        ),
        f"adding {tp[0]}-{tp[1]} to transaction {txn.transactional_id!r}",
    )


def commit_marker(
    client: GatewayClient, txn: TaskTransaction, marker: tuple[str, int], batch_id: int
) -> None:
    """The offset `batch_id + 1` in the task's marker group, committed with the transaction."""
    what = f"the commit marker of transaction {txn.transactional_id!r}"
    call_transaction(
        client,
        "AddOffsetsToTxn",
        gateway_pb2.AddOffsetsToTxnRequest(
            transactional_id=txn.transactional_id,
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            group_id=txn.transactional_id,
        ),
        what,
    )
    offset = gateway_pb2.OffsetCommitPartition(
        partition=marker[1], offset=batch_id + 1, metadata=MARKER_METADATA, leader_epoch=-1
    )
    call_transaction(
        client,
        "TxnOffsetCommit",
        gateway_pb2.TxnOffsetCommitRequest(
            transactional_id=txn.transactional_id,
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            group_id=txn.transactional_id,
            member_epoch=-1,
            topics=[gateway_pb2.OffsetCommitTopic(topic=marker[0], partitions=[offset])],
        ),
        what,
    )


# What a marker offset's metadata says, for whoever describes the group.
MARKER_METADATA = "Spark exactly-once sink: the next micro-batch this task writes"


def end_transactions(client: GatewayClient, txns: list[TaskTransaction], commit: bool) -> None:
    """EndTxn for every task's transaction, on the driver. A commit that fails raises (Spark then
    runs the write again); an abort that fails is logged (the transaction times out)."""
    started = time.monotonic()
    for txn in txns:
        request = gateway_pb2.EndTxnRequest(
            transactional_id=txn.transactional_id,
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            commit=commit,
        )
        what = f"{'committing' if commit else 'aborting'} transaction {txn.transactional_id!r}"
        if commit:
            call_transaction(client, "EndTxn", request, what)
            continue
        try:
            call_transaction(client, "EndTxn", request, what)
        except HighwaterSparkError as error:
            log.warning("%s failed (%s); it aborts at its transaction timeout", what, error)
    log.info(
        "%s %d transactions in %.0f ms",
        "committed" if commit else "aborted",
        len(txns),
        (time.monotonic() - started) * 1000,
    )
