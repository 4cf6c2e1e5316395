"""The admin client's topic calls: create, delete, list and describe topics, grow them, alter
their configs, reassign partitions and elect leaders (AsyncAdmin, clients/admin.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from clients.admin_calls import AdminCalls, raise_first
from clients.common.topics import (
    altered_topic_configs,
    effective_topic_configs,
    topic_configs_from_proto,
    validate_topic_configs,
)
from clients.config import check_int, check_topic_name
from clients.consumer import check_partitions
from clients.errors import InvalidArgument, error_for_code
from clients.types import (
    NewTopic,
    OngoingReassignment,
    PartitionDescription,
    TopicCreated,
    TopicDescription,
    TopicPartition,
)
from protos.highwater.v1 import common_pb2

ELECTION_TYPES = {"preferred": common_pb2.PREFERRED, "unclean": common_pb2.UNCLEAN}


def topic_config_dict(config: common_pb2.TopicConfig) -> dict[str, int | bool | str | float]:
    """Every topic config under its Kafka name with the value in force: the topic's, else the default."""
    return {entry.name: entry.typed() for entry in effective_topic_configs(topic_configs_from_proto(config))}


def topic_config_sources(config: common_pb2.TopicConfig) -> dict[str, str]:
    """Where each value comes from, as Kafka's DescribeConfigs says it: TOPIC_CONFIG or DEFAULT_CONFIG."""
    return {entry.name: entry.source for entry in effective_topic_configs(topic_configs_from_proto(config))}


def _check_replicas(what: str, replicas: object) -> list[int]:
    if isinstance(replicas, (str, bytes)) or not isinstance(replicas, Iterable):
        raise InvalidArgument(f"{what}: replicas must be a list of broker ids, got {replicas!r}")
    checked = [check_int(f"{what} replica", r, minimum=0) for r in replicas]
    if len(set(checked)) != len(checked):
        raise InvalidArgument(f"{what}: replica list {checked} names a broker twice")
    return checked


class TopicAdmin(AdminCalls):
    """Topics, their configs and partitions: AsyncAdmin's topic calls."""

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
        raise_first(errors)
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
        raise_first(errors)
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
        raise_first(errors)
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
        raise_first(
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
        raise_first(
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
        raise_first(
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
        raise_first(errors)
        return outcome
