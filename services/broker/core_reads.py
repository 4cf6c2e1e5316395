"""Reads on the broker core: Fetch (consumers and followers), ListOffsets, OffsetsForLeaderEpoch.

A consumer reads below the high watermark, or below the last stable offset when it reads
committed only (with the aborted transactions in what it may read); a follower reads up to the
leader's LEO, and its fetch offsets move the leader's view of it (ISR expansion, the HW).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from clients.common.errors import HighwaterError, InconsistentTopicId
from clients.common.fetch_request import READ_COMMITTED, READ_UNCOMMITTED
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import broker_pb2, common_pb2
from services.broker import metrics
from services.broker.core_tasks import ControllerTasks
from services.broker.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP
from services.broker.partition import Partition, Role
from services.broker.purgatory import DelayedFetch
from services.broker.replica_sessions import ReplicaFetchSession, SessionFetch, read_session
from services.common import limits

_PartitionEntry = TypeVar("_PartitionEntry", covariant=True)
_Answer = TypeVar("_Answer")
_TopicAnswer = TypeVar("_TopicAnswer")


class _TopicEntry(Protocol[_PartitionEntry]):
    """A request's per-topic entry (ListOffsetsTopic, OffsetsForLeaderEpochTopic, ...)."""

    @property
    def topic(self) -> str: ...

    @property
    def partitions(self) -> Iterable[_PartitionEntry]: ...


def _answer_each_partition(
    topics: Iterable[_TopicEntry[_PartitionEntry]],
    answer: Callable[[str, _PartitionEntry], _Answer],
    topic_answer: Callable[..., _TopicAnswer],
) -> list[_TopicAnswer]:
    """One `topic_answer(topic=..., partitions=[...])` a requested topic, holding `answer(topic,
    entry)` for each of its entries in the request's order: the reads that answer partition by
    partition, each with its own error, share this walk."""
    return [
        topic_answer(topic=t.topic, partitions=[answer(t.topic, entry) for entry in t.partitions])
        for t in topics
    ]


class Reads(ControllerTasks):
    """What a leader answers to readers; a follower's Fetch also moves its ISR and HW."""

    # ---- Fetch ----------------------------------------------------------------------------------

    def fetch(
        self, req: common_pb2.FetchRequest, on_complete: Callable[[common_pb2.FetchResponse], None]
    ) -> None:
        """Read now, or wait in the purgatory for min_bytes, an error or max_wait_ms."""
        incremental = req.replica_id >= 0 and req.HasField("session") and req.session.id != 0
        # An incremental request may name no partition; its session was opened by this replica id.
        problem = None if incremental else self._replica_id_problem(req)
        if req.isolation_level not in (READ_UNCOMMITTED, READ_COMMITTED):
            problem = (
                f"isolation_level {req.isolation_level} is not one: 0 reads up to the high watermark "
                "(read_uncommitted), 1 up to the last stable offset (read_committed)"
            )
        if problem is not None:
            on_complete(
                common_pb2.FetchResponse(
                    topics=[
                        common_pb2.FetchTopicResponse(
                            topic=t.topic,
                            partitions=[
                                common_pb2.FetchPartitionResponse(
                                    partition=fp.partition,
                                    error_code=common_pb2.INVALID_REQUEST,
                                    high_watermark=-1,
                                    error_message=problem,
                                )
                                for fp in t.partitions
                            ],
                        )
                        for t in req.topics
                    ]
                )
            )
            return
        is_follower = req.replica_id >= 0
        if is_follower and req.HasField("session"):
            self._session_fetch(req, on_complete)
            return
        if is_follower:
            self._record_follower_fetches(req)
        max_wait_ms = min(req.max_wait_ms, limits.FETCH_MAX_WAIT_MS_MAX)
        keys = [(t.topic, p.partition) for t in req.topics for p in t.partitions]
        op = DelayedFetch(
            request=req,
            keys=keys,
            deadline_ms=self.clock.monotonic_ms() + max_wait_ms,
            read=lambda r: self.read_all(r, is_follower),
            on_complete=on_complete,
            partition_state=lambda tp: self._readable_state(tp, req.replica_id),
        )
        self._watch(op, max_wait_ms)

    def _session_fetch(
        self, req: common_pb2.FetchRequest, on_complete: Callable[[common_pb2.FetchResponse], None]
    ) -> None:
        """A follower's Fetch in a fetch session (replica_sessions.py): id 0 opens one (the
        request names every partition), any other id must be this replica's live session at
        its next epoch, or the answer says to open a new one."""
        now_ms = self.clock.monotonic_ms()
        if req.session.id == 0:
            session = self.replica_sessions.open(req.replica_id, now_ms)
        else:
            found = self.replica_sessions.find(req.replica_id, req.session.id, req.session.epoch)
            if not isinstance(found, ReplicaFetchSession):
                on_complete(common_pb2.FetchResponse(error_code=found))
                return
            session = found
        self.replica_sessions.update(session, req, now_ms)
        # Only the named partitions moved; the others' fetch offsets are what the session holds.
        self._record_follower_fetches(req)
        max_wait_ms = min(req.max_wait_ms, limits.FETCH_MAX_WAIT_MS_MAX)
        op = SessionFetch(
            session=session,
            request=req,
            deadline_ms=now_ms + max_wait_ms,
            read=lambda: read_session(session, req, lambda r: self.read_all(r, True), self._leader_log_end),
            on_complete=on_complete,
        )
        self._watch(op, max_wait_ms)

    def _leader_log_end(self, tp: TopicPartitionKey) -> int | None:
        p = self.partitions.get(tp)
        return p.log.log_end_offset if p is not None and p.role is Role.LEADER else None

    def _replica_id_problem(self, req: common_pb2.FetchRequest) -> str | None:
        """Why this Fetch's replica_id is refused, or None: -1 (a consumer), or a broker of the cluster.

        A broker id is known from UpdateMetadata or as a replica of an asked partition (a follower
        may fetch before this broker's metadata lists it). A consumer that left replica_id at 0
        would otherwise be served as some broker, silently.
        """
        if req.replica_id == -1:
            return None
        if req.replica_id >= 0:
            if req.replica_id in self.metadata.brokers:
                return None
            for t in req.topics:
                for fp in t.partitions:
                    p = self.partitions.get((t.topic, fp.partition))
                    if p is not None and req.replica_id in p.replicas:
                        return None
            return (
                f"replica_id {req.replica_id} is no broker of this cluster: consumers send -1, followers "
                "their broker id"
            )
        return f"replica_id {req.replica_id}: consumers send -1, followers their broker id"

    def _readable_state(self, tp: TopicPartitionKey, replica_id: int) -> object:
        """What a read of tp by replica_id depends on (DelayedFetch's `partition_state`)."""
        p = self.partitions.get(tp)
        if p is None:
            return None
        as_replica = replica_id >= 0 and replica_id in p.replicas
        return (
            id(p),
            p.role,
            p.leader_epoch,
            p.log.log_start_offset,
            p.log.log_end_offset if as_replica else p.high_watermark,
            # A marker moves the LSO of a read_committed consumer before the HW moves.
            None if as_replica else p.last_stable_offset,
        )

    def _record_follower_fetches(self, req: common_pb2.FetchRequest) -> None:
        mono = self.clock.monotonic_ms()
        for t in req.topics:
            for fp in t.partitions:
                p = self.partitions.get((t.topic, fp.partition))
                if p is None or p.role is not Role.LEADER:
                    continue
                if fp.current_leader_epoch >= 0 and fp.current_leader_epoch != p.leader_epoch:
                    continue
                if self.topic_id_differs((t.topic, fp.partition), t.topic_id):
                    continue  # a fetch of a deleted topic's partition says nothing of this one
                self._follower_fetched(p, req.replica_id, fp.fetch_offset, fp.log_start_offset, mono)

    def read_all(
        self, req: common_pb2.FetchRequest, is_follower: bool
    ) -> tuple[common_pb2.FetchResponse, int, bool]:
        """Read every asked partition into one response, built in place.

        Building with .add() matters: composing finished sub-messages makes protobuf copy
        every record batch again at each level.
        """
        total = 0
        has_error = False
        budget = self._answer_bytes_max(req, is_follower)
        resp = common_pb2.FetchResponse()
        for t in req.topics:
            out_topic = resp.topics.add(topic=t.topic)
            for fp in t.partitions:
                tp = (t.topic, fp.partition)
                pr = out_topic.partitions.add(
                    partition=fp.partition, high_watermark=-1, log_start_offset=-1, log_end_offset=-1
                )
                try:
                    if self.topic_id_differs(tp, t.topic_id):
                        raise InconsistentTopicId(
                            f"{tp[0]}-{tp[1]} here belongs to topic id {self.topic_ids.get(tp)}, not "
                            f"{t.topic_id}: the topic was deleted and created again; a follower waits "
                            "for its LeaderAndIsr"
                        )
                    p = self._fetchable_partition(tp, fp.current_leader_epoch)
                    # Only a replica of the partition reads past the HW: anyone else claiming a broker
                    # id (plaintext mode lets anyone try) reads what a consumer may.
                    as_replica = is_follower and req.replica_id in p.replicas
                    read_committed = req.isolation_level == READ_COMMITTED and not as_replica
                    pr.high_watermark = p.high_watermark
                    pr.last_stable_offset = lso = p.last_stable_offset
                    pr.log_start_offset = p.log.log_start_offset
                    pr.log_end_offset = p.log.log_end_offset
                    pr.leader_epoch = p.leader_epoch
                    # A consumer reads below the HW, or below the LSO when it reads committed only.
                    bound = lso if read_committed else p.high_watermark
                    max_offset = None if as_replica else bound
                    # A partition's bound is what it asked, at most what is left of the answer's.
                    limit = min(fp.partition_max_bytes or limits.FETCH_PARTITION_MAX_BYTES_DEFAULT, budget)
                    if (
                        fp.fetch_offset == (p.log.log_end_offset if as_replica else bound)
                        and fp.fetch_offset >= p.log.log_start_offset
                    ):
                        continue
                    if req.locate_records and not is_follower:
                        size = self._locate(p, fp.fetch_offset, bound, max(limit, 1), total == 0, pr)
                    else:
                        size = -1
                    if size < 0:
                        info = p.log.read(
                            fp.fetch_offset,
                            max_bytes=max(limit, 1),
                            max_offset=max_offset,
                            min_one_message=total == 0,
                        )
                        size = len(info.records)
                        if size:
                            pr.records = info.records
                    if size and read_committed:
                        # Every transaction aborted in what the answer may cover (up to the LSO).
                        for txn in p.log.aborted_txns(fp.fetch_offset, bound):
                            pr.aborted_transactions.add(
                                producer_id=txn.producer_id, first_offset=txn.first_offset
                            )
                    if size:
                        total += size
                        budget = max(budget - size, 0)
                        if not as_replica:
                            metrics.BYTES_OUT.labels(t.topic).inc(size)
                except HighwaterError as exc:
                    pr.error_code, pr.error_message = self._client_error(tp, exc)
                    has_error = True
        return resp, total, has_error

    def _answer_bytes_max(self, req: common_pb2.FetchRequest, is_follower: bool) -> int:
        """The record bytes one answer to req may hold: what it asked (0: the default), at most the
        broker's bound for its kind of fetcher.

        The client's max_bytes is only a wish: honoured as asked, 2^31-1 read a whole 100 MB
        partition into one answer. Each partition then takes at most what is left (read_all), and
        only the answer's first batch may pass the bound, whole (KIP-74), so an answer holds at
        most max(bound, first batch) bytes of records.
        """
        bound = self.replica_fetch_response_max_bytes if is_follower else self.fetch_max_bytes
        return min(req.max_bytes or limits.FETCH_MAX_BYTES_DEFAULT, bound)

    def _locate(
        self,
        p: Partition,
        fetch_offset: int,
        max_offset: int,
        max_bytes: int,
        min_one_message: bool,
        pr: common_pb2.FetchPartitionResponse,
    ) -> int:
        """A consumer's short-circuit local read (transport/local_reads.py): fill pr.records_location.

        Returns the bytes located (0: nothing to read), or -1 when the storage cannot say
        where its files are (MemoryStorage): the caller then sends the bytes.
        """
        located = p.log.read_location(
            fetch_offset, max_bytes=max_bytes, max_offset=max_offset, min_one_message=min_one_message
        )
        if located is None:
            return 0
        where = self.storage.file_location(located.path)
        if where is None:
            return -1
        location = pr.records_location
        location.path = where.path
        location.position = located.position
        location.size = located.size
        location.device = where.device
        location.inode = where.inode
        location.host_id = where.host_id
        return located.size

    # ---- other reads ----------------------------------------------------------------------------

    def list_offsets(self, req: common_pb2.ListOffsetsRequest) -> common_pb2.ListOffsetsResponse:
        def answer(
            topic: str, lp: common_pb2.ListOffsetsPartition
        ) -> common_pb2.ListOffsetsPartitionResponse:
            res = common_pb2.ListOffsetsPartitionResponse(partition=lp.partition, timestamp=-1, offset=-1)
            try:
                p = self._fetchable_partition((topic, lp.partition), lp.current_leader_epoch)
                res.leader_epoch = p.leader_epoch
                if lp.timestamp == EARLIEST_TIMESTAMP:
                    res.offset = p.log.log_start_offset
                elif lp.timestamp == LATEST_TIMESTAMP:
                    read_committed = req.isolation_level == READ_COMMITTED
                    res.offset = p.last_stable_offset if read_committed else p.high_watermark
                else:
                    # Kafka's max-timestamp lookup (-3, KIP-734) goes to the log as it is; other
                    # negative values are read as 0, the first record (common.proto).
                    asked = lp.timestamp if lp.timestamp >= 0 or lp.timestamp == MAX_TIMESTAMP else 0
                    found = p.log.offset_for_timestamp(asked)
                    if found is not None and found[0] < p.high_watermark:
                        res.offset, res.timestamp = found
            except HighwaterError as exc:
                res.error_code, res.error_message = self._client_error((topic, lp.partition), exc)
            return res

        topics = _answer_each_partition(req.topics, answer, common_pb2.ListOffsetsTopicResponse)
        return common_pb2.ListOffsetsResponse(topics=topics)

    def offsets_for_leader_epoch(
        self, req: broker_pb2.OffsetsForLeaderEpochRequest
    ) -> broker_pb2.OffsetsForLeaderEpochResponse:
        def answer(topic: str, op: broker_pb2.OffsetsForLeaderEpochPartition) -> broker_pb2.EpochEndOffset:
            res = broker_pb2.EpochEndOffset(partition=op.partition, leader_epoch=-1, end_offset=-1)
            try:
                p = self._fetchable_partition((topic, op.partition), op.current_leader_epoch)
                res.leader_epoch, res.end_offset = p.last_offset_for_leader_epoch(op.leader_epoch)
            except HighwaterError as exc:
                res.error_code = exc.code
            return res

        topics = _answer_each_partition(req.topics, answer, broker_pb2.OffsetsForLeaderEpochTopicResult)
        return broker_pb2.OffsetsForLeaderEpochResponse(topics=topics)
