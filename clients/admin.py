"""Admin clients: `AsyncAdmin` (asyncio) and `Admin` (synchronous) — topics, partitions,
reassignments, leader elections, the cluster, consumer groups, ACLs and tokens.

Every call goes to a gateway, which passes admin calls to the active controller
(DESIGN.md section 3). A per-topic or per-partition error in the answer is raised
as its typed HighwaterError carrying the server's message; for a call about
several topics the first error is raised after the whole answer was read.
NOT_CONTROLLER (a controller election in progress) is retried within
request_timeout_ms.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clients.common.acls import ACL_BINDINGS_PER_REQUEST_MAX, AclBinding, AclError
from clients.common.topics import (
    altered_topic_configs,
    effective_topic_configs,
    topic_configs_from_proto,
    validate_topic_configs,
)
from clients.config import (
    COMMIT_OFFSETS_PER_REQUEST_MAX,
    DEFAULT_BOOTSTRAP,
    ConnectionConfig,
    build_config,
    check_group_id,
    check_int,
    check_topic_name,
)
from clients.connection import GatewayConnection
from clients.consumer import EARLIEST, LATEST, check_partitions
from clients.errors import HighwaterError, InvalidArgument, error_for_code
from clients.loop_thread import SyncClient
from clients.metadata import now_ms
from clients.types import (
    ClusterDescription,
    ConsumerGroupDescription,
    EtcdSpace,
    GroupListing,
    GroupMemberDescription,
    GroupPartitionOffset,
    NewTopic,
    NodeDescription,
    OngoingReassignment,
    PartitionDescription,
    TopicCreated,
    TopicDescription,
    TopicPartition,
)
from protos.highwater.v1 import common_pb2, controller_pb2, gateway_pb2

ELECTION_TYPES = {"preferred": common_pb2.PREFERRED, "unclean": common_pb2.UNCLEAN}


def topic_config_dict(config: common_pb2.TopicConfig) -> dict[str, int | bool | str | float]:
    """Every topic config under its Kafka name with the value in force: the topic's, else the default."""
    return {entry.name: entry.typed() for entry in effective_topic_configs(topic_configs_from_proto(config))}


def topic_config_sources(config: common_pb2.TopicConfig) -> dict[str, str]:
    """Where each value comes from, as Kafka's DescribeConfigs says it: TOPIC_CONFIG or DEFAULT_CONFIG."""
    return {entry.name: entry.source for entry in effective_topic_configs(topic_configs_from_proto(config))}


@dataclass(frozen=True)
class TokenDescription:
    """A bearer token as ListTokens shows it: never its secret. expires_ms 0: never."""

    token_id: str
    principal: str
    created_ms: int
    expires_ms: int
    description: str


@dataclass(frozen=True)
class CreatedToken:
    """A new token: `token` (hwt.<id>.<secret>) is shown this once; the cluster keeps only a hash."""

    token: str
    description: TokenDescription


@dataclass(frozen=True)
class LogDescription:
    """One partition's log on its leader (DescribeLogDirs, Kafka's API 35), or why it could not
    be described (`error`, with every other field at its default).

    The cleaner fields are set for a compacted log (cleanup.policy has "compact") only:
    dirty_ratio is the share of the cleanable bytes not cleaned yet (the cleaner takes the log at
    min.cleanable.dirty.ratio), cleaner_lag_ms how long the oldest uncleaned cleanable record
    has waited (None: nothing cleanable is dirty), uncleanable whether the cleaner failed on it
    and waits to try again (uncleanable_reason says why).
    """

    topic: str
    partition: int
    broker_id: int = -1
    log_dir: str = ""
    size_bytes: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0
    high_watermark: int = 0
    cleanup_policy: str = ""
    dirty_ratio: float | None = None
    cleaner_lag_ms: int | None = None
    first_dirty_offset: int | None = None
    uncleanable: bool = False
    uncleanable_reason: str = ""
    last_cleaned_ms: int | None = None  # wall time of the leader's last finished pass since its start
    error: str = ""
    # Where read_committed consumers stop: below the HW while a transaction is open (last, so
    # that positional construction from before it keeps working).
    last_stable_offset: int = 0

    @property
    def compacted(self) -> bool:
        return self.dirty_ratio is not None


def log_description(topic: str, p: common_pb2.DescribeLogDirsPartitionResponse) -> LogDescription:
    """A DescribeLogDirs answer's partition as a LogDescription."""
    if p.error_code != common_pb2.NONE:
        name = (
            common_pb2.ErrorCode.Name(p.error_code) if p.error_code in common_pb2.ErrorCode.values() else ""
        )
        return LogDescription(topic, p.partition, error=f"{name or p.error_code}: {p.error_message}")
    return LogDescription(
        topic,
        p.partition,
        broker_id=p.broker_id,
        log_dir=p.log_dir,
        size_bytes=p.size_bytes,
        log_start_offset=p.log_start_offset,
        log_end_offset=p.log_end_offset,
        high_watermark=p.high_watermark,
        last_stable_offset=p.last_stable_offset if p.HasField("last_stable_offset") else p.high_watermark,
        cleanup_policy=p.cleanup_policy,
        dirty_ratio=p.dirty_ratio if p.compacted else None,
        cleaner_lag_ms=p.cleaner_lag_ms if p.compacted and p.cleaner_lag_ms >= 0 else None,
        first_dirty_offset=p.first_dirty_offset if p.compacted else None,
        uncleanable=p.uncleanable,
        uncleanable_reason=p.uncleanable_reason,
        last_cleaned_ms=p.last_cleaned_ms if p.compacted and p.last_cleaned_ms >= 0 else None,
    )


def _token_description(info: controller_pb2.TokenInfo) -> TokenDescription:
    return TokenDescription(info.token_id, info.principal, info.created_ms, info.expires_ms, info.description)


def _binding(msg: controller_pb2.AclBinding) -> AclBinding:
    try:
        return AclBinding.of(
            msg.principal,
            msg.operation,
            msg.resource_type,
            msg.resource_name,
            permission=msg.permission,
            pattern_type=msg.pattern_type or "Literal",
            host=msg.host or "*",
        )
    except AclError as exc:
        raise error_for_code(
            common_pb2.UNKNOWN_SERVER_ERROR, f"the cluster answered a malformed ACL: {exc}"
        ) from None


def _check_bindings(bindings: Iterable[AclBinding], what: str) -> list[AclBinding]:
    checked = list(bindings)
    if not checked:
        raise InvalidArgument(f"{what}() needs at least one ACL binding")
    for b in checked:
        if not isinstance(b, AclBinding):
            raise InvalidArgument(f"{what}() takes AclBinding objects (AclBinding.of(...)), got {b!r}")
    return checked


def _raise_first(errors: list[HighwaterError]) -> None:
    if errors:
        raise errors[0]


def _check_replicas(what: str, replicas: object) -> list[int]:
    if isinstance(replicas, (str, bytes)) or not isinstance(replicas, Iterable):
        raise InvalidArgument(f"{what}: replicas must be a list of broker ids, got {replicas!r}")
    checked = [check_int(f"{what} replica", r, minimum=0) for r in replicas]
    if len(set(checked)) != len(checked):
        raise InvalidArgument(f"{what}: replica list {checked} names a broker twice")
    return checked


class AsyncAdmin:
    """asyncio admin client. `async with AsyncAdmin("127.0.0.1:9092") as admin:`."""

    def __init__(self, bootstrap: str | list[str] = DEFAULT_BOOTSTRAP, **settings: Any) -> None:
        self.config: ConnectionConfig = build_config(ConnectionConfig, bootstrap, settings)
        self._connection: GatewayConnection | None = None

    def _conn(self) -> GatewayConnection:
        if self._connection is None:
            self._connection = GatewayConnection.from_config(self.config)
        return self._connection

    async def _call(self, method: str, request: Any) -> Any:
        """Call and check the whole-request error, retrying NOT_CONTROLLER within the timeout."""
        deadline = now_ms() + self.config.request_timeout_ms
        attempts = 0
        while True:
            response = await self._conn().call(method, request)
            code = getattr(response, "error_code", common_pb2.NONE)
            if code == common_pb2.NONE:
                return response
            error = error_for_code(code, getattr(response, "error_message", "") or method)
            attempts += 1
            if not error.retriable or now_ms() >= deadline:
                raise error
            pause_ms = min(self.config.retry_backoff_max_ms, self.config.retry_backoff_ms * attempts)
            await asyncio.sleep(pause_ms / 1000)

    # --- topics -------------------------------------------------------------------

    async def create_topics(
        self,
        topics: str | NewTopic | Sequence[NewTopic],
        partitions: int = -1,
        replication_factor: int = -1,
        configs: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
    ) -> list[TopicCreated]:
        """Create one topic (name, partitions, replication_factor, configs) or several NewTopics.

        -1 takes the cluster default. Raises TopicAlreadyExists, InvalidReplicationFactor,
        InvalidPartitions, InvalidConfig, ... with the controller's message.
        """
        if isinstance(topics, str):
            wanted = [NewTopic(topics, partitions, replication_factor, dict(configs or {}))]
        elif isinstance(topics, NewTopic):
            wanted = [topics]
        else:
            wanted = list(topics)
        if not wanted:
            raise InvalidArgument("create_topics() needs at least one topic")
        creatable = []
        for topic in wanted:
            if not isinstance(topic, NewTopic):
                raise InvalidArgument(f"create_topics() takes a name or NewTopic objects, got {topic!r}")
            check_topic_name(topic.name)
            if topic.num_partitions != -1:
                check_int("partitions", topic.num_partitions, minimum=1)
            if topic.replication_factor != -1:
                check_int("replication_factor", topic.replication_factor, minimum=1)
            for key, value in topic.configs.items():
                if not isinstance(key, str) or not key or not isinstance(value, str):
                    raise InvalidArgument(f"topic config {key!r}={value!r}: names and values must be str")
            # The controller checks again; checking here names the bad value before any request.
            validate_topic_configs(topic.configs)
            assignments = {
                check_int("partition", p, minimum=0): common_pb2.ReplicaList(
                    replicas=_check_replicas(f"partition {p}", replicas)
                )
                for p, replicas in topic.assignments.items()
            }
            creatable.append(
                common_pb2.CreatableTopic(
                    name=topic.name,
                    num_partitions=topic.num_partitions,
                    replication_factor=topic.replication_factor,
                    assignments=assignments,
                    configs=dict(topic.configs),
                )
            )
        response = await self._call(
            "CreateTopics",
            common_pb2.CreateTopicsRequest(
                topics=creatable, timeout_ms=self.config.request_timeout_ms, validate_only=validate_only
            ),
        )
        created, errors = [], []
        for result in response.topics:
            if result.error_code != common_pb2.NONE:
                errors.append(
                    error_for_code(result.error_code, result.error_message or f"topic {result.name!r}")
                )
            else:
                created.append(
                    TopicCreated(
                        result.name, result.topic_id, result.num_partitions, result.replication_factor
                    )
                )
        _raise_first(errors)
        return created

    async def delete_topics(self, names: str | Iterable[str]) -> list[str]:
        """Delete topics (their data on every replica too); returns the names deleted."""
        wanted = [check_topic_name(n) for n in ([names] if isinstance(names, str) else names)]
        if not wanted:
            raise InvalidArgument("delete_topics() needs at least one topic")
        response = await self._call(
            "DeleteTopics",
            common_pb2.DeleteTopicsRequest(names=wanted, timeout_ms=self.config.request_timeout_ms),
        )
        errors = [
            error_for_code(r.error_code, r.error_message or f"topic {r.name!r}")
            for r in response.topics
            if r.error_code != common_pb2.NONE
        ]
        _raise_first(errors)
        return [r.name for r in response.topics]

    async def _metadata(self, names: list[str]) -> common_pb2.MetadataResponse:
        response: common_pb2.MetadataResponse = await self._conn().call(
            "Metadata", common_pb2.MetadataRequest(topics=names)
        )
        return response

    async def list_topics(self) -> list[str]:
        """Names of every topic, sorted."""
        response = await self._metadata([])
        return sorted(t.name for t in response.topics if t.error_code == common_pb2.NONE)

    async def describe_topics(self, names: str | Iterable[str] | None = None) -> list[TopicDescription]:
        """Partitions of each topic (default: all) with leader, leader epoch, replicas and ISR."""
        wanted = (
            []
            if names is None
            else [check_topic_name(n) for n in ([names] if isinstance(names, str) else names)]
        )
        response = await self._metadata(wanted)
        descriptions, errors = [], []
        answered = set()
        for topic in response.topics:
            answered.add(topic.name)
            if topic.error_code != common_pb2.NONE:
                errors.append(
                    error_for_code(topic.error_code, topic.error_message or f"topic {topic.name!r}")
                )
                continue
            partitions = tuple(
                PartitionDescription(
                    p.partition,
                    p.leader,
                    p.leader_epoch,
                    tuple(p.replicas),
                    tuple(p.isr),
                    tuple(p.offline_replicas),
                )
                for p in sorted(topic.partitions, key=lambda p: p.partition)
            )
            descriptions.append(
                TopicDescription(
                    topic.name,
                    topic.topic_id,
                    partitions,
                    topic_config_dict(topic.config),
                    topic_config_sources(topic.config),
                )
            )
        for name in wanted:
            if name not in answered:
                errors.append(
                    error_for_code(common_pb2.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
                )
        _raise_first(errors)
        return sorted(descriptions, key=lambda d: d.name)

    async def create_partitions(
        self,
        topics: str | Mapping[str, int],
        total_count: int | None = None,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Grow a topic to `total_count` partitions (or {topic: total_count} for several).

        `assignments` optionally gives the replicas of each new partition.
        """
        if isinstance(topics, str):
            if total_count is None:
                raise InvalidArgument("create_partitions(topic, total_count): total_count is missing")
            wanted = {topics: total_count}
        else:
            wanted = dict(topics)
        request_topics = []
        for name, count in wanted.items():
            check_topic_name(name)
            check_int(f"partition count of {name!r}", count, minimum=1)
            replica_lists = [
                common_pb2.ReplicaList(replicas=_check_replicas(f"new partition {i}", r))
                for i, r in enumerate(assignments or [])
            ]
            request_topics.append(
                common_pb2.CreatePartitionsTopic(name=name, count=count, assignments=replica_lists)
            )
        response = await self._call(
            "CreatePartitions",
            common_pb2.CreatePartitionsRequest(
                topics=request_topics, timeout_ms=self.config.request_timeout_ms
            ),
        )
        _raise_first(
            [
                error_for_code(r.error_code, r.error_message or f"topic {r.name!r}")
                for r in response.topics
                if r.error_code != common_pb2.NONE
            ]
        )

    async def alter_topic_configs(
        self,
        topic: str,
        set: Mapping[str, str] | None = None,
        delete: Iterable[str] = (),
        *,
        validate_only: bool = False,
    ) -> None:
        """Change a topic's configs: `set` {name: value}, `delete` names back to their defaults;
        the others are kept (Kafka's IncrementalAlterConfigs). Every replica takes the new values.

        Raises InvalidConfig (an unknown name, with the known ones, or a value out of bounds),
        InvalidRequest (a name both set and deleted), UnknownTopicOrPartition, ... with the
        controller's message.
        """
        check_topic_name(topic)
        wanted = dict(set or {})
        deleted = [delete] if isinstance(delete, str) else list(delete)
        for key, value in wanted.items():
            if not isinstance(key, str) or not key or not isinstance(value, str):
                raise InvalidArgument(f"topic config {key!r}={value!r}: names and values must be str")
        if not wanted and not deleted:
            raise InvalidArgument("alter_topic_configs() needs configs to set or delete")
        # The controller checks again; checking here names the bad name or value before any request.
        altered_topic_configs({}, wanted, deleted)
        response = await self._call(
            "AlterTopicConfigs",
            common_pb2.AlterTopicConfigsRequest(
                topics=[
                    common_pb2.AlterTopicConfigsTopic(name=topic, set_configs=wanted, delete_configs=deleted)
                ],
                timeout_ms=self.config.request_timeout_ms,
                validate_only=validate_only,
            ),
        )
        _raise_first(
            [
                error_for_code(r.error_code, r.error_message or f"topic {r.name!r}")
                for r in response.topics
                if r.error_code != common_pb2.NONE
            ]
        )

    # --- partitions -----------------------------------------------------------------

    async def alter_partition_reassignments(
        self, reassignments: Mapping[TopicPartition, Sequence[int] | None]
    ) -> None:
        """Move partitions to new replica lists; None for a partition cancels its reassignment."""
        by_topic: dict[str, list[common_pb2.ReassignablePartition]] = {}
        for tp in check_partitions(reassignments, "reassignments"):
            target = reassignments[tp]
            if target is None:
                part = common_pb2.ReassignablePartition(partition=tp.partition, cancel=True)
            else:
                replicas = _check_replicas(str(tp), target)
                if not replicas:
                    raise InvalidArgument(f"{tp}: a reassignment needs at least one replica (None cancels)")
                part = common_pb2.ReassignablePartition(partition=tp.partition, replicas=replicas)
            by_topic.setdefault(tp.topic, []).append(part)
        if not by_topic:
            raise InvalidArgument("alter_partition_reassignments() needs at least one partition")
        response = await self._call(
            "AlterPartitionReassignments",
            common_pb2.AlterPartitionReassignmentsRequest(
                topics=[common_pb2.ReassignableTopic(name=t, partitions=p) for t, p in by_topic.items()],
                timeout_ms=self.config.request_timeout_ms,
            ),
        )
        _raise_first(
            [
                error_for_code(r.error_code, r.error_message or f"{r.topic}-{r.partition}")
                for r in response.partitions
                if r.error_code != common_pb2.NONE
            ]
        )

    async def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OngoingReassignment]:
        """Reassignments in progress (of these partitions, default all)."""
        tps = [] if partitions is None else check_partitions(partitions)
        response = await self._call(
            "ListPartitionReassignments",
            common_pb2.ListPartitionReassignmentsRequest(
                partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in tps]
            ),
        )
        return {
            TopicPartition(r.topic, r.partition): OngoingReassignment(
                r.topic, r.partition, tuple(r.replicas), tuple(r.adding_replicas), tuple(r.removing_replicas)
            )
            for r in response.reassignments
        }

    async def elect_leaders(
        self, election_type: str = "preferred", partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, str]:
        """Elect leaders ("preferred": the first replica; "unclean": any live replica, may lose data)
        for these partitions (default all). Returns {tp: "elected" | "not needed"}."""
        if election_type not in ELECTION_TYPES:
            raise InvalidArgument(f"election_type must be 'preferred' or 'unclean', got {election_type!r}")
        tps = [] if partitions is None else check_partitions(partitions)
        response = await self._call(
            "ElectLeaders",
            common_pb2.ElectLeadersRequest(
                election_type=ELECTION_TYPES[election_type],
                partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in tps],
                timeout_ms=self.config.request_timeout_ms,
            ),
        )
        outcome: dict[TopicPartition, str] = {}
        errors = []
        for r in response.partitions:
            tp = TopicPartition(r.topic, r.partition)
            if r.error_code == common_pb2.NONE:
                outcome[tp] = "elected"
            elif r.error_code == common_pb2.ELECTION_NOT_NEEDED:
                outcome[tp] = "not needed"
            else:
                errors.append(error_for_code(r.error_code, r.error_message or str(tp)))
        _raise_first(errors)
        return outcome

    # --- cluster --------------------------------------------------------------------

    async def describe_cluster(self) -> ClusterDescription:
        """Cluster id, the active controller, live brokers and gateways."""
        r = await self._call("DescribeCluster", common_pb2.DescribeClusterRequest())
        controller_address = f"{r.controller_host}:{r.controller_port}" if r.controller_host else ""
        return ClusterDescription(
            cluster_id=r.cluster_id,
            controller_id=r.controller_id,
            controller_epoch=r.controller_epoch,
            controller_address=controller_address,
            brokers=tuple(
                sorted(
                    (NodeDescription(b.broker_id, b.host, b.port, b.rack) for b in r.brokers),
                    key=lambda n: n.node_id,
                )
            ),
            gateways=tuple(
                sorted(
                    (NodeDescription(g.gateway_id, g.host, g.port) for g in r.gateways),
                    key=lambda n: n.node_id,
                )
            ),
            etcd_space=EtcdSpace(
                r.etcd_space.db_size_bytes,
                r.etcd_space.db_size_in_use_bytes,
                r.etcd_space.quota_bytes,
                r.etcd_space.nospace_alarm,
            )
            if r.HasField("etcd_space")
            else None,
        )

    # --- ACLs and tokens (need Alter on the cluster; listing, Describe) -------------------

    async def _alter_acls(self, method: str, bindings: Iterable[AclBinding]) -> dict[AclBinding, bool]:
        wanted = _check_bindings(bindings, "create_acls" if method == "CreateAcls" else "delete_acls")
        outcome: dict[AclBinding, bool] = {}
        errors: list[HighwaterError] = []
        for start in range(0, len(wanted), ACL_BINDINGS_PER_REQUEST_MAX):
            chunk = [
                controller_pb2.AclBinding(**b.to_dict())
                for b in wanted[start : start + ACL_BINDINGS_PER_REQUEST_MAX]
            ]
            request = (
                controller_pb2.CreateAclsRequest(creations=chunk)
                if method == "CreateAcls"
                else controller_pb2.DeleteAclsRequest(deletions=chunk)
            )
            response = await self._call(method, request)
            for r in response.results:
                if r.error_code != common_pb2.NONE:
                    errors.append(error_for_code(r.error_code, r.error_message or method))
                else:
                    b = _binding(r.binding)
                    outcome[b] = outcome.get(b, False) or r.changed
        _raise_first(errors)
        return outcome

    async def create_acls(self, bindings: Iterable[AclBinding]) -> dict[AclBinding, bool]:
        """Add ACLs; returns {binding: True if it was new, False if already present}.

        Raises ClusterAuthorizationFailed without Alter on the cluster, InvalidRequest for a
        malformed binding (the well-formed ones of the same request are added).
        """
        return await self._alter_acls("CreateAcls", bindings)

    async def delete_acls(self, bindings: Iterable[AclBinding]) -> dict[AclBinding, bool]:
        """Remove these exact ACLs; returns {binding: True if it was present}."""
        return await self._alter_acls("DeleteAcls", bindings)

    async def describe_acls(
        self, principal: str | None = None, resource_type: str | None = None, resource_name: str | None = None
    ) -> list[AclBinding]:
        """ACLs of a principal (and of User:*), and/or whose pattern matches a resource; default all."""
        response = await self._call(
            "DescribeAcls",
            controller_pb2.DescribeAclsRequest(
                principal=principal or "",
                resource_type=resource_type or "",
                resource_name=resource_name or "",
            ),
        )
        return [_binding(b) for b in response.acls]

    async def create_token(
        self, principal: str, expires_in_ms: int = 0, description: str = ""
    ) -> CreatedToken:
        """A bearer token for the principal (0: until revoked). The token text is returned only here."""
        check_int("expires_in_ms", expires_in_ms, minimum=0)
        response = await self._call(
            "CreateToken",
            controller_pb2.CreateTokenRequest(
                principal=principal, expires_in_ms=expires_in_ms, description=description
            ),
        )
        return CreatedToken(response.token, _token_description(response.info))

    async def revoke_token(self, token_id: str) -> bool:
        """Revoke a token by id (or give the whole token); False when there was no such token."""
        from clients.common.tokens import token_id_of

        parsed = token_id_of(token_id) if isinstance(token_id, str) else None
        if parsed is None:
            raise InvalidArgument(f"{str(token_id)[:80]!r} is neither a token nor a token id")
        response = await self._call("RevokeToken", controller_pb2.RevokeTokenRequest(token_id=parsed))
        return bool(response.revoked)

    async def list_tokens(self) -> list[TokenDescription]:
        """Every token: id, principal, creation and expiry, description (never a secret)."""
        response = await self._call("ListTokens", controller_pb2.ListTokensRequest())
        return [_token_description(t) for t in response.tokens]

    # --- offsets and groups -----------------------------------------------------------

    async def list_offsets(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """ListOffsets: -2 earliest, -1 latest (HW), else the first offset at or after a timestamp."""
        by_topic: dict[str, list[common_pb2.ListOffsetsPartition]] = {}
        for tp in check_partitions(timestamps):
            ts = check_int(f"timestamp for {tp}", timestamps[tp], minimum=EARLIEST)
            by_topic.setdefault(tp.topic, []).append(
                common_pb2.ListOffsetsPartition(partition=tp.partition, timestamp=ts, current_leader_epoch=-1)
            )
        response = await self._conn().call(
            "ListOffsets",
            common_pb2.ListOffsetsRequest(
                replica_id=-1,
                topics=[common_pb2.ListOffsetsTopic(topic=t, partitions=p) for t, p in by_topic.items()],
            ),
        )
        result, errors = {}, []
        for topic in response.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.topic, p.partition)
                if p.error_code != common_pb2.NONE:
                    errors.append(error_for_code(p.error_code, p.error_message or f"ListOffsets for {tp}"))
                else:
                    result[tp] = p.offset
        _raise_first(errors)
        return result

    async def describe_log_dirs(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, LogDescription]:
        """Each partition's log as its leader holds it (Kafka's describeLogDirs, narrowed to the
        partitions asked): size, offsets and, for a compacted topic, the cleaner's dirty ratio, lag
        and whether the log is uncleanable. A partition that cannot be described now (no leader,
        leadership moving, no Describe on its topic) is answered with its `error` set, never
        raised, so one offline partition does not hide the others."""
        by_topic: dict[str, list[common_pb2.DescribeLogDirsPartition]] = {}
        for tp in check_partitions(partitions):
            by_topic.setdefault(tp.topic, []).append(
                common_pb2.DescribeLogDirsPartition(partition=tp.partition)
            )
        if not by_topic:
            return {}
        response = await self._conn().call(
            "DescribeLogDirs",
            common_pb2.DescribeLogDirsRequest(
                topics=[common_pb2.DescribeLogDirsTopic(topic=t, partitions=p) for t, p in by_topic.items()]
            ),
        )
        return {
            TopicPartition(topic.topic, p.partition): log_description(topic.topic, p)
            for topic in response.topics
            for p in topic.partitions
        }

    async def delete_records(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Delete every record below each partition's offset (Kafka's deleteRecords); -1 means
        the high watermark. Returns each partition's low watermark (its new log start offset once
        every in-sync replica has it).

        The records below become unreadable at once (a consumer there gets OffsetOutOfRange and
        resets); whole segments below go from disk. An offset at or below the current start
        changes nothing. Raises OffsetOutOfRange above the high watermark, RequestTimedOut when
        an in-sync replica did not take the new start within request_timeout_ms (the leader has
        all the same), NotLeaderOrFollower / LeaderNotAvailable while leadership moves.
        """
        by_topic: dict[str, list[common_pb2.DeleteRecordsPartition]] = {}
        for tp in check_partitions(offsets):
            offset = check_int(f"offset for {tp}", offsets[tp], minimum=-1)
            by_topic.setdefault(tp.topic, []).append(
                common_pb2.DeleteRecordsPartition(partition=tp.partition, offset=offset)
            )
        if not by_topic:
            raise InvalidArgument("delete_records() needs at least one partition")
        timeout_ms = self.config.request_timeout_ms
        response = await self._conn().call(
            "DeleteRecords",
            common_pb2.DeleteRecordsRequest(
                timeout_ms=timeout_ms,
                topics=[common_pb2.DeleteRecordsTopic(topic=t, partitions=p) for t, p in by_topic.items()],
            ),
            # The leaders wait up to timeout_ms for their ISR; the answer needs a moment more.
            timeout_ms=2 * timeout_ms,
        )
        result, errors = {}, []
        for topic in response.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.topic, p.partition)
                if p.error_code != common_pb2.NONE:
                    errors.append(error_for_code(p.error_code, p.error_message or f"DeleteRecords for {tp}"))
                else:
                    result[tp] = p.low_watermark
        _raise_first(errors)
        return result

    async def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, int]:
        """The group's committed offsets (next offset to read) for these partitions, default all."""
        if not isinstance(group_id, str) or not group_id:
            raise InvalidArgument(f"group id must be a non-empty str, got {group_id!r}")
        tps = [] if partitions is None else check_partitions(partitions)
        response = await self._call(
            "FetchCommittedOffsets",
            gateway_pb2.FetchCommittedOffsetsRequest(
                group_id=group_id,
                partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in tps],
            ),
        )
        return {TopicPartition(o.topic, o.partition): o.offset for o in response.offsets}

    async def describe_group(self, group_id: str) -> list[GroupPartitionOffset]:
        """Committed offset, end offset (HW) and lag of every partition the group committed."""
        committed = await self.list_group_offsets(group_id)
        if not committed:
            return []
        ends = await self.list_offsets(dict.fromkeys(committed, LATEST))
        rows = []
        for tp in sorted(committed):
            offset = committed[tp]
            end = ends.get(tp, -1)
            lag = max(0, end - offset) if offset >= 0 and end >= 0 else None
            rows.append(GroupPartitionOffset(tp.topic, tp.partition, offset, end, lag))
        return rows

    async def list_groups(self) -> list[GroupListing]:
        """Every consumer group with members or committed offsets."""
        response = await self._call("ListGroups", gateway_pb2.ListGroupsRequest())
        return [GroupListing(g.group_id, g.state, g.members, g.group_epoch) for g in response.groups]

    async def describe_consumer_group(self, group_id: str) -> ConsumerGroupDescription:
        """Members (host, client id, epoch, assignment) and committed offsets with lag;
        GroupIdNotFound when the group has neither."""
        group_id = check_group_id(group_id)
        response = await self._call("DescribeGroups", gateway_pb2.DescribeGroupsRequest(group_ids=[group_id]))
        (d,) = response.groups
        if d.error_code != common_pb2.NONE:
            raise error_for_code(d.error_code, d.error_message or f"DescribeGroups {group_id}")
        members = [
            GroupMemberDescription(
                member_id=m.member_id,
                instance_id=m.instance_id or None,
                client_id=m.client_id,
                client_host=m.client_host,
                member_epoch=m.member_epoch,
                assignment=[TopicPartition(p.topic, p.partition) for p in m.assignment],
                target_assignment=[TopicPartition(p.topic, p.partition) for p in m.target_assignment],
                state=m.state,
            )
            for m in d.members
        ]
        return ConsumerGroupDescription(
            group_id=group_id,
            state=d.state,
            group_epoch=d.group_epoch,
            target_epoch=d.target_epoch,
            assignor=d.assignor,
            members=members,
            offsets=await self.describe_group(group_id),
        )

    async def delete_group(self, group_id: str) -> None:
        """Delete a group's committed offsets; NonEmptyGroup while it has members."""
        group_id = check_group_id(group_id)
        response = await self._call("DeleteGroups", gateway_pb2.DeleteGroupsRequest(group_ids=[group_id]))
        for r in response.results:
            if r.error_code != common_pb2.NONE:
                raise error_for_code(r.error_code, r.error_message or f"DeleteGroups {group_id}")

    async def alter_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Set a group's committed offsets (the next offset to read) from outside the group:
        kafka-consumer-groups --reset-offsets. NonEmptyGroup while the group has members
        (their progress would be overwritten under them)."""
        group_id = check_group_id(group_id)
        items = [
            (tp, check_int(f"offset for {tp}", offsets[tp], minimum=0)) for tp in check_partitions(offsets)
        ]
        for start in range(0, len(items), COMMIT_OFFSETS_PER_REQUEST_MAX):
            by_topic: dict[str, list[gateway_pb2.OffsetCommitPartition]] = {}
            for tp, offset in items[start : start + COMMIT_OFFSETS_PER_REQUEST_MAX]:
                by_topic.setdefault(tp.topic, []).append(
                    gateway_pb2.OffsetCommitPartition(partition=tp.partition, offset=offset, leader_epoch=-1)
                )
            response = await self._call(
                "CommitOffsets",
                gateway_pb2.CommitOffsetsRequest(
                    group_id=group_id,
                    topics=[
                        gateway_pb2.OffsetCommitTopic(topic=t, partitions=p) for t, p in by_topic.items()
                    ],
                ),
            )
            _raise_first(
                [
                    error_for_code(r.error_code, r.error_message or f"commit for {r.topic}-{r.partition}")
                    for r in response.partitions
                    if r.error_code != common_pb2.NONE
                ]
            )

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class Admin(SyncClient[AsyncAdmin]):
    """Synchronous admin client: an AsyncAdmin on a private event-loop thread.

    Example::

        with Admin("127.0.0.1:9092") as admin:
            admin.create_topics("orders", partitions=6, replication_factor=3)
            for partition in admin.describe_topics("orders")[0].partitions:
                print(partition.partition, partition.leader, partition.isr)
    """

    def __init__(self, bootstrap: str | list[str] = DEFAULT_BOOTSTRAP, **settings: Any) -> None:
        super().__init__(AsyncAdmin(bootstrap, **settings), "highwater-admin")
        self.config = self._async.config

    def create_topics(
        self,
        topics: str | NewTopic | Sequence[NewTopic],
        partitions: int = -1,
        replication_factor: int = -1,
        configs: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
    ) -> list[TopicCreated]:
        return self._run(
            self._async.create_topics(
                topics, partitions, replication_factor, configs, validate_only=validate_only
            ),
            "create_topics()",
        )

    def delete_topics(self, names: str | Iterable[str]) -> list[str]:
        return self._run(self._async.delete_topics(names), "delete_topics()")

    def list_topics(self) -> list[str]:
        return self._run(self._async.list_topics(), "list_topics()")

    def describe_topics(self, names: str | Iterable[str] | None = None) -> list[TopicDescription]:
        return self._run(self._async.describe_topics(names), "describe_topics()")

    def create_partitions(
        self,
        topics: str | Mapping[str, int],
        total_count: int | None = None,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self._run(self._async.create_partitions(topics, total_count, assignments), "create_partitions()")

    def alter_topic_configs(
        self,
        topic: str,
        set: Mapping[str, str] | None = None,
        delete: Iterable[str] = (),
        *,
        validate_only: bool = False,
    ) -> None:
        self._run(
            self._async.alter_topic_configs(topic, set, delete, validate_only=validate_only),
            "alter_topic_configs()",
        )

    def alter_partition_reassignments(
        self, reassignments: Mapping[TopicPartition, Sequence[int] | None]
    ) -> None:
        self._run(self._async.alter_partition_reassignments(reassignments), "alter_partition_reassignments()")

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OngoingReassignment]:
        return self._run(
            self._async.list_partition_reassignments(partitions), "list_partition_reassignments()"
        )

    def elect_leaders(
        self, election_type: str = "preferred", partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, str]:
        return self._run(self._async.elect_leaders(election_type, partitions), "elect_leaders()")

    def describe_cluster(self) -> ClusterDescription:
        return self._run(self._async.describe_cluster(), "describe_cluster()")

    def create_acls(self, bindings: Iterable[AclBinding]) -> dict[AclBinding, bool]:
        return self._run(self._async.create_acls(bindings), "create_acls()")

    def delete_acls(self, bindings: Iterable[AclBinding]) -> dict[AclBinding, bool]:
        return self._run(self._async.delete_acls(bindings), "delete_acls()")

    def describe_acls(
        self, principal: str | None = None, resource_type: str | None = None, resource_name: str | None = None
    ) -> list[AclBinding]:
        return self._run(
            self._async.describe_acls(principal, resource_type, resource_name), "describe_acls()"
        )

    def create_token(self, principal: str, expires_in_ms: int = 0, description: str = "") -> CreatedToken:
        return self._run(self._async.create_token(principal, expires_in_ms, description), "create_token()")

    def revoke_token(self, token_id: str) -> bool:
        return self._run(self._async.revoke_token(token_id), "revoke_token()")

    def list_tokens(self) -> list[TokenDescription]:
        return self._run(self._async.list_tokens(), "list_tokens()")

    def list_offsets(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        return self._run(self._async.list_offsets(timestamps), "list_offsets()")

    def describe_log_dirs(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, LogDescription]:
        return self._run(self._async.describe_log_dirs(partitions), "describe_log_dirs()")

    def delete_records(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        return self._run(self._async.delete_records(offsets), "delete_records()")

    def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, int]:
        return self._run(self._async.list_group_offsets(group_id, partitions), "list_group_offsets()")

    def describe_group(self, group_id: str) -> list[GroupPartitionOffset]:
        return self._run(self._async.describe_group(group_id), "describe_group()")

    def list_groups(self) -> list[GroupListing]:
        return self._run(self._async.list_groups(), "list_groups()")

    def describe_consumer_group(self, group_id: str) -> ConsumerGroupDescription:
        return self._run(self._async.describe_consumer_group(group_id), "describe_consumer_group()")

    def delete_group(self, group_id: str) -> None:
        self._run(self._async.delete_group(group_id), "delete_group()")

    def alter_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        self._run(self._async.alter_group_offsets(group_id, offsets), "alter_group_offsets()")
