"""The broker core's shared state: what every part of BrokerCore reads and changes.

BrokerCore (core.py) is split by responsibility, as Kafka's ReplicaManager is from Partition
and the delayed operations; core.py's docstring names the parts. Each part is a class over
`CoreState`, which holds every field and the lookups the parts share, and BrokerCore joins
them: there is still one object, owned by the broker's one event loop, and no part keeps
state of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from clients.common.errors import (
    HighwaterError,
    NotLeaderOrFollower,
    StorageError,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
    check,
)
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.broker.fetcher_core import (
    DEFAULT_FETCHER_SETTINGS,
    BrokerLog,
    Clock,
    FetcherCore,
    FetcherSettings,
    TruncationObserver,
)
from services.broker.log import LogConfig
from services.broker.log.checkpoints import HighWatermarkCheckpoint
from services.broker.log.storage import Storage
from services.broker.partition import LeaderAppend, Partition, Role
from services.broker.purgatory import AwaitedAppend, DelayedOperation, Purgatory
from services.broker.replica_sessions import ReplicaFetchSessions, SessionFetch
from services.broker.steps import Task
from services.common import limits
from services.common.metadata_cache import MetadataCache


class BrokerIO(Protocol):
    """What the core needs its driver to do."""

    def start_fetcher(self, fetcher: FetcherCore) -> None: ...
    def stop_fetcher(self, fetcher: FetcherCore) -> None: ...
    def spawn(self, name: str, task: Task[Any]) -> None: ...
    def call_later(self, delay_ms: int, fn: Callable[[], None]) -> Callable[[], None]:
        """Run fn after delay_ms; returns what cancels it."""
        ...

    def run_blocking(
        self, name: str, fn: Callable[[], None], then: Callable[[BaseException | None], None]
    ) -> None:
        """Run fn (file I/O that touches nothing the core owns) where it does not hold up the
        core's requests, then `then(its exception or None)` back on the core's loop. The
        simulation and unit tests run both at once."""
        ...


class ReplicaObserver(TruncationObserver, Protocol):
    """Told of the moments the simulation's checker judges; the broker passes none."""

    def on_become_leader(self, p: Partition) -> None: ...
    def on_leader_append(self, p: Partition, append: LeaderAppend, acks: int) -> object: ...
    def on_acknowledged(self, p: Partition, append: AwaitedAppend) -> None: ...
    def on_follower_append(self, p: Partition) -> None: ...


class _NoObserver:
    def on_become_leader(self, p: Partition) -> None:
        pass

    def on_leader_append(self, p: Partition, append: LeaderAppend, acks: int) -> object:
        return None

    def on_acknowledged(self, p: Partition, append: AwaitedAppend) -> None:
        pass

    def on_follower_append(self, p: Partition) -> None:
        pass

    def before_truncation(self, tp: TopicPartitionKey, offset: int) -> None:
        pass

    def after_truncation(self, tp: TopicPartitionKey, leader_id: int, leader_epoch: int) -> None:
        pass


class CoreState:
    """Every replica this broker holds, and the seams it was given. Every method runs on the
    broker's one event loop."""

    def __init__(
        self,
        *,
        broker_id: int,
        data_dir: str,
        storage: Storage,
        clock: Clock,
        io: BrokerIO,
        log: BrokerLog,
        replica_lag_time_max_ms: int = limits.REPLICA_LAG_TIME_MAX_MS,
        fetch_max_bytes: int = limits.FETCH_RESPONSE_MAX_BYTES_DEFAULT,
        replica_fetch_response_max_bytes: int = limits.REPLICA_FETCH_RESPONSE_MAX_BYTES,
        fetcher_settings: FetcherSettings = DEFAULT_FETCHER_SETTINGS,
        tune_log_config: Callable[[LogConfig], LogConfig] = lambda config: config,
        observer: ReplicaObserver | None = None,
    ) -> None:
        check(
            fetch_max_bytes > 0 and replica_fetch_response_max_bytes > 0,
            "fetch answer bounds must be positive: fetch_max_bytes=%s replica_fetch_response_max_bytes=%s",
            fetch_max_bytes,
            replica_fetch_response_max_bytes,
        )
        self.broker_id = broker_id
        self.data_dir = data_dir.rstrip("/")
        self.storage = storage
        self.clock = clock
        self.io = io
        self.log = log
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        # The most one Fetch answer carries (Kafka's fetch.max.bytes and
        # replica.fetch.response.max.bytes), whatever the request asked: read_all.
        self.fetch_max_bytes = fetch_max_bytes
        self.replica_fetch_response_max_bytes = replica_fetch_response_max_bytes
        self.fetcher_settings = fetcher_settings
        self.tune_log_config = tune_log_config
        self.observer: ReplicaObserver = observer or _NoObserver()
        self.broker_epoch = -1
        self.controller_epoch = -1
        self.closing = False
        self.partitions: dict[TopicPartitionKey, Partition] = {}
        # The topic id each open replica was created for (also in its partition.metadata file).
        self.topic_ids: dict[TopicPartitionKey, str] = {}
        # Every replica's HW in one file of the data directory (Kafka's replication-offset-checkpoint).
        self.hw_checkpoint = HighWatermarkCheckpoint(storage, self.data_dir, warn=log.error)
        # The current fetcher per leader (one replaced for a new leader address is stopped: _fetcher_for).
        self.fetchers: dict[int, FetcherCore] = {}
        self.metadata = MetadataCache()
        # Each topic's config as last given to its replicas here: an UpdateMetadata walks the
        # replicas only for topics whose config differs (a full one names 100,000 partitions').
        self.applied_topic_configs: dict[str, common_pb2.TopicConfig] = {}
        self.purgatory = Purgatory()
        # Followers' fetch sessions with the partitions led here (replica_sessions.py).
        self.replica_sessions = ReplicaFetchSessions()
        self._isr_ticks = 0
        # A periodic HW checkpoint being written off the loop (core._checkpoint_high_watermarks_aside).
        self._hw_checkpoint_writing = False
        self._boot_id = ""

    # ---- the purgatory's wake-up --------------------------------------------------------------

    def notify(self, tp: TopicPartitionKey) -> None:
        """New data, HW moved or leadership changed on tp: complete what waits on it and can."""
        now_ms = self.clock.monotonic_ms()
        self.purgatory.check_and_complete(tp, now_ms)
        for op in self.replica_sessions.partition_changed(tp):
            op.try_complete(now_ms, tp)

    def _watch(self, op: DelayedOperation | SessionFetch, delay_ms: int) -> None:
        if isinstance(op, SessionFetch):
            # Not under partitions: the session wakes it (notify).
            if op.try_complete(self.clock.monotonic_ms()):
                return
            op.session.waiting = op
        elif self.purgatory.try_complete_else_watch(op, self.clock.monotonic_ms()):
            return

        def expire() -> None:
            if not op.completed:
                op.deadline_ms = min(op.deadline_ms, self.clock.monotonic_ms())
                op.try_complete(op.deadline_ms)
            for tp in op.keys:
                self.purgatory.purge_completed(tp)

        # Kafka's forceComplete cancels the operation's timer task: a timer left set keeps the
        # completed operation, its request and its response alive until the deadline (at 350
        # produces/s with a 30 s timeout, 10,000 of them, and every full collection walked them).
        op.cancel_expiry = self.io.call_later(delay_ms, expire)

    # ---- lookups every part uses ----------------------------------------------------------------

    def _partition_dir(self, tp: TopicPartitionKey) -> str:
        return f"{self.data_dir}/{tp[0]}-{tp[1]}"

    def _client_error(self, tp: TopicPartitionKey, exc: HighwaterError) -> tuple[common_pb2.ErrorCode, str]:
        """The error code and sentence a client gets: a storage failure is logged here with its
        file and cause, and the client is told only that it happened (no paths leave the broker)."""
        code = exc.code  # every HighwaterError.code is an ErrorCode value
        if isinstance(exc, StorageError):
            self.log.error("%s-%d: %s", *tp, exc.message)
            return code, (
                f"broker {self.broker_id} could not read or write its replica of {tp[0]}-{tp[1]} "
                "(a storage error; the broker's log names the file and the cause)"
            )
        return code, exc.message

    def _leader_partition(self, tp: TopicPartitionKey) -> Partition:
        p = self.partitions.get(tp)
        if p is None:
            if tp[0] not in self.metadata.topics():
                raise UnknownTopicOrPartition(f"topic-partition {tp[0]}-{tp[1]} does not exist")
            state = self.metadata.partitions.get(tp)
            if state is None:
                raise UnknownTopicOrPartition(f"topic {tp[0]} has no partition {tp[1]}")
            raise NotLeaderOrFollower(
                f"broker {self.broker_id} holds no replica of {tp[0]}-{tp[1]} (leader is {state.leader})"
            )
        if p.role is not Role.LEADER:
            raise NotLeaderOrFollower(
                f"broker {self.broker_id} is not the leader of {tp[0]}-{tp[1]} (leader is {p.leader_id})"
            )
        return p

    def topic_id_differs(self, tp: TopicPartitionKey, topic_id: str) -> bool:
        """A follower's Fetch names tp under another topic id than the partition held here: the
        topic was deleted and created again under its name (both ids known; "" is not checked)."""
        if not topic_id:
            return False
        ours = self.topic_ids.get(tp)
        return bool(ours) and ours != topic_id

    def _fetchable_partition(self, tp: TopicPartitionKey, current_leader_epoch: int) -> Partition:
        local = self.partitions.get(tp)
        if local is not None and current_leader_epoch > local.leader_epoch:
            # As Kafka (checkCurrentLeaderEpoch before the leader check): a follower that heard
            # of the new epoch first learns that we have not yet, and retries soon, instead of
            # being told we do not lead and backing off as from a wrong leader.
            raise UnknownLeaderEpoch(
                f"leader epoch {current_leader_epoch} is newer than {local.leader_epoch}"
            )
        p = self._leader_partition(tp)
        p.check_current_leader_epoch(current_leader_epoch)
        return p
