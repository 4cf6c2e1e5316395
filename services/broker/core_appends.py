"""Appends on the broker core: Produce, WriteTxnMarkers and DeleteRecords on the leader.

Each appends (or moves the log start) at once, then answers when its ISR has it or at the
request's timeout, through the purgatory (purgatory.py: DelayedProduce, DelayedDeleteRecords).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from clients.common.control_records import ControlType
from clients.common.errors import HighwaterError, OffsetOutOfRange, PolicyViolation
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import broker_pb2, common_pb2
from services.broker import metrics
from services.broker.core_state import CoreState
from services.broker.partition import Partition, Role
from services.broker.producer_state import NO_OFFSET
from services.broker.purgatory import (
    AwaitedAppend,
    AwaitedLogStart,
    DelayedDeleteRecords,
    DelayedProduce,
    produce_response,
)
from services.common import limits
from services.common.request_checks import produce_request_problem


class Appends(CoreState):
    """What a leader writes for its clients and for the transaction coordinator."""

    def open_transaction_epoch(self, tp: TopicPartitionKey, producer_id: int) -> int | None:
        """The epoch of the producer's open transaction on a partition this broker leads (the
        KIP-890 check's fast path: services/transactions/produce_verifier.py); None when it has no
        transaction open here, or this broker does not lead the partition."""
        p = self.partitions.get(tp)
        if p is None or p.role is not Role.LEADER:
            return None
        entry = p.producers.producers.get(producer_id)
        if entry is None or entry.current_txn_first_offset == NO_OFFSET:
            return None
        return entry.producer_epoch

    # ---- Produce --------------------------------------------------------------------------------

    def produce(
        self,
        req: common_pb2.ProduceRequest,
        on_complete: Callable[[common_pb2.ProduceResponse], None],
        *,
        transactional: bool = False,
    ) -> None:
        """Append as leader; answer at once (acks 0/1, errors) or when the ISR has it (acks=all).
        `transactional`: the Kafka listener's transactional Produce, its partitions verified by
        the transaction coordinator (KIP-890); only then may batches be transactional."""
        problem = produce_request_problem(req)
        if problem is not None:
            on_complete(
                produce_response(
                    {
                        (t.topic, pd.partition): common_pb2.ProducePartitionResponse(
                            partition=pd.partition,
                            error_code=common_pb2.INVALID_REQUEST,
                            error_message=problem,
                            base_offset=-1,
                            log_append_time_ms=-1,
                        )
                        for t in req.topics
                        for pd in t.partitions
                    }
                )
            )
            return
        timeout_ms = min(req.timeout_ms or limits.PRODUCE_TIMEOUT_MS_DEFAULT, limits.PRODUCE_TIMEOUT_MS_MAX)
        results: dict[TopicPartitionKey, common_pb2.ProducePartitionResponse] = {}
        awaited: dict[TopicPartitionKey, AwaitedAppend] = {}
        wall = self.clock.wall_ms()
        for topic in req.topics:
            for pd in topic.partitions:
                tp = (topic.topic, pd.partition)
                # base_offset stays -1 unless the batches were appended: a gateway may retry
                # a failed partition on its own only when nothing of it was written.
                res = common_pb2.ProducePartitionResponse(
                    partition=pd.partition, log_append_time_ms=-1, base_offset=-1
                )
                try:
                    p = self._leader_partition(tp)
                    records = pd.records  # each read of a bytes field copies it: read once
                    info = p.append_as_leader(
                        records, acks=req.acks, now_ms=wall, transactional=transactional
                    )
                    res.base_offset = info.first_offset
                    res.log_append_time_ms = info.log_append_time_ms
                    res.log_start_offset = p.log.log_start_offset
                    note = self.observer.on_leader_append(p, info, req.acks)
                    if not info.duplicate:
                        metrics.BYTES_IN.labels(topic.topic).inc(len(records))
                        self.notify(tp)
                    if req.acks == -1:
                        awaited[tp] = AwaitedAppend(info.next_offset, p.leader_epoch, note)
                except HighwaterError as exc:
                    res.error_code, res.error_message = self._client_error(tp, exc)
                results[tp] = res
        self._answer_when_replicated(results, awaited, timeout_ms, on_complete, self.observer.on_acknowledged)

    def _answer_when_replicated(
        self,
        results: dict[TopicPartitionKey, common_pb2.ProducePartitionResponse],
        awaited: dict[TopicPartitionKey, AwaitedAppend],
        timeout_ms: int,
        on_complete: Callable[[common_pb2.ProduceResponse], None],
        on_acknowledged: Callable[[Partition, AwaitedAppend], None] = lambda p, append: None,
    ) -> None:
        """Answer `results` once every awaited append is in its ISR, or at timeout_ms (acks=all)."""
        op = DelayedProduce(
            results=results,
            awaited=awaited,
            deadline_ms=self.clock.monotonic_ms() + timeout_ms,
            timeout_ms=timeout_ms,
            partition=self.partitions.get,
            on_complete=on_complete,
            on_acknowledged=on_acknowledged,
        )
        self._watch(op, timeout_ms)

    # ---- WriteTxnMarkers -----------------------------------------------------------------------

    def write_txn_markers(
        self,
        req: broker_pb2.WriteTxnMarkersRequest,
        on_complete: Callable[[broker_pb2.WriteTxnMarkersResponse], None],
    ) -> None:
        """Append each marker to each of its partitions this broker leads (Partition.append_marker),
        then answer per partition once the ISR has it, or at timeout_ms (Kafka's WriteTxnMarkers:
        appended as acks=all, so a committed transaction's marker is never lost to a failover)."""
        timeout_ms = min(req.timeout_ms or limits.PRODUCE_TIMEOUT_MS_DEFAULT, limits.PRODUCE_TIMEOUT_MS_MAX)
        answers: list[common_pb2.ProduceResponse | None] = [None] * len(req.markers)

        def answered(index: int) -> Callable[[common_pb2.ProduceResponse], None]:
            def done(resp: common_pb2.ProduceResponse) -> None:
                answers[index] = resp
                complete = [a for a in answers if a is not None]
                if len(complete) == len(answers):
                    on_complete(_txn_marker_response(req, complete))

            return done

        if not req.markers:
            on_complete(broker_pb2.WriteTxnMarkersResponse())
        wall = self.clock.wall_ms()
        for index, marker in enumerate(req.markers):
            control = ControlType.COMMIT if marker.committed else ControlType.ABORT
            results: dict[TopicPartitionKey, common_pb2.ProducePartitionResponse] = {}
            awaited: dict[TopicPartitionKey, AwaitedAppend] = {}
            for topic in marker.topics:
                for partition in topic.partitions:
                    tp = (topic.topic, partition)
                    res = common_pb2.ProducePartitionResponse(partition=partition, base_offset=-1)
                    try:
                        p = self._leader_partition(tp)
                        info = p.append_marker(
                            control,
                            producer_id=marker.producer_id,
                            producer_epoch=marker.producer_epoch,
                            coordinator_epoch=marker.coordinator_epoch,
                            now_ms=wall,
                        )
                        res.base_offset = info.first_offset
                        awaited[tp] = AwaitedAppend(info.next_offset, p.leader_epoch)
                        self.notify(tp)
                    except HighwaterError as exc:
                        res.error_code, res.error_message = self._client_error(tp, exc)
                    results[tp] = res
            self._answer_when_replicated(results, awaited, timeout_ms, answered(index))

    # ---- DeleteRecords -------------------------------------------------------------------------

    def delete_records(
        self,
        req: common_pb2.DeleteRecordsRequest,
        on_complete: Callable[[common_pb2.DeleteRecordsResponse], None],
    ) -> None:
        """Advance the log start offset of each asked partition this broker leads (Kafka's
        ReplicaManager.deleteRecords), then answer once every ISR member has it, or at timeout_ms.

        Offset -1 means the HW. Per partition: NOT_LEADER_OR_FOLLOWER (or UNKNOWN_TOPIC_OR_PARTITION)
        off the leader; OFFSET_OUT_OF_RANGE for an offset above the HW or below -1; an offset at or
        below the current log start changes nothing and is answered with the current low
        watermark. The leader's own log start moves (checkpointed, whole segments below it
        deleted) before anything waits; followers take it from their Fetch answers.
        """
        timeout_ms = min(
            req.timeout_ms if req.timeout_ms > 0 else limits.DELETE_RECORDS_TIMEOUT_MS_DEFAULT,
            limits.DELETE_RECORDS_TIMEOUT_MS_MAX,
        )
        results: dict[TopicPartitionKey, common_pb2.DeleteRecordsPartitionResponse] = {}
        awaited: dict[TopicPartitionKey, AwaitedLogStart] = {}
        for topic in req.topics:
            for dp in topic.partitions:
                tp = (topic.topic, dp.partition)
                res = common_pb2.DeleteRecordsPartitionResponse(partition=dp.partition, low_watermark=-1)
                try:
                    p = self._leader_partition(tp)
                    offset = self._advance_log_start_on_leader(p, dp.offset)
                    awaited[tp] = AwaitedLogStart(offset, p.leader_epoch)
                    # Wakes the followers' waiting fetches, whose next answers carry the new start.
                    self.notify(tp)
                except HighwaterError as exc:
                    res.error_code, res.error_message = self._client_error(tp, exc)
                    awaited.pop(tp, None)
                results[tp] = res
        op = DelayedDeleteRecords(
            results=results,
            awaited=awaited,
            deadline_ms=self.clock.monotonic_ms() + timeout_ms,
            timeout_ms=timeout_ms,
            partition=self.partitions.get,
            on_complete=on_complete,
        )
        self._watch(op, timeout_ms)

    def _advance_log_start_on_leader(self, p: Partition, asked: int) -> int:
        """Move the leader's log start to `asked` (-1: the HW); returns the offset the ISR must reach.

        Raises OffsetOutOfRange for an offset above the HW (uncommitted records may yet be
        truncated away, as Kafka refuses) or below -1; PolicyViolation on a compacted topic
        without "delete" in its cleanup.policy (as Kafka: its log keeps every key's last value).
        """
        if not p.log.config.retention_applies:
            raise PolicyViolation(
                f"DeleteRecords on {p.topic}-{p.partition}: the topic's cleanup.policy is "
                f"{p.log.config.cleanup_policy!r}, which keeps every key's latest record; set it to "
                "'compact,delete' to allow deleting records"
            )
        hw = p.high_watermark
        offset = hw if asked == -1 else asked
        if offset < 0:
            raise OffsetOutOfRange(
                f"DeleteRecords offset {asked} for {p.topic}-{p.partition} is not valid: give an offset "
                "in [0, high watermark], or -1 for the high watermark"
            )
        if offset > hw:
            raise OffsetOutOfRange(
                f"DeleteRecords offset {offset} for {p.topic}-{p.partition} is above its high watermark "
                f"{hw}: only committed records can be deleted"
            )
        if offset > p.log.log_start_offset:
            before = p.log.log_start_offset
            p.log.advance_log_start_offset(offset)
            self.log.info(
                "DeleteRecords moved the log start offset of %s-%d from %d to %d",
                p.topic,
                p.partition,
                before,
                offset,
            )
        return offset


def _txn_marker_response(
    req: broker_pb2.WriteTxnMarkersRequest, answers: Sequence[common_pb2.ProduceResponse]
) -> broker_pb2.WriteTxnMarkersResponse:
    """The per-marker, per-partition answers (one ProduceResponse per marker), in the request's order."""
    resp = broker_pb2.WriteTxnMarkersResponse()
    for marker, answer in zip(req.markers, answers, strict=True):
        out = resp.markers.add(producer_id=marker.producer_id)
        for topic in answer.topics:
            out_topic = out.topics.add(topic=topic.topic)
            for pr in topic.partitions:
                out_topic.partitions.add(
                    partition=pr.partition, error_code=pr.error_code, error_message=pr.error_message
                )
    return resp
