"""Kafka's ACL rules for the Kafka listener: what (operation, resource) each request needs.

Pure: no sockets, no clock, no etcd. The listener authenticates the connection (mutual TLS,
principal "User:<CN>" as on the gRPC side) and the handler asks `decide` before it acts; the
same Authorizer snapshot the gRPC interceptor uses answers each check (services/security).

Kafka's documented mapping (docs/KAFKA.md, Security), onto our ACL operations
(clients/common/acls.py):

    Produce                        Write on each Topic
    Fetch                          Read on each Topic
    Metadata                       Describe on each Topic (hidden from a full listing)
    ListOffsets, OffsetForLeaderEpoch   Describe on each Topic
    CreateTopics                   Create on the Cluster, or else on each Topic
    DeleteTopics                   Delete on each Topic
    DeleteRecords                  Delete on each Topic
    CreatePartitions               Alter on each Topic
    DescribeConfigs                Describe on each Topic (Kafka: DescribeConfigs, which we lack)
    AlterConfigs, IncrementalAlterConfigs   Alter on each Topic (Kafka: AlterConfigs, which we
                                   lack); broker resources are refused whatever the ACLs
    DescribeCluster                Describe on the Cluster
    DescribeLogDirs                Describe on the Cluster
    InitProducerId                 IdempotentWrite on the Cluster or Write on any Topic
                                   (Kafka 3; we lack IdempotentWrite: Write on the Cluster stands
                                   for it)
    FindCoordinator                Describe on the Group
    JoinGroup, SyncGroup, Heartbeat, LeaveGroup   Read on the Group
    OffsetCommit                   Read on the Group, Read on each Topic
    OffsetFetch                    Describe on the Group, Describe on each Topic
    ListGroups                     Describe on each Group listed (the others are left out)
    DescribeGroups                 Describe on each Group
    DeleteGroups                   Delete on each Group
    OffsetDelete                   Delete on the Group, Read on each Topic
    AddPartitionsToTxn             Write on the TransactionalId, Write on each Topic
    AddOffsetsToTxn                Write on the TransactionalId, Read on the Group
    TxnOffsetCommit                Write on the TransactionalId, Read on the Group and each Topic
    EndTxn, InitProducerId and Produce with a transactional id, FindCoordinator for one
                                   Write on the TransactionalId
    DescribeTransactions, ListTransactions   Describe on the TransactionalId
    ApiVersions                    nothing (read before anything else, as in Kafka)

Our ACLs have no TransactionalId resource (clients/common/acls.py; adding one would change the
stored ACL format older releases read): Write on a transactional id stands for Write on the
Cluster or on any Topic, as IdempotentWrite does, and Describe for Describe on the Cluster or
that Write. A refused transactional id is TRANSACTIONAL_ID_AUTHORIZATION_FAILED.

A refused topic is answered TOPIC_AUTHORIZATION_FAILED and the rest of the request proceeds; a
refused group GROUP_AUTHORIZATION_FAILED; a refused cluster check CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from services.kafka import protocol
from services.security.authz import CLUSTER, Authorizer, Operation, Resource, ResourceType, group, topic
from services.security.identity import Caller

Allowed = Callable[[Operation, Resource], bool]
AllowedAny = Callable[[Operation, ResourceType], bool]

# Our stand-in for Kafka's IdempotentWrite on the Cluster (no such operation in our ACLs).
IDEMPOTENT_WRITE = Operation.WRITE

# Operation on each topic a request names.
TOPIC_OPERATIONS: dict[int, Operation] = {
    protocol.PRODUCE: Operation.WRITE,
    protocol.FETCH: Operation.READ,
    protocol.METADATA: Operation.DESCRIBE,
    protocol.LIST_OFFSETS: Operation.DESCRIBE,
    protocol.OFFSET_FOR_LEADER_EPOCH: Operation.DESCRIBE,
    protocol.CREATE_TOPICS: Operation.CREATE,
    protocol.DELETE_TOPICS: Operation.DELETE,
    protocol.DELETE_RECORDS: Operation.DELETE,
    protocol.CREATE_PARTITIONS: Operation.ALTER,
    protocol.DESCRIBE_CONFIGS: Operation.DESCRIBE,
    protocol.ALTER_CONFIGS: Operation.ALTER,
    protocol.INCREMENTAL_ALTER_CONFIGS: Operation.ALTER,
    protocol.OFFSET_COMMIT: Operation.READ,
    protocol.OFFSET_FETCH: Operation.DESCRIBE,
    protocol.OFFSET_DELETE: Operation.READ,
    protocol.ADD_PARTITIONS_TO_TXN: Operation.WRITE,
    protocol.TXN_OFFSET_COMMIT: Operation.READ,
}
# Operation on each group a request names.
GROUP_OPERATIONS: dict[int, Operation] = {
    protocol.FIND_COORDINATOR: Operation.DESCRIBE,
    protocol.JOIN_GROUP: Operation.READ,
    protocol.SYNC_GROUP: Operation.READ,
    protocol.HEARTBEAT: Operation.READ,
    protocol.LEAVE_GROUP: Operation.READ,
    protocol.OFFSET_COMMIT: Operation.READ,
    protocol.OFFSET_FETCH: Operation.DESCRIBE,
    protocol.DESCRIBE_GROUPS: Operation.DESCRIBE,
    protocol.LIST_GROUPS: Operation.DESCRIBE,
    protocol.DELETE_GROUPS: Operation.DELETE,
    protocol.OFFSET_DELETE: Operation.DELETE,
    protocol.ADD_OFFSETS_TO_TXN: Operation.READ,
    protocol.TXN_OFFSET_COMMIT: Operation.READ,
}
# APIs acting on a transactional id, and whether they only describe it.
TRANSACTIONAL_APIS: dict[int, bool] = {
    protocol.ADD_PARTITIONS_TO_TXN: False,
    protocol.ADD_OFFSETS_TO_TXN: False,
    protocol.TXN_OFFSET_COMMIT: False,
    protocol.END_TXN: False,
    protocol.DESCRIBE_TRANSACTIONS: True,
    protocol.LIST_TRANSACTIONS: True,
}
# FindCoordinator's key type for a transactional id (0 is a group).
KEY_TYPE_TRANSACTION = 1
# APIs that need nothing (ApiVersions) or decide with a rule of their own below.
OTHER_APIS = frozenset(
    {protocol.API_VERSIONS, protocol.DESCRIBE_CLUSTER, protocol.DESCRIBE_LOG_DIRS, protocol.INIT_PRODUCER_ID}
    | set(TRANSACTIONAL_APIS)
)
# DescribeConfigs resource type of a topic (Kafka's ConfigResource.Type.TOPIC).
_CONFIG_RESOURCE_TOPIC = 2


@dataclass(frozen=True, slots=True)
class Decision:
    """What one request may not touch. Empty: everything it names is allowed.

    cluster_refused: the whole request is refused (CLUSTER_AUTHORIZATION_FAILED).
    topics_refused / groups_refused: names answered TOPIC_ / GROUP_AUTHORIZATION_FAILED.
    """

    cluster_refused: bool = False
    topics_refused: frozenset[str] = field(default_factory=frozenset)
    groups_refused: frozenset[str] = field(default_factory=frozenset)
    # The request's transactional id (a transactional API, or Produce, InitProducerId and
    # FindCoordinator naming one) is refused: TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    transactional_refused: bool = False

    @property
    def refuses_anything(self) -> bool:
        return (
            self.cluster_refused
            or bool(self.topics_refused)
            or bool(self.groups_refused)
            or self.transactional_refused
        )


def named_topics(api_key: int, body: Any) -> list[str]:
    """The topic names a request body names (Metadata: [] for "every topic")."""
    if api_key == protocol.PRODUCE:
        return [t.name for t in body.topic_data]
    if api_key in (protocol.FETCH, protocol.OFFSET_FOR_LEADER_EPOCH):
        return [t.topic for t in body.topics]
    if api_key == protocol.METADATA:
        return [t.name for t in (body.topics or ()) if getattr(t, "name", None) is not None]
    if api_key == protocol.DELETE_TOPICS:
        return list(body.topic_names)
    if api_key in (protocol.DESCRIBE_CONFIGS, protocol.ALTER_CONFIGS, protocol.INCREMENTAL_ALTER_CONFIGS):
        return [r.resource_name for r in body.resources if r.resource_type == _CONFIG_RESOURCE_TOPIC]
    if api_key == protocol.OFFSET_FETCH:
        return [t.name for t in (body.topics or ())]
    if api_key == protocol.ADD_PARTITIONS_TO_TXN:
        return [t.name for t in body.v3_and_below_topics]
    if api_key in (
        protocol.LIST_OFFSETS,
        protocol.CREATE_TOPICS,
        protocol.CREATE_PARTITIONS,
        protocol.OFFSET_COMMIT,
        protocol.OFFSET_DELETE,
        protocol.DELETE_RECORDS,
        protocol.TXN_OFFSET_COMMIT,
    ):
        return [t.name for t in body.topics]
    return []


def named_groups(api_key: int, body: Any) -> list[str]:
    """The group ids a request body names (ListGroups: none; its answer is filtered instead)."""
    if api_key == protocol.FIND_COORDINATOR:
        if getattr(body, "key_type", 0) == KEY_TYPE_TRANSACTION:
            return []
        keys = getattr(body, "coordinator_keys", None)
        return list(keys) if keys is not None else [body.key]
    if api_key == protocol.DESCRIBE_GROUPS:
        return list(body.groups)
    if api_key == protocol.DELETE_GROUPS:
        return list(body.groups_names)
    if api_key in GROUP_OPERATIONS and api_key != protocol.LIST_GROUPS:
        return [body.group_id]
    return []


def _refused(
    names: Iterable[str], operation: Operation, make: Callable[[str], Resource], ok: Allowed
) -> frozenset[str]:
    return frozenset(n for n in set(names) if not ok(operation, make(n)))


def decide(api_key: int, body: Any, allowed: Allowed, allowed_any: AllowedAny) -> Decision:
    """What this request may not do, by Kafka's rules. allowed / allowed_any ask the authorizer
    for this connection's principal (Authorizer.authorize / authorize_any)."""
    if api_key == protocol.API_VERSIONS:
        return Decision()
    transactional_refused = _transactional_refused(api_key, body, allowed, allowed_any)
    if api_key in (protocol.DESCRIBE_CLUSTER, protocol.DESCRIBE_LOG_DIRS):
        return Decision(cluster_refused=not allowed(Operation.DESCRIBE, CLUSTER))
    if api_key == protocol.INIT_PRODUCER_ID:
        ok = allowed(IDEMPOTENT_WRITE, CLUSTER) or allowed_any(Operation.WRITE, ResourceType.TOPIC)
        return Decision(cluster_refused=not ok, transactional_refused=transactional_refused)
    if api_key in (protocol.END_TXN, protocol.DESCRIBE_TRANSACTIONS, protocol.LIST_TRANSACTIONS):
        return Decision(transactional_refused=transactional_refused)
    if api_key not in TOPIC_OPERATIONS and api_key not in GROUP_OPERATIONS:
        raise ValueError(f"no ACL rule for Kafka API key {api_key}: add one to acl_rules.py")
    topics: frozenset[str] = frozenset()
    if api_key in TOPIC_OPERATIONS:
        names = named_topics(api_key, body)
        if api_key == protocol.CREATE_TOPICS and allowed(Operation.CREATE, CLUSTER):
            names = []
        topics = _refused(names, TOPIC_OPERATIONS[api_key], topic, allowed)
    groups: frozenset[str] = frozenset()
    if api_key in GROUP_OPERATIONS:
        groups = _refused(named_groups(api_key, body), GROUP_OPERATIONS[api_key], group, allowed)
    return Decision(topics_refused=topics, groups_refused=groups, transactional_refused=transactional_refused)


def _transactional_refused(api_key: int, body: Any, allowed: Allowed, allowed_any: AllowedAny) -> bool:
    """Whether the request's transactional id is refused (False: it names none, or is allowed).
    Our stand-in for Kafka's TransactionalId resource (the module's docstring says why)."""
    names_one = api_key in TRANSACTIONAL_APIS or (
        api_key in (protocol.PRODUCE, protocol.INIT_PRODUCER_ID) and getattr(body, "transactional_id", None)
    )
    if api_key == protocol.FIND_COORDINATOR:
        names_one = getattr(body, "key_type", 0) == KEY_TYPE_TRANSACTION
    if not names_one:
        return False
    may_write = allowed(IDEMPOTENT_WRITE, CLUSTER) or allowed_any(Operation.WRITE, ResourceType.TOPIC)
    if TRANSACTIONAL_APIS.get(api_key, False):
        return not (may_write or allowed(Operation.DESCRIBE, CLUSTER))
    return not may_write


def uncovered(api_keys: Iterable[int]) -> set[int]:
    """The API keys among these that have no rule here (a unit test keeps it empty)."""
    return {
        k for k in api_keys if k not in TOPIC_OPERATIONS and k not in GROUP_OPERATIONS and k not in OTHER_APIS
    }


@dataclass(frozen=True, slots=True)
class ConnectionAccess:
    """One authenticated Kafka connection's principal, asked of the current ACL snapshot.

    authorizer: returns the snapshot in force (SecurityCache swaps it when etcd's ACLs change,
    so a grant or revocation applies to connections already open, from their next request).
    A service identity's certificate acts as a super user, as on the gRPC data plane.
    """

    caller: Caller
    authorizer: Callable[[], Authorizer]

    @property
    def principal(self) -> str:
        return self.caller.principal

    def allowed(self, operation: Operation, resource: Resource) -> bool:
        if self.caller.service is not None:
            return True
        return self.authorizer().authorize(self.caller.principal, operation, resource)

    def allowed_any(self, operation: Operation, resource_type: ResourceType) -> bool:
        if self.caller.service is not None:
            return True
        return self.authorizer().authorize_any(self.caller.principal, operation, resource_type)
