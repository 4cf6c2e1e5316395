"""The partition leader's check of a transactional Produce (KIP-890 part 1; issue 41), one rule for
both doors: the Kafka listener (services/kafka/txn_calls.py) and the brokers' gRPC Produce
(services/broker/server.py). Pure: the check over etcd is produce_verifier.py's; this module
finds a Produce's transactional batches and answers the partitions it refused.

A transactional batch may be appended only to a partition in its producer's ongoing transaction.
A partition where the producer already has its transaction open (the leader's producer state,
same epoch) needs nothing more; for the others the coordinator's durable state in etcd says
whether they were added (`rules.verify_partitions`), so a late or stray batch cannot open a
transaction the coordinator will never end.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from clients.common.record_batch import parse_header
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.transactions.coordinator import TxnError


def produce_refusal_message(tp: TopicPartitionKey, error: TxnError) -> str:
    """What a refused partition's answer says."""
    if error in (TxnError.CONCURRENT_TRANSACTIONS, TxnError.COORDINATOR_NOT_AVAILABLE):
        return f"partition {tp[0]}-{tp[1]}: the transaction's state could not be read from etcd: retry"
    return (
        f"partition {tp[0]}-{tp[1]} is not in an ongoing transaction of this producer ({error.value}): "
        "add it first (AddPartitionsToTxn)"
    )


_ERROR_CODE_NAMES = frozenset(common_pb2.ErrorCode.keys())


def produce_error_code(error: TxnError) -> common_pb2.ErrorCode:
    """A refusal's gRPC code: the coordinator's error of the same name."""
    if error.value in _ERROR_CODE_NAMES:
        code: common_pb2.ErrorCode = common_pb2.ErrorCode.Value(error.value)
        return code
    return common_pb2.INVALID_TXN_STATE


def split_refused_produce(
    req: common_pb2.ProduceRequest, refused: Mapping[TopicPartitionKey, TxnError]
) -> tuple[common_pb2.ProduceRequest, dict[TopicPartitionKey, common_pb2.ProducePartitionResponse]]:
    """The Produce without its refused partitions, and the refused partitions' answers."""
    kept = common_pb2.ProduceRequest(
        acks=req.acks, timeout_ms=req.timeout_ms, transactional_id=req.transactional_id
    )
    answers: dict[TopicPartitionKey, common_pb2.ProducePartitionResponse] = {}
    for t in req.topics:
        partitions = []
        for p in t.partitions:
            error = refused.get((t.topic, p.partition))
            if error is None:
                partitions.append(p)
                continue
            answers[(t.topic, p.partition)] = common_pb2.ProducePartitionResponse(
                partition=p.partition,
                error_code=produce_error_code(error),
                error_message=produce_refusal_message((t.topic, p.partition), error),
                base_offset=-1,
                log_append_time_ms=-1,
                log_start_offset=-1,
            )
        if partitions:
            kept.topics.append(common_pb2.ProduceTopicData(topic=t.topic, partitions=partitions))
    return kept, answers


def transactional_batches(req: common_pb2.ProduceRequest) -> dict[tuple[int, int], list[TopicPartitionKey]]:
    """The partitions of a Produce carrying transactional data batches, by (producer id, epoch).
    A batch whose header cannot be read is left to the leader's own validation, which refuses it
    with its reason."""
    by_producer: dict[tuple[int, int], list[TopicPartitionKey]] = {}
    for t in req.topics:
        for p in t.partitions:
            try:
                header = parse_header(p.records)
            except struct.error:
                continue
            if header.is_transactional and not header.is_control:
                by_producer.setdefault((header.producer_id, header.producer_epoch), []).append(
                    (t.topic, p.partition)
                )
    return by_producer
