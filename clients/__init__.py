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
    subscription_state.py, consumer_fetcher.py, consumer_coordinator.py, group_member.py
                      the consumer's parts (positions, fetching, its group), behind consumer.py
    producer.py, consumer.py, admin.py   the public clients
    tools/            operator tools: the `highwater` command, the local cluster launcher

Importing `clients` gives the public names below. They are loaded on first use (PEP 562),
so importing `clients.common` (as every service does) does not load the client library,
its gRPC channels and its threads.
"""

from __future__ import annotations

from types import ModuleType
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
        FailedRecord,
        NewTopic,
        OffsetAndTimestamp,
        PartitionDescription,
        RecordMetadata,
        TopicDescription,
        TopicPartition,
    )

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "ClientClosed",
    "ClusterDescription",
    "Consumer",
    "ConsumerRecord",
    "FailedRecord",
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
    """PEP 562: a public name, imported from its module on first use."""
    home: ModuleType
    if name in ("Admin", "AsyncAdmin"):
        from clients import admin

        home = admin
    elif name in ("AsyncConsumer", "Consumer"):
        from clients import consumer

        home = consumer
    elif name in ("ClientClosed", "GatewayUnavailable", "HighwaterError", "InvalidArgument"):
        from clients import errors

        home = errors
    elif name in ("AsyncProducer", "Producer"):
        from clients import producer

        home = producer
    elif name == "SentRecords":
        from clients import sender

        home = sender
    elif name in __all__:
        from clients import types

        home = types
    else:
        raise AttributeError(f"module 'clients' has no attribute {name!r}")
    value = getattr(home, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
