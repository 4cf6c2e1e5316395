"""What every family of Kafka calls shares: the backend and access ports, the per-connection
context, each request's ACL decision, and the small helpers of their answers.

The families (data_calls.py, fetch_calls.py, admin_calls.py, group_calls.py, txn_calls.py) each hold one
ConnectionContext; handler.py composes them and routes each API key to one of them. Pure: no
sockets, no clock (the listener owns the connection, backend.py the I/O).
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode as K

from clients.common.topics import group_id_problem
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import broker_pb2, common_pb2
from services.common.metadata_cache import MetadataCache
from services.groups import offset_commits
from services.groups.errors import GroupError
from services.kafka import acl_rules, fetch_sessions, protocol
from services.kafka.acl_rules import Decision
from services.kafka.classic_groups import Group, JoinAnswer, SyncAnswer, coordinator_of
from services.kafka.protocol import build, nested
from services.security import authz
from services.transactions.coordinator import (
    DescribedTransaction,
    TransactionListing,
    TxnAnswer,
    TxnError,
    TxnRequest,
)

log = logging.getLogger("highwater.kafka")

NO_THROTTLE = datetime.timedelta(0)
TOPIC_REFUSED = common_pb2.TOPIC_AUTHORIZATION_FAILED
NOT_AUTHORIZED = "not authorized by the cluster's ACLs (docs/KAFKA.md, Security)"
_ALLOW_ALL: acl_rules.Allowed = lambda operation, resource: True  # noqa: E731


@dataclass(frozen=True)
class RequestAcl:
    """The ACL decision of one request and the check behind it (Metadata's and ListGroups' full
    listings ask it per name). Made per request by KafkaHandler.handle and passed to the call that
    answers it: a connection's requests may be in progress together (listener.py), so the
    decision is the request's, never the connection's."""

    decision: Decision
    allowed: acl_rules.Allowed


# Without ACLs: nothing refused.
NO_ACL = RequestAcl(Decision(), _ALLOW_ALL)


class KafkaAccess(Protocol):
    """The authenticated connection's principal and the authorizer's answers for it."""

    @property
    def principal(self) -> str: ...

    def allowed(self, operation: authz.Operation, resource: authz.Resource) -> bool: ...

    def allowed_any(self, operation: authz.Operation, resource_type: authz.ResourceType) -> bool: ...


@dataclass(frozen=True)
class KafkaBroker:
    """A registered broker as Kafka clients must reach it: its Kafka listener's address."""

    broker_id: int
    host: str
    kafka_port: int
    rack: str


@dataclass(frozen=True)
class ReplicaLogSize:
    """One replica's log in a DescribeLogDirs answer (Kafka's DescribeLogDirsPartition)."""

    topic: str
    partition: int
    size_bytes: int
    offset_lag: int  # the high watermark minus the log end offset, at least 0 (Kafka's, for a current log)


@dataclass(frozen=True)
class LogDirDescription:
    """A log directory of this broker and the replicas in it (Kafka's DescribeLogDirsResult)."""

    path: str
    total_bytes: int  # of its volume; -1: unknown
    usable_bytes: int
    replicas: tuple[ReplicaLogSize, ...]


class BackendUnavailable(Exception):
    """The controller or etcd could not be reached in time; answered with a retriable code."""


class KafkaBackend(Protocol):
    """What the Kafka listener needs of its broker process (backend.py is the real one)."""

    @property
    def broker_id(self) -> int: ...

    @property
    def metadata(self) -> MetadataCache: ...

    async def produce(
        self, req: common_pb2.ProduceRequest, *, transactional: bool = False
    ) -> common_pb2.ProduceResponse:
        """`transactional`: a transactional producer's batches, verified (txn_calls.py)."""
        ...

    async def fetch(self, req: common_pb2.FetchRequest) -> common_pb2.FetchResponse: ...

    def list_offsets(self, req: common_pb2.ListOffsetsRequest) -> common_pb2.ListOffsetsResponse: ...

    async def delete_records(self, req: common_pb2.DeleteRecordsRequest) -> common_pb2.DeleteRecordsResponse:
        """The partitions this broker leads; answered when their ISR has the new log start."""
        ...

    def log_dirs(self, wanted: Collection[tuple[str, int]] | None) -> list[LogDirDescription]:
        """This broker's log directories with its replicas (leaders and followers) among
        `wanted` (None: all of them)."""
        ...

    def offsets_for_leader_epoch(
        self, req: broker_pb2.OffsetsForLeaderEpochRequest
    ) -> broker_pb2.OffsetsForLeaderEpochResponse: ...

    async def kafka_brokers(self) -> list[KafkaBroker]:
        """Registered brokers with a Kafka listener; raises BackendUnavailable."""
        ...

    async def cluster_id(self) -> str: ...

    async def call_controller(self, rpc: str, request: Any) -> Any:
        """One call to the active controller; raises BackendUnavailable."""
        ...

    async def commit_offsets(self, group: str, offsets: list[OffsetCommit]) -> tuple[int, str]:
        """Store commits made from outside the group's membership: (common_pb2 code, message) for
        all of them; NON_EMPTY_GROUP while the group has members. Raises BackendUnavailable."""
        ...

    async def committed_offsets(self, group: str) -> dict[tuple[str, int], OffsetCommit]:
        """The group's committed offsets. Raises BackendUnavailable."""
        ...

    @property
    def classic_groups(self) -> ClassicGroupsPort: ...

    async def stored_groups(self, group: str | None = None) -> list[StoredGroupListing]:
        """The groups etcd holds (committed offsets, KIP-848 state), or only `group`.
        Raises BackendUnavailable."""
        ...

    async def delete_group(self, group: str) -> tuple[GroupError, str]:
        """DeleteGroups for one group (NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND as Kafka).
        Raises BackendUnavailable."""
        ...

    async def delete_offsets(
        self, group: str, partitions: list[tuple[str, int]]
    ) -> tuple[GroupError, str, dict[tuple[str, int], GroupError]]:
        """OffsetDelete: the group's error and message, each partition's error.
        Raises BackendUnavailable."""
        ...

    @property
    def transactions(self) -> TransactionsPort: ...

    def open_transaction_epoch(self, tp: TopicPartitionKey, producer_id: int) -> int | None:
        """The epoch of the producer's open transaction on a partition this broker leads (its
        producer state); None when it has none there, or this broker does not lead it."""
        ...

    async def consumer_group_member_check(self, group: str, member_id: str, member_epoch: int) -> GroupError:
        """KIP-447 for a KIP-848 group: whether a member at this epoch may commit in a
        transaction (services/transactions/group_fencing.py). Raises BackendUnavailable."""
        ...


class TransactionsPort(Protocol):
    """The transaction coordinator on this broker (services/transactions/hosting.py's
    TransactionHost). Every call raises BackendUnavailable when etcd cannot be reached."""

    async def handle(self, request: TxnRequest) -> TxnAnswer: ...

    async def describe(self, transactional_ids: Sequence[str]) -> list[DescribedTransaction]: ...

    async def listing(
        self, states: Sequence[str], producer_ids: Sequence[int], duration_ms: int
    ) -> tuple[list[TransactionListing], list[str]]: ...

    async def produce_refusals(
        self,
        transactional_id: str,
        req: common_pb2.ProduceRequest,
        open_epoch: Callable[[TopicPartitionKey, int], int | None],
    ) -> dict[TopicPartitionKey, TxnError]: ...


class ClassicGroupsPort(Protocol):
    """The classic groups this broker coordinates (group_driver.py: the core plus its waits)."""

    async def join(self, **request: Any) -> JoinAnswer: ...

    async def sync(
        self, *, group_id: str, member_id: str, generation: int, assignments: dict[str, bytes]
    ) -> SyncAnswer: ...

    def heartbeat(self, *, group_id: str, member_id: str, generation: int) -> GroupError: ...

    def leave(self, *, group_id: str, member_ids: Sequence[str]) -> list[GroupError]: ...

    def commit_check(self, group_id: str, member_id: str, generation: int) -> GroupError: ...

    def groups(self) -> list[Group]: ...

    def group(self, group_id: str) -> Group | None: ...


@dataclass(frozen=True)
class StoredGroupListing:
    """A group etcd holds: its Kafka state name (Empty without members) and member count."""

    group_id: str
    state: str
    members: int


# One partition's commit, as services/groups/offset_commits.py (the rules of commits) takes it.
OffsetCommit = offset_commits.Commit


@dataclass(frozen=True)
class ConnectionContext:
    """What every call family of one connection's handler reads: the broker's backend and fetch
    sessions (shared by all connections), the connection's access (None: no ACLs) and the
    broker's --max-batch-records (0: no bound beyond the batch size). Never changed: a
    connection with another principal gets its own (KafkaHandler.for_connection)."""

    backend: KafkaBackend
    access: KafkaAccess | None
    max_batch_records: int
    fetch_session_cache: fetch_sessions.FetchSessionCache


def ms(value: datetime.timedelta) -> int:
    return int(value.total_seconds() * 1000)


def topic_uuid(topic_id: str) -> uuid.UUID:
    """A topic id as Kafka's UUID; the nil UUID for one that is not (or not yet) known."""
    try:
        return uuid.UUID(topic_id)
    except ValueError:
        return uuid.UUID(int=0)


class Refused(Exception):
    """A whole request refused by the ACLs: code is the Kafka error it is answered with."""

    def __init__(self, code: K, message: str) -> None:
        super().__init__(message)
        self.code = code


def group_refusal(group_id: str, acl: RequestAcl) -> K | None:
    """The code a group request is refused with before any work: not authorized, or a bad id."""
    if group_id in acl.decision.groups_refused:
        return K.group_authorization_failed
    return K.invalid_group_id if group_id_problem(group_id) is not None else None


def split_topics(req: Any, refused: frozenset[str]) -> tuple[Any, Any]:
    """(the request without the refused topics, one of the same kind holding only them)."""
    if not refused:
        return req, type(req)()
    kept, denied = type(req)(), type(req)()
    kept.CopyFrom(req)
    del kept.topics[:]
    for t in req.topics:
        (denied if t.topic in refused else kept).topics.append(t)
    return kept, denied


def without_topics(req: Any, refused: frozenset[str]) -> Any:
    """An admin request without the refused topics (DeleteTopics names them in `names`)."""
    narrowed = type(req)()
    narrowed.CopyFrom(req)
    if isinstance(req, common_pb2.DeleteTopicsRequest):
        del narrowed.names[:]
        narrowed.names.extend(n for n in req.names if n not in refused)
    else:
        del narrowed.topics[:]
        narrowed.topics.extend(t for t in req.topics if t.name not in refused)
    return narrowed


def coordinating_broker(brokers: Sequence[KafkaBroker], group_id: str) -> KafkaBroker | None:
    """The broker that coordinates a group (classic_groups.coordinator_of), or None."""
    broker_id = coordinator_of(group_id, [b.broker_id for b in brokers])
    return next((b for b in brokers if b.broker_id == broker_id), None)


async def not_coordinator(context: ConnectionContext, key: str, what: str) -> K | None:
    """None when this broker coordinates `key` (a group id, or a transactional id: both placed by
    classic_groups.coordinator_of over the brokers with a Kafka listener, as FindCoordinator
    answers), else the code that sends the client to FindCoordinator again."""
    try:
        brokers = await context.backend.kafka_brokers()
    except BackendUnavailable as exc:
        log.warning("%s %r: %s", what, key, exc)
        return K.coordinator_not_available
    me = coordinating_broker(brokers, key)
    if me is None:
        return K.coordinator_not_available
    return None if me.broker_id == context.backend.broker_id else K.not_coordinator


def api_versions_response(version: int, error_code: K) -> Any:
    """ApiVersions' answer in `version`: every API key with the versions answered."""
    cls = protocol.response_class(protocol.API_VERSIONS, version)
    api_cls = nested(cls, "ApiVersion")
    return build(
        cls,
        error_code=error_code,
        api_keys=tuple(
            api_cls(api_key=key, min_version=lo, max_version=hi)
            for key, (lo, hi) in sorted(protocol.SUPPORTED_VERSIONS.items())
        ),
        throttle_time=NO_THROTTLE,
    )
