"""What each RPC requires, as data plus small functions: request in, admission out.

The interceptor (interceptor.py) authenticates the caller, then looks up the
method's rule here and applies the result. A rule never does I/O: it reads
the request, asks `Access` (the caller plus the pure ACL authorizer), and
returns an `Admission`:

- `Denied` raised: the whole request is refused with a gRPC status
  (PERMISSION_DENIED, INVALID_ARGUMENT) and the servicer never runs;
- `answer` set: the response is made here (every partition refused), the
  servicer never runs, so nothing is written;
- otherwise the servicer runs on `request` (the original object when nothing
  was refused, else a copy without the refused partitions), and `respond`
  puts the refused partitions back into its response with their error code.

This is Kafka's KafkaApis order: authorize each partition first, hand only the
authorized ones to the replica manager, merge the errors into the answer.
Servicers stay unaware of security. Every RPC of every service must have a rule
(`RULES`); a method without one is refused, so a new RPC cannot slip past
(tests/unit/test_authz.py checks the table against the protos).

Control-plane RPCs check identities rather than ACLs: LeaderAndIsr,
UpdateMetadata and StopReplica only from a controller certificate; Fetch (and
each message of FetchStream, UNARY_OVER_STREAM) with
a replica id >= 0 and OffsetsForLeaderEpoch only from the certificate of that
very broker; AlterPartition and ControlledShutdown only from the broker they
name; each BrokerHeartbeat message only from the broker it names, each
StandbyHeartbeat message only from a controller. Service identities act as
super users on the data plane (a gateway refreshing metadata, a follower
fetching). Without TLS there are no identities and these checks are skipped,
as before this layer existed.

Streams are checked on their messages, never on their opening alone (a rule
reads the request, which arrives after the stream opened): the interceptor runs
the method's rule on every message of every stream a caller sends, the first
before the servicer runs (issue 37). Except on UNARY_OVER_STREAM methods, which
answer each message, a rule of a client-streaming method admits or refuses each
message whole: there is no answer per message to merge refusals into.

ACLs and tokens are managed through the controller's admin RPCs: CreateAcls
and DeleteAcls need Alter on the Cluster, DescribeAcls Describe on it (Kafka's
rules); CreateToken and RevokeToken need Alter, ListTokens Describe, alike,
since a token may name any principal. Alter on the Cluster is
therefore full administration (its holder can grant itself anything and mint
a token for any principal); the first one is granted by a super user
(--super-users), who needs no ACL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from clients.common.record_batch import iter_batch_headers
from protos.highwater.v1 import broker_pb2, common_pb2, gateway_pb2
from protos.highwater.v1.common_pb2 import ErrorCode
from services.security.authz import (
    CLUSTER,
    Authorizer,
    Operation,
    Resource,
    ResourceType,
    group,
    topic,
)
from services.security.identity import Caller

TOPIC_AUTHORIZATION_FAILED = common_pb2.TOPIC_AUTHORIZATION_FAILED


class Denied(Exception):
    """The whole request is refused. code: a grpc.StatusCode name; message: for the caller."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Limits:
    """Request limits the rules enforce (0: off)."""

    max_batch_records: int = 0


@dataclass(slots=True)
class Access:
    """The caller of one request and what it may do.

    identities_checked: TLS is on, so service identities are proven and
      control-plane RPCs demand them. authorizer: None when ACLs are off
      (every authenticated caller may do every data-plane operation).
    """

    caller: Caller
    authorizer: Authorizer | None
    identities_checked: bool
    denials: list[tuple[Operation, Resource]] = field(default_factory=list)

    def allowed(self, operation: Operation, resource: Resource) -> bool:
        if self.authorizer is None or self.caller.service is not None:
            return True
        ok = self.authorizer.authorize(self.caller.principal, operation, resource)
        if not ok:
            self.denials.append((operation, resource))
        return ok

    def allowed_any(self, operation: Operation, resource_type: ResourceType) -> bool:
        if self.authorizer is None or self.caller.service is not None:
            return True
        ok = self.authorizer.authorize_any(self.caller.principal, operation, resource_type)
        if not ok:
            self.denials.append((operation, Resource(resource_type, "*")))
        return ok

    def require(self, operation: Operation, resource: Resource, what: str) -> None:
        if not self.allowed(operation, resource):
            raise Denied(
                "PERMISSION_DENIED",
                f"{self.caller.describe()} may not {operation.value} "
                f"{resource.type.value} {resource.name!r} ({what})",
            )

    def require_service(self, what: str, kinds: tuple[str, ...], service_id: int | None = None) -> None:
        """Only these service identities (and, when given, only the one with this id) may call."""
        if not self.identities_checked:
            return
        svc = self.caller.service
        if svc is None or svc.kind not in kinds:
            raise Denied(
                "PERMISSION_DENIED",
                f"{what} is only accepted from {' or '.join(kinds)} certificates, "
                f"not from {self.caller.describe()}",
            )
        if service_id is not None and svc.id != service_id:
            raise Denied(
                "PERMISSION_DENIED", f"{what} names {svc.kind} {service_id} but the certificate is {svc.name}"
            )


@dataclass(slots=True)
class Admission:
    request: Any
    answer: Any = None
    respond: Callable[[Any], Any] | None = None


Rule = Callable[[Any, Access, Limits], Admission]


def _refusal(access: Access, operation: Operation, kind: str, name: str) -> str:
    return f"{access.caller.describe()} may not {operation.value} {kind} {name!r}"


# --- per-partition filters ------------------------------------------------------------------


def _split(
    topics: Iterable[Any], refuse: Callable[[Any, Any], tuple[ErrorCode, str] | None]
) -> tuple[list[tuple[Any, list[Any]]], list[tuple[str, int, ErrorCode, str]]]:
    """Sort each topic's partitions into kept ones and refused (topic, partition, code, message)."""
    kept: list[tuple[Any, list[Any]]] = []
    refused: list[tuple[str, int, ErrorCode, str]] = []
    for t in topics:
        parts = []
        for p in t.partitions:
            why = refuse(t, p)
            if why is None:
                parts.append(p)
            else:
                refused.append((t.topic, p.partition, why[0], why[1]))
        if parts:
            kept.append((t, parts))
    return kept, refused


def _merge(topics: Any, refused: list[tuple[str, int, ErrorCode, str]], make: Callable[..., Any]) -> None:
    """Add the refused partitions to a response's repeated topic field (one entry per topic)."""
    by_topic = {t.topic: t for t in topics}
    for name, partition, code, message in refused:
        entry = by_topic.get(name)
        if entry is None:
            entry = by_topic[name] = topics.add(topic=name)
        entry.partitions.append(make(partition, code, message))


def _records_over(records: bytes, max_records: int) -> int:
    """The record count of the first batch holding more than max_records, else 0."""
    try:
        for header in iter_batch_headers(records):
            if header.records_count > max_records:
                return header.records_count
    except (ValueError, IndexError):
        return 0  # malformed: the broker answers CORRUPT_MESSAGE for it
    return 0


def produce(req: common_pb2.ProduceRequest, access: Access, limits: Limits) -> Admission:
    allowed: dict[str, bool] = {}

    def refuse(t: Any, p: Any) -> tuple[ErrorCode, str] | None:
        ok = allowed.get(t.topic)
        if ok is None:
            ok = allowed[t.topic] = access.allowed(Operation.WRITE, topic(t.topic))
        if not ok:
            return TOPIC_AUTHORIZATION_FAILED, _refusal(access, Operation.WRITE, "topic", t.topic)
        if limits.max_batch_records:
            count = _records_over(p.records, limits.max_batch_records)
            if count:
                return (
                    common_pb2.INVALID_REQUEST,
                    f"a batch of {count} records is over the limit of "
                    f"{limits.max_batch_records} records per batch",
                )
        return None

    kept, refused = _split(req.topics, refuse)
    if not refused:
        return Admission(req)

    def make(partition: int, code: ErrorCode, message: str) -> common_pb2.ProducePartitionResponse:
        return common_pb2.ProducePartitionResponse(
            partition=partition,
            error_code=code,
            error_message=message,
            base_offset=-1,
            log_append_time_ms=-1,
            log_start_offset=-1,
        )

    def respond(resp: common_pb2.ProduceResponse) -> common_pb2.ProduceResponse:
        _merge(resp.topics, refused, make)
        return resp

    if not kept:
        return Admission(req, answer=respond(common_pb2.ProduceResponse()))
    narrowed = common_pb2.ProduceRequest(
        acks=req.acks, timeout_ms=req.timeout_ms, transactional_id=req.transactional_id
    )
    for t, parts in kept:
        narrowed.topics.add(topic=t.topic).partitions.extend(parts)
    return Admission(narrowed, respond=respond)


def fetch(req: common_pb2.FetchRequest, access: Access, limits: Limits) -> Admission:
    if req.replica_id >= 0:
        access.require_service(f"Fetch with replica id {req.replica_id}", ("broker",), req.replica_id)
        return Admission(req)
    return _per_topic_read(req, access, Operation.READ, common_pb2.FetchRequest, _fetch_error)


def _fetch_error(partition: int, code: ErrorCode, message: str) -> common_pb2.FetchPartitionResponse:
    return common_pb2.FetchPartitionResponse(
        partition=partition,
        error_code=code,
        error_message=message,
        high_watermark=-1,
        log_start_offset=-1,
        log_end_offset=-1,
    )


def list_offsets(req: common_pb2.ListOffsetsRequest, access: Access, limits: Limits) -> Admission:
    return _per_topic_read(
        req, access, Operation.DESCRIBE, common_pb2.ListOffsetsRequest, _list_offsets_error
    )


def _list_offsets_error(
    partition: int, code: ErrorCode, message: str
) -> common_pb2.ListOffsetsPartitionResponse:
    return common_pb2.ListOffsetsPartitionResponse(
        partition=partition, error_code=code, error_message=message, timestamp=-1, offset=-1
    )


def describe_log_dirs(req: common_pb2.DescribeLogDirsRequest, access: Access, limits: Limits) -> Admission:
    """Describe on each topic, as ListOffsets (Kafka asks Describe on the cluster for its
    all-brokers DescribeLogDirs; ours describes only the asked partitions' leaders' logs)."""
    return _per_topic_read(
        req, access, Operation.DESCRIBE, common_pb2.DescribeLogDirsRequest, _describe_log_dirs_error
    )


def _describe_log_dirs_error(
    partition: int, code: ErrorCode, message: str
) -> common_pb2.DescribeLogDirsPartitionResponse:
    return common_pb2.DescribeLogDirsPartitionResponse(
        partition=partition, error_code=code, error_message=message, broker_id=-1
    )


def _per_topic_read(
    req: Any,
    access: Access,
    operation: Operation,
    request_cls: type,
    make: Callable[[int, ErrorCode, str], Any],
) -> Admission:
    allowed: dict[str, bool] = {}

    def refuse(t: Any, p: Any) -> tuple[ErrorCode, str] | None:
        ok = allowed.get(t.topic)
        if ok is None:
            ok = allowed[t.topic] = access.allowed(operation, topic(t.topic))
        return None if ok else (TOPIC_AUTHORIZATION_FAILED, _refusal(access, operation, "topic", t.topic))

    kept, refused = _split(req.topics, refuse)
    if not refused:
        return Admission(req)

    def respond(resp: Any) -> Any:
        _merge(resp.topics, refused, make)
        return resp

    response_cls = _PER_TOPIC_READ_RESPONSES[request_cls]
    if not kept:
        return Admission(req, answer=respond(response_cls()))
    narrowed = request_cls()
    narrowed.CopyFrom(req)
    del narrowed.topics[:]
    for t, parts in kept:
        narrowed.topics.add(topic=t.topic).partitions.extend(parts)
    return Admission(narrowed, respond=respond)


_PER_TOPIC_READ_RESPONSES: dict[type, type] = {
    common_pb2.FetchRequest: common_pb2.FetchResponse,
    common_pb2.ListOffsetsRequest: common_pb2.ListOffsetsResponse,
    common_pb2.DescribeLogDirsRequest: common_pb2.DescribeLogDirsResponse,
}


def delete_records(req: common_pb2.DeleteRecordsRequest, access: Access, limits: Limits) -> Admission:
    """Kafka's rule for DeleteRecords: Delete on each topic; refused partitions are answered
    TOPIC_AUTHORIZATION_FAILED and the rest proceed."""
    allowed: dict[str, bool] = {}

    def refuse(t: Any, p: Any) -> tuple[ErrorCode, str] | None:
        ok = allowed.get(t.topic)
        if ok is None:
            ok = allowed[t.topic] = access.allowed(Operation.DELETE, topic(t.topic))
        if ok:
            return None
        return TOPIC_AUTHORIZATION_FAILED, _refusal(access, Operation.DELETE, "topic", t.topic)

    kept, refused = _split(req.topics, refuse)
    if not refused:
        return Admission(req)

    def make(partition: int, code: ErrorCode, message: str) -> common_pb2.DeleteRecordsPartitionResponse:
        return common_pb2.DeleteRecordsPartitionResponse(
            partition=partition, error_code=code, error_message=message, low_watermark=-1
        )

    def respond(resp: common_pb2.DeleteRecordsResponse) -> common_pb2.DeleteRecordsResponse:
        _merge(resp.topics, refused, make)
        return resp

    if not kept:
        return Admission(req, answer=respond(common_pb2.DeleteRecordsResponse()))
    narrowed = common_pb2.DeleteRecordsRequest(timeout_ms=req.timeout_ms)
    for t, parts in kept:
        narrowed.topics.add(topic=t.topic).partitions.extend(parts)
    return Admission(narrowed, respond=respond)


def offsets_for_leader_epoch(
    req: broker_pb2.OffsetsForLeaderEpochRequest, access: Access, limits: Limits
) -> Admission:
    access.require_service("OffsetsForLeaderEpoch", ("broker",), req.replica_id)
    return Admission(req)


def metadata(req: common_pb2.MetadataRequest, access: Access, limits: Limits) -> Admission:
    """Unauthorized topics: hidden when all topics are asked, TOPIC_AUTHORIZATION_FAILED when named."""
    if access.authorizer is None or access.caller.service is not None:
        return Admission(req)
    named = set(req.topics)

    def respond(resp: common_pb2.MetadataResponse) -> common_pb2.MetadataResponse:
        kept = []
        for t in resp.topics:
            if access.allowed(Operation.DESCRIBE, topic(t.name)):
                kept.append(t)
            elif t.name in named:
                kept.append(
                    common_pb2.TopicMetadata(
                        name=t.name,
                        error_code=TOPIC_AUTHORIZATION_FAILED,
                        error_message=_refusal(access, Operation.DESCRIBE, "topic", t.name),
                    )
                )
        del resp.topics[:]
        resp.topics.extend(kept)
        return resp

    return Admission(req, respond=respond)


def describe_cluster(req: common_pb2.DescribeClusterRequest, access: Access, limits: Limits) -> Admission:
    access.require(Operation.DESCRIBE, CLUSTER, "DescribeCluster")
    if access.authorizer is None or access.caller.service is not None:
        return Admission(req)

    def respond(resp: common_pb2.DescribeClusterResponse) -> common_pb2.DescribeClusterResponse:
        visible = {
            t: access.allowed(Operation.DESCRIBE, topic(t))
            for t in {p.topic for p in resp.partitions} | set(resp.topic_configs)
        }
        kept = [p for p in resp.partitions if visible[p.topic]]
        del resp.partitions[:]
        resp.partitions.extend(kept)
        for t, ok in visible.items():
            if not ok and t in resp.topic_configs:
                del resp.topic_configs[t]
        return resp

    return Admission(req, respond=respond)


# --- consumer offsets and streaming -----------------------------------------------------------


def commit_offsets(req: gateway_pb2.CommitOffsetsRequest, access: Access, limits: Limits) -> Admission:
    access.require(Operation.READ, group(req.group_id), "CommitOffsets")
    allowed: dict[str, bool] = {}

    def refuse(t: Any, p: Any) -> tuple[ErrorCode, str] | None:
        ok = allowed.get(t.topic)
        if ok is None:
            ok = allowed[t.topic] = access.allowed(Operation.READ, topic(t.topic))
        return (
            None if ok else (TOPIC_AUTHORIZATION_FAILED, _refusal(access, Operation.READ, "topic", t.topic))
        )

    kept, refused = _split(req.topics, refuse)
    if not refused:
        return Admission(req)

    def respond(resp: gateway_pb2.CommitOffsetsResponse) -> gateway_pb2.CommitOffsetsResponse:
        for name, partition, code, message in refused:
            resp.partitions.add(topic=name, partition=partition, error_code=code, error_message=message)
        return resp

    narrowed = gateway_pb2.CommitOffsetsRequest(group_id=req.group_id)
    for t, parts in kept:
        narrowed.topics.add(topic=t.topic).partitions.extend(parts)
    if not kept:
        return Admission(req, answer=respond(gateway_pb2.CommitOffsetsResponse()))
    return Admission(narrowed, respond=respond)


def fetch_committed_offsets(
    req: gateway_pb2.FetchCommittedOffsetsRequest, access: Access, limits: Limits
) -> Admission:
    """Offsets of topics the caller may not Describe read as "nothing committed" (or are left out)."""
    access.require(Operation.DESCRIBE, group(req.group_id), "FetchCommittedOffsets")
    if access.authorizer is None or access.caller.service is not None:
        return Admission(req)
    named = {(p.topic, p.partition) for p in req.partitions}

    def respond(resp: gateway_pb2.FetchCommittedOffsetsResponse) -> gateway_pb2.FetchCommittedOffsetsResponse:
        kept = []
        for o in resp.offsets:
            if access.allowed(Operation.DESCRIBE, topic(o.topic)):
                kept.append(o)
            elif (o.topic, o.partition) in named:
                kept.append(
                    gateway_pb2.CommittedOffset(
                        topic=o.topic, partition=o.partition, offset=-1, leader_epoch=-1
                    )
                )
        del resp.offsets[:]
        resp.offsets.extend(kept)
        return resp

    return Admission(req, respond=respond)


# --- consumer groups (Kafka's rules for ConsumerGroupHeartbeat, ListGroups, DescribeGroups,
# DeleteGroups) ----------------------------------------------------------------------------------


def consumer_group_heartbeat(
    req: gateway_pb2.ConsumerGroupHeartbeatRequest, access: Access, limits: Limits
) -> Admission:
    """Read on the group, and Describe on every subscribed topic (a member may not learn of
    partitions of a topic it may not see)."""
    access.require(Operation.READ, group(req.group_id), "ConsumerGroupHeartbeat")
    for name in req.subscribed_topics:
        if not access.allowed(Operation.DESCRIBE, topic(name)):
            return Admission(
                req,
                answer=gateway_pb2.ConsumerGroupHeartbeatResponse(
                    error_code=TOPIC_AUTHORIZATION_FAILED,
                    error_message=_refusal(access, Operation.DESCRIBE, "topic", name),
                ),
            )
    return Admission(req)


def list_groups(req: gateway_pb2.ListGroupsRequest, access: Access, limits: Limits) -> Admission:
    """Describe on the cluster lists every group; otherwise only the groups the caller may
    Describe (as Kafka's ListGroups)."""
    if (
        access.authorizer is None
        or access.caller.service is not None
        or access.allowed(Operation.DESCRIBE, CLUSTER)
    ):
        return Admission(req)

    def respond(resp: gateway_pb2.ListGroupsResponse) -> gateway_pb2.ListGroupsResponse:
        kept = [g for g in resp.groups if access.allowed(Operation.DESCRIBE, group(g.group_id))]
        del resp.groups[:]
        resp.groups.extend(kept)
        return resp

    return Admission(req, respond=respond)


def describe_groups(req: gateway_pb2.DescribeGroupsRequest, access: Access, limits: Limits) -> Admission:
    for name in req.group_ids:
        access.require(Operation.DESCRIBE, group(name), "DescribeGroups")
    return Admission(req)


def delete_groups(req: gateway_pb2.DeleteGroupsRequest, access: Access, limits: Limits) -> Admission:
    for name in req.group_ids:
        access.require(Operation.DELETE, group(name), "DeleteGroups")
    return Admission(req)


def subscribe(req: gateway_pb2.SubscribeRequest, access: Access, limits: Limits) -> Admission:
    """A stream: an unauthorized partition ends it with one error message, as Subscribe reports errors."""
    for p in req.partitions:
        if not access.allowed(Operation.READ, topic(p.topic)):
            return Admission(
                req,
                answer=[
                    gateway_pb2.SubscribeResponse(
                        topic=p.topic,
                        partition=p.partition,
                        error_code=TOPIC_AUTHORIZATION_FAILED,
                        error_message=_refusal(access, Operation.READ, "topic", p.topic),
                    )
                ],
            )
    return Admission(req)


def produce_records(req: gateway_pb2.ProduceRecordsRequest, access: Access, limits: Limits) -> Admission:
    """Write on the topic; refused, every record is answered TOPIC_AUTHORIZATION_FAILED
    and none is written.
    """
    if access.allowed(Operation.WRITE, topic(req.topic)):
        return Admission(req)
    message = _refusal(access, Operation.WRITE, "topic", req.topic)
    return Admission(
        req,
        answer=gateway_pb2.ProduceRecordsResponse(
            topic=req.topic,
            results=[
                gateway_pb2.RecordResult(
                    partition=-1,
                    offset=-1,
                    timestamp_ms=-1,
                    error_code=TOPIC_AUTHORIZATION_FAILED,
                    error_message=message,
                )
                for _ in req.records
            ],
        ),
    )


def consume_records(req: gateway_pb2.ConsumeRecordsRequest, access: Access, limits: Limits) -> Admission:
    """Read on the topic (the stream ends with one error), and Read on the group when one is named."""
    if req.group_id:
        access.require(Operation.READ, group(req.group_id), "ConsumeRecords with a group_id")
    if access.allowed(Operation.READ, topic(req.topic)):
        return Admission(req)
    message = _refusal(access, Operation.READ, "topic", req.topic)
    partitions = [p.partition for p in req.partitions] or [-1]
    return Admission(
        req,
        answer=[
            gateway_pb2.ConsumeRecordsResponse(
                errors=[
                    gateway_pb2.ConsumePartitionError(
                        partition=p,
                        error_code=TOPIC_AUTHORIZATION_FAILED,
                        error_message=message,
                        next_offset=-1,
                    )
                    for p in partitions
                ]
            )
        ],
    )


# --- admin --------------------------------------------------------------------------------------


def _per_topic_admin(
    req: Any,
    names: list[str],
    access: Access,
    check: Callable[[str], bool],
    operation: Operation,
    rebuild: Callable[[set[str]], Any],
    response_cls: type,
) -> Admission:
    """Pass `req` on without the topics `check` refuses (`rebuild`), their refusals merged into
    the answer; with every topic refused, answer at once."""
    refused = [n for n in dict.fromkeys(names) if not check(n)]
    if not refused:
        return Admission(req)

    def respond(resp: Any) -> Any:
        for name in refused:
            resp.topics.add(
                name=name,
                error_code=TOPIC_AUTHORIZATION_FAILED,
                error_message=_refusal(access, operation, "topic", name),
            )
        return resp

    if len(refused) == len(set(names)):
        return Admission(req, answer=respond(response_cls()))
    return Admission(rebuild(set(refused)), respond=respond)


def _without_topics(req: Any, refused: set[str]) -> Any:
    """A copy of a request whose `topics` (each with a `name`) leaves out the refused ones."""
    narrowed = type(req)()
    narrowed.CopyFrom(req)
    del narrowed.topics[:]
    narrowed.topics.extend(t for t in req.topics if t.name not in refused)
    return narrowed


def create_topics(req: common_pb2.CreateTopicsRequest, access: Access, limits: Limits) -> Admission:
    cluster_create = (
        access.authorizer is None
        or access.caller.service is not None
        or access.authorizer.authorize(access.caller.principal, Operation.CREATE, CLUSTER)
    )

    return _per_topic_admin(
        req,
        [t.name for t in req.topics],
        access,
        lambda n: cluster_create or access.allowed(Operation.CREATE, topic(n)),
        Operation.CREATE,
        lambda refused: _without_topics(req, refused),
        common_pb2.CreateTopicsResponse,
    )


def delete_topics(req: common_pb2.DeleteTopicsRequest, access: Access, limits: Limits) -> Admission:
    def rebuild(refused: set[str]) -> common_pb2.DeleteTopicsRequest:
        return common_pb2.DeleteTopicsRequest(
            names=[n for n in req.names if n not in refused], timeout_ms=req.timeout_ms
        )

    return _per_topic_admin(
        req,
        list(req.names),
        access,
        lambda n: access.allowed(Operation.DELETE, topic(n)),
        Operation.DELETE,
        rebuild,
        common_pb2.DeleteTopicsResponse,
    )


def create_partitions(req: common_pb2.CreatePartitionsRequest, access: Access, limits: Limits) -> Admission:
    return _per_topic_admin(
        req,
        [t.name for t in req.topics],
        access,
        lambda n: access.allowed(Operation.ALTER, topic(n)),
        Operation.ALTER,
        lambda refused: _without_topics(req, refused),
        common_pb2.CreatePartitionsResponse,
    )


def alter_topic_configs(
    req: common_pb2.AlterTopicConfigsRequest, access: Access, limits: Limits
) -> Admission:
    """Kafka's AlterConfigs rule for topics (AlterConfigs on each; our Alter stands for it)."""
    return _per_topic_admin(
        req,
        [t.name for t in req.topics],
        access,
        lambda n: access.allowed(Operation.ALTER, topic(n)),
        Operation.ALTER,
        lambda refused: _without_topics(req, refused),
        common_pb2.AlterTopicConfigsResponse,
    )


def _cluster(operation: Operation, what: str) -> Rule:
    def rule(req: Any, access: Access, limits: Limits) -> Admission:
        access.require(operation, CLUSTER, what)
        return Admission(req)

    return rule


def init_producer_id(req: common_pb2.InitProducerIdRequest, access: Access, limits: Limits) -> Admission:
    """Kafka's rule for idempotent producers: Write on at least one topic. A transactional id
    needs the same: our ACLs have no TransactionalId resource, so Write on a topic (or the
    cluster) stands for Write on the id, as on the Kafka listener (docs/KAFKA.md, Security)."""
    if not access.allowed_any(Operation.WRITE, ResourceType.TOPIC):
        raise Denied(
            "PERMISSION_DENIED",
            f"{access.caller.describe()} may not Write any topic, so it cannot "
            "get a producer id (InitProducerId)",
        )
    return Admission(req)


def transactional(what: str) -> Rule:
    """AddPartitionsToTxn, AddOffsetsToTxn, EndTxn: the InitProducerId rule (a producer that got
    its id may run its transactions; each Produce is still checked per topic)."""

    def rule(req: Any, access: Access, limits: Limits) -> Admission:
        if not access.allowed_any(Operation.WRITE, ResourceType.TOPIC):
            raise Denied(
                "PERMISSION_DENIED",
                f"{access.caller.describe()} may not Write any topic, so it cannot run transactions ({what})",
            )
        return Admission(req)

    return rule


def txn_offset_commit(req: gateway_pb2.TxnOffsetCommitRequest, access: Access, limits: Limits) -> Admission:
    """A transactional producer's rule, and Read on the group, as CommitOffsets."""
    transactional("TxnOffsetCommit")(req, access, limits)
    access.require(Operation.READ, group(req.group_id), "TxnOffsetCommit")
    return Admission(req)


# --- control plane ---------------------------------------------------------------------------------


def _from(kinds: tuple[str, ...], what: str, id_field: str | None = None) -> Rule:
    def rule(req: Any, access: Access, limits: Limits) -> Admission:
        access.require_service(what, kinds, getattr(req, id_field) if id_field else None)
        return Admission(req)

    return rule


def open_rule(req: Any, access: Access, limits: Limits) -> Admission:
    return Admission(req)


# Method -> rule. Keys are full gRPC method names, so the same short name on two
# services (UpdateMetadata on brokers and gateways) is listed twice on purpose.
_BROKER = "/highwater.v1.BrokerService/"
_CONTROLLER = "/highwater.v1.ControllerService/"
_GATEWAY = "/highwater.v1.GatewayService/"
_ADMIN: dict[str, Rule] = {
    "CreateTopics": create_topics,
    "DeleteTopics": delete_topics,
    "CreatePartitions": create_partitions,
    "AlterTopicConfigs": alter_topic_configs,
    "AlterPartitionReassignments": _cluster(Operation.ALTER, "AlterPartitionReassignments"),
    "ListPartitionReassignments": _cluster(Operation.DESCRIBE, "ListPartitionReassignments"),
    "ElectLeaders": _cluster(Operation.ALTER, "ElectLeaders"),
    "DescribeCluster": describe_cluster,
    "InitProducerId": init_producer_id,
    # Security admin: Kafka's rules for the ACL calls; the token calls follow them.
    "CreateAcls": _cluster(Operation.ALTER, "CreateAcls"),
    "DeleteAcls": _cluster(Operation.ALTER, "DeleteAcls"),
    "DescribeAcls": _cluster(Operation.DESCRIBE, "DescribeAcls"),
    "CreateToken": _cluster(Operation.ALTER, "CreateToken"),
    "RevokeToken": _cluster(Operation.ALTER, "RevokeToken"),
    "ListTokens": _cluster(Operation.DESCRIBE, "ListTokens"),
}
RULES: dict[str, Rule] = {
    _BROKER + "LeaderAndIsr": _from(("controller",), "LeaderAndIsr"),
    _BROKER + "UpdateMetadata": _from(("controller",), "UpdateMetadata"),
    _BROKER + "StopReplica": _from(("controller",), "StopReplica"),
    _BROKER + "Produce": produce,
    _BROKER + "Fetch": fetch,
    # FetchStream: the Fetch rule, applied to each message of the stream (UNARY_OVER_STREAM below).
    _BROKER + "FetchStream": fetch,
    # ProduceStream: the Produce rule, applied to each message of the stream.
    _BROKER + "ProduceStream": produce,
    _BROKER + "ListOffsets": list_offsets,
    _BROKER + "DeleteRecords": delete_records,
    _BROKER + "DescribeLogDirs": describe_log_dirs,
    _BROKER + "OffsetsForLeaderEpoch": offsets_for_leader_epoch,
    _BROKER + "Metadata": metadata,
    # Transaction markers come from the broker hosting the transaction's coordinator (Kafka's
    # ClusterAction): a client writing them could commit or abort anyone's transaction.
    _BROKER + "WriteTxnMarkers": _from(("broker",), "WriteTxnMarkers"),
    _CONTROLLER + "AlterPartition": _from(("broker",), "AlterPartition", "broker_id"),
    _CONTROLLER + "ControlledShutdown": _from(("broker",), "ControlledShutdown", "broker_id"),
    # Liveness streams: the rule runs on every message, the first before the servicer runs. A
    # stream naming a broker is that broker's only: another's, held open, would keep a dead broker
    # "connected" until its lease expired (issue 37).
    _CONTROLLER + "BrokerHeartbeat": _from(("broker",), "BrokerHeartbeat", "broker_id"),
    # Any controller's certificate: controller_id only names the standby in logs, and a controller
    # may hold the plain "controller" certificate, which names no id.
    _CONTROLLER + "StandbyHeartbeat": _from(("controller",), "StandbyHeartbeat"),
    **{_CONTROLLER + name: rule for name, rule in _ADMIN.items()},
    _GATEWAY + "Produce": produce,
    _GATEWAY + "Fetch": fetch,
    _GATEWAY + "ListOffsets": list_offsets,
    _GATEWAY + "DeleteRecords": delete_records,
    _GATEWAY + "DescribeLogDirs": describe_log_dirs,
    _GATEWAY + "Metadata": metadata,
    _GATEWAY + "CommitOffsets": commit_offsets,
    _GATEWAY + "FetchCommittedOffsets": fetch_committed_offsets,
    _GATEWAY + "Subscribe": subscribe,
    _GATEWAY + "ConsumerGroupHeartbeat": consumer_group_heartbeat,
    _GATEWAY + "ListGroups": list_groups,
    _GATEWAY + "DescribeGroups": describe_groups,
    _GATEWAY + "DeleteGroups": delete_groups,
    _GATEWAY + "ProduceRecords": produce_records,
    _GATEWAY + "ConsumeRecords": consume_records,
    _GATEWAY + "UpdateMetadata": _from(("controller",), "UpdateMetadata"),
    # Transactions (issue 41), answered by the gateway's own coordinator.
    _GATEWAY + "AddPartitionsToTxn": transactional("AddPartitionsToTxn"),
    _GATEWAY + "AddOffsetsToTxn": transactional("AddOffsetsToTxn"),
    _GATEWAY + "TxnOffsetCommit": txn_offset_commit,
    _GATEWAY + "EndTxn": transactional("EndTxn"),
    _GATEWAY + "ListTransactions": _cluster(Operation.DESCRIBE, "ListTransactions"),
    _GATEWAY + "DescribeTransactions": _cluster(Operation.DESCRIBE, "DescribeTransactions"),
    _GATEWAY + "AbortTransaction": _cluster(Operation.ALTER, "AbortTransaction"),
    **{_GATEWAY + name: rule for name, rule in _ADMIN.items()},
    # Any authenticated caller may list services (the protos are public anyway).
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": open_rule,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": open_rule,
}
# Streaming methods that carry a unary method's calls, one request and one answer at a time, in
# order: stream method -> its unary method. The interceptor admits each message as a call of the
# unary method (its rule, quota and connection slot, a token still valid), not the stream once, so
# moving a caller from the unary call to the stream changes nothing of what it may do.
UNARY_OVER_STREAM: dict[str, str] = {
    _BROKER + "FetchStream": _BROKER + "Fetch",
    _BROKER + "ProduceStream": _BROKER + "Produce",
}
# Health checks answer without credentials: load balancers and orchestrators probe them.
UNAUTHENTICATED_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
# Methods whose request/response byte counts are charged to byte-rate quotas.
PRODUCE_METHODS = frozenset({_BROKER + "Produce", _GATEWAY + "Produce", _GATEWAY + "ProduceRecords"})
FETCH_METHODS = frozenset(
    {_BROKER + "Fetch", _GATEWAY + "Fetch", _GATEWAY + "Subscribe", _GATEWAY + "ConsumeRecords"}
)
# Calls a gateway makes on behalf of its client: the principal travels with them, so the
# controller authorizes the client and never the gateway's own (service) identity. Every
# admin call but DescribeCluster, which gateways also make for themselves.
FORWARDED_METHODS = frozenset(
    {
        _BROKER + "Produce",
        _BROKER + "Fetch",
        _BROKER + "ListOffsets",
        _BROKER + "DeleteRecords",
        _BROKER + "DescribeLogDirs",
        _BROKER + "Metadata",
        *(_CONTROLLER + name for name in _ADMIN if name != "DescribeCluster"),
    }
)


def rule_for(method: str) -> Rule | None:
    """The method's rule; for a unary-over-stream method, its unary method's, applied per message."""
    return RULES.get(UNARY_OVER_STREAM.get(method, method))
