"""Highwater's clients: Producer, Consumer and Admin, each synchronous and asyncio.

Layering follows aiokafka's and the protocol stack (STYLE.md):

    common/           what both sides of the wire share (errors and codes, the record batch
                      layout and validation, RecordBatch v2 encode/decode, protocol limits,
                      the partitioner, topic rules, the ACL model, the token format);
                      the services import it too
    connection.py     grpc.aio channels to the gateways, failover, typed errors
    metadata.py       topic -> partitions cache from Metadata
    accumulator.py    per-partition batching (pure)      idempotence.py  sequence numbers (pure)
    sender.py         the producer's I/O task
    producer.py, consumer.py, admin.py   the public clients
    tools/            operator tools: the `highwater` command, the local cluster launcher

Importing `clients` gives the public names below. They are loaded on first use (PEP 562),
so importing `clients.common` (as every service does) does not load the client library,
its gRPC channels and its threads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clients.admin import Admin, AsyncAdmin
    from clients.consumer import AsyncConsumer, Consumer
    from clients.errors import ClientClosed, GatewayUnavailable, HighwaterError, InvalidArgument
    from clients.producer import AsyncProducer, Producer
    from clients.sender import SentRecords
    from clients.types import (
        ClusterDescription,
        ConsumerRecord,
        NewTopic,
        OffsetAndTimestamp,
        PartitionDescription,
        RecordMetadata,
        TopicDescription,
        TopicPartition,
    )

# Public name -> the module that defines it.
_HOMES = {
    "Admin": "clients.admin",
    "AsyncAdmin": "clients.admin",
    "AsyncConsumer": "clients.consumer",
    "Consumer": "clients.consumer",
    "ClientClosed": "clients.errors",
    "GatewayUnavailable": "clients.errors",
    "HighwaterError": "clients.errors",
    "InvalidArgument": "clients.errors",
    "AsyncProducer": "clients.producer",
    "Producer": "clients.producer",
    "SentRecords": "clients.sender",
    "ClusterDescription": "clients.types",
    "ConsumerRecord": "clients.types",
    "NewTopic": "clients.types",
    "OffsetAndTimestamp": "clients.types",
    "PartitionDescription": "clients.types",
    "RecordMetadata": "clients.types",
    "TopicDescription": "clients.types",
    "TopicPartition": "clients.types",
}

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "ClientClosed",
    "ClusterDescription",
    "Consumer",
    "ConsumerRecord",
    "GatewayUnavailable",
    "HighwaterError",
    "InvalidArgument",
    "NewTopic",
    "OffsetAndTimestamp",
    "PartitionDescription",
    "Producer",
    "RecordMetadata",
    "SentRecords",
    "TopicDescription",
    "TopicPartition",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'clients' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
