"""Values the clients hand to and receive from their callers.

Records and metadata are NamedTuples: a consumer builds one per record, and a
tuple is the cheapest Python object that still has field names. Descriptions
returned by Admin are frozen dataclasses: few, and read by people.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from clients.common.types import TopicPartition

__all__ = ["TopicPartition"]  # defined with the wire's shared types, re-exported for callers

Headers = list[tuple[str, bytes]]


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed. offset is -1 with acks=0 (nobody says)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


class FailedRecord(NamedTuple):
    """A record the producer could not deliver, as its delivery callback gets it on failure.

    `callback(metadata, error)` gets RecordMetadata with error None on success, and this with
    the error on failure, so a callback can tell which record failed (confluent-kafka's
    msg.key()/value(), Kafka's onCompletion metadata with offset -1). The first four fields
    are RecordMetadata's, so code reading .topic/.partition/.offset works for both; offset
    is always -1 (nothing acknowledged) and partition -1 when none was chosen.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Headers


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int


class OffsetAndTimestamp(NamedTuple):
    """The first offset whose timestamp is >= the one asked, and that record's timestamp."""

    offset: int
    timestamp_ms: int


@dataclass(frozen=True)
class PartitionDescription:
    partition: int
    leader: int  # -1: offline
    leader_epoch: int
    replicas: tuple[int, ...]  # AR, preferred leader first
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()


@dataclass(frozen=True)
class TopicDescription:
    name: str
    topic_id: str
    partitions: tuple[PartitionDescription, ...]
    # Every topic config with the value in force (the topic's own, else the default) ...
    config: dict[str, int | bool | str | float] = field(default_factory=dict)
    # ... and where it comes from, as Kafka's DescribeConfigs says: TOPIC_CONFIG or DEFAULT_CONFIG.
    config_sources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeDescription:
    node_id: int
    host: str
    port: int
    rack: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int  # -1: no active controller
    controller_epoch: int
    controller_address: str
    brokers: tuple[NodeDescription, ...]
    gateways: tuple[NodeDescription, ...]
    etcd_space: EtcdSpace | None = None  # None: the controller has not read etcd's status yet


@dataclass(frozen=True)
class EtcdSpace:
    """How full etcd's database is: at quota_bytes etcd raises its NOSPACE alarm and refuses
    every write (deploy/README.md, etcd's space)."""

    db_size_bytes: int
    db_size_in_use_bytes: int
    quota_bytes: int
    nospace_alarm: bool


@dataclass(frozen=True)
class OngoingReassignment:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


@dataclass(frozen=True)
class TopicCreated:
    name: str
    topic_id: str
    num_partitions: int
    replication_factor: int


@dataclass(frozen=True)
class NewTopic:
    """A topic to create: -1 partitions / replication factor takes the cluster default."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: dict[str, str] = field(default_factory=dict)
    # Explicit assignment: partition -> replicas; then the two counts must be -1.
    assignments: dict[int, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupPartitionOffset:
    """A consumer group's committed offset for one partition and how far behind it is."""

    topic: str
    partition: int
    committed_offset: int  # -1: nothing committed
    end_offset: int  # the high watermark
    lag: (
        int | None
    )  # end_offset - committed_offset; None when nothing is committed (as Kafka's tool shows "-")
    metadata: str = ""


@dataclass(frozen=True)
class GroupListing:
    """One consumer group as `highwater groups list` shows it."""

    group_id: str
    state: str  # "Empty", "Stable", "Reconciling", "Assigning"
    members: int
    group_epoch: int


@dataclass(frozen=True)
class GroupMemberDescription:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    member_epoch: int
    assignment: list[TopicPartition]  # what it owns now (or is giving up)
    target_assignment: list[TopicPartition]  # what the coordinator wants it to own
    state: str


@dataclass(frozen=True)
class ConsumerGroupDescription:
    """A consumer group: its members and what they own, and its committed offsets with lag."""

    group_id: str
    state: str
    group_epoch: int
    target_epoch: int
    assignor: str
    members: list[GroupMemberDescription]
    offsets: list[GroupPartitionOffset]
