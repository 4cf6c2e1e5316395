"""The data path's Kafka calls other than Fetch: Produce, ListOffsets, DeleteRecords,
DescribeLogDirs, OffsetForLeaderEpoch and InitProducerId.

Each turns kio's request into the protobuf request the gRPC servicers pass to the same
ReplicaManager (so Produce gets the same validation, sequence checks and purgatory) or the
controller, and the answer back into kio's response class of the asked version. Topics the
request's ACL decision refuses are answered TOPIC_AUTHORIZATION_FAILED and never reach the
ReplicaManager. Pure: the backend (backend.py) does the I/O.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection
from typing import Any

from kio.schema.errors import ErrorCode as K

from clients.common.record_batch import iter_batch_headers
from protos.highwater.v1 import broker_pb2, common_pb2
from services.common import limits
from services.kafka import protocol
from services.kafka.handler_common import (
    NO_THROTTLE,
    TOPIC_REFUSED,
    BackendUnavailable,
    ConnectionContext,
    ReplicaLogSize,
    RequestAcl,
    log,
    ms,
    split_topics,
)
from services.kafka.protocol import Request, build, kafka_error, nested
from services.kafka.txn_calls import TxnCalls


class DataCalls:
    """Produce, ListOffsets, DeleteRecords, DescribeLogDirs, OffsetForLeaderEpoch, InitProducerId
    for one connection (its ConnectionContext)."""

    def __init__(self, context: ConnectionContext, transactions: TxnCalls) -> None:
        self.context = context
        # A transactional Produce's checks and InitProducerId with a transactional id.
        self.transactions = transactions

    # ---- Produce -----------------------------------------------------------------------------

    async def produce(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        # Built in place: finished sub-messages handed to a constructor are serialised and parsed
        # again, a copy of every record batch per level.
        req = common_pb2.ProduceRequest(
            acks=body.acks, timeout_ms=max(0, min(ms(body.timeout), limits.PRODUCE_TIMEOUT_MS_MAX))
        )
        # Partitions of a transactional Produce refused before the log: their Kafka code, message.
        refusals: dict[tuple[str, int], tuple[K, str]] = {}
        for t in body.topic_data:
            topic = req.topics.add(topic=t.name)
            for p in t.partition_data:
                topic.partitions.add(partition=p.index, records=bytes(p.records or b""))
        if body.acks not in (0, 1, -1):
            resp = _produce_refusal(
                req, common_pb2.INVALID_REQUEST, f"acks must be 0, 1 or -1, got {body.acks}"
            )
        elif body.transactional_id is not None:
            refusals = await self.transactions.produce_refusals(body.transactional_id, req, acl)
            kept = _without_partitions(req, refusals)
            topics_refused = acl.decision.topics_refused
            resp = (
                await self._produce_authorized(kept, topics_refused, transactional=True)
                if kept.topics
                else common_pb2.ProduceResponse()
            )
            if refusals:
                denied = _only_partitions(req, refusals)
                resp.topics.extend(_produce_refusal(denied, common_pb2.INVALID_REQUEST, "").topics)
                resp = _one_entry_per_topic(resp)
        else:
            resp = await self._produce_authorized(req, acl.decision.topics_refused)
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
                            error_code=refusals[(t.topic, p.partition)][0]
                            if (t.topic, p.partition) in refusals
                            else kafka_error(p.error_code),
                            base_offset=p.base_offset,
                            log_append_time=(
                                datetime.datetime.fromtimestamp(p.log_append_time_ms / 1000, datetime.UTC)
                                if p.log_append_time_ms >= 0
                                else None
                            ),
                            log_start_offset=p.log_start_offset,
                            record_errors=(),
                            error_message=refusals[(t.topic, p.partition)][1]
                            if (t.topic, p.partition) in refusals
                            else p.error_message or None,
                        )
                        for p in t.partitions
                    ),
                )
                for t in resp.topics
            ),
        )

    async def _produce_authorized(
        self, req: common_pb2.ProduceRequest, refused: frozenset[str], *, transactional: bool = False
    ) -> common_pb2.ProduceResponse:
        """Partitions of the `refused` topics (the principal may not write them) answered
        TOPIC_AUTHORIZATION_FAILED and never written; the rest produced, as the gRPC listeners'
        security rules do."""
        if not refused:
            return await self._produce_within_batch_limit(req, transactional)
        kept, denied = split_topics(req, refused)
        resp = (
            await self._produce_within_batch_limit(kept, transactional)
            if kept.topics
            else common_pb2.ProduceResponse()
        )
        resp.topics.extend(
            _produce_refusal(denied, TOPIC_REFUSED, "not authorized to Write this topic").topics
        )
        return resp

    async def _produce_within_batch_limit(
        self, req: common_pb2.ProduceRequest, transactional: bool = False
    ) -> common_pb2.ProduceResponse:
        """The broker's produce, with partitions whose batches break --max-batch-records refused
        INVALID_REQUEST first, as the gRPC listeners' security rules refuse them."""
        if not self.context.max_batch_records:
            return await self.context.backend.produce(req, transactional=transactional)
        refused = common_pb2.ProduceRequest()
        kept = common_pb2.ProduceRequest(acks=req.acks, timeout_ms=req.timeout_ms)
        for t in req.topics:
            for p in t.partitions:
                over = _records_over(p.records, self.context.max_batch_records)
                target = refused if over else kept
                if not target.topics or target.topics[-1].topic != t.topic:
                    target.topics.add(topic=t.topic)
                target.topics[-1].partitions.append(p)
        resp = (
            await self.context.backend.produce(kept, transactional=transactional)
            if kept.topics
            else common_pb2.ProduceResponse()
        )
        message = f"a batch is over the limit of {self.context.max_batch_records} records per batch"
        resp.topics.extend(_produce_refusal(refused, common_pb2.INVALID_REQUEST, message).topics)
        return resp

    # ---- ListOffsets -------------------------------------------------------------------------

    async def list_offsets(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.LIST_OFFSETS, request.api_version)
        list_req = common_pb2.ListOffsetsRequest(
            replica_id=-1,
            isolation_level=getattr(body, "isolation_level", 0),  # v2+
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
        kept, denied = split_topics(list_req, acl.decision.topics_refused)
        resp = (
            self.context.backend.list_offsets(kept)
            if kept.topics or not denied.topics
            else common_pb2.ListOffsetsResponse()
        )
        for t in denied.topics:
            resp.topics.add(topic=t.topic).partitions.extend(
                common_pb2.ListOffsetsPartitionResponse(
                    partition=p.partition, error_code=TOPIC_REFUSED, timestamp=-1, offset=-1, leader_epoch=-1
                )
                for p in t.partitions
            )
        topic_cls = nested(cls, "ListOffsetsTopicResponse")
        part_cls = nested(cls, "ListOffsetsPartitionResponse")
        return build(
            cls,
            throttle_time=NO_THROTTLE,
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

    async def delete_records(self, request: Request, acl: RequestAcl) -> Any:
        """Advance log start offsets of partitions this broker leads (Kafka's clients send each
        leader its own partitions); the others are answered NOT_LEADER_OR_FOLLOWER by the replica
        manager, as Kafka does. Refused topics (Delete) answer TOPIC_AUTHORIZATION_FAILED."""
        body = request.body
        cls = protocol.response_class(protocol.DELETE_RECORDS, request.api_version)
        delete_req = common_pb2.DeleteRecordsRequest(
            timeout_ms=max(0, ms(body.timeout)),
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
        kept, denied = split_topics(delete_req, acl.decision.topics_refused)
        resp = (
            await self.context.backend.delete_records(kept)
            if kept.topics
            else common_pb2.DeleteRecordsResponse()
        )
        for t in denied.topics:
            resp.topics.add(topic=t.topic).partitions.extend(
                common_pb2.DeleteRecordsPartitionResponse(
                    partition=p.partition, error_code=TOPIC_REFUSED, low_watermark=-1
                )
                for p in t.partitions
            )
        topic_cls = nested(cls, "DeleteRecordsTopicResult")
        part_cls = nested(cls, "DeleteRecordsPartitionResult")
        return build(
            cls,
            throttle_time=NO_THROTTLE,
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

    async def describe_log_dirs(self, request: Request, acl: RequestAcl) -> Any:
        """This broker's replicas by log directory (Kafka's API 35; admin tools ask every broker):
        each partition's size and offset lag. Needs Describe on the cluster, as Kafka's; refused,
        v3+ answers CLUSTER_AUTHORIZATION_FAILED and older versions no directories, as Kafka does.
        The cleaner's view of a compacted log is on the gRPC DescribeLogDirs (docs/GRPC.md)."""
        cls = protocol.response_class(protocol.DESCRIBE_LOG_DIRS, request.api_version)
        if acl.decision.cluster_refused:
            return build(
                cls, throttle_time=NO_THROTTLE, error_code=K.cluster_authorization_failed, results=()
            )
        topics = request.body.topics
        wanted = None if topics is None else {(t.topic, int(p)) for t in topics for p in t.partitions}
        result_cls = nested(cls, "DescribeLogDirsResult")
        topic_cls = nested(cls, "DescribeLogDirsTopic")
        part_cls = nested(cls, "DescribeLogDirsPartition")
        results = []
        for log_dir in self.context.backend.log_dirs(wanted):
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
        return build(cls, throttle_time=NO_THROTTLE, error_code=K.none, results=tuple(results))

    # ---- OffsetForLeaderEpoch ----------------------------------------------------------------

    async def offsets_for_leader_epoch(self, request: Request, acl: RequestAcl) -> Any:
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
        kept, denied = split_topics(epoch_req, acl.decision.topics_refused)
        resp = (
            self.context.backend.offsets_for_leader_epoch(kept)
            if kept.topics or not denied.topics
            else broker_pb2.OffsetsForLeaderEpochResponse()
        )
        for t in denied.topics:
            resp.topics.add(topic=t.topic).partitions.extend(
                broker_pb2.EpochEndOffset(
                    partition=p.partition, error_code=TOPIC_REFUSED, leader_epoch=-1, end_offset=-1
                )
                for p in t.partitions
            )
        topic_cls = nested(cls, "OffsetForLeaderTopicResult")
        part_cls = nested(cls, "EpochEndOffset")
        return build(
            cls,
            throttle_time=NO_THROTTLE,
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

    async def init_producer_id(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.INIT_PRODUCER_ID, request.api_version)
        if body.transactional_id is not None:
            return await self.transactions.init_producer_id(request, acl)
        if acl.decision.cluster_refused:
            return build(
                cls,
                throttle_time=NO_THROTTLE,
                error_code=K.cluster_authorization_failed,
                producer_id=-1,
                producer_epoch=-1,
            )
        try:
            resp = await self.context.backend.call_controller(
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
                throttle_time=NO_THROTTLE,
                error_code=K.coordinator_not_available,
                producer_id=-1,
                producer_epoch=-1,
            )
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            error_code=code,
            producer_id=resp.producer_id if code == K.none else -1,
            producer_epoch=resp.producer_epoch if code == K.none else -1,
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


def _without_partitions(
    req: common_pb2.ProduceRequest, dropped: Collection[tuple[str, int]]
) -> common_pb2.ProduceRequest:
    """The request without the `dropped` partitions (itself when none is dropped)."""
    if not dropped:
        return req
    kept = common_pb2.ProduceRequest(acks=req.acks, timeout_ms=req.timeout_ms)
    for t in req.topics:
        partitions = [p for p in t.partitions if (t.topic, p.partition) not in dropped]
        if partitions:
            kept.topics.add(topic=t.topic).partitions.extend(partitions)
    return kept


def _only_partitions(
    req: common_pb2.ProduceRequest, wanted: Collection[tuple[str, int]]
) -> common_pb2.ProduceRequest:
    """The request with only the `wanted` partitions."""
    only = common_pb2.ProduceRequest(acks=req.acks, timeout_ms=req.timeout_ms)
    for t in req.topics:
        partitions = [p for p in t.partitions if (t.topic, p.partition) in wanted]
        if partitions:
            only.topics.add(topic=t.topic).partitions.extend(partitions)
    return only


def _one_entry_per_topic(resp: common_pb2.ProduceResponse) -> common_pb2.ProduceResponse:
    """The answer with each topic once (appended and refused partitions of one topic merged):
    a client matches the answer's topics to the ones it sent."""
    merged = common_pb2.ProduceResponse(throttle_time_ms=resp.throttle_time_ms)
    by_topic: dict[str, common_pb2.ProduceTopicResponse] = {}
    for t in resp.topics:
        entry = by_topic.get(t.topic)
        if entry is None:
            entry = by_topic[t.topic] = merged.topics.add(topic=t.topic)
        entry.partitions.extend(t.partitions)
    return merged
