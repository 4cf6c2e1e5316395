"""Kafka requests -> the broker's own calls -> Kafka answers.

Each API is one method that turns kio's request object into the protobuf request the gRPC
servicers pass to the same ReplicaManager (so Produce gets the same validation, sequence checks
and purgatory) or the controller, and the answer back into kio's response class of the asked
version. Fields are named as in the newest version and `build` drops the ones an older version
lacks, so one method serves every version in protocol.SUPPORTED_VERSIONS.

No sockets and no clock here: the listener owns the connection, the backend (backend.py) the
I/O and the broker the fetch session cache's clock, so a unit test drives this with a fake
backend.
"""

from __future__ import annotations

import contextvars
import datetime
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode as K

from clients.common.record_batch import iter_batch_headers
from clients.common.topics import (
    TOPIC_CONFIG_SCHEMA,
    effective_topic_configs,
    group_id_problem,
    topic_configs_from_proto,
)
from protos.highwater.v1 import broker_pb2, common_pb2
from services.broker import metrics
from services.common import limits
from services.common.metadata_cache import MetadataCache
from services.groups import offset_commits
from services.kafka import acl_rules, config_changes, fetch_sessions, protocol
from services.kafka.acl_rules import Decision
from services.kafka.classic_groups import (
    CONSUMER_PROTOCOL_TYPE,
    Group,
    JoinAnswer,
    SyncAnswer,
    coordinator_of,
)
from services.kafka.classic_groups import Error as GroupError
from services.kafka.protocol import Request, build, kafka_error, nested
from services.security import authz

log = logging.getLogger("highwater.kafka")

_NO_THROTTLE = datetime.timedelta(0)
_TOPIC_REFUSED = common_pb2.TOPIC_AUTHORIZATION_FAILED
_ALLOW_ALL: acl_rules.Allowed = lambda operation, resource: True  # noqa: E731


@dataclass(frozen=True)
class RequestAcl:
    """The ACL decision of the request being answered and the check behind it (Metadata's and
    ListGroups' full listings ask it per name). Set per request task in _ACL."""

    decision: Decision
    allowed: acl_rules.Allowed


_ACL: contextvars.ContextVar[RequestAcl | None] = contextvars.ContextVar("highwater_kafka_acl", default=None)
_NO_ACL = RequestAcl(Decision(), _ALLOW_ALL)


def _acl() -> RequestAcl:
    """The current request's ACL decision (without ACLs: nothing refused)."""
    return _ACL.get() or _NO_ACL


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

    async def produce(self, req: common_pb2.ProduceRequest) -> common_pb2.ProduceResponse: ...

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


def _ms(value: datetime.timedelta) -> int:
    return int(value.total_seconds() * 1000)


_SESSION_ERRORS = {
    fetch_sessions.SessionError.FETCH_SESSION_ID_NOT_FOUND: K.fetch_session_id_not_found,
    fetch_sessions.SessionError.INVALID_FETCH_SESSION_EPOCH: K.invalid_fetch_session_epoch,
}


def _topic_uuid(topic_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(topic_id)
    except ValueError:
        return uuid.UUID(int=0)


class KafkaHandler:
    """Answers decoded Kafka requests for one broker. Owned by the broker's event loop."""

    def __init__(
        self,
        backend: KafkaBackend,
        *,
        max_batch_records: int = 0,
        access: KafkaAccess | None = None,
        fetch_session_cache: fetch_sessions.FetchSessionCache | None = None,
    ) -> None:
        """max_batch_records: the broker's --max-batch-records (0: no bound beyond the batch size).
        access: one authenticated connection's principal and ACLs (None: no ACLs, all allowed).
        fetch_session_cache: the broker's fetch sessions (KIP-227), shared by its connections
        (None: none, every Fetch is served whole)."""
        self.backend = backend
        self.max_batch_records = max_batch_records
        self.access = access
        self.fetch_session_cache = (
            fetch_session_cache if fetch_session_cache is not None else fetch_sessions.without_sessions()
        )
        self._apis: dict[int, Callable[[Request], Awaitable[Any]]] = {
            protocol.API_VERSIONS: self.api_versions,
            protocol.METADATA: self.metadata,
            protocol.PRODUCE: self.produce,
            protocol.FETCH: self.fetch,
            protocol.LIST_OFFSETS: self.list_offsets,
            protocol.DELETE_RECORDS: self.delete_records,
            protocol.DESCRIBE_LOG_DIRS: self.describe_log_dirs,
            protocol.OFFSET_FOR_LEADER_EPOCH: self.offsets_for_leader_epoch,
            protocol.INIT_PRODUCER_ID: self.init_producer_id,
            protocol.CREATE_TOPICS: self.create_topics,
            protocol.DELETE_TOPICS: self.delete_topics,
            protocol.CREATE_PARTITIONS: self.create_partitions,
            protocol.DESCRIBE_CONFIGS: self.describe_configs,
            protocol.ALTER_CONFIGS: self.alter_configs,
            protocol.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            protocol.DESCRIBE_CLUSTER: self.describe_cluster,
            protocol.FIND_COORDINATOR: self.find_coordinator,
            protocol.OFFSET_COMMIT: self.offset_commit,
            protocol.OFFSET_FETCH: self.offset_fetch,
            protocol.JOIN_GROUP: self.join_group,
            protocol.SYNC_GROUP: self.sync_group,
            protocol.HEARTBEAT: self.heartbeat,
            protocol.LEAVE_GROUP: self.leave_group,
            protocol.LIST_GROUPS: self.list_groups,
            protocol.DESCRIBE_GROUPS: self.describe_groups,
            protocol.DELETE_GROUPS: self.delete_groups,
            protocol.OFFSET_DELETE: self.offset_delete,
        }
        missing = set(protocol.SUPPORTED_VERSIONS) - set(self._apis)
        if missing:
            raise RuntimeError(f"advertised Kafka API keys without a handler: {sorted(missing)}")
        unruled = acl_rules.uncovered(protocol.SUPPORTED_VERSIONS)
        if unruled:
            raise RuntimeError(f"advertised Kafka API keys without an ACL rule: {sorted(unruled)}")

    def for_connection(self, access: KafkaAccess) -> KafkaHandler:
        """This handler for one authenticated connection: every request checked against ACLs."""
        return KafkaHandler(
            self.backend,
            max_batch_records=self.max_batch_records,
            access=access,
            fetch_session_cache=self.fetch_session_cache,
        )

    async def handle(self, request: Request) -> Any | None:
        """The answer to one request, or None when Kafka sends none (Produce with acks=0).

        With ACLs, the request's decision (acl_rules.decide) is set for this task first; each API
        answers what it refuses with Kafka's authorization codes and acts on the rest."""
        if self.access is not None:
            decision = acl_rules.decide(
                request.api_key, request.body, self.access.allowed, self.access.allowed_any
            )
            if decision.refuses_anything:
                log.debug(
                    "Kafka API %d for %s: refused cluster=%s topics=%s groups=%s",
                    request.api_key,
                    self.access.principal,
                    decision.cluster_refused,
                    sorted(decision.topics_refused)[:10],
                    sorted(decision.groups_refused)[:10],
                )
            _ACL.set(RequestAcl(decision, self.access.allowed))
        return await self._apis[request.api_key](request)

    # ---- ApiVersions -------------------------------------------------------------------------

    async def api_versions(self, request: Request) -> Any:
        return api_versions_response(request.api_version, K.none)

    # ---- Metadata ----------------------------------------------------------------------------

    async def metadata(self, request: Request) -> Any:
        cls = protocol.response_class(protocol.METADATA, request.api_version)
        body = request.body
        try:
            brokers = await self.backend.kafka_brokers()
            cluster_id = await self.backend.cluster_id()
        except BackendUnavailable as exc:
            # Without etcd this broker cannot say where the others listen; its own address is
            # still right, and a client retries Metadata (every topic LEADER_NOT_AVAILABLE).
            log.warning("Metadata without the broker list: %s", exc)
            brokers, cluster_id = [], ""
        cache = self.backend.metadata
        acl = _acl()
        if body.topics is None or (request.api_version == 0 and not body.topics):
            # A full listing leaves out the topics the principal may not describe.
            names = [
                n for n in sorted(cache.topics()) if acl.allowed(authz.Operation.DESCRIBE, authz.topic(n))
            ]
        else:
            names = []
            for t in body.topics:
                name = getattr(t, "name", None)
                if name is None and getattr(t, "topic_id", None) is not None:
                    name = next(
                        (n for n, tid in cache.topic_ids.items() if _topic_uuid(tid) == t.topic_id), None
                    )
                if name is not None:
                    names.append(name)
        broker_cls = nested(cls, "MetadataResponseBroker")
        topic_cls = nested(cls, "MetadataResponseTopic")
        partition_cls = nested(cls, "MetadataResponsePartition")
        live = {b.broker_id for b in brokers}
        topics = []
        for name in names:
            parts = cache.partitions_of(name)
            if name in acl.decision.topics_refused:
                topics.append(
                    build(
                        topic_cls,
                        error_code=K.topic_authorization_failed,
                        name=name,
                        topic_id=uuid.UUID(int=0),
                        partitions=(),
                    )
                )
                continue
            if not parts:
                topics.append(
                    build(
                        topic_cls,
                        error_code=K.unknown_topic_or_partition,
                        name=name,
                        topic_id=uuid.UUID(int=0),
                        partitions=(),
                    )
                )
                continue
            topics.append(
                build(
                    topic_cls,
                    error_code=K.none,
                    name=name,
                    topic_id=_topic_uuid(cache.topic_ids.get(name, "")),
                    is_internal=False,
                    partitions=tuple(
                        build(
                            partition_cls,
                            error_code=K.none if s.leader >= 0 else K.leader_not_available,
                            partition_index=s.partition,
                            leader_id=s.leader,
                            leader_epoch=s.leader_epoch,
                            replica_nodes=tuple(s.replicas),
                            isr_nodes=tuple(s.isr),
                            offline_replicas=tuple(r for r in s.replicas if r not in live),
                        )
                        for s in parts
                    ),
                )
            )
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            brokers=tuple(
                build(broker_cls, node_id=b.broker_id, host=b.host, port=b.kafka_port, rack=b.rack or None)
                for b in brokers
            ),
            cluster_id=cluster_id or None,
            # Kafka clients send admin requests to the controller named here, which must be a
            # broker they can reach: every broker forwards them to the active controller.
            controller_id=self.backend.broker_id,
            topics=tuple(topics),
        )

    # ---- Produce -----------------------------------------------------------------------------

    async def produce(self, request: Request) -> Any:
        body = request.body
        # Built in place: finished sub-messages handed to a constructor are serialised and parsed
        # again, a copy of every record batch per level.
        req = common_pb2.ProduceRequest(
            acks=body.acks, timeout_ms=max(0, min(_ms(body.timeout), limits.PRODUCE_TIMEOUT_MS_MAX))
        )
        for t in body.topic_data:
            topic = req.topics.add(topic=t.name)
            for p in t.partition_data:
                topic.partitions.add(partition=p.index, records=bytes(p.records or b""))
        if body.acks not in (0, 1, -1):
            resp = _produce_refusal(
                req, common_pb2.INVALID_REQUEST, f"acks must be 0, 1 or -1, got {body.acks}"
            )
        elif body.transactional_id is not None:
            resp = _produce_refusal(
                req, common_pb2.INVALID_REQUEST, "transactions are not supported (docs/KAFKA.md)"
            )
        else:
            resp = await self._produce_authorized(req)
        if body.acks == 0:
            return None
        cls = protocol.response_class(protocol.PRODUCE, request.api_version)
        topic_cls = nested(cls, "TopicProduceResponse")
        part_cls = nested(cls, "PartitionProduceResponse")
        return build(
            cls,
            throttle_time=datetime.timedelta(milliseconds=resp.throttle_time_ms),
            responses=tuple(
                build(
                    topic_cls,
                    name=t.topic,
                    partition_responses=tuple(
                        build(
                            part_cls,
                            index=p.partition,
                            error_code=kafka_error(p.error_code),
                            base_offset=p.base_offset,
                            log_append_time=(
                                datetime.datetime.fromtimestamp(p.log_append_time_ms / 1000, datetime.UTC)
                                if p.log_append_time_ms >= 0
                                else None
                            ),
                            log_start_offset=p.log_start_offset,
                            record_errors=(),
                            error_message=p.error_message or None,
                        )
                        for p in t.partitions
                    ),
                )
                for t in resp.topics
            ),
        )

    async def _produce_authorized(self, req: common_pb2.ProduceRequest) -> common_pb2.ProduceResponse:
        """Partitions of topics the principal may not write answered TOPIC_AUTHORIZATION_FAILED and
        never written; the rest produced, as the gRPC listeners' security rules do."""
        refused = _acl().decision.topics_refused
        if not refused:
            return await self._produce_within_batch_limit(req)
        kept, denied = _split_topics(req, refused)
        resp = await self._produce_within_batch_limit(kept) if kept.topics else common_pb2.ProduceResponse()
        resp.topics.extend(
            _produce_refusal(denied, _TOPIC_REFUSED, "not authorized to Write this topic").topics
        )
        return resp

    async def _produce_within_batch_limit(self, req: common_pb2.ProduceRequest) -> common_pb2.ProduceResponse:
        """The broker's produce, with partitions whose batches break --max-batch-records refused
        INVALID_REQUEST first, as the gRPC listeners' security rules refuse them."""
        if not self.max_batch_records:
            return await self.backend.produce(req)
        refused = common_pb2.ProduceRequest()
        kept = common_pb2.ProduceRequest(acks=req.acks, timeout_ms=req.timeout_ms)
        for t in req.topics:
            for p in t.partitions:
                over = _records_over(p.records, self.max_batch_records)
                target = refused if over else kept
                if not target.topics or target.topics[-1].topic != t.topic:
                    target.topics.add(topic=t.topic)
                target.topics[-1].partitions.append(p)
        resp = await self.backend.produce(kept) if kept.topics else common_pb2.ProduceResponse()
        message = f"a batch is over the limit of {self.max_batch_records} records per batch"
        resp.topics.extend(_produce_refusal(refused, common_pb2.INVALID_REQUEST, message).topics)
        return resp

    # ---- Fetch -------------------------------------------------------------------------------

    async def fetch(self, request: Request) -> Any:
        """A consumer's Fetch, in its fetch session (KIP-227, fetch_sessions.py) if it has one.

        Versions 7+ carry a session id and epoch (4-6 are full Fetches without a session); an
        incremental Fetch reads every partition of its session and answers the changed ones."""
        body = request.body
        cls = protocol.response_class(protocol.FETCH, request.api_version)
        if body.replica_id >= 0:
            # Followers fetch over gRPC only; a Kafka replica fetch would skip the broker-epoch check.
            return build(cls, throttle_time=_NO_THROTTLE, error_code=K.invalid_request, responses=())
        sessions = self.fetch_session_cache
        context = sessions.new_context(
            getattr(body, "session_id", fetch_sessions.INVALID_SESSION_ID),
            getattr(body, "session_epoch", fetch_sessions.FINAL_EPOCH),
            {
                (t.topic, p.partition): fetch_sessions.PartitionRequest(
                    fetch_offset=p.fetch_offset,
                    log_start_offset=getattr(p, "log_start_offset", -1),
                    max_bytes=max(0, p.partition_max_bytes),
                    current_leader_epoch=getattr(p, "current_leader_epoch", -1),
                )
                for t in body.topics
                for p in t.partitions
            },
            [(t.topic, p) for t in getattr(body, "forgotten_topics_data", None) or () for p in t.partitions],
        )
        if isinstance(context, fetch_sessions.SessionErrorContext):
            _export_fetch_session_metrics(sessions, 0)
            return build(
                cls,
                throttle_time=_NO_THROTTLE,
                error_code=_SESSION_ERRORS[context.error],
                session_id=fetch_sessions.INVALID_SESSION_ID,
                responses=(),
            )
        fetch_req = common_pb2.FetchRequest(
            replica_id=-1,
            max_wait_ms=max(0, min(_ms(body.max_wait), limits.FETCH_MAX_WAIT_MS_MAX)),
            min_bytes=max(0, body.min_bytes),
            max_bytes=max(0, body.max_bytes),
            isolation_level=0,
        )
        by_topic: dict[str, common_pb2.FetchTopic] = {}
        for (topic, partition), asked in context.partitions():
            fetch_topic = by_topic.get(topic)
            if fetch_topic is None:
                fetch_topic = by_topic[topic] = fetch_req.topics.add(topic=topic)
            fetch_topic.partitions.add(
                partition=partition,
                fetch_offset=asked.fetch_offset,
                partition_max_bytes=asked.max_bytes,
                current_leader_epoch=asked.current_leader_epoch,
            )
        refused = _acl().decision.topics_refused
        if isinstance(context, fetch_sessions.IncrementalContext) and self.access is not None:
            # The request lists only what changed: every topic of the session is checked again,
            # as Kafka checks each partition of the context on every Fetch.
            allowed = _acl().allowed
            read = acl_rules.TOPIC_OPERATIONS[protocol.FETCH]
            refused = frozenset(t for t in by_topic if not allowed(read, authz.topic(t)))
        kept, denied = _split_topics(fetch_req, refused)
        resp = (
            await self.backend.fetch(kept) if kept.topics or not denied.topics else common_pb2.FetchResponse()
        )
        for t in denied.topics:
            resp.topics.add(topic=t.topic).partitions.extend(
                common_pb2.FetchPartitionResponse(
                    partition=p.partition, error_code=_TOPIC_REFUSED, high_watermark=-1, log_start_offset=-1
                )
                for p in t.partitions
            )
        answers: dict[fetch_sessions.PartitionKey, fetch_sessions.PartitionAnswer] = {}
        for t in resp.topics:
            for p in t.partitions:
                ok = p.error_code == common_pb2.NONE
                answers[(t.topic, p.partition)] = fetch_sessions.PartitionAnswer(
                    has_records=ok and bool(p.records),
                    high_watermark=p.high_watermark if ok else -1,
                    last_stable_offset=p.high_watermark if ok else -1,
                    log_start_offset=p.log_start_offset if ok else -1,
                    has_error=not ok,
                )
        evictions_before = sessions.evictions
        session_answer = context.respond(answers)
        _export_fetch_session_metrics(sessions, sessions.evictions - evictions_before)
        if session_answer.error is not None:
            return build(
                cls,
                throttle_time=_NO_THROTTLE,
                error_code=_SESSION_ERRORS[session_answer.error],
                session_id=session_answer.session_id,
                responses=(),
            )
        answered = set(session_answer.partitions) if len(session_answer.partitions) < len(answers) else None
        topic_cls = nested(cls, "FetchableTopicResponse")
        part_cls = nested(cls, "PartitionData")
        cache = self.backend.metadata
        leader_cls = (
            nested(cls, "LeaderIdAndEpoch") if protocol.has_field(part_cls, "current_leader") else None
        )

        def current_leader(topic: str, partition: int) -> Any:
            state = cache.partitions.get((topic, partition))
            if leader_cls is None or state is None:
                return None
            return leader_cls(leader_id=state.leader, leader_epoch=state.leader_epoch)

        topics = []
        for t in resp.topics:
            parts = []
            for p in t.partitions:
                if answered is not None and (t.topic, p.partition) not in answered:
                    continue  # unchanged since this session's last answer
                extra: dict[str, Any] = {}
                if (
                    p.error_code == common_pb2.NOT_LEADER_OR_FOLLOWER
                    or p.error_code == common_pb2.FENCED_LEADER_EPOCH
                ):
                    leader = current_leader(t.topic, p.partition)
                    if leader is not None:
                        extra["current_leader"] = leader
                ok = p.error_code == common_pb2.NONE
                parts.append(
                    build(
                        part_cls,
                        partition_index=p.partition,
                        error_code=kafka_error(p.error_code),
                        high_watermark=p.high_watermark if ok else -1,
                        # No transactions: everything below the HW is stable.
                        last_stable_offset=p.high_watermark if ok else -1,
                        log_start_offset=p.log_start_offset if ok else -1,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        # Empty, never null: librdkafka refuses a null record set (MessageSetSize -1).
                        records=p.records if ok else b"",
                        **extra,
                    )
                )
            if parts or answered is None:
                topics.append(build(topic_cls, topic=t.topic, partitions=tuple(parts)))
        return build(
            cls,
            throttle_time=datetime.timedelta(milliseconds=resp.throttle_time_ms),
            error_code=kafka_error(resp.error_code),
            session_id=session_answer.session_id,
            responses=tuple(topics),
        )

    # ---- ListOffsets -------------------------------------------------------------------------

    async def list_offsets(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.LIST_OFFSETS, request.api_version)
        list_req = common_pb2.ListOffsetsRequest(
            replica_id=-1,
            topics=[
                common_pb2.ListOffsetsTopic(
                    topic=t.name,
                    partitions=[
                        common_pb2.ListOffsetsPartition(
                            partition=p.partition_index,
                            timestamp=p.timestamp,
                            current_leader_epoch=getattr(p, "current_leader_epoch", -1),
                        )
                        for p in t.partitions
                    ],
                )
                for t in body.topics
            ],
        )
        kept, denied = _split_topics(list_req, _acl().decision.topics_refused)
        resp = (
            self.backend.list_offsets(kept)
            if kept.topics or not denied.topics
            else common_pb2.ListOffsetsResponse()
        )
        for t in denied.topics:
            resp.topics.add(topic=t.topic).partitions.extend(
                common_pb2.ListOffsetsPartitionResponse(
                    partition=p.partition, error_code=_TOPIC_REFUSED, timestamp=-1, offset=-1, leader_epoch=-1
                )
                for p in t.partitions
            )
        topic_cls = nested(cls, "ListOffsetsTopicResponse")
        part_cls = nested(cls, "ListOffsetsPartitionResponse")
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            topics=tuple(
                build(
                    topic_cls,
                    name=t.topic,
                    partitions=tuple(
                        build(
                            part_cls,
                            partition_index=p.partition,
                            error_code=kafka_error(p.error_code),
                            timestamp=p.timestamp,
                            offset=p.offset,
                            leader_epoch=p.leader_epoch,
                        )
                        for p in t.partitions
                    ),
                )
                for t in resp.topics
            ),
        )

    # ---- DeleteRecords -----------------------------------------------------------------------

    async def delete_records(self, request: Request) -> Any:
        """Advance log start offsets of partitions this broker leads (Kafka's clients send each
        leader its own partitions); the others are answered NOT_LEADER_OR_FOLLOWER by the replica
        manager, as Kafka does. Refused topics (Delete) answer TOPIC_AUTHORIZATION_FAILED."""
        body = request.body
        cls = protocol.response_class(protocol.DELETE_RECORDS, request.api_version)
        delete_req = common_pb2.DeleteRecordsRequest(
            timeout_ms=max(0, _ms(body.timeout)),
            topics=[
                common_pb2.DeleteRecordsTopic(
                    topic=t.name,
                    partitions=[
                        common_pb2.DeleteRecordsPartition(partition=p.partition_index, offset=p.offset)
                        for p in t.partitions
                    ],
                )
                for t in body.topics
            ],
        )
        kept, denied = _split_topics(delete_req, _acl().decision.topics_refused)
        resp = await self.backend.delete_records(kept) if kept.topics else common_pb2.DeleteRecordsResponse()
        for t in denied.topics:
            resp.topics.add(topic=t.topic).partitions.extend(
                common_pb2.DeleteRecordsPartitionResponse(
                    partition=p.partition, error_code=_TOPIC_REFUSED, low_watermark=-1
                )
                for p in t.partitions
            )
        topic_cls = nested(cls, "DeleteRecordsTopicResult")
        part_cls = nested(cls, "DeleteRecordsPartitionResult")
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            topics=tuple(
                build(
                    topic_cls,
                    name=t.topic,
                    partitions=tuple(
                        build(
                            part_cls,
                            partition_index=p.partition,
                            low_watermark=p.low_watermark,
                            error_code=kafka_error(p.error_code),
                        )
                        for p in t.partitions
                    ),
                )
                for t in resp.topics
            ),
        )

    # ---- DescribeLogDirs ---------------------------------------------------------------------

    async def describe_log_dirs(self, request: Request) -> Any:
        """This broker's replicas by log directory (Kafka's API 35; admin tools ask every broker):
        each partition's size and offset lag. Needs Describe on the cluster, as Kafka's; refused,
        v3+ answers CLUSTER_AUTHORIZATION_FAILED and older versions no directories, as Kafka does.
        The cleaner's view of a compacted log is on the gRPC DescribeLogDirs (docs/GRPC.md)."""
        cls = protocol.response_class(protocol.DESCRIBE_LOG_DIRS, request.api_version)
        if _acl().decision.cluster_refused:
            return build(
                cls, throttle_time=_NO_THROTTLE, error_code=K.cluster_authorization_failed, results=()
            )
        topics = request.body.topics
        wanted = None if topics is None else {(t.topic, int(p)) for t in topics for p in t.partitions}
        result_cls = nested(cls, "DescribeLogDirsResult")
        topic_cls = nested(cls, "DescribeLogDirsTopic")
        part_cls = nested(cls, "DescribeLogDirsPartition")
        results = []
        for log_dir in self.backend.log_dirs(wanted):
            by_topic: dict[str, list[ReplicaLogSize]] = {}
            for replica in log_dir.replicas:
                by_topic.setdefault(replica.topic, []).append(replica)
            results.append(
                build(
                    result_cls,
                    error_code=K.none,
                    log_dir=log_dir.path,
                    total_bytes=log_dir.total_bytes,
                    usable_bytes=log_dir.usable_bytes,
                    topics=tuple(
                        build(
                            topic_cls,
                            name=name,
                            partitions=tuple(
                                build(
                                    part_cls,
                                    partition_index=r.partition,
                                    partition_size=r.size_bytes,
                                    offset_lag=r.offset_lag,
                                    is_future_key=False,
                                )
                                for r in replicas
                            ),
                        )
                        for name, replicas in sorted(by_topic.items())
                    ),
                )
            )
        return build(cls, throttle_time=_NO_THROTTLE, error_code=K.none, results=tuple(results))

    # ---- OffsetForLeaderEpoch ----------------------------------------------------------------

    async def offsets_for_leader_epoch(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.OFFSET_FOR_LEADER_EPOCH, request.api_version)
        epoch_req = broker_pb2.OffsetsForLeaderEpochRequest(
            replica_id=-1,
            topics=[
                broker_pb2.OffsetsForLeaderEpochTopic(
                    topic=t.topic,
                    partitions=[
                        broker_pb2.OffsetsForLeaderEpochPartition(
                            partition=p.partition,
                            current_leader_epoch=p.current_leader_epoch,
                            leader_epoch=p.leader_epoch,
                        )
                        for p in t.partitions
                    ],
                )
                for t in body.topics
            ],
        )
        kept, denied = _split_topics(epoch_req, _acl().decision.topics_refused)
        resp = (
            self.backend.offsets_for_leader_epoch(kept)
            if kept.topics or not denied.topics
            else broker_pb2.OffsetsForLeaderEpochResponse()
        )
        for t in denied.topics:
            resp.topics.add(topic=t.topic).partitions.extend(
                broker_pb2.EpochEndOffset(
                    partition=p.partition, error_code=_TOPIC_REFUSED, leader_epoch=-1, end_offset=-1
                )
                for p in t.partitions
            )
        topic_cls = nested(cls, "OffsetForLeaderTopicResult")
        part_cls = nested(cls, "EpochEndOffset")
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            topics=tuple(
                build(
                    topic_cls,
                    topic=t.topic,
                    partitions=tuple(
                        build(
                            part_cls,
                            error_code=kafka_error(p.error_code),
                            partition=p.partition,
                            leader_epoch=p.leader_epoch,
                            end_offset=p.end_offset,
                        )
                        for p in t.partitions
                    ),
                )
                for t in resp.topics
            ),
        )

    # ---- InitProducerId ----------------------------------------------------------------------

    async def init_producer_id(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.INIT_PRODUCER_ID, request.api_version)
        if body.transactional_id is not None:
            return build(
                cls,
                throttle_time=_NO_THROTTLE,
                error_code=K.transactional_id_authorization_failed,
                producer_id=-1,
                producer_epoch=-1,
            )
        if _acl().decision.cluster_refused:
            return build(
                cls,
                throttle_time=_NO_THROTTLE,
                error_code=K.cluster_authorization_failed,
                producer_id=-1,
                producer_epoch=-1,
            )
        try:
            resp = await self.backend.call_controller(
                "InitProducerId",
                common_pb2.InitProducerIdRequest(
                    producer_id=getattr(body, "producer_id", -1),
                    producer_epoch=getattr(body, "producer_epoch", -1),
                ),
            )
            code = kafka_error(resp.error_code)
            if resp.error_code == common_pb2.NOT_CONTROLLER:
                code = K.coordinator_not_available
        except BackendUnavailable as exc:
            log.warning("InitProducerId: %s", exc)
            # Retriable for every Kafka client, which asks again (NOT_CONTROLLER is not, for them).
            return build(
                cls,
                throttle_time=_NO_THROTTLE,
                error_code=K.coordinator_not_available,
                producer_id=-1,
                producer_epoch=-1,
            )
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            error_code=code,
            producer_id=resp.producer_id if code == K.none else -1,
            producer_epoch=resp.producer_epoch if code == K.none else -1,
        )

    # ---- admin: forwarded to the active controller ------------------------------------------

    async def _admin_authorized(
        self, rpc: str, request: Any, names: Callable[[Any], list[str]]
    ) -> tuple[Any, K, str | None, list[str]]:
        """_admin for the topics the principal may act on; the refused ones' names come back apart
        (answered TOPIC_AUTHORIZATION_FAILED, never sent to the controller)."""
        refused_names = _acl().decision.topics_refused
        refused = [n for n in names(request) if n in refused_names]
        if not refused:
            return (*await self._admin(rpc, request), [])
        if len(refused) == len(names(request)):
            return None, K.none, None, refused
        return (*await self._admin(rpc, _without_topics(request, refused_names)), refused)

    async def _admin(self, rpc: str, request: Any) -> tuple[Any, K, str | None]:
        """The controller's answer, or (None, a whole-request code, message). NOT_CONTROLLER is what
        Kafka's admin clients retry after refreshing metadata, for a standby's answer and for a
        controller that cannot be reached alike."""
        try:
            resp = await self.backend.call_controller(rpc, request)
        except BackendUnavailable as exc:
            log.warning("%s: %s", rpc, exc)
            return None, K.not_controller, str(exc)
        if resp.error_code != common_pb2.NONE:
            return None, kafka_error(resp.error_code), resp.error_message or None
        return resp, K.none, None

    async def create_topics(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.CREATE_TOPICS, request.api_version)
        result_cls = nested(cls, "CreatableTopicResult")
        resp, code, message, refused = await self._admin_authorized(
            "CreateTopics",
            common_pb2.CreateTopicsRequest(
                topics=[
                    common_pb2.CreatableTopic(
                        name=t.name,
                        num_partitions=t.num_partitions,
                        replication_factor=t.replication_factor,
                        assignments={
                            a.partition_index: common_pb2.ReplicaList(replicas=list(a.broker_ids))
                            for a in t.assignments
                        },
                        configs={c.name: c.value for c in t.configs if c.value is not None},
                    )
                    for t in body.topics
                ],
                timeout_ms=max(0, _ms(body.timeout)),
                validate_only=getattr(body, "validate_only", False),
            ),
            lambda r: [t.name for t in r.topics],
        )
        results: list[tuple[str, K, str | None, str, int, int]] = [
            (n, K.topic_authorization_failed, _NOT_AUTHORIZED, "", -1, -1) for n in refused
        ]
        if resp is None:
            results += [(t.name, code, message, "", -1, -1) for t in body.topics if t.name not in refused]
        else:
            results += [
                (
                    r.name,
                    kafka_error(r.error_code),
                    r.error_message or None,
                    r.topic_id,
                    r.num_partitions or -1,
                    r.replication_factor or -1,
                )
                for r in resp.topics
            ]
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            topics=tuple(
                build(
                    result_cls,
                    name=name,
                    topic_id=_topic_uuid(topic_id),
                    error_code=err,
                    error_message=msg,
                    num_partitions=partitions if err == K.none else -1,
                    replication_factor=factor if err == K.none else -1,
                    configs=None,  # not returned: DescribeConfigs says them
                )
                for name, err, msg, topic_id, partitions, factor in results
            ),
        )

    async def delete_topics(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.DELETE_TOPICS, request.api_version)
        result_cls = nested(cls, "DeletableTopicResult")
        names = list(body.topic_names)
        resp, code, message, refused = await self._admin_authorized(
            "DeleteTopics",
            common_pb2.DeleteTopicsRequest(names=names, timeout_ms=max(0, _ms(body.timeout))),
            lambda r: list(r.names),
        )
        results = [(n, K.topic_authorization_failed, _NOT_AUTHORIZED) for n in refused] + (
            [(n, code, message) for n in names if n not in refused]
            if resp is None
            else [(r.name, kafka_error(r.error_code), r.error_message or None) for r in resp.topics]
        )
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            responses=tuple(
                build(result_cls, name=n, error_code=err, error_message=msg) for n, err, msg in results
            ),
        )

    async def create_partitions(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.CREATE_PARTITIONS, request.api_version)
        result_cls = nested(cls, "CreatePartitionsTopicResult")
        resp, code, message, refused = await self._admin_authorized(
            "CreatePartitions",
            common_pb2.CreatePartitionsRequest(
                topics=[
                    common_pb2.CreatePartitionsTopic(
                        name=t.name,
                        count=t.count,
                        assignments=[
                            common_pb2.ReplicaList(replicas=list(a.broker_ids)) for a in (t.assignments or ())
                        ],
                    )
                    for t in body.topics
                ],
                timeout_ms=max(0, _ms(body.timeout)),
                validate_only=body.validate_only,
            ),
            lambda r: [t.name for t in r.topics],
        )
        results = [(n, K.topic_authorization_failed, _NOT_AUTHORIZED) for n in refused] + (
            [(t.name, code, message) for t in body.topics if t.name not in refused]
            if resp is None
            else [(r.name, kafka_error(r.error_code), r.error_message or None) for r in resp.topics]
        )
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            results=tuple(
                build(result_cls, name=n, error_code=err, error_message=msg) for n, err, msg in results
            ),
        )

    # ---- AlterConfigs and IncrementalAlterConfigs: topic configs, through the controller ------

    async def alter_configs(self, request: Request) -> Any:
        """AlterConfigs (33): each topic's whole config replaced; what it does not name returns to
        its default, as in Kafka."""
        return await self._alter_configs(request, protocol.ALTER_CONFIGS, incremental=False)

    async def incremental_alter_configs(self, request: Request) -> Any:
        """IncrementalAlterConfigs (44): SET and DELETE the keys named, keep the rest."""
        return await self._alter_configs(request, protocol.INCREMENTAL_ALTER_CONFIGS, incremental=True)

    async def _alter_configs(self, request: Request, api_key: int, *, incremental: bool) -> Any:
        """Topic resources go to the controller's AlterTopicConfigs in one request; the rest are
        answered here (config_changes.py's table), each resource on its own, in request order."""
        body = request.body
        cls = protocol.response_class(api_key, request.api_version)
        result_cls = nested(cls, "AlterConfigsResourceResponse")
        refused = _acl().decision.topics_refused
        answers: list[tuple[K, str | None]] = [(K.none, None)] * len(body.resources)
        sent: list[tuple[int, common_pb2.AlterTopicConfigsTopic]] = []
        for i, resource in enumerate(body.resources):
            try:
                refusal = config_changes.refusal_of_resource_type(
                    resource.resource_type, resource.resource_name
                )
                if refusal is not None:
                    raise refusal
                if resource.resource_name in refused:
                    raise config_changes.Refused(K.topic_authorization_failed, _NOT_AUTHORIZED)
                sent.append((i, config_changes.topic_change(resource, incremental=incremental)))
            except config_changes.Refused as exc:
                answers[i] = (exc.code, exc.message)
        if sent:
            resp, code, message = await self._admin(
                "AlterTopicConfigs",
                common_pb2.AlterTopicConfigsRequest(
                    topics=[change for _, change in sent], validate_only=body.validate_only
                ),
            )
            for n, (i, _) in enumerate(sent):
                if resp is None:
                    answers[i] = (code, message)
                else:
                    r = resp.topics[n]
                    answers[i] = (kafka_error(r.error_code), r.error_message or None)
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            responses=tuple(
                build(
                    result_cls,
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                )
                for resource, (code, message) in zip(body.resources, answers, strict=True)
            ),
        )

    # ---- DescribeConfigs and DescribeCluster: this broker's metadata ---------------------------

    async def describe_configs(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.DESCRIBE_CONFIGS, request.api_version)
        result_cls = nested(cls, "DescribeConfigsResult")
        entry_cls = nested(cls, "DescribeConfigsResourceResult")
        cache = self.backend.metadata
        results = []
        for resource in body.resources:
            wanted = set(resource.configuration_keys) if resource.configuration_keys is not None else None
            code, message, entries = K.none, None, []
            if resource.resource_type == RESOURCE_TOPIC:
                if resource.resource_name in _acl().decision.topics_refused:
                    code, message = K.topic_authorization_failed, _NOT_AUTHORIZED
                elif resource.resource_name not in cache.topics():
                    code, message = (
                        K.unknown_topic_or_partition,
                        f"topic {resource.resource_name!r} does not exist",
                    )
                else:
                    config = cache.topic_configs.get(resource.resource_name, common_pb2.TopicConfig())
                    entries = [
                        build(
                            entry_cls,
                            name=name,
                            value=value,
                            read_only=False,
                            config_source=SOURCE_TOPIC_CONFIG if set_here else SOURCE_DEFAULT_CONFIG,
                            is_sensitive=False,
                            synonyms=(),
                            config_type=TOPIC_CONFIG_SCHEMA[name].kafka_config_type,
                            # Why an accepted config has no effect here; None for one honoured.
                            documentation=TOPIC_CONFIG_SCHEMA[name].note or None,
                        )
                        for name, value, set_here in topic_config_entries(config)
                        if wanted is None or name in wanted
                    ]
            elif resource.resource_type != RESOURCE_BROKER:
                # Broker resources are answered with no entries (no broker config is dynamic here).
                code, message = (
                    K.invalid_request,
                    f"resource type {resource.resource_type} is not described here",
                )
            results.append(
                build(
                    result_cls,
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=tuple(entries),
                )
            )
        return build(cls, throttle_time=_NO_THROTTLE, results=tuple(results))

    async def describe_cluster(self, request: Request) -> Any:
        cls = protocol.response_class(protocol.DESCRIBE_CLUSTER, request.api_version)
        broker_cls = nested(cls, "DescribeClusterBroker")
        try:
            if _acl().decision.cluster_refused:
                raise _Refused(K.cluster_authorization_failed, "not authorized to Describe the cluster")
            brokers = await self.backend.kafka_brokers()
            cluster_id = await self.backend.cluster_id()
        except (BackendUnavailable, _Refused) as exc:
            return build(
                cls,
                throttle_time=_NO_THROTTLE,
                error_code=exc.code if isinstance(exc, _Refused) else K.request_timed_out,
                error_message=str(exc),
                cluster_id="",
                controller_id=-1,
                brokers=(),
            )
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            error_code=K.none,
            error_message=None,
            endpoint_type=1,  # brokers: the only endpoints a Kafka client reaches here
            cluster_id=cluster_id,
            controller_id=self.backend.broker_id,  # as in Metadata: this broker forwards admin requests
            brokers=tuple(
                build(broker_cls, broker_id=b.broker_id, host=b.host, port=b.kafka_port, rack=b.rack or None)
                for b in brokers
            ),
        )

    # ---- offsets: every broker coordinates every group -----------------------------------------

    async def find_coordinator(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.FIND_COORDINATOR, request.api_version)
        keys = list(body.coordinator_keys) if hasattr(body, "coordinator_keys") else [body.key]
        key_type = getattr(body, "key_type", KEY_TYPE_GROUP)
        brokers: list[KafkaBroker] = []
        try:
            brokers = await self.backend.kafka_brokers()
        except BackendUnavailable as exc:
            log.warning("FindCoordinator: %s", exc)

        def answer(key: str) -> dict[str, Any]:
            if key_type != KEY_TYPE_GROUP:
                code, message = K.invalid_request, "transactions are not supported (docs/KAFKA.md)"
            elif key in _acl().decision.groups_refused:
                code, message = K.group_authorization_failed, _NOT_AUTHORIZED
            elif (problem := group_id_problem(key)) is not None:
                code, message = K.invalid_group_id, problem
            elif (me := _coordinator(brokers, key)) is None:
                code, message = K.coordinator_not_available, "no broker's registration could be read"
            else:
                return {
                    "key": key,
                    "error_code": K.none,
                    "error_message": None,
                    "node_id": me.broker_id,
                    "host": me.host,
                    "port": me.kafka_port,
                }
            return {
                "key": key,
                "error_code": code,
                "error_message": message,
                "node_id": -1,
                "host": "",
                "port": -1,
            }

        if hasattr(body, "coordinator_keys"):
            coordinator_cls = nested(cls, "Coordinator")
            return build(
                cls,
                throttle_time=_NO_THROTTLE,
                coordinators=tuple(build(coordinator_cls, **answer(k)) for k in keys),
            )
        single = answer(keys[0])
        del single["key"]  # before v4 the response is the one answer, with no key beside it
        return build(cls, throttle_time=_NO_THROTTLE, **single)

    async def offset_commit(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.OFFSET_COMMIT, request.api_version)
        topic_cls = nested(cls, "OffsetCommitResponseTopic")
        part_cls = nested(cls, "OffsetCommitResponsePartition")
        codes: dict[tuple[str, int], K] = {}
        commits: list[OffsetCommit] = []
        whole: K | None = None
        acl = _acl().decision
        if body.group_id in acl.groups_refused:
            whole = K.group_authorization_failed
        elif group_id_problem(body.group_id) is not None:
            whole = K.invalid_group_id
        elif (refused := await self._not_coordinator(body.group_id)) is not None:
            whole = refused
        else:
            # Members commit for their generation; a commit from outside (generation -1, no
            # member id) only to a group without classic members (and, in commit_offsets,
            # without KIP-848 members).
            check = self.backend.classic_groups.commit_check(
                body.group_id, body.member_id, body.generation_id_or_member_epoch
            )
            whole = None if check == GroupError.NONE else K[check.value]
        cache = self.backend.metadata
        for t in body.topics:
            for p in t.partitions:
                tp = (t.name, p.partition_index)
                commit = offset_commits.Commit(
                    t.name,
                    p.partition_index,
                    p.committed_offset,
                    p.committed_metadata or "",
                    getattr(p, "committed_leader_epoch", -1),
                )
                if whole is not None:
                    codes[tp] = whole
                elif t.name in acl.topics_refused:
                    codes[tp] = K.topic_authorization_failed
                # Negative offsets are stored as given, as Kafka's coordinator does (kafkajs'
                # resetOffsets commits -2 / -1 for earliest / latest).
                elif problem := offset_commits.partition_problem(
                    commit, tp in cache.partitions, negative_offset_allowed=True
                ):
                    # INVALID_COMMIT_OFFSET cannot arise here: negative offsets are allowed.
                    codes[tp] = (
                        K.unknown_topic_or_partition
                        if problem == offset_commits.PartitionProblem.UNKNOWN_TOPIC_OR_PARTITION
                        else K.offset_metadata_too_large
                    )
                else:
                    commits.append(commit)
        if commits:
            try:
                code, message = await self.backend.commit_offsets(body.group_id, commits)
                result = kafka_error(code)
                if code != common_pb2.NONE:
                    log.info("OffsetCommit for group %r refused: %s", body.group_id, message)
            except BackendUnavailable as exc:
                log.warning("OffsetCommit: %s", exc)
                result = K.coordinator_not_available
            for c in commits:
                codes[(c.topic, c.partition)] = result
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            topics=tuple(
                build(
                    topic_cls,
                    name=t.name,
                    partitions=tuple(
                        build(
                            part_cls,
                            partition_index=p.partition_index,
                            error_code=codes[(t.name, p.partition_index)],
                        )
                        for p in t.partitions
                    ),
                )
                for t in body.topics
            ),
        )

    async def offset_fetch(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.OFFSET_FETCH, request.api_version)
        topic_cls = nested(cls, "OffsetFetchResponseTopic")
        part_cls = nested(cls, "OffsetFetchResponsePartition")
        whole = K.none
        stored: dict[tuple[str, int], OffsetCommit] = {}
        acl = _acl()
        if body.group_id in acl.decision.groups_refused:
            whole = K.group_authorization_failed
        elif group_id_problem(body.group_id) is not None:
            whole = K.invalid_group_id
        else:
            try:
                stored = await self.backend.committed_offsets(body.group_id)
            except BackendUnavailable as exc:
                log.warning("OffsetFetch: %s", exc)
                whole = K.coordinator_not_available
        if body.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(stored):
                # All the group's offsets: the topics the principal may not describe left out.
                if acl.allowed(authz.Operation.DESCRIBE, authz.topic(topic)):
                    wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in body.topics}

        def partition_answer(topic: str, index: int) -> Any:
            found = stored.get((topic, index))
            return build(
                part_cls,
                partition_index=index,
                committed_offset=found.offset if found else -1,
                committed_leader_epoch=found.leader_epoch if found else -1,
                metadata=found.metadata if found else "",
                error_code=K.topic_authorization_failed
                if whole == K.none and topic in acl.decision.topics_refused
                else whole,
            )

        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            error_code=whole,
            topics=tuple(
                build(topic_cls, name=name, partitions=tuple(partition_answer(name, i) for i in indexes))
                for name, indexes in wanted.items()
            ),
        )

    # ---- the classic group protocol (classic_groups.py) -----------------------------------------

    async def _not_coordinator(self, group_id: str) -> K | None:
        """None when this broker coordinates the group, else the code that sends the client to
        FindCoordinator again."""
        try:
            brokers = await self.backend.kafka_brokers()
        except BackendUnavailable as exc:
            log.warning("group %r: %s", group_id, exc)
            return K.coordinator_not_available
        me = _coordinator(brokers, group_id)
        if me is None:
            return K.coordinator_not_available
        return None if me.broker_id == self.backend.broker_id else K.not_coordinator

    async def join_group(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.JOIN_GROUP, request.api_version)
        member_cls = nested(cls, "JoinGroupResponseMember")

        def refused(code: K) -> Any:
            return build(
                cls,
                throttle_time=_NO_THROTTLE,
                error_code=code,
                generation_id=-1,
                protocol_type=None,
                # Nullable from v7 only: None in v2-v6 cannot be written, and the answer never left.
                protocol_name=None if request.api_version >= 7 else "",
                leader="",
                member_id=body.member_id,
                members=(),
            )

        if body.group_id in _acl().decision.groups_refused:
            return refused(K.group_authorization_failed)
        if group_id_problem(body.group_id) is not None:
            return refused(K.invalid_group_id)
        if (code := await self._not_coordinator(body.group_id)) is not None:
            return refused(code)
        answer = await self.backend.classic_groups.join(
            group_id=body.group_id,
            member_id=body.member_id,
            group_instance_id=getattr(body, "group_instance_id", None),
            client_id=request.client_id or "",
            client_host="",
            protocol_type=body.protocol_type,
            protocols=[(p.name, bytes(p.metadata)) for p in body.protocols],
            session_timeout_ms=_ms(body.session_timeout),
            rebalance_timeout_ms=_ms(getattr(body, "rebalance_timeout", body.session_timeout)),
            # KIP-394 (JoinGroup 4+): a new member first gets its id, then joins with it.
            require_known_member_id=request.api_version >= 4,
        )
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            error_code=K[answer.error.value],
            generation_id=answer.generation,
            protocol_type=answer.protocol_type,
            protocol_name=answer.protocol_name or ("" if request.api_version < 7 else None),
            leader=answer.leader,
            member_id=answer.member_id,
            members=tuple(
                build(member_cls, member_id=m, group_instance_id=instance, metadata=metadata)
                for m, instance, metadata in answer.members
            ),
        )

    async def sync_group(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.SYNC_GROUP, request.api_version)
        code = _group_refusal(body.group_id) or await self._not_coordinator(body.group_id)
        if code is not None:
            return build(cls, throttle_time=_NO_THROTTLE, error_code=code, assignment=b"")
        answer = await self.backend.classic_groups.sync(
            group_id=body.group_id,
            member_id=body.member_id,
            generation=body.generation_id,
            assignments={a.member_id: bytes(a.assignment) for a in body.assignments},
        )
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            error_code=K[answer.error.value],
            protocol_type=answer.protocol_type,
            protocol_name=answer.protocol_name,
            assignment=answer.assignment,
        )

    async def heartbeat(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.HEARTBEAT, request.api_version)
        code = _group_refusal(body.group_id) or await self._not_coordinator(body.group_id)
        if code is None:
            error = self.backend.classic_groups.heartbeat(
                group_id=body.group_id, member_id=body.member_id, generation=body.generation_id
            )
            code = K[error.value]
        return build(cls, throttle_time=_NO_THROTTLE, error_code=code)

    async def leave_group(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.LEAVE_GROUP, request.api_version)
        member_ids = [m.member_id for m in body.members] if hasattr(body, "members") else [body.member_id]
        code = _group_refusal(body.group_id) or await self._not_coordinator(body.group_id)
        errors = (
            [
                K[e.value]
                for e in self.backend.classic_groups.leave(group_id=body.group_id, member_ids=member_ids)
            ]
            if code is None
            else [code] * len(member_ids)
        )
        if not hasattr(body, "members"):
            return build(cls, throttle_time=_NO_THROTTLE, error_code=errors[0])
        response_cls = nested(cls, "MemberResponse")
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            error_code=code or K.none,
            members=tuple(
                build(
                    response_cls, member_id=m.member_id, group_instance_id=m.group_instance_id, error_code=e
                )
                for m, e in zip(body.members, errors, strict=True)
            ),
        )

    async def list_groups(self, request: Request) -> Any:
        """The classic groups this broker holds, and the groups etcd holds (committed offsets, a
        KIP-848 state) that it coordinates: clients ask every broker and merge, as in Kafka,
        where each broker lists the groups of the offsets partitions it leads."""
        body = request.body
        cls = protocol.response_class(protocol.LIST_GROUPS, request.api_version)
        listed_cls = nested(cls, "ListedGroup")
        wanted = set(getattr(body, "states_filter", ()) or ())
        listed = {
            g.group_id: (g.protocol_type or "", g.state.value) for g in self.backend.classic_groups.groups()
        }
        error = K.none
        try:
            brokers = await self.backend.kafka_brokers()
            for stored in await self.backend.stored_groups():
                me = _coordinator(brokers, stored.group_id)
                if me is not None and me.broker_id == self.backend.broker_id:
                    listed.setdefault(stored.group_id, (CONSUMER_PROTOCOL_TYPE, stored.state))
        except BackendUnavailable as exc:
            log.warning("ListGroups: %s", exc)
            error = K.coordinator_not_available
        return build(
            cls,
            throttle_time=_NO_THROTTLE,
            error_code=error,
            groups=tuple(
                build(listed_cls, group_id=group_id, protocol_type=protocol_type, group_state=state)
                for group_id, (protocol_type, state) in sorted(listed.items())
                if (not wanted or state in wanted)
                and _acl().allowed(authz.Operation.DESCRIBE, authz.group(group_id))
            ),
        )

    async def describe_groups(self, request: Request) -> Any:
        """A group this broker holds as a classic group with its members; else one etcd holds
        (committed offsets, a KIP-848 state) in its state, Empty without members, as ListGroups
        lists it; else Dead (DescribeGroups 1-5 has no GROUP_ID_NOT_FOUND)."""
        body = request.body
        cls = protocol.response_class(protocol.DESCRIBE_GROUPS, request.api_version)
        group_cls = nested(cls, "DescribedGroup")
        member_cls = nested(cls, "DescribedGroupMember")
        described = []
        for group_id in body.groups:
            code = (
                K.group_authorization_failed
                if group_id in _acl().decision.groups_refused
                else _group_refusal(group_id) or await self._not_coordinator(group_id)
            )
            group = self.backend.classic_groups.group(group_id) if code is None else None
            state, protocol_type = "Dead", ""
            if group is not None:
                state, protocol_type = group.state.value, group.protocol_type or ""
            elif code is None:
                try:
                    stored = await self.backend.stored_groups(group_id)
                    if stored:
                        state, protocol_type = stored[0].state, CONSUMER_PROTOCOL_TYPE
                except BackendUnavailable as exc:
                    log.warning("DescribeGroups: %s", exc)
                    code = K.coordinator_not_available
            described.append(
                build(
                    group_cls,
                    error_code=code or K.none,
                    group_id=group_id,
                    group_state=state,
                    protocol_type=protocol_type,
                    protocol_data=(group.protocol_name or "") if group is not None else "",
                    members=tuple(
                        build(
                            member_cls,
                            member_id=m.member_id,
                            group_instance_id=m.group_instance_id,
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=m.metadata(group.protocol_name)
                            if group is not None and group.protocol_name
                            else b"",
                            member_assignment=m.assignment,
                        )
                        for m in (group.members.values() if group is not None else ())
                    ),
                    authorized_operations=-2147483648,
                )
            )
        return build(cls, throttle_time=_NO_THROTTLE, groups=tuple(described))

    # ---- group admin: DeleteGroups, OffsetDelete (backend.py decides) -------------------------

    async def delete_groups(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.DELETE_GROUPS, request.api_version)
        result_cls = nested(cls, "DeletableGroupResult")
        results = []
        for group_id in body.groups_names:
            code = _group_refusal(group_id) or await self._not_coordinator(group_id)
            if code is None:
                try:
                    error, message = await self.backend.delete_group(group_id)
                    code = K[error.value]
                    if error != GroupError.NONE:
                        log.info("DeleteGroups %r refused: %s", group_id, message)
                except BackendUnavailable as exc:
                    log.warning("DeleteGroups: %s", exc)
                    code = K.coordinator_not_available
            results.append(build(result_cls, group_id=group_id, error_code=code))
        return build(cls, throttle_time=_NO_THROTTLE, results=tuple(results))

    async def offset_delete(self, request: Request) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.OFFSET_DELETE, request.api_version)
        topic_cls = nested(cls, "OffsetDeleteResponseTopic")
        part_cls = nested(cls, "OffsetDeleteResponsePartition")
        whole = _group_refusal(body.group_id) or await self._not_coordinator(body.group_id)
        codes: dict[tuple[str, int], K] = {}
        if whole is None:
            refused_topics = _acl().decision.topics_refused
            cache = self.backend.metadata
            wanted: list[tuple[str, int]] = []
            for t in body.topics:
                for p in t.partitions:
                    tp = (t.name, p.partition_index)
                    if t.name in refused_topics:
                        codes[tp] = K.topic_authorization_failed
                    elif tp not in cache.partitions:
                        codes[tp] = K.unknown_topic_or_partition
                    else:
                        wanted.append(tp)
            try:
                error, message, errors = await self.backend.delete_offsets(body.group_id, wanted)
                if error != GroupError.NONE:
                    log.info("OffsetDelete for group %r refused: %s", body.group_id, message)
                    whole = K[error.value]
                codes.update((tp, K[e.value]) for tp, e in errors.items())
            except BackendUnavailable as exc:
                log.warning("OffsetDelete: %s", exc)
                whole = K.coordinator_not_available
        if whole is not None:
            return build(cls, error_code=whole, throttle_time=_NO_THROTTLE, topics=())
        return build(
            cls,
            error_code=K.none,
            throttle_time=_NO_THROTTLE,
            topics=tuple(
                build(
                    topic_cls,
                    name=t.name,
                    partitions=tuple(
                        build(
                            part_cls,
                            partition_index=p.partition_index,
                            error_code=codes[(t.name, p.partition_index)],
                        )
                        for p in t.partitions
                    ),
                )
                for t in body.topics
            ),
        )


_NOT_AUTHORIZED = "not authorized by the cluster's ACLs (docs/KAFKA.md, Security)"


class _Refused(Exception):
    """A whole request refused by the ACLs: code is the Kafka error it is answered with."""

    def __init__(self, code: K, message: str) -> None:
        super().__init__(message)
        self.code = code


def _group_refusal(group_id: str) -> K | None:
    """The code a group request is refused with before any work: not authorized, or a bad id."""
    if group_id in _acl().decision.groups_refused:
        return K.group_authorization_failed
    return K.invalid_group_id if group_id_problem(group_id) is not None else None


def _export_fetch_session_metrics(sessions: fetch_sessions.FetchSessionCache, evicted: int) -> None:
    metrics.KAFKA_FETCH_SESSIONS.set(sessions.size)
    metrics.KAFKA_FETCH_SESSION_PARTITIONS_CACHED.set(sessions.partitions_cached)
    if evicted:
        metrics.KAFKA_FETCH_SESSION_EVICTIONS.inc(evicted)


def _split_topics(req: Any, refused: frozenset[str]) -> tuple[Any, Any]:
    """(the request without the refused topics, one of the same kind holding only them)."""
    if not refused:
        return req, type(req)()
    kept, denied = type(req)(), type(req)()
    kept.CopyFrom(req)
    del kept.topics[:]
    for t in req.topics:
        (denied if t.topic in refused else kept).topics.append(t)
    return kept, denied


def _without_topics(req: Any, refused: frozenset[str]) -> Any:
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


def _coordinator(brokers: Sequence[KafkaBroker], group_id: str) -> KafkaBroker | None:
    """The broker that coordinates a group (classic_groups.coordinator_of), or None."""
    broker_id = coordinator_of(group_id, [b.broker_id for b in brokers])
    return next((b for b in brokers if b.broker_id == broker_id), None)


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
        throttle_time=_NO_THROTTLE,
    )


def _records_over(records: bytes, max_records: int) -> int:
    """The record count of the first batch holding more than max_records, else 0 (a malformed
    batch is the leader's to refuse, CORRUPT_MESSAGE)."""
    try:
        for header in iter_batch_headers(records):
            if header.records_count > max_records:
                return header.records_count
    except (ValueError, IndexError):
        return 0
    return 0


def _produce_refusal(req: common_pb2.ProduceRequest, code: int, message: str) -> common_pb2.ProduceResponse:
    return common_pb2.ProduceResponse(
        topics=[
            common_pb2.ProduceTopicResponse(
                topic=t.topic,
                partitions=[
                    common_pb2.ProducePartitionResponse(
                        partition=p.partition,
                        error_code=code,  # type: ignore[arg-type]
                        base_offset=-1,
                        log_append_time_ms=-1,
                        log_start_offset=-1,
                        error_message=message,
                    )
                    for p in t.partitions
                ],
            )
            for t in req.topics
        ]
    )


# FindCoordinator's key types: 0 a group, 1 a transactional id.
KEY_TYPE_GROUP = 0

# Kafka's DescribeConfigs resource types and config sources (DescribeConfigsResponse.json).
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_TOPIC_CONFIG = 1
SOURCE_DEFAULT_CONFIG = 5


def topic_config_entries(config: common_pb2.TopicConfig) -> list[tuple[str, str, bool]]:
    """(name, effective value, set on the topic) for every topic config Highwater keeps; an unset
    one shows its default (clients/common/topics.py, the one schema), as Kafka's DescribeConfigs does."""
    return [
        (entry.name, entry.value, not entry.is_default)
        for entry in effective_topic_configs(topic_configs_from_proto(config))
    ]
