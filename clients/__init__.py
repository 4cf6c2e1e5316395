"""Highwater's clients: Producer, Consumer and Admin, each synchronous and asyncio, and the CLI.

Layering follows aiokafka's and the protocol stack (STYLE.md):

    records.py        RecordBatch v2 encode/decode (per batch, in C)
    connection.py     grpc.aio channels to the gateways, failover, typed errors
    metadata.py       topic -> partitions cache from Metadata
    partitioner.py    Kafka's murmur2 key partitioner and sticky keyless partitioning
    accumulator.py    per-partition batching (pure)      idempotence.py  sequence numbers (pure)
    sender.py         the producer's I/O task
    producer.py, consumer.py, admin.py   the public clients
    cli.py            the `highwater` command

Importing `clients` gives the public names below.
"""

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
