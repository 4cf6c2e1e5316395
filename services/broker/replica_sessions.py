"""Replica fetch sessions on a leader: a follower's Fetch names only what changed (KIP-227).

Without a session, every follower Fetch names every partition the follower fetches from this
leader, and the leader reads, watches and answers every one: with thousands of partitions
per broker that walk, twice a round even when nothing is written, was most of an idle
broker's CPU (bench/RESULTS.md, partition scale). Kafka's sessions (KIP-227) shrink the
request and the answer, but its leader still reads every partition of a session on every
fetch. Here the leader also keeps, per session, the partitions that may have something to
say (`dirty`), so a fetch costs what changed, not what is followed:

- a partition is dirty when the follower names it (a new fetch offset, leader epoch or log
  start), when it changes here (`partition_changed`: whoever appends, moves the HW or the log
  start, or changes leadership already calls the broker's notify), and once every
  `REPLICA_FETCH_SESSION_SWEEP_MS` for all of them, `REPLICA_FETCH_SESSION_SWEEP_PARTITIONS` at
  each fetch (a change nobody notified about, such as retention moving the log start, reaches
  the follower within that, and no fetch reads every partition at once);
- a fetch reads only the dirty partitions, and answers those with records, an error, or a high
  watermark, log start, log end or leader epoch the follower has not been told;
- a dirty partition stays dirty while the follower's offset is below the leader's log end (the
  answer's byte budget ran out before it, or the follower could not use what it got).

One session per follower broker: a follower opens a new one after any failed call, and it
replaces the old, so the sessions a leader keeps are bounded by the brokers in the cluster
(Kafka's FetchSessionCache eviction is for consumers, which do not apply here).

A follower named in a session keeps its place in the ISR on an idle partition through the
session's fetches (`last_fetch_ms`), without the leader walking every partition to record
each fetch: Partition.check_isr_shrink and Partition's appends ask it.

Pure: owned by the broker core's event loop (or the simulation's); no clock of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from clients.common.errors import check
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.broker.purgatory import fetch_answers_now
from services.common import limits

# What a follower was last told of a partition: (high watermark, log start, log end, leader epoch).
Told = tuple[int, int, int, int]
# Reads a FetchRequest as a follower: (answer, record bytes read, whether some partition erred).
FollowerRead = Callable[[common_pb2.FetchRequest], tuple[common_pb2.FetchResponse, int, bool]]
# The leader's log end offset of a partition (None: not led here).
LogEnd = Callable[[TopicPartitionKey], int | None]


@dataclass(slots=True)
class SessionPartition:
    """What the follower asked for one partition, and what it was last told."""

    fetch_offset: int
    current_leader_epoch: int
    log_start_offset: int
    partition_max_bytes: int
    # The topic id the follower named it under ("": not checked); the leader answers and counts
    # the session's position only for a partition of that topic (FetchTopic.topic_id).
    topic_id: str = ""
    told: Told | None = None


@dataclass(eq=False)
class ReplicaFetchSession:
    id: int
    replica_id: int
    # The epoch the next request must carry: update() moves it on, the opening request's to 1.
    epoch: int = 0
    partitions: dict[TopicPartitionKey, SessionPartition] = field(default_factory=dict)
    # Partitions that may have something to say, in the order they became so (round-robin).
    dirty: dict[TopicPartitionKey, None] = field(default_factory=dict)
    last_fetch_ms: int = 0
    last_sweep_ms: int = 0
    # Partitions a sweep still has to mark dirty, a bounded piece at each fetch.
    sweep_left: list[TopicPartitionKey] = field(default_factory=list)
    waiting: SessionFetch | None = None


class ReplicaFetchSessions:
    """Every follower's session with this leader, and which sessions hold each partition."""

    def __init__(self) -> None:
        self.by_id: dict[int, ReplicaFetchSession] = {}
        self.by_replica: dict[int, ReplicaFetchSession] = {}
        # In insertion order, not a set: the simulation replays schedules, and a set of objects
        # iterates in the order of their addresses.
        self.by_partition: dict[TopicPartitionKey, dict[ReplicaFetchSession, None]] = {}
        self._next_id = 1

    def open(self, replica_id: int, now_ms: int) -> ReplicaFetchSession:
        """A new session for replica_id, replacing the one it had."""
        old = self.by_replica.get(replica_id)
        if old is not None:
            self.close(old)
        session_id = self._next_id
        # Ids stay positive int32s (the field's type); a wrapped id cannot meet a live one: at
        # most one session per broker is live.
        self._next_id = self._next_id + 1 if self._next_id < 2**31 - 1 else 1
        session = ReplicaFetchSession(session_id, replica_id, last_fetch_ms=now_ms, last_sweep_ms=now_ms)
        self.by_id[session_id] = session
        self.by_replica[replica_id] = session
        return session

    def close(self, session: ReplicaFetchSession) -> None:
        self.by_id.pop(session.id, None)
        if self.by_replica.get(session.replica_id) is session:
            del self.by_replica[session.replica_id]
        for tp in session.partitions:
            self._unindex(tp, session)
        session.partitions.clear()
        session.dirty.clear()

    def close_all(self) -> None:
        for session in list(self.by_id.values()):
            self.close(session)

    def find(
        self, replica_id: int, session_id: int, epoch: int
    ) -> ReplicaFetchSession | common_pb2.ErrorCode:
        """The session an incremental request names, or why it cannot be used."""
        session = self.by_id.get(session_id)
        if session is None or session.replica_id != replica_id:
            return common_pb2.FETCH_SESSION_ID_NOT_FOUND
        if epoch != session.epoch:
            return common_pb2.INVALID_FETCH_SESSION_EPOCH
        return session

    def update(self, session: ReplicaFetchSession, req: common_pb2.FetchRequest, now_ms: int) -> None:
        """Take one request of the session: the partitions it names (new or changed) become
        dirty, the forgotten ones leave, and the session moves to its next epoch."""
        for tp in req.session.forgotten:
            key = (tp.topic, tp.partition)
            if session.partitions.pop(key, None) is not None:
                session.dirty.pop(key, None)
                self._unindex(key, session)
        for t in req.topics:
            for fp in t.partitions:
                key = (t.topic, fp.partition)
                sp = session.partitions.get(key)
                if sp is None:
                    session.partitions[key] = SessionPartition(
                        fp.fetch_offset,
                        fp.current_leader_epoch,
                        fp.log_start_offset,
                        fp.partition_max_bytes,
                        t.topic_id,
                    )
                    self.by_partition.setdefault(key, {})[session] = None
                else:
                    sp.fetch_offset = fp.fetch_offset
                    sp.current_leader_epoch = fp.current_leader_epoch
                    sp.log_start_offset = fp.log_start_offset
                    sp.partition_max_bytes = fp.partition_max_bytes
                    sp.topic_id = t.topic_id
                session.dirty.pop(key, None)
                session.dirty[key] = None
        if now_ms - session.last_sweep_ms >= limits.REPLICA_FETCH_SESSION_SWEEP_MS and not session.sweep_left:
            session.last_sweep_ms = now_ms
            session.sweep_left = list(session.partitions)
        if session.sweep_left:
            piece = session.sweep_left[-limits.REPLICA_FETCH_SESSION_SWEEP_PARTITIONS :]
            del session.sweep_left[-limits.REPLICA_FETCH_SESSION_SWEEP_PARTITIONS :]
            for key in piece:
                if key in session.partitions:  # not forgotten since the sweep began
                    session.dirty.setdefault(key, None)
        session.last_fetch_ms = now_ms
        session.epoch = session.epoch + 1 if session.epoch < 2**31 - 1 else 1

    def partition_changed(self, tp: TopicPartitionKey) -> list[SessionFetch]:
        """tp changed here: every session holding it must look at it again. Returns the
        sessions' waiting fetches, for the caller to try."""
        sessions = self.by_partition.get(tp)
        if not sessions:
            return []
        waiting = []
        for session in sessions:
            session.dirty[tp] = None
            if session.waiting is not None:
                waiting.append(session.waiting)
        return waiting

    def held(self, replica_id: int, tp: TopicPartitionKey) -> tuple[SessionPartition, int] | None:
        """What replica_id's session holds for tp, and when it last fetched (None: not held)."""
        session = self.by_replica.get(replica_id)
        if session is None:
            return None
        sp = session.partitions.get(tp)
        return None if sp is None else (sp, session.last_fetch_ms)

    def last_fetch_ms(self, replica_id: int, tp: TopicPartitionKey) -> int:
        """When replica_id last fetched tp through its session (-1: tp is in no session of it)."""
        session = self.by_replica.get(replica_id)
        if session is None or tp not in session.partitions:
            return -1
        return session.last_fetch_ms

    @property
    def partitions_held(self) -> int:
        return sum(len(s.partitions) for s in self.by_id.values())

    def _unindex(self, tp: TopicPartitionKey, session: ReplicaFetchSession) -> None:
        holders = self.by_partition.get(tp)
        if holders is not None:
            holders.pop(session, None)
            if not holders:
                del self.by_partition[tp]


@dataclass
class SessionAnswer:
    """A read of a session's dirty partitions, and what sending it would change in the session."""

    response: common_pb2.FetchResponse
    bytes_read: int
    has_error: bool
    told: list[tuple[SessionPartition, Told]] = field(default_factory=list)
    settled: list[TopicPartitionKey] = field(default_factory=list)

    def sent(self, session: ReplicaFetchSession) -> None:
        """The answer goes to the follower: what it tells is now known there."""
        for sp, told in self.told:
            sp.told = told
        for key in self.settled:
            session.dirty.pop(key, None)


def read_session(
    session: ReplicaFetchSession, req: common_pb2.FetchRequest, read: FollowerRead, log_end: LogEnd
) -> SessionAnswer:
    """Read the session's dirty partitions; the answer holds those with something to say.

    `req` is the follower's request (its limits); `read` reads a request as the follower. The
    session changes only when the answer is sent (SessionAnswer.sent): a read that does not
    answer yet (below min_bytes) tells the follower nothing.
    """
    if not session.dirty:
        return SessionAnswer(common_pb2.FetchResponse(session_id=session.id), 0, False)
    asked = common_pb2.FetchRequest(
        replica_id=req.replica_id,
        replica_epoch=req.replica_epoch,
        max_wait_ms=req.max_wait_ms,
        min_bytes=req.min_bytes,
        max_bytes=req.max_bytes,
    )
    by_topic: dict[tuple[str, str], common_pb2.FetchTopic] = {}
    for key in session.dirty:
        sp = session.partitions[key]
        topic = by_topic.get((key[0], sp.topic_id))
        if topic is None:
            topic = by_topic[(key[0], sp.topic_id)] = asked.topics.add(topic=key[0], topic_id=sp.topic_id)
        topic.partitions.add(
            partition=key[1],
            fetch_offset=sp.fetch_offset,
            partition_max_bytes=sp.partition_max_bytes,
            current_leader_epoch=sp.current_leader_epoch,
            log_start_offset=sp.log_start_offset,
        )
    response, total, has_error = read(asked)
    answer = SessionAnswer(response, total, has_error)
    response.session_id = session.id
    # Partitions with nothing to say leave the answer in place (no copy of anyone's records).
    for t in range(len(response.topics) - 1, -1, -1):
        topic_answer = response.topics[t]
        partitions = topic_answer.partitions
        for i in range(len(partitions) - 1, -1, -1):
            pr = partitions[i]
            key = (topic_answer.topic, pr.partition)
            sp = session.partitions[key]
            told = (pr.high_watermark, pr.log_start_offset, pr.log_end_offset, pr.leader_epoch)
            erred = pr.error_code != common_pb2.NONE
            if erred or pr.records or pr.HasField("records_location") or told != sp.told:
                answer.told.append((sp, told))
            else:
                del partitions[i]
            end = log_end(key)
            # Dirty while the follower is below the log end and this did not end in an error: more
            # is to come for it (or it could not use what it got, and gets it again).
            if erred or end is None or sp.fetch_offset >= end:
                answer.settled.append(key)
        if not partitions:
            del response.topics[t]
    return answer


@dataclass(eq=False)
class SessionFetch:
    """A session's Fetch waiting for min_bytes (the purgatory's DelayedFetch for sessions).

    It is not watched under partitions, as a DelayedFetch is under every one it asks: the
    session's `partition_changed` wakes it, for the partitions the session holds. Every wake-up
    reads the session's dirty partitions (a few): skipping the ones whose state a follower reads
    had not moved, as DelayedFetch does, saved no CPU in bench/e2e_latency.py and cost 0.5-1 ms
    of p50 in three rounds out of three.
    """

    session: ReplicaFetchSession
    request: common_pb2.FetchRequest
    deadline_ms: int
    read: Callable[[], SessionAnswer]
    on_complete: Callable[[common_pb2.FetchResponse], None]
    completed: bool = False
    cancel_expiry: Callable[[], None] | None = field(default=None, repr=False)
    keys: list[TopicPartitionKey] = field(default_factory=list)

    def try_complete(self, now_ms: int, changed: TopicPartitionKey | None = None) -> bool:
        if self.completed:
            return True
        answer = self.read()
        if not fetch_answers_now(
            max_wait_ms=self.request.max_wait_ms,
            partitions_asked=len(self.session.partitions),
            bytes_read=answer.bytes_read,
            min_bytes=self.request.min_bytes,
            has_error=answer.has_error,
            now_ms=now_ms,
            deadline_ms=self.deadline_ms,
        ):
            return False
        check(not self.keys, "a session's fetch is watched by its session, not under partitions")
        self.completed = True
        if self.cancel_expiry is not None:
            self.cancel_expiry()
            self.cancel_expiry = None
        if self.session.waiting is self:
            self.session.waiting = None
        answer.sent(self.session)
        self.on_complete(answer.response)
        return True
