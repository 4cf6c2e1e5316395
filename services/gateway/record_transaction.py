"""ProduceRecords with a `transactional_id` (issue 41; docs/GRPC.md): the request's records as one
transaction, for callers with nothing but a gRPC stub.

The gateway does what our Python Producer does for a transaction, within the request's timeout:
InitProducerId for the id (a new epoch: any earlier request or producer with the id is fenced,
its open transaction aborted), AddPartitionsToTxn for every partition the records go to, the
batches (transactional, numbered from 0 per partition under the new epoch) to the leaders, then
EndTxn: commit when every batch was written, else abort. All through the gateway's own
transaction coordinator door (transaction_calls.py), so the decision is the same etcd state a
Kafka client's would be.

All or nothing is the point, so one refused record fails the request: it answers its own error,
and every other record INVALID_TXN_STATE naming it. A commit whose outcome the deadline left
unknown answers REQUEST_TIMED_OUT for every record (read_committed readers will see all of them
or none; which, the caller learns by reading).

Owned by the gateway's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from protos.highwater.v1 import common_pb2, gateway_pb2
from services.common import limits
from services.gateway import record_level
from services.gateway.record_level import ProducePlan
from services.gateway.transaction_calls import GatewayTransactions

SendProduce = Callable[[common_pb2.ProduceRequest], Awaitable[common_pb2.ProduceResponse]]
Results = dict[int, gateway_pb2.RecordResult]

# Answers a step waits out and tries again within the request's deadline.
RETRIABLE = frozenset({common_pb2.CONCURRENT_TRANSACTIONS, common_pb2.COORDINATOR_NOT_AVAILABLE})
RETRY_BACKOFF_S = 0.05


async def produce_in_transaction(
    request: gateway_pb2.ProduceRecordsRequest,
    plan: ProducePlan,
    *,
    transactions: GatewayTransactions,
    send: SendProduce,
    batch_bytes_max: int,
    records_per_batch_max: int,
    deadline: float,
) -> Results:
    """Every record's result: all written in one committed transaction, or none."""
    every = range(len(request.records))
    if plan.refused:
        first = min(plan.refused)
        return _all_failed(every, plan, first, *plan.refused[first])
    tid = request.transactional_id
    timeout_ms = max(1, int((deadline - time.monotonic()) * 1000))
    init = await _until_done(
        lambda: transactions.init_producer_id(
            common_pb2.InitProducerIdRequest(
                transactional_id=tid,
                # The transaction must not outlive the request: a gateway that dies mid-request
                # leaves it to the coordinator's timeout.
                transaction_timeout_ms=min(timeout_ms, limits.TRANSACTION_TIMEOUT_MS_MAX),
                producer_id=-1,
                producer_epoch=-1,
            )
        ),
        deadline,
    )
    if init.error_code != common_pb2.NONE:
        return _all_failed(
            every, plan, None, init.error_code, f"starting the transaction: {init.error_message}"
        )
    pid, epoch = init.producer_id, init.producer_epoch
    added = await _until_done(
        lambda: transactions.add_partitions(
            gateway_pb2.AddPartitionsToTxnRequest(
                transactional_id=tid,
                producer_id=pid,
                producer_epoch=epoch,
                partitions=[
                    common_pb2.TopicPartition(topic=request.topic, partition=p)
                    for p in sorted(plan.by_partition)
                ],
            )
        ),
        deadline,
    )
    if added.error_code != common_pb2.NONE:
        return await _aborted(
            transactions, request, plan, pid, epoch, deadline, None, added.error_code, added.error_message
        )
    writes = [
        _write_partition(
            request, partition, indexes, pid, epoch, send, batch_bytes_max, records_per_batch_max, deadline
        )
        for partition, indexes in plan.by_partition.items()
    ]
    results: Results = {}
    failure: tuple[int, common_pb2.ErrorCode, str] | None = None
    for written, failed in await asyncio.gather(*writes):
        results.update(written)
        if failed is not None and (failure is None or failed[0] < failure[0]):
            failure = failed
    if failure is not None:
        return await _aborted(transactions, request, plan, pid, epoch, deadline, *failure)
    ended = await _until_done(
        lambda: transactions.end_txn(
            gateway_pb2.EndTxnRequest(
                transactional_id=tid, producer_id=pid, producer_epoch=epoch, commit=True
            )
        ),
        deadline,
    )
    if ended.error_code != common_pb2.NONE:
        return _all_failed(
            every, plan, None, ended.error_code, f"committing the transaction: {ended.error_message}"
        )
    return results


async def _write_partition(
    request: gateway_pb2.ProduceRecordsRequest,
    partition: int,
    indexes: list[int],
    producer_id: int,
    producer_epoch: int,
    send: SendProduce,
    batch_bytes_max: int,
    records_per_batch_max: int,
    deadline: float,
) -> tuple[Results, tuple[int, common_pb2.ErrorCode, str] | None]:
    """The partition's batches, PRODUCER_BATCHES_KEPT a Produce, in order; the first failure
    (its first record's index, code, message) stops it."""
    records = request.records
    now_ms = int(time.time() * 1000)
    batches = record_level.cut_batches(records, indexes, batch_bytes_max, records_per_batch_max)
    results: Results = {}
    sequence = 0
    for start in range(0, len(batches), limits.PRODUCER_BATCHES_KEPT):
        group = batches[start : start + limits.PRODUCER_BATCHES_KEPT]
        encoded = []
        for batch in group:
            encoded.append(
                record_level.encode_records(
                    records,
                    batch,
                    now_ms=now_ms,
                    compression=request.compression,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    base_sequence=sequence,
                    transactional=True,
                )
            )
            sequence = record_level.next_sequence(sequence, len(batch))
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        flat = [i for batch in group for i in batch]
        if remaining_ms <= 0:
            return results, (flat[0], common_pb2.REQUEST_TIMED_OUT, "the request's timeout_ms ran out")
        produce = common_pb2.ProduceRequest(
            acks=-1, timeout_ms=remaining_ms, transactional_id=request.transactional_id
        )
        produce.topics.add(topic=request.topic).partitions.add(partition=partition, records=b"".join(encoded))
        answer = (await send(produce)).topics[0].partitions[0]
        if answer.error_code != common_pb2.NONE:
            return results, (flat[0], answer.error_code, answer.error_message)
        timestamps = [
            records[i].timestamp_ms if records[i].HasField("timestamp_ms") else now_ms for i in flat
        ]
        results.update(
            record_level.written_results(
                flat, partition, answer.base_offset, timestamps, answer.log_append_time_ms
            )
        )
    return results, None


async def _aborted(
    transactions: GatewayTransactions,
    request: gateway_pb2.ProduceRecordsRequest,
    plan: ProducePlan,
    producer_id: int,
    producer_epoch: int,
    deadline: float,
    first: int | None,
    code: common_pb2.ErrorCode,
    message: str,
) -> Results:
    """Abort the transaction (what was written is never read at read_committed) and answer."""
    await _until_done(
        lambda: transactions.end_txn(
            gateway_pb2.EndTxnRequest(
                transactional_id=request.transactional_id,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                commit=False,
            )
        ),
        deadline,
    )
    return _all_failed(range(len(request.records)), plan, first, code, message)


def _all_failed(
    every: range, plan: ProducePlan, first: int | None, code: common_pb2.ErrorCode, message: str
) -> Results:
    """`first` (when one record failed the transaction) answers its own error; the others say
    why they were not written."""
    partition_of = {i: p for p, indexes in plan.by_partition.items() for i in indexes}
    cause = f"record {first} was refused ({message})" if first is not None else message
    results: Results = {}
    for i in every:
        if i in plan.refused:
            own = plan.refused[i]
        elif i == first or first is None:
            own = (code, message)
        else:
            own = (
                common_pb2.INVALID_TXN_STATE,
                f"not written: the request's transaction was aborted: {cause}",
            )
        results.update(record_level.failed_results([i], partition_of.get(i, -1), *own))
    return results


async def _until_done(call: Callable[[], Awaitable[Any]], deadline: float) -> Any:
    """`call()` again while it answers a retriable code and the deadline allows."""
    while True:
        answer = await call()
        if answer.error_code not in RETRIABLE or time.monotonic() + RETRY_BACKOFF_S >= deadline:
            return answer
        await asyncio.sleep(RETRY_BACKOFF_S)
