"""Kafka's Fetch for consumers, in its fetch session (KIP-227, fetch_sessions.py) if it has one.

One Fetch is five steps, each a function below: the session's context from the request's
session fields (`_session_context`), the protobuf FetchRequest for the partitions that context
reads (`_fetch_request`), the read itself without the topics the principal may not read
(`_read`), what each partition answered as the session keeps it (`_session_answers`), and the
Kafka answer of the partitions the session says to send (`_response`). Pure: the backend does
the I/O and the broker's fetch session cache owns the clock.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode as K

from clients.common.fetch_request import last_stable_offset
from protos.highwater.v1 import common_pb2
from services.broker import metrics
from services.common import limits
from services.common.metadata_cache import MetadataCache
from services.kafka import acl_rules, fetch_sessions, protocol
from services.kafka.handler_common import (
    NO_THROTTLE,
    TOPIC_REFUSED,
    ConnectionContext,
    RequestAcl,
    ms,
    split_topics,
)
from services.kafka.protocol import Request, build, kafka_error, nested
from services.security import authz

_SESSION_ERRORS = {
    fetch_sessions.SessionError.FETCH_SESSION_ID_NOT_FOUND: K.fetch_session_id_not_found,
    fetch_sessions.SessionError.INVALID_FETCH_SESSION_EPOCH: K.invalid_fetch_session_epoch,
}


class FetchCalls:
    """Consumers' Fetch for one connection (its ConnectionContext); the fetch sessions are the
    broker's, shared by its connections."""

    def __init__(self, context: ConnectionContext) -> None:
        self.context = context

    async def fetch(self, request: Request, acl: RequestAcl) -> Any:
        """A consumer's Fetch, in its fetch session (KIP-227, fetch_sessions.py) if it has one.

        Versions 7+ carry a session id and epoch (4-6 are full Fetches without a session); an
        incremental Fetch reads every partition of its session and answers the changed ones."""
        body = request.body
        cls = protocol.response_class(protocol.FETCH, request.api_version)
        if body.replica_id >= 0:
            # Followers fetch over gRPC only; a Kafka replica fetch would skip the broker-epoch check.
            return build(cls, throttle_time=NO_THROTTLE, error_code=K.invalid_request, responses=())
        sessions = self.context.fetch_session_cache
        context = _session_context(sessions, body)
        if isinstance(context, fetch_sessions.SessionErrorContext):
            _export_fetch_session_metrics(sessions, 0)
            return _session_refusal(cls, context.error, fetch_sessions.INVALID_SESSION_ID)
        fetch_req = _fetch_request(body, context)
        resp = await self._read(fetch_req, self._refused_topics(context, fetch_req, acl))
        answers = _session_answers(resp)
        evictions_before = sessions.evictions
        session_answer = context.respond(answers)
        _export_fetch_session_metrics(sessions, sessions.evictions - evictions_before)
        if session_answer.error is not None:
            return _session_refusal(cls, session_answer.error, session_answer.session_id)
        # None: every partition read is answered (a full Fetch, or every one changed).
        answered = set(session_answer.partitions) if len(session_answer.partitions) < len(answers) else None
        return _response(cls, resp, session_answer.session_id, answered, self.context.backend.metadata)

    def _refused_topics(
        self, context: fetch_sessions.FetchContext, fetch_req: common_pb2.FetchRequest, acl: RequestAcl
    ) -> frozenset[str]:
        """The topics of this Fetch the principal may not read. An incremental Fetch lists only
        what changed: every topic of the session is checked again, as Kafka checks each
        partition of the context on every Fetch."""
        if not isinstance(context, fetch_sessions.IncrementalContext) or self.context.access is None:
            return acl.decision.topics_refused
        read = acl_rules.TOPIC_OPERATIONS[protocol.FETCH]
        return frozenset(t.topic for t in fetch_req.topics if not acl.allowed(read, authz.topic(t.topic)))

    async def _read(
        self, fetch_req: common_pb2.FetchRequest, refused: frozenset[str]
    ) -> common_pb2.FetchResponse:
        """The broker's Fetch of the topics not `refused`; the refused ones' partitions answered
        TOPIC_AUTHORIZATION_FAILED, never read."""
        kept, denied = split_topics(fetch_req, refused)
        resp = (
            await self.context.backend.fetch(kept)
            if kept.topics or not denied.topics
            else common_pb2.FetchResponse()
        )
        for t in denied.topics:
            resp.topics.add(topic=t.topic).partitions.extend(
                common_pb2.FetchPartitionResponse(
                    partition=p.partition, error_code=TOPIC_REFUSED, high_watermark=-1, log_start_offset=-1
                )
                for p in t.partitions
            )
        return resp


def _session_context(sessions: fetch_sessions.FetchSessionCache, body: Any) -> fetch_sessions.FetchContext:
    """The Fetch's context in the broker's session cache: the partitions it reads (the session's,
    for an incremental Fetch) and how its answer is kept."""
    return sessions.new_context(
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


def _fetch_request(body: Any, context: fetch_sessions.FetchContext) -> common_pb2.FetchRequest:
    """The protobuf FetchRequest of the partitions the context reads, with the request's bounds
    (the wait capped at limits.FETCH_MAX_WAIT_MS_MAX)."""
    fetch_req = common_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=max(0, min(ms(body.max_wait), limits.FETCH_MAX_WAIT_MS_MAX)),
        min_bytes=max(0, body.min_bytes),
        max_bytes=max(0, body.max_bytes),
        # v4+: 1 is read_committed (below the LSO, aborted transactions answered). A value the
        # broker does not know is answered INVALID_REQUEST per partition.
        isolation_level=getattr(body, "isolation_level", 0),
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
    return fetch_req


def _session_answers(
    resp: common_pb2.FetchResponse,
) -> dict[fetch_sessions.PartitionKey, fetch_sessions.PartitionAnswer]:
    """Each partition's answer as the session compares it with the last one it sent."""
    answers: dict[fetch_sessions.PartitionKey, fetch_sessions.PartitionAnswer] = {}
    for t in resp.topics:
        for p in t.partitions:
            ok = p.error_code == common_pb2.NONE
            answers[(t.topic, p.partition)] = fetch_sessions.PartitionAnswer(
                has_records=ok and bool(p.records),
                high_watermark=p.high_watermark if ok else -1,
                last_stable_offset=last_stable_offset(p) if ok else -1,
                log_start_offset=p.log_start_offset if ok else -1,
                has_error=not ok,
            )
    return answers


def _session_refusal(cls: type, error: fetch_sessions.SessionError, session_id: int) -> Any:
    """The whole Fetch answered with a session error and no partitions."""
    return build(
        cls, throttle_time=NO_THROTTLE, error_code=_SESSION_ERRORS[error], session_id=session_id, responses=()
    )


def _response(
    cls: type,
    resp: common_pb2.FetchResponse,
    session_id: int,
    answered: set[fetch_sessions.PartitionKey] | None,
    cache: MetadataCache,
) -> Any:
    """The Kafka answer of the partitions in `answered` (None: all of them); a partition fenced
    or no longer led here names its current leader where the version has the field."""
    topic_cls = nested(cls, "FetchableTopicResponse")
    part_cls = nested(cls, "PartitionData")
    aborted_cls = (
        nested(part_cls, "AbortedTransaction")
        if protocol.has_field(part_cls, "aborted_transactions")
        else None
    )
    leader_cls = nested(cls, "LeaderIdAndEpoch") if protocol.has_field(part_cls, "current_leader") else None

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
            aborted = None
            if aborted_cls is not None and p.aborted_transactions:
                aborted = tuple(
                    aborted_cls(producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in p.aborted_transactions
                )
            parts.append(
                build(
                    part_cls,
                    partition_index=p.partition,
                    error_code=kafka_error(p.error_code),
                    high_watermark=p.high_watermark if ok else -1,
                    last_stable_offset=last_stable_offset(p) if ok else -1,
                    log_start_offset=p.log_start_offset if ok else -1,
                    aborted_transactions=aborted,
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
        session_id=session_id,
        responses=tuple(topics),
    )


def _export_fetch_session_metrics(sessions: fetch_sessions.FetchSessionCache, evicted: int) -> None:
    metrics.KAFKA_FETCH_SESSIONS.set(sessions.size)
    metrics.KAFKA_FETCH_SESSION_PARTITIONS_CACHED.set(sessions.partitions_cached)
    if evicted:
        metrics.KAFKA_FETCH_SESSION_EVICTIONS.inc(evicted)
