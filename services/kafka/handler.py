"""Kafka requests -> the broker's own calls -> Kafka answers: the API-key routing.

KafkaHandler routes each decoded request to the call family that answers it: data_calls.py
(Produce, ListOffsets, DeleteRecords, DescribeLogDirs, OffsetForLeaderEpoch, InitProducerId),
fetch_calls.py (Fetch and its sessions), admin_calls.py (Metadata, DescribeCluster, configs, the
admin calls forwarded to the controller), group_calls.py (FindCoordinator, offsets, the
classic group protocol, group admin) and txn_calls.py (the transaction coordinator's calls, and
the leader's check of a transactional Produce). Each family turns kio's request into the protobuf request
the gRPC servicers pass to the same ReplicaManager or the controller, and the answer back into
kio's response class of the asked version; fields are named as in the newest version and `build`
drops the ones an older version lacks, so one method serves every version in
protocol.SUPPORTED_VERSIONS. A new family is one more module and its rows in KafkaHandler's
table.

No sockets and no clock here: the listener owns the connection, the backend (backend.py) the
I/O and the broker the fetch session cache's clock, so a unit test drives this with a fake
backend. What the families share is handler_common.py's; its names other modules import are
re-exported here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kio.schema.errors import ErrorCode as K

from services.kafka import acl_rules, fetch_sessions, protocol
from services.kafka.admin_calls import AdminCalls, topic_config_entries
from services.kafka.data_calls import DataCalls
from services.kafka.fetch_calls import FetchCalls
from services.kafka.group_calls import GroupCalls
from services.kafka.handler_common import (
    NO_ACL,
    BackendUnavailable,
    ClassicGroupsPort,
    ConnectionContext,
    KafkaAccess,
    KafkaBackend,
    KafkaBroker,
    LogDirDescription,
    OffsetCommit,
    ReplicaLogSize,
    RequestAcl,
    StoredGroupListing,
    api_versions_response,
    log,
)
from services.kafka.protocol import Request
from services.kafka.txn_calls import TxnCalls

__all__ = [
    "BackendUnavailable",
    "ClassicGroupsPort",
    "KafkaAccess",
    "KafkaBackend",
    "KafkaBroker",
    "KafkaHandler",
    "LogDirDescription",
    "OffsetCommit",
    "ReplicaLogSize",
    "RequestAcl",
    "StoredGroupListing",
    "api_versions_response",
    "topic_config_entries",
]

# One Kafka API's answer to a request, under that request's ACL decision.
KafkaCall = Callable[[Request, RequestAcl], Awaitable[Any]]


class KafkaHandler:
    """Answers decoded Kafka requests for one broker, or for one connection of it
    (for_connection). Owned by the broker's event loop."""

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
        self.context = ConnectionContext(
            backend=backend,
            access=access,
            max_batch_records=max_batch_records,
            fetch_session_cache=(
                fetch_session_cache if fetch_session_cache is not None else fetch_sessions.without_sessions()
            ),
        )
        txn = TxnCalls(self.context)
        data = DataCalls(self.context, txn)
        fetch = FetchCalls(self.context)
        admin = AdminCalls(self.context)
        groups = GroupCalls(self.context)
        # Every API served, by key, and the call that answers it.
        self._apis: dict[int, KafkaCall] = {
            protocol.API_VERSIONS: self.api_versions,
            protocol.METADATA: admin.metadata,
            protocol.PRODUCE: data.produce,
            protocol.FETCH: fetch.fetch,
            protocol.LIST_OFFSETS: data.list_offsets,
            protocol.DELETE_RECORDS: data.delete_records,
            protocol.DESCRIBE_LOG_DIRS: data.describe_log_dirs,
            protocol.OFFSET_FOR_LEADER_EPOCH: data.offsets_for_leader_epoch,
            protocol.INIT_PRODUCER_ID: data.init_producer_id,
            protocol.CREATE_TOPICS: admin.create_topics,
            protocol.DELETE_TOPICS: admin.delete_topics,
            protocol.CREATE_PARTITIONS: admin.create_partitions,
            protocol.DESCRIBE_CONFIGS: admin.describe_configs,
            protocol.ALTER_CONFIGS: admin.alter_configs,
            protocol.INCREMENTAL_ALTER_CONFIGS: admin.incremental_alter_configs,
            protocol.DESCRIBE_CLUSTER: admin.describe_cluster,
            protocol.FIND_COORDINATOR: groups.find_coordinator,
            protocol.OFFSET_COMMIT: groups.offset_commit,
            protocol.OFFSET_FETCH: groups.offset_fetch,
            protocol.JOIN_GROUP: groups.join_group,
            protocol.SYNC_GROUP: groups.sync_group,
            protocol.HEARTBEAT: groups.heartbeat,
            protocol.LEAVE_GROUP: groups.leave_group,
            protocol.LIST_GROUPS: groups.list_groups,
            protocol.DESCRIBE_GROUPS: groups.describe_groups,
            protocol.DELETE_GROUPS: groups.delete_groups,
            protocol.OFFSET_DELETE: groups.offset_delete,
            protocol.ADD_PARTITIONS_TO_TXN: txn.add_partitions_to_txn,
            protocol.ADD_OFFSETS_TO_TXN: txn.add_offsets_to_txn,
            protocol.TXN_OFFSET_COMMIT: txn.txn_offset_commit,
            protocol.END_TXN: txn.end_txn,
            protocol.DESCRIBE_TRANSACTIONS: txn.describe_transactions,
            protocol.LIST_TRANSACTIONS: txn.list_transactions,
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
            self.context.backend,
            max_batch_records=self.context.max_batch_records,
            access=access,
            fetch_session_cache=self.context.fetch_session_cache,
        )

    async def handle(self, request: Request) -> Any | None:
        """The answer to one request, or None when Kafka sends none (Produce with acks=0).

        With ACLs, the request's decision (acl_rules.decide) is made first and passed to the call
        that answers it, which answers what it refuses with Kafka's authorization codes and acts
        on the rest."""
        return await self._apis[request.api_key](request, self._acl_of(request))

    def _acl_of(self, request: Request) -> RequestAcl:
        """The request's ACL decision (without ACLs: nothing refused)."""
        access = self.context.access
        if access is None:
            return NO_ACL
        decision = acl_rules.decide(request.api_key, request.body, access.allowed, access.allowed_any)
        if decision.refuses_anything:
            log.debug(
                "Kafka API %d for %s: refused cluster=%s topics=%s groups=%s",
                request.api_key,
                access.principal,
                decision.cluster_refused,
                sorted(decision.topics_refused)[:10],
                sorted(decision.groups_refused)[:10],
            )
        return RequestAcl(decision, access.allowed)

    async def api_versions(self, request: Request, acl: RequestAcl) -> Any:
        return api_versions_response(request.api_version, K.none)
