"""The replica fetcher's rules, without I/O: build a request, handle its answer.

Kafka's AbstractFetcherThread, sans I/O. One FetcherCore per leader broker this
broker follows; its `run()` task is the loop `maybe_truncate(); maybe_fetch()`,
yielding the RPCs it needs (services/broker/steps.py) to a driver that owns the
transport: gRPC in the broker (services/broker/fetcher.py), the simulated network
in tests/sim. Everything the loop decides is in the plain methods below, which the
unit tests call directly:

- `build_truncation_request(now_ms)` / `handle_truncation_answer(...)`: partitions
  in TRUNCATING ask the leader OffsetsForLeaderEpoch for their latest epoch and
  truncate to min(answer, own LEO) (KIP-101/279);
- `build_fetch_request(now_ms)` / `handle_fetch_answer(...)`: one Fetch for every
  partition in FETCHING, round-robin (a partition that got data, or was delayed,
  goes to the end); per-partition errors delay that partition only.
- `leader_unreachable(now_ms, reason)`: the RPC failed as a whole (Kafka's
  handleFetchError): every partition waits the back-off.

A partition whose append or truncation fails with an error of its own (a storage
error, a corrupt batch from the leader) is isolated in `failed` (Kafka's
failedPartitions): the others keep fetching, and it is retried when the controller
next tells this broker to follow (add_partition). A broken invariant is raised, not
isolated: the broker halts.

The log itself is changed only through `FollowerLogs` (the broker core), on the same
event loop as everything else, so no locks exist.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from clients.common.errors import InvariantViolation
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import broker_pb2, common_pb2
from services.broker.fetch_state import (
    FetchPhase,
    PartitionFetchState,
    backoff_after_error,
    truncation_offset,
)
from services.broker.steps import AwaitWork, CallLeader, RpcFailed, Sleep, Task
from services.common import limits

# With nothing to follow, the loop waits for a partition this long before looking again.
FETCHER_EMPTY_WAIT_MS = 1_000
# With every partition delayed, the loop sleeps at most this long before looking again.
FETCHER_IDLE_SLEEP_MS_MAX = 100
# OffsetsForLeaderEpoch and the part of a Fetch's deadline beyond its max_wait_ms.
FETCHER_RPC_TIMEOUT_MS = int(limits.CONTROL_RPC_TIMEOUT_S * 1000)


class Clock(Protocol):
    def monotonic_ms(self) -> int: ...
    def wall_ms(self) -> int: ...


class BrokerLog(Protocol):
    """Where the core's log lines go: a logging.Logger in the broker, the trace in the simulation."""

    def info(self, msg: str, *args: object) -> None: ...
    def warning(self, msg: str, *args: object) -> None: ...
    def error(self, msg: str, *args: object) -> None: ...


class FollowerLogs(Protocol):
    """The follower replicas as the fetcher sees them (the broker core)."""

    def local_leo(self, tp: TopicPartitionKey) -> int | None: ...
    def local_log_start(self, tp: TopicPartitionKey) -> int: ...
    def local_high_watermark(self, tp: TopicPartitionKey) -> int | None: ...
    def latest_local_epoch(self, tp: TopicPartitionKey) -> int | None: ...
    def local_end_offset_for_epoch(self, tp: TopicPartitionKey, epoch: int) -> int: ...
    def truncate(self, tp: TopicPartitionKey, offset: int) -> None: ...
    def truncate_fully_and_start_at(self, tp: TopicPartitionKey, offset: int) -> None: ...
    def append_fetched(self, tp: TopicPartitionKey, response: common_pb2.FetchPartitionResponse) -> None: ...


class TruncationObserver(Protocol):
    """Told of every truncation decision (the simulation's checker; nothing in the broker)."""

    def before_truncation(self, tp: TopicPartitionKey, offset: int) -> None: ...
    def after_truncation(self, tp: TopicPartitionKey, leader_id: int, leader_epoch: int) -> None: ...


class _NoObserver:
    def before_truncation(self, tp: TopicPartitionKey, offset: int) -> None:
        pass

    def after_truncation(self, tp: TopicPartitionKey, leader_id: int, leader_epoch: int) -> None:
        pass


@dataclass(frozen=True)
class FetcherSettings:
    fetch_wait_max_ms: int = limits.REPLICA_FETCH_WAIT_MAX_MS
    fetch_min_bytes: int = limits.REPLICA_FETCH_MIN_BYTES
    fetch_max_bytes: int = limits.REPLICA_FETCH_MAX_BYTES
    partition_max_bytes: int = limits.REPLICA_FETCH_PARTITION_MAX_BYTES
    backoff_ms: int = limits.REPLICA_FETCH_BACKOFF_MS
    rpc_timeout_ms: int = FETCHER_RPC_TIMEOUT_MS
    # Off only in the simulation, to show what KIP-101 prevents: a truncating follower
    # then cuts its log at its own high watermark, as Kafka did before leader epochs.
    truncate_by_leader_epoch: bool = True


DEFAULT_FETCHER_SETTINGS = FetcherSettings()


@dataclass(frozen=True)
class TruncationRequest:
    request: broker_pb2.OffsetsForLeaderEpochRequest
    # The latest local epoch each partition asked about.
    asked: dict[TopicPartitionKey, int]


class FetcherCore:
    """Every partition this broker follows from one leader broker."""

    def __init__(
        self,
        *,
        local_broker_id: int,
        broker_epoch: Callable[[], int],
        leader_id: int,
        leader_address: str,
        logs: FollowerLogs,
        clock: Clock,
        log: BrokerLog,
        settings: FetcherSettings | None = None,
        observer: TruncationObserver | None = None,
    ) -> None:
        self.local_broker_id = local_broker_id
        self.broker_epoch = broker_epoch
        self.leader_id = leader_id
        self.leader_address = leader_address
        self.logs = logs
        self.clock = clock
        self.log = log
        self.settings = settings or DEFAULT_FETCHER_SETTINGS
        self.observer: TruncationObserver = observer or _NoObserver()
        # Insertion order is the round-robin order.
        self.partitions: OrderedDict[TopicPartitionKey, PartitionFetchState] = OrderedDict()
        self.failed: set[TopicPartitionKey] = set()
        self.max_lag = 0
        self.stopped = False
        # Set by the driver: resumes a task waiting in AwaitWork.
        self.wake: Callable[[], None] = lambda: None
        # The fetch session with the leader (services/broker/replica_sessions.py): its id (0:
        # none, the next Fetch opens one), the epoch the next request carries, and what the
        # leader holds for each partition from our requests: only changes are sent.
        self.session_id = 0
        self.session_epoch = 0
        self.session_sent: dict[TopicPartitionKey, tuple[int, int, int]] = {}
        # A leader that answered a request to open a session with session_id 0 (an older broker,
        # during a rolling upgrade) is fetched from in full until then (monotonic ms), or until a
        # call fails (it may have been upgraded behind the same address).
        self.full_fetches_until_ms = 0
        # Partitions whose fetch state may have changed since the last request was built (added,
        # answered, delayed, removed): an incremental request and the truncation step look at
        # these only, so an idle round does not walk every partition followed. A partition
        # leaves when a request holds it as it is; a delayed or truncating one stays until then.
        self.unsettled: dict[TopicPartitionKey, None] = {}

    # ---- membership (from the broker core) ---------------------------------------------

    def add_partition(
        self, tp: TopicPartitionKey, leader_epoch: int, fetch_offset: int, topic_id: str = ""
    ) -> None:
        """Follow tp from this leader, starting over in TRUNCATING (also un-fails it). topic_id:
        the topic's id from LeaderAndIsr ("" unknown), sent so the leader checks it."""
        self.failed.discard(tp)
        self.partitions.pop(tp, None)
        self.partitions[tp] = PartitionFetchState(tp[0], tp[1], fetch_offset, leader_epoch, topic_id=topic_id)
        # Named again in the next request, whatever the session held for it.
        self.session_sent.pop(tp, None)
        self.unsettled[tp] = None
        self.wake()

    def remove_partition(self, tp: TopicPartitionKey) -> None:
        self.partitions.pop(tp, None)
        self.failed.discard(tp)
        self.unsettled[tp] = None

    def _fail_partition(self, tp: TopicPartitionKey, what: str, exc: Exception) -> None:
        self.partitions.pop(tp, None)
        self.failed.add(tp)
        self.unsettled[tp] = None
        self.log.error(
            "%s-%d: %s from leader %d failed (%s: %s); not fetched until the controller assigns it again",
            tp[0],
            tp[1],
            what,
            self.leader_id,
            type(exc).__name__,
            exc,
        )

    def _delay(
        self, tp: TopicPartitionKey, st: PartitionFetchState, now_ms: int, backoff_ms: int, resume: FetchPhase
    ) -> None:
        st.delay(now_ms, backoff_ms, resume)
        self.partitions.move_to_end(tp)  # delayed partitions go to the end of the round
        self.unsettled[tp] = None

    # ---- the loop ---------------------------------------------------------------------

    def run(self) -> Task[None]:
        """maybe_truncate(); maybe_fetch() until the driver stops the task."""
        while not self.stopped:
            if not self.partitions:
                yield AwaitWork(FETCHER_EMPTY_WAIT_MS)
                continue
            truncation = self.build_truncation_request(self.clock.monotonic_ms())
            if truncation is not None:
                answer = yield CallLeader(
                    "OffsetsForLeaderEpoch", truncation.request, self.settings.rpc_timeout_ms
                )
                if isinstance(answer, RpcFailed):
                    yield Sleep(self.leader_unreachable(self.clock.monotonic_ms(), answer.reason))
                    continue
                self.handle_truncation_answer(answer, truncation.asked, self.clock.monotonic_ms())
            request = self.build_fetch_request(self.clock.monotonic_ms())
            if request is None:
                yield Sleep(min(self.settings.backoff_ms, FETCHER_IDLE_SLEEP_MS_MAX))
                continue
            answer = yield CallLeader("Fetch", request, request.max_wait_ms + self.settings.rpc_timeout_ms)
            if isinstance(answer, RpcFailed):
                yield Sleep(self.leader_unreachable(self.clock.monotonic_ms(), answer.reason))
                continue
            session_id = request.session.id if request.HasField("session") else None
            self.handle_fetch_answer(answer, self.clock.monotonic_ms(), session_id)

    def reset_session(self) -> None:
        """The next Fetch opens a new session, naming every partition."""
        self.session_id = 0
        self.session_epoch = 0
        self.session_sent.clear()

    def leader_unreachable(self, now_ms: int, reason: str) -> int:
        """A whole RPC failed: every partition not yet delayed backs off. Returns the sleep in ms."""
        # The leader may have taken the request, or not: only a new session is certain.
        self.reset_session()
        self.full_fetches_until_ms = 0
        self.log.warning(
            "fetch from leader %d failed: %s; backing off %d ms",
            self.leader_id,
            reason,
            self.settings.backoff_ms,
        )
        for tp, st in self.partitions.items():
            if st.phase is not FetchPhase.DELAYED:
                st.delay(now_ms, self.settings.backoff_ms, st.phase)
            self.unsettled[tp] = None
        return self.settings.backoff_ms

    # ---- maybe_truncate ------------------------------------------------------------------

    def build_truncation_request(self, now_ms: int) -> TruncationRequest | None:
        """The OffsetsForLeaderEpoch request for the partitions in TRUNCATING, if any needs one.

        A partition with no epoch at all (an empty log) has nothing to truncate and moves
        to FETCHING from its LEO at once.
        """
        # Only an unsettled partition can be truncating: it got there by being added, delayed
        # or answered, and leaves `unsettled` only once a fetch request holds it in FETCHING.
        partitions = self.partitions
        truncating = [
            (tp, st)
            for tp in self.unsettled
            if (st := partitions.get(tp)) is not None
            and st.ready(now_ms)  # first: a delay that ended resumes its phase here
            and st.phase is FetchPhase.TRUNCATING
        ]
        if not truncating:
            return None
        if not self.settings.truncate_by_leader_epoch:
            for tp, st in truncating:
                self._truncate_to_high_watermark(tp, st)
            return None
        by_topic: dict[str, list[broker_pb2.OffsetsForLeaderEpochPartition]] = {}
        asked: dict[TopicPartitionKey, int] = {}
        for tp, st in truncating:
            epoch = self.logs.latest_local_epoch(tp)
            if epoch is None:
                st.fetch_offset = self.logs.local_leo(tp) or 0
                st.move(FetchPhase.FETCHING)
                continue
            asked[tp] = epoch
            by_topic.setdefault(tp[0], []).append(
                broker_pb2.OffsetsForLeaderEpochPartition(
                    partition=tp[1], current_leader_epoch=st.current_leader_epoch, leader_epoch=epoch
                )
            )
        if not by_topic:
            return None
        request = broker_pb2.OffsetsForLeaderEpochRequest(
            replica_id=self.local_broker_id,
            topics=[
                broker_pb2.OffsetsForLeaderEpochTopic(topic=t, partitions=ps) for t, ps in by_topic.items()
            ],
        )
        return TruncationRequest(request, asked)

    def handle_truncation_answer(
        self,
        response: broker_pb2.OffsetsForLeaderEpochResponse,
        asked: dict[TopicPartitionKey, int],
        now_ms: int,
    ) -> None:
        for topic in response.topics:
            for result in topic.partitions:
                tp = (topic.topic, result.partition)
                st = self.partitions.get(tp)
                if st is None or tp not in asked or st.phase is not FetchPhase.TRUNCATING:
                    continue  # removed, re-added or answered twice while the request was in flight
                self.unsettled[tp] = None
                if result.error_code != common_pb2.NONE:
                    backoff_ms = backoff_after_error(result.error_code, self.settings.backoff_ms)
                    self.log.info(
                        "OffsetsForLeaderEpoch for %s-%d: %s; retrying after %d ms",
                        *tp,
                        common_pb2.ErrorCode.Name(result.error_code),
                        backoff_ms,
                    )
                    self._delay(tp, st, now_ms, backoff_ms, FetchPhase.TRUNCATING)
                    continue
                try:
                    self._truncate_after_answer(tp, st, asked[tp], result)
                except InvariantViolation:
                    raise
                except Exception as exc:
                    self._fail_partition(tp, "truncation", exc)

    def _truncate_after_answer(
        self,
        tp: TopicPartitionKey,
        st: PartitionFetchState,
        asked_epoch: int,
        result: broker_pb2.EpochEndOffset,
    ) -> None:
        local_leo = self.logs.local_leo(tp)
        if local_leo is None:
            return
        if result.leader_epoch < 0 or result.end_offset < 0:
            offset = local_leo  # the leader knows no epoch at all: keep ours
        else:
            offset = truncation_offset(
                local_leo=local_leo,
                requested_epoch=asked_epoch,
                leader_epoch=result.leader_epoch,
                leader_end_offset=result.end_offset,
                local_end_offset_for_leader_epoch=self.logs.local_end_offset_for_epoch(
                    tp, result.leader_epoch
                ),
            )
        if offset < local_leo:
            self.log.info(
                "truncating %s-%d from %d to %d (leader epoch %d ends at %d)",
                *tp,
                local_leo,
                offset,
                result.leader_epoch,
                result.end_offset,
            )
            self.observer.before_truncation(tp, offset)
        # Always, even with nothing to cut: epochs of ours starting at the offset go too.
        self.logs.truncate(tp, offset)
        st.fetch_offset = offset
        st.move(FetchPhase.FETCHING)
        self.observer.after_truncation(tp, self.leader_id, st.current_leader_epoch)

    def _truncate_to_high_watermark(self, tp: TopicPartitionKey, st: PartitionFetchState) -> None:
        local_leo = self.logs.local_leo(tp)
        hw = self.logs.local_high_watermark(tp)
        if local_leo is None or hw is None:
            return
        offset = min(hw, local_leo)
        if offset < local_leo:
            self.log.info(
                "truncating %s-%d from %d to its HW %d (leader-epoch truncation off)", *tp, local_leo, offset
            )
            self.observer.before_truncation(tp, offset)
            self.logs.truncate(tp, offset)
        st.fetch_offset = offset
        st.move(FetchPhase.FETCHING)
        self.observer.after_truncation(tp, self.leader_id, st.current_leader_epoch)

    # ---- maybe_fetch ---------------------------------------------------------------------

    def build_fetch_request(self, now_ms: int) -> common_pb2.FetchRequest | None:
        """One Fetch for the partitions in FETCHING, in round-robin order; None if none is ready.

        In a session (the leader keeps one) the request names only the partitions whose fetch
        offset, leader epoch or log start the leader does not hold yet, and forgets those no
        longer ready (delayed, truncating, removed); without one, it names every ready one and
        asks the leader to open a session.
        """
        incremental = self.session_id != 0
        sent = self.session_sent
        partitions = self.partitions
        # By (topic, topic id): a follower may still hold a partition of a deleted topic beside
        # one of the new topic of the same name.
        by_topic: dict[tuple[str, str], list[common_pb2.FetchPartition]] = {}
        forgotten: list[TopicPartitionKey] = []
        if incremental:
            # Only what may have changed since the last request; the rest the leader holds.
            looked_at: list[TopicPartitionKey] = list(self.unsettled)
        else:
            looked_at = list(partitions)
            for tp in sent:
                if tp not in partitions:
                    forgotten.append(tp)
        for tp in looked_at:
            st = partitions.get(tp)
            if st is None or not st.ready(now_ms) or st.phase is not FetchPhase.FETCHING:
                if tp in sent:
                    forgotten.append(tp)
                if st is None:
                    self.unsettled.pop(tp, None)
                continue
            self.unsettled.pop(tp, None)
            log_start = self.logs.local_log_start(tp)
            position = (st.fetch_offset, st.current_leader_epoch, log_start)
            if incremental and sent.get(tp) == position:
                continue
            sent[tp] = position
            by_topic.setdefault((tp[0], st.topic_id), []).append(
                common_pb2.FetchPartition(
                    partition=tp[1],
                    fetch_offset=st.fetch_offset,
                    partition_max_bytes=self.settings.partition_max_bytes,
                    current_leader_epoch=st.current_leader_epoch,
                    log_start_offset=log_start,
                )
            )
        for tp in forgotten:
            del sent[tp]
        if not sent:
            # Nothing to fetch: the next request, whenever it comes, opens a new session.
            self.reset_session()
            return None
        request = common_pb2.FetchRequest(
            replica_id=self.local_broker_id,
            replica_epoch=self.broker_epoch(),
            max_wait_ms=self.settings.fetch_wait_max_ms,
            min_bytes=self.settings.fetch_min_bytes,
            max_bytes=self.settings.fetch_max_bytes,
            topics=[
                common_pb2.FetchTopic(topic=t, topic_id=topic_id, partitions=ps)
                for (t, topic_id), ps in by_topic.items()
            ],
        )
        if incremental:
            request.session.id = self.session_id
            request.session.epoch = self.session_epoch
            for tp in forgotten:
                request.session.forgotten.add(topic=tp[0], partition=tp[1])
        elif now_ms >= self.full_fetches_until_ms:
            request.session.id = 0
        return request

    def _take_session(self, request_session_id: int, response: common_pb2.FetchResponse, now_ms: int) -> bool:
        """Follow the session through an answer; False when the answer is the session's refusal."""
        if response.error_code in (
            common_pb2.FETCH_SESSION_ID_NOT_FOUND,
            common_pb2.INVALID_FETCH_SESSION_EPOCH,
        ):
            self.log.info(
                "fetch session %d with leader %d: %s; opening a new one",
                self.session_id,
                self.leader_id,
                common_pb2.ErrorCode.Name(response.error_code),
            )
            self.reset_session()
            return False
        if request_session_id == 0:
            if response.session_id == 0:
                # An older leader, or one that keeps no session for us: fetch in full for a while.
                self.full_fetches_until_ms = now_ms + limits.REPLICA_FETCH_SESSION_RETRY_MS
                self.reset_session()
            else:
                self.session_id = response.session_id
                self.session_epoch = 1
        elif response.session_id != self.session_id:
            self.reset_session()
        else:
            self.session_epoch = self.session_epoch + 1 if self.session_epoch < 2**31 - 1 else 1
        return True

    def handle_fetch_answer(
        self, response: common_pb2.FetchResponse, now_ms: int, request_session_id: int | None = None
    ) -> None:
        """Take an answer: `request_session_id` is the session id its request carried (None: the
        request had no session)."""
        if request_session_id is not None and not self._take_session(request_session_id, response, now_ms):
            return
        max_lag = 0
        for topic in response.topics:
            for pr in topic.partitions:
                tp = (topic.topic, pr.partition)
                st = self.partitions.get(tp)
                if st is None or st.phase is not FetchPhase.FETCHING:
                    continue  # removed or re-added while the fetch was in flight
                self.unsettled[tp] = None
                code = pr.error_code
                try:
                    if code == common_pb2.NONE:
                        max_lag = max(max_lag, self._append(tp, st, pr))
                    elif code == common_pb2.OFFSET_OUT_OF_RANGE:
                        self._handle_out_of_range(tp, st, pr)
                    else:
                        backoff_ms = backoff_after_error(code, self.settings.backoff_ms)
                        self.log.info(
                            "fetch %s-%d from leader %d: %s; backing off %d ms",
                            *tp,
                            self.leader_id,
                            common_pb2.ErrorCode.Name(code),
                            backoff_ms,
                        )
                        self._delay(tp, st, now_ms, backoff_ms, FetchPhase.TRUNCATING)
                except InvariantViolation:
                    raise
                except Exception as exc:
                    self._fail_partition(tp, "append of fetched data", exc)
        self.max_lag = max_lag

    def _append(
        self, tp: TopicPartitionKey, st: PartitionFetchState, pr: common_pb2.FetchPartitionResponse
    ) -> int:
        """Append what the leader sent at our LEO; returns the partition's lag behind the leader's HW."""
        if self.logs.local_leo(tp) != st.fetch_offset:
            # The log moved under us (truncated by a newer LeaderAndIsr): start over.
            st.move(FetchPhase.TRUNCATING)
            return 0
        self.logs.append_fetched(tp, pr)
        new_leo = self.logs.local_leo(tp)
        if new_leo is not None and new_leo > st.fetch_offset:
            st.fetch_offset = new_leo
            self.partitions.move_to_end(tp)
        return max(pr.high_watermark - st.fetch_offset, 0)

    def _handle_out_of_range(
        self, tp: TopicPartitionKey, st: PartitionFetchState, pr: common_pb2.FetchPartitionResponse
    ) -> None:
        """Our offset is outside the leader's log: above its LEO -> truncate; below its start -> reset.

        The second is how a lagging follower adopts the leader's log start offset after
        retention deleted what it had not fetched yet.
        """
        if st.fetch_offset > pr.log_end_offset >= 0:
            self.log.info(
                "%s-%d: fetch offset %d above leader LEO %d; truncating",
                *tp,
                st.fetch_offset,
                pr.log_end_offset,
            )
            self.observer.before_truncation(tp, pr.log_end_offset)
            self.logs.truncate(tp, pr.log_end_offset)
            st.fetch_offset = pr.log_end_offset
        else:
            self.log.info(
                "%s-%d: fetch offset %d below leader log start %d; restarting the log there",
                *tp,
                st.fetch_offset,
                pr.log_start_offset,
            )
            self.logs.truncate_fully_and_start_at(tp, pr.log_start_offset)
            st.fetch_offset = pr.log_start_offset
