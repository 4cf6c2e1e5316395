"""Whole-request checks of client requests, made before anything is written: pure.

The gateway refuses such a request with INVALID_ARGUMENT; the broker core answers
INVALID_REQUEST for every partition of it (a broker is reached by gateways and, in
plaintext mode, by anyone); the controller answers an InitProducerId it cannot take
with INVALID_REQUEST.
"""

from __future__ import annotations

from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.common import limits


def produce_request_problem(request: common_pb2.ProduceRequest) -> str | None:
    """What makes a Produce unanswerable as a whole (checked before anything is written), or None."""
    if request.acks not in (0, 1, -1):
        return f"acks must be 0, 1 or -1 (all), got {request.acks}"
    if request.timeout_ms < 0:
        return (
            f"timeout_ms must be >= 0 (0: the default, {limits.PRODUCE_TIMEOUT_MS_DEFAULT} ms), got "
            f"{request.timeout_ms}"
        )
    seen: set[TopicPartitionKey] = set()
    for t in request.topics:
        for pd in t.partitions:
            tp = (t.topic, pd.partition)
            if tp in seen:
                # Both would be written and the answer could name only one offset.
                return f"partition {tp[0]}-{tp[1]} appears more than once; send all its batches in one entry"
            seen.add(tp)
    return None


def consumer_fetch_problem(request: common_pb2.FetchRequest) -> str | None:
    """What makes a client's Fetch (through a gateway) unanswerable as a whole, or None."""
    if request.replica_id != -1:
        return (
            f"replica_id must be -1 for a consumer, got {request.replica_id} (ids >= 0 are brokers "
            "fetching as followers, which talk to brokers, not to a gateway)"
        )
    if request.max_wait_ms < 0 or request.min_bytes < 0 or request.max_bytes < 0:
        return "max_wait_ms, min_bytes and max_bytes must be >= 0"
    return None


def init_producer_id_problem(request: common_pb2.InitProducerIdRequest) -> str | None:
    """Why an InitProducerId cannot be answered, or None (ids and epochs as a batch header holds them)."""
    if request.transactional_id:
        return (
            "transactional ids are served by the Kafka listener's InitProducerId (the gRPC API has no "
            "transactions yet, docs/KAFKA.md); send an empty one here"
        )
    if request.producer_id < -1:
        return (
            f"producer_id must be -1 (a new producer) or an id this cluster gave out, "
            f"got {request.producer_id}"
        )
    if not -1 <= request.producer_epoch <= limits.PRODUCER_EPOCH_MAX:
        return (
            f"producer_epoch must be -1 (a new producer) or within [0, {limits.PRODUCER_EPOCH_MAX}] (int16 "
            f"in a batch header), got {request.producer_epoch}"
        )
    if request.producer_id == -1 and request.producer_epoch != -1:
        return f"a new producer (producer_id -1) sends producer_epoch -1, got {request.producer_epoch}"
    return None
