"""Admin clients: `AsyncAdmin` (asyncio) and `Admin` (synchronous) — topics, partitions,
reassignments, leader elections, the cluster, consumer groups, ACLs and tokens.

Every call goes to a gateway, which passes admin calls to the active controller
(DESIGN.md section 3). A per-topic or per-partition error in the answer is raised
as its typed HighwaterError carrying the server's message; for a call about
several topics the first error is raised after the whole answer was read.
NOT_CONTROLLER (a controller election in progress) is retried within
request_timeout_ms.

The calls live by API family in clients/admin_topics.py (topics, configs, partitions,
reassignments, elections), admin_cluster.py (the cluster, ACLs, tokens), admin_groups.py
(offsets, consumer groups), admin_records.py (log dirs, deleting records) and
admin_transactions.py (list, describe and abort transactions), over the
transport of admin_calls.py; AsyncAdmin is all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from clients.admin_cluster import ClusterAdmin, CreatedToken, TokenDescription
from clients.admin_groups import GroupAdmin
from clients.admin_records import LogDescription, RecordAdmin, log_description
from clients.admin_topics import ELECTION_TYPES, TopicAdmin, topic_config_dict, topic_config_sources
from clients.admin_transactions import (
    AbortedTransaction,
    TransactionAdmin,
    TransactionDescription,
    TransactionListing,
)
from clients.common.acls import AclBinding
from clients.config import DEFAULT_BOOTSTRAP
from clients.loop_thread import SyncClient
from clients.types import (
    ClusterDescription,
    ConsumerGroupDescription,
    GroupListing,
    GroupPartitionOffset,
    NewTopic,
    OngoingReassignment,
    TopicCreated,
    TopicDescription,
    TopicPartition,
)

__all__ = [
    "ELECTION_TYPES",
    "Admin",
    "AsyncAdmin",
    "CreatedToken",
    "LogDescription",
    "TokenDescription",
    "log_description",
    "topic_config_dict",
    "topic_config_sources",
]


class AsyncAdmin(TopicAdmin, ClusterAdmin, GroupAdmin, RecordAdmin, TransactionAdmin):
    """asyncio admin client. `async with AsyncAdmin("127.0.0.1:9092") as admin:`."""

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

    def list_transactions(
        self, states: Iterable[str] = (), producer_ids: Iterable[int] = (), older_than_ms: int = -1
    ) -> list[TransactionListing]:
        return self._run(
            self._async.list_transactions(states, producer_ids, older_than_ms), "list_transactions()"
        )

    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[TransactionDescription]:
        return self._run(self._async.describe_transactions(transactional_ids), "describe_transactions()")

    def abort_transaction(self, transactional_id: str) -> AbortedTransaction:
        return self._run(self._async.abort_transaction(transactional_id), "abort_transaction()")
