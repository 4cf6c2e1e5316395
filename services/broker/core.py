"""The broker core: every replica this broker holds, and every rule about them, without I/O.

Kafka's ReplicaManager, sans I/O (as the controller's handlers already are). The
core answers control requests (LeaderAndIsr, UpdateMetadata, StopReplica), data
requests (Produce, Fetch, ListOffsets, OffsetsForLeaderEpoch, DeleteRecords) and runs the leader's
periodic duties (ISR shrink, HW checkpoints, retention). It never touches a socket,
sleeps or reads a clock of its own: time comes from the `Clock` passed in, files go
through the `Storage` seam, and everything that waits or talks to another process
goes out through `BrokerIO`:

- a produce or fetch that must wait goes into the purgatory (purgatory.py) and is
  completed by `notify(tp)` (new data, HW moved, leadership changed) or by the
  expiry the core asks `io.call_later` for;
- a replica fetcher per leader (fetcher_core.py) is started and stopped through
  `io.start_fetcher` / `io.stop_fetcher`;
- an AlterPartition with its retries and the controlled shutdown are tasks
  (steps.py) run by `io.spawn` or by the caller.

Two drivers run this one core: services/broker/replica_manager.py (asyncio and
gRPC, in the broker process) and tests/sim/sim_broker.py (the deterministic
simulation). Calls that may take long (LeaderAndIsr over thousands of partitions,
the periodic pass) are generators that yield between slices, so the asyncio driver
can let the lease keep-alive and requests run in between.

Control requests are answered only by a registered broker that is not closing
(BROKER_NOT_AVAILABLE otherwise, which the controller retries), and are refused
only for an older broker epoch (STALE_BROKER_EPOCH) or controller epoch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from clients.common.control_records import ControlType
from clients.common.errors import (
    BrokerNotAvailable,
    HighwaterError,
    NotLeaderOrFollower,
    OffsetOutOfRange,
    PolicyViolation,
    StaleBrokerEpoch,
    StaleControllerEpoch,
    StorageError,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
    check,
)
from clients.common.fetch_request import READ_COMMITTED, READ_UNCOMMITTED
from clients.common.topics import stored_topic_configs, topic_config_value, topic_configs_from_proto
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import broker_pb2, common_pb2, controller_pb2
from services.broker import metrics
from services.broker.fetcher_core import (
    DEFAULT_FETCHER_SETTINGS,
    BrokerLog,
    Clock,
    FetcherCore,
    FetcherSettings,
    TruncationObserver,
)
from services.broker.log import MAX_TIMESTAMP, Log, LogConfig
from services.broker.log.checkpoints import HighWatermarkCheckpoint, UnknownFileVersion
from services.broker.log.log import CLOSE_STAGING_DIR, close_logs
from services.broker.log.storage import Storage
from services.broker.partition import (
    IsrChange,
    LeaderAndIsrAction,
    LeaderAndIsrState,
    LeaderAppend,
    Partition,
    Role,
    decide_leader_and_isr,
)
from services.broker.purgatory import (
    AwaitedAppend,
    AwaitedLogStart,
    DelayedDeleteRecords,
    DelayedFetch,
    DelayedOperation,
    DelayedProduce,
    Purgatory,
    produce_response,
)
from services.broker.steps import CallController, RpcFailed, Sleep, Task
from services.common import limits
from services.common.metadata_cache import MetadataCache
from services.common.request_checks import produce_request_problem

# LeaderAndIsr handles this many partitions between yields (opening logs is synchronous work).
LEADER_AND_ISR_PARTITIONS_PER_YIELD = 10
# The periodic pass yields after this many log flushes (fsyncs) and after this many partitions.
FLUSHES_PER_YIELD = 10
ISR_PASS_PARTITIONS_PER_YIELD = 100
# Each AlterPartition call's deadline.
ALTER_PARTITION_TIMEOUT_MS = int(limits.CONTROL_RPC_TIMEOUT_S * 1000)
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
# The broker's run marker in its data directory: written "not clean" at start and
# "clean" at the end of a clean stop (see BrokerCore.start). JSON {"version", "clean",
# "boot_id"}; a marker without "version" (written before 2026-11-28) is version 1.
RUN_MARKER_FILE = "broker-run-marker"
RUN_MARKER_VERSION = 1
RUN_MARKER_VERSIONS_READ = (RUN_MARKER_VERSION,)
# Per replica directory: the id of the topic it was created for (Kafka's KIP-516 file and format).
PARTITION_METADATA_FILE = "partition.metadata"


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


class BrokerIO(Protocol):
    """What the core needs its driver to do."""

    def start_fetcher(self, fetcher: FetcherCore) -> None: ...
    def stop_fetcher(self, fetcher: FetcherCore) -> None: ...
    def spawn(self, name: str, task: Task[Any]) -> None: ...
    def call_later(self, delay_ms: int, fn: Callable[[], None]) -> Callable[[], None]:
        """Run fn after delay_ms; returns what cancels it."""
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


def log_config_from(config: common_pb2.TopicConfig) -> LogConfig:
    """The log settings of a topic config as the controller sent it (0 = default)."""
    defaults = LogConfig()
    # The compaction configs through the schema: from their fields, or from unserved_configs when
    # a controller of a release before they were honoured sent them there (it also did not check
    # min.compaction.lag.ms <= max.compaction.lag.ms: such a pair falls back to the defaults).
    served, _ = stored_topic_configs(topic_configs_from_proto(config))
    return LogConfig(
        segment_bytes=config.segment_bytes or defaults.segment_bytes,
        segment_ms=config.segment_ms or defaults.segment_ms,
        retention_bytes=config.retention_bytes or defaults.retention_bytes,
        retention_ms=config.retention_ms or defaults.retention_ms,
        max_message_bytes=config.max_message_bytes or defaults.max_message_bytes,
        message_timestamp_type=config.message_timestamp_type or defaults.message_timestamp_type,
        cleanup_policy=config.cleanup_policy or defaults.cleanup_policy,
        # Optional fields: 0 is a legal limit, so only an absent field means the default.
        message_timestamp_before_max_ms=(
            config.message_timestamp_before_max_ms
            if config.HasField("message_timestamp_before_max_ms")
            else defaults.message_timestamp_before_max_ms
        ),
        message_timestamp_after_max_ms=(
            config.message_timestamp_after_max_ms
            if config.HasField("message_timestamp_after_max_ms")
            else defaults.message_timestamp_after_max_ms
        ),
        min_cleanable_dirty_ratio=float(topic_config_value(served, "min.cleanable.dirty.ratio")),
        min_compaction_lag_ms=int(topic_config_value(served, "min.compaction.lag.ms")),
        max_compaction_lag_ms=int(topic_config_value(served, "max.compaction.lag.ms")),
        delete_retention_ms=int(topic_config_value(served, "delete.retention.ms")),
    )


@dataclass(frozen=True)
class PreviousRun:
    """How this broker's previous run ended, from its run marker."""

    clean: bool
    same_boot: bool

    @property
    def unclean_shutdown(self) -> bool:
        """Whether unflushed writes may be lost: an unclean stop across a reboot (power loss).

        A process that was killed while its host stayed up lost nothing the kernel had
        accepted: the page cache survives it. Reported at registration, so the controller
        does not elect this broker from a last ISR it may no longer match (Kafka's KIP-966).
        """
        return not self.clean and not self.same_boot


class BrokerCore:
    """All replicas on this broker. Every method runs on the broker's one event loop."""

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
        # The current fetcher per leader; `all_fetchers` also holds replaced ones until stopped.
        self.fetchers: dict[int, FetcherCore] = {}
        self.metadata = MetadataCache()
        # Each topic's config as last given to its replicas here: an UpdateMetadata walks the
        # replicas only for topics whose config differs (a full one names 100,000 partitions').
        self.applied_topic_configs: dict[str, common_pb2.TopicConfig] = {}
        self.purgatory = Purgatory()
        self._isr_ticks = 0
        self._boot_id = ""

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self, boot_id: str) -> PreviousRun:
        """Read how the previous run ended, then mark this run as not (yet) cleanly stopped."""
        self._boot_id = boot_id
        path = f"{self.data_dir}/{RUN_MARKER_FILE}"
        previous = PreviousRun(clean=True, same_boot=True)  # no marker: a new data directory
        if self.storage.exists(path):
            try:
                stored = json.loads(self.storage.read_file(path))
                version = stored.get("version", 1)
                if version not in RUN_MARKER_VERSIONS_READ:
                    # A newer release's marker: refuse to start rather than misread its run.
                    raise UnknownFileVersion(path, version, RUN_MARKER_VERSIONS_READ)
                previous = PreviousRun(
                    clean=bool(stored.get("clean")), same_boot=stored.get("boot_id") == boot_id
                )
            except (ValueError, AttributeError):
                # Unreadable: assume the worst, as after a power loss.
                self.log.warning("run marker %s is unreadable; treating the last stop as unclean", path)
                previous = PreviousRun(clean=False, same_boot=False)
        self._write_run_marker(clean=False)
        # Files a crash left in the middle of a batched close (log.close_logs); no log reads them.
        self.storage.delete_dir(f"{self.data_dir}/{CLOSE_STAGING_DIR}")
        if previous.unclean_shutdown:
            self.log.warning(
                "broker %d did not stop cleanly and its host restarted since: unflushed writes "
                "may be lost; registering with unclean_shutdown",
                self.broker_id,
            )
        return previous

    def _write_run_marker(self, *, clean: bool) -> None:
        self.storage.mkdir(self.data_dir)
        self.storage.write_atomic(
            f"{self.data_dir}/{RUN_MARKER_FILE}",
            json.dumps({"clean": clean, "boot_id": self._boot_id, "version": RUN_MARKER_VERSION}).encode(),
        )

    def begin_close(self) -> None:
        """The broker is stopping: refuse control requests, answer every waiting request,
        stop every fetcher. Idempotent."""
        if self.closing:
            return
        self.closing = True
        for p in self.partitions.values():
            p.change_role(Role.CLOSED)
        self.purgatory.complete_all(self.clock.monotonic_ms())
        for fetcher in list(self.fetchers.values()):
            self._stop_fetcher(fetcher)
        self.fetchers.clear()

    def close(self, on_phase: Callable[[str], None] = lambda phase: None) -> None:
        """After begin_close: checkpoint HWs, close every log, mark the run clean.

        The logs close together (`close_logs`: three file-system syncs for all of them, not
        ~11 fsyncs each: 1,000 partitions took ~1.9 s one by one), and the run marker says
        "clean" only after that returned, so only once every byte it vouches for is durable.
        """
        self.begin_close()
        self.checkpoint_high_watermarks()
        failures = close_logs(
            [p.log for p in self.partitions.values()],
            storage=self.storage,
            sync_root=self.data_dir,
            on_phase=on_phase,
        )
        for log, exc in failures:
            self.log.error("closing the log %s failed: %s", log.directory, exc)
        if failures:
            # Its bytes may not be durable: the next start must not take this stop as clean.
            self.log.error("%d log(s) did not close cleanly; the run stays marked unclean", len(failures))
            return
        self._write_run_marker(clean=True)

    def crash(self) -> None:
        """The process dies (simulation): logs are dropped without closing."""
        for p in self.partitions.values():
            p.log.abandon()

    def checkpoint_high_watermarks(self) -> None:
        """Write every replica's HW (one file, one fsync; skipped when nothing moved)."""
        try:
            self.hw_checkpoint.write({tp: p.high_watermark for tp, p in self.partitions.items()})
        except HighwaterError as exc:
            self.log.error("writing the high watermark checkpoint of %s failed: %s", self.data_dir, exc)

    def periodic_duties(self) -> Generator[None, None, None]:
        """One pass of the leader's periodic duties: roll/flush, ISR shrink, HW checkpoint, retention.

        Yields after every FLUSHES_PER_YIELD flushes (each an fsync) and every
        ISR_PASS_PARTITIONS_PER_YIELD partitions.
        """
        self._isr_ticks += 1
        checkpoint_now = self._isr_ticks % limits.HW_CHECKPOINT_EVERY_ISR_TICKS == 0
        flushed = 0
        for i, p in enumerate(list(self.partitions.values())):
            if flushed >= FLUSHES_PER_YIELD or (i and i % ISR_PASS_PARTITIONS_PER_YIELD == 0):
                flushed = 0
                yield
                if self.closing:
                    return
                if self.partitions.get((p.topic, p.partition)) is not p:
                    continue  # stopped or deleted while we yielded
            wall = self.clock.wall_ms()
            try:
                p.log.maybe_roll(wall)
                flushed += int(p.log.maybe_flush(wall))
            except HighwaterError as exc:
                self.log.error("roll/flush of %s-%d failed: %s", p.topic, p.partition, exc)
            change = p.check_isr_shrink(self.clock.monotonic_ms(), self.replica_lag_time_max_ms)
            if change is not None:
                self.log.info(
                    "shrinking ISR of %s-%d from %s to %s",
                    p.topic,
                    p.partition,
                    list(p.isr),
                    list(change.new_isr),
                )
                metrics.ISR_SHRINKS.inc()
                self.io.spawn("alter-partition", self._alter_partition(p, change))
            if checkpoint_now and p.role in (Role.LEADER, Role.FOLLOWER):
                try:
                    p.log.delete_old_segments(wall, p.high_watermark)
                except HighwaterError as exc:
                    self.log.error("retention of %s-%d failed: %s", p.topic, p.partition, exc)
        if checkpoint_now:
            self.checkpoint_high_watermarks()

    def update_gauges(self) -> None:
        metrics.PARTITION_COUNT.set(len(self.partitions))
        metrics.LEADER_COUNT.set(sum(1 for p in self.partitions.values() if p.role is Role.LEADER))
        metrics.UNDER_REPLICATED.set(sum(1 for p in self.partitions.values() if p.under_replicated))
        metrics.FETCHER_MAX_LAG.set(max((f.max_lag for f in self.fetchers.values()), default=0))
        leaders = [p for p in self.partitions.values() if p.role is Role.LEADER]
        metrics.OPEN_TRANSACTIONS.set(sum(p.producers.open_transactions for p in leaders))
        metrics.LAST_STABLE_OFFSET_MAX_LAG.set(
            max((p.high_watermark - p.last_stable_offset for p in leaders), default=0)
        )

    # ---- the purgatory's wake-up --------------------------------------------------------------

    def notify(self, tp: TopicPartitionKey) -> None:
        """New data, HW moved or leadership changed on tp: complete what waits on it and can."""
        self.purgatory.check_and_complete(tp, self.clock.monotonic_ms())

    def _watch(self, op: DelayedOperation, delay_ms: int) -> None:
        if self.purgatory.try_complete_else_watch(op, self.clock.monotonic_ms()):
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

    # ---- control plane ----------------------------------------------------------------------

    def check_control_request(self, header: common_pb2.ControllerHeader) -> HighwaterError | None:
        """Fence a control request (Kafka: stale controller epoch; broker epoch older than ours).

        A newer broker epoch is accepted: it names this incarnation, registered a moment
        before the driver learned its epoch. Before registration, and while closing, the
        answer is BROKER_NOT_AVAILABLE, which the controller retries.
        """
        if self.closing:
            return BrokerNotAvailable(f"broker {self.broker_id} is shutting down")
        if self.broker_epoch < 0:
            return BrokerNotAvailable(f"broker {self.broker_id} has not registered yet; retry")
        if header.controller_epoch < self.controller_epoch:
            return StaleControllerEpoch(
                f"controller epoch {header.controller_epoch} is older than "
                f"{self.controller_epoch} already seen"
            )
        if 0 <= header.broker_epoch < self.broker_epoch:
            return StaleBrokerEpoch(
                f"request for broker epoch {header.broker_epoch}, older than this incarnation's "
                f"{self.broker_epoch}"
            )
        self.controller_epoch = header.controller_epoch
        return None

    def leader_and_isr(
        self, req: broker_pb2.LeaderAndIsrRequest
    ) -> Generator[None, None, broker_pb2.LeaderAndIsrResponse]:
        """becomeLeaderOrFollower: fence, then split into make-leader and make-follower."""
        err = self.check_control_request(req.header)
        if err is not None:
            return broker_pb2.LeaderAndIsrResponse(error_code=err.code, error_message=err.message)
        for node in req.live_leaders:
            # The controller's view is newer than our cache: a restarted leader has a new address.
            self.metadata.brokers[node.broker_id] = node
        results = []
        for i, item in enumerate(req.partitions):
            s = item.state
            if i and i % LEADER_AND_ISR_PARTITIONS_PER_YIELD == 0:
                yield
            if self.closing:
                results.append(
                    common_pb2.PartitionResult(
                        topic=s.topic,
                        partition=s.partition,
                        error_code=common_pb2.BROKER_NOT_AVAILABLE,
                        error_message=f"broker {self.broker_id} is shutting down",
                    )
                )
                continue
            code, message = self._leader_and_isr_partition(item)
            results.append(
                common_pb2.PartitionResult(
                    topic=s.topic, partition=s.partition, error_code=code, error_message=message
                )
            )
        # One line for every partition refused as not newer: a new controller repeats its whole
        # failover state to every broker (100,000 partitions at a takeover), and a line each cost
        # the brokers more CPU than applying the request.
        fenced = [r for r in results if r.error_code == common_pb2.FENCED_LEADER_EPOCH]
        if fenced:
            self.log.info(
                "LeaderAndIsr from controller epoch %d: %d of %d partitions at a leader epoch not newer "
                "than this broker's (a new controller repeating what it has, or a late request); "
                "refused, for example %s-%d: %s",
                req.header.controller_epoch,
                len(fenced),
                len(results),
                fenced[0].topic,
                fenced[0].partition,
                fenced[0].error_message,
            )
        return broker_pb2.LeaderAndIsrResponse(partitions=results)

    def _leader_and_isr_partition(
        self, item: broker_pb2.LeaderAndIsrPartition
    ) -> tuple[common_pb2.ErrorCode, str]:
        s = item.state
        tp = (s.topic, s.partition)
        existing = self.partitions.get(tp)
        if (
            existing is not None
            and s.leader_epoch == existing.leader_epoch
            and s.partition_epoch <= existing.partition_epoch
            and (not s.topic_id or self.topic_ids.get(tp) == s.topic_id)
            and self.broker_id in s.replicas
        ):
            # What this replica already applied (a new controller repeats its whole state): refused
            # as decide_leader_and_isr would, without building the state or raising for it.
            return common_pb2.FENCED_LEADER_EPOCH, (
                f"leader epoch {s.leader_epoch} is not newer than {existing.leader_epoch}"
            )
        state = LeaderAndIsrState(
            s.leader, s.leader_epoch, tuple(s.isr), tuple(s.replicas), s.partition_epoch, s.controller_epoch
        )
        try:
            self._drop_replica_of_an_older_topic(tp, s.topic_id)
            action = decide_leader_and_isr(self.broker_id, self.partitions.get(tp), state)
            if action is LeaderAndIsrAction.NOT_A_REPLICA:
                self.log.warning(
                    "LeaderAndIsr for %s-%d does not list broker %d among replicas %s; skipped",
                    *tp,
                    self.broker_id,
                    list(s.replicas),
                )
                return common_pb2.UNKNOWN_TOPIC_OR_PARTITION, "this broker is not a replica"
            if action is not LeaderAndIsrAction.ISR_UPDATED:
                p = self.partitions.get(tp) or self._create_partition(s, item.config)
                # The log of a replica that exists keeps its config here: a changed topic config
                # comes in UpdateMetadata (_take_topic_configs), and building a LogConfig for each
                # of a failover's partitions would cost 30 µs apiece.
                p.min_insync_replicas = max(1, item.config.min_insync_replicas or 1)
                if action is LeaderAndIsrAction.BECOME_LEADER:
                    self._make_leader(p, state)
                else:
                    self._make_follower(p, state)
                self.notify(tp)
            else:
                p = self.partitions[tp]
                if p.maybe_advance_high_watermark():  # a shrink can let the HW move on
                    self.notify(tp)
        except HighwaterError as exc:
            if exc.code == common_pb2.FENCED_LEADER_EPOCH:
                return exc.code, exc.message  # counted in one line per request (leader_and_isr)
            # Logged: a replica the controller thinks is fine but this broker refused (a topic config
            # its log cannot take, a storage error) must not fail every produce in silence.
            self.log.warning(
                "LeaderAndIsr for %s-%d at leader epoch %d refused: %s: %s",
                *tp,
                s.leader_epoch,
                exc.code_name(),
                exc.message,
            )
            return exc.code, exc.message
        return common_pb2.NONE, ""

    def _partition_dir(self, tp: TopicPartitionKey) -> str:
        return f"{self.data_dir}/{tp[0]}-{tp[1]}"

    def _stored_topic_id(self, tp: TopicPartitionKey) -> str:
        """The topic id in the replica's partition.metadata (Kafka's KIP-516 file); "" if none."""
        path = f"{self._partition_dir(tp)}/{PARTITION_METADATA_FILE}"
        if not self.storage.exists(path):
            return ""
        for line in self.storage.read_file(path).decode(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "topic_id":
                return value.strip()
        return ""

    def _drop_replica_of_an_older_topic(self, tp: TopicPartitionKey, topic_id: str) -> None:
        """A replica left on disk by a deleted topic of the same name goes before the new one starts.

        It stays behind when its broker was down while the topic was deleted, or while a
        reassignment moved the replica away; reusing its log would graft the old topic's
        records and leader epochs onto the new one (KIP-516 names topics by id for this).
        """
        if not topic_id:
            return
        stored = self.topic_ids.get(tp) if tp in self.partitions else self._stored_topic_id(tp)
        if not stored or stored == topic_id:
            return
        self.log.warning(
            "replica %s-%d on disk belongs to topic id %s, not %s (a deleted topic of the same "
            "name); deleting it",
            *tp,
            stored,
            topic_id,
        )
        self._remove_from_fetchers(tp)
        p = self.partitions.pop(tp, None)
        self.hw_checkpoint.forget(tp)
        self.topic_ids.pop(tp, None)
        if p is not None:
            p.change_role(Role.CLOSED)
            self.notify(tp)
            p.log.close()
            p.log.delete()
        else:
            self.storage.delete_dir(self._partition_dir(tp))

    def _create_partition(self, s: common_pb2.PartitionState, config: common_pb2.TopicConfig) -> Partition:
        tp = (s.topic, s.partition)
        directory = self._partition_dir(tp)
        plog = Log.open(
            directory,
            self.tune_log_config(log_config_from(config)),
            storage=self.storage,
            now_ms=self.clock.wall_ms(),
        )
        p = Partition(topic=s.topic, partition=s.partition, local_broker_id=self.broker_id, log=plog)
        # Never below the log start: a DeleteRecords up to the HW is checkpointed at once, the HW
        # only periodically, and a HW below the log start would answer ListOffsets' latest below
        # its earliest (Kafka's updateHighWatermark bounds it the same way).
        p.high_watermark = max(
            min(self.hw_checkpoint.stored_at_start((s.topic, s.partition)), plog.log_end_offset),
            plog.log_start_offset,
        )
        p.rebuild_producer_state()
        self.partitions[tp] = p
        if s.topic_id:
            if self._stored_topic_id(tp) != s.topic_id:
                self.storage.write_atomic(
                    f"{directory}/{PARTITION_METADATA_FILE}", f"version: 0\ntopic_id: {s.topic_id}\n".encode()
                )
            self.topic_ids[tp] = s.topic_id
        return p

    def _make_leader(self, p: Partition, state: LeaderAndIsrState) -> None:
        self._remove_from_fetchers((p.topic, p.partition))
        p.become_leader(state, self.clock.monotonic_ms())
        p.maybe_advance_high_watermark()
        self.log.info(
            "became leader of %s-%d at epoch %d, LEO %d, HW %d, ISR %s",
            p.topic,
            p.partition,
            p.leader_epoch,
            p.log.log_end_offset,
            p.high_watermark,
            list(p.isr),
        )
        self.observer.on_become_leader(p)

    def _make_follower(self, p: Partition, state: LeaderAndIsrState) -> None:
        tp = (p.topic, p.partition)
        self._remove_from_fetchers(tp)
        p.become_follower(state)
        if state.leader < 0:
            self.log.info("%s-%d has no leader at epoch %d; not fetching", *tp, state.leader_epoch)
            return
        leader = self.metadata.brokers.get(state.leader)
        if leader is None:
            self.log.warning(
                "leader %d of %s-%d is not a live broker we know; waiting for metadata", state.leader, *tp
            )
            return
        fetcher = self._fetcher_for(state.leader, f"{leader.host}:{leader.port}")
        fetcher.add_partition(tp, state.leader_epoch, p.log.log_end_offset)
        self.log.info(
            "following %d for %s-%d at epoch %d from LEO %d, HW %d",
            state.leader,
            *tp,
            state.leader_epoch,
            p.log.log_end_offset,
            p.high_watermark,
        )

    def _fetcher_for(self, leader_id: int, address: str) -> FetcherCore:
        """The fetcher for a leader at its current address.

        A leader that restarted listens on a new address: its old fetcher is stopped and
        its partitions move to a new one, starting over in TRUNCATING (they may have
        missed an epoch change).
        """
        fetcher = self.fetchers.get(leader_id)
        if fetcher is not None and fetcher.leader_address == address:
            return fetcher
        moved = dict(fetcher.partitions) if fetcher is not None else {}
        if fetcher is not None:
            self._stop_fetcher(fetcher)
        fetcher = FetcherCore(
            local_broker_id=self.broker_id,
            broker_epoch=lambda: self.broker_epoch,
            leader_id=leader_id,
            leader_address=address,
            logs=self,
            clock=self.clock,
            log=self.log,
            settings=self.fetcher_settings,
            observer=self.observer,
        )
        self.fetchers[leader_id] = fetcher
        self.io.start_fetcher(fetcher)
        for tp, st in moved.items():
            leo = self.local_leo(tp)
            if leo is not None:
                fetcher.add_partition(tp, st.current_leader_epoch, leo)
        return fetcher

    def _stop_fetcher(self, fetcher: FetcherCore) -> None:
        fetcher.stopped = True
        fetcher.wake()
        self.io.stop_fetcher(fetcher)

    def _remove_from_fetchers(self, tp: TopicPartitionKey) -> None:
        for fetcher in self.fetchers.values():
            fetcher.remove_partition(tp)

    def stop_replica(self, req: broker_pb2.StopReplicaRequest) -> broker_pb2.StopReplicaResponse:
        err = self.check_control_request(req.header)
        if err is not None:
            return broker_pb2.StopReplicaResponse(error_code=err.code, error_message=err.message)
        results = []
        for item in req.partitions:
            tp = (item.topic, item.partition)
            self._remove_from_fetchers(tp)
            p = self.partitions.get(tp)
            if p is not None:
                p.change_role(Role.CLOSED if item.delete_partition else Role.NONE)
                self.notify(tp)
                if item.delete_partition:
                    self.partitions.pop(tp, None)
                    self.topic_ids.pop(tp, None)
                    self.hw_checkpoint.forget(tp)
                    p.log.close()
                    p.log.delete()
                    self.log.info("deleted replica %s-%d", *tp)
            elif item.delete_partition:
                self.hw_checkpoint.forget(tp)
                self.storage.delete_dir(f"{self.data_dir}/{item.topic}-{item.partition}")
            results.append(common_pb2.PartitionResult(topic=item.topic, partition=item.partition))
        return broker_pb2.StopReplicaResponse(partitions=results)

    def update_metadata(self, req: broker_pb2.UpdateMetadataRequest) -> broker_pb2.UpdateMetadataResponse:
        err = self.check_control_request(req.header)
        if err is not None:
            return broker_pb2.UpdateMetadataResponse(error_code=err.code, error_message=err.message)
        self.metadata.apply(req)
        for name in req.deleted_topics:
            self.applied_topic_configs.pop(name, None)
            metrics.forget_topic(name)
        if req.topic_configs:
            self._take_topic_configs(req.topic_configs)
        for leader_id, fetcher in list(self.fetchers.items()):
            node = self.metadata.brokers.get(leader_id)
            if node is not None and fetcher.leader_address != f"{node.host}:{node.port}":
                self._fetcher_for(leader_id, f"{node.host}:{node.port}")
        # ISR changes the controller made (shrinks after failures) reach leaders here too. Only
        # the request's states are read (a full update's 100,000 are not indexed for this: the
        # cache indexes them when first asked), and none at all when this broker leads nothing.
        hosted = self.partitions
        if any(p.role is Role.LEADER for p in hosted.values()):
            for state in req.partitions:
                p = hosted.get((state.topic, state.partition))
                if p is not None and p.role is Role.LEADER:
                    p.update_isr(tuple(state.isr), state.partition_epoch, state.leader_epoch)
                    if p.maybe_advance_high_watermark():  # a shrink can let the HW move on
                        self.notify((state.topic, state.partition))
        return broker_pb2.UpdateMetadataResponse()

    def _take_topic_configs(self, configs: Mapping[str, common_pb2.TopicConfig]) -> None:
        """Give this broker's replicas their topics' configs as the controller sent them: a config
        changed by AlterConfigs / AlterTopicConfigs reaches every broker in UpdateMetadata."""
        applied = self.applied_topic_configs
        changed = {name: config for name, config in configs.items() if applied.get(name) != config}
        if not changed:
            return
        built: dict[str, LogConfig] = {}  # one LogConfig per topic, not per replica
        for tp, p in self.partitions.items():
            config = changed.get(tp[0])
            if config is not None:
                log_config = built.get(tp[0])
                if log_config is None:
                    log_config = built[tp[0]] = self.tune_log_config(log_config_from(config))
                self._take_topic_config(p, config, log_config)
        applied.update(changed)

    def _take_topic_config(self, p: Partition, config: common_pb2.TopicConfig, new: LogConfig) -> None:
        """The log's settings (retention, segment size, max.message.bytes, timestamps) and the
        partition's min.insync.replicas from a topic config (`new`: its LogConfig), in force from
        the next append (a leader checks min.insync.replicas on each acks=all produce)."""
        if new != p.log.config:
            self.log.info("%s-%d takes its topic's changed config: %s", p.topic, p.partition, new)
            p.log.set_config(new)
        p.min_insync_replicas = max(1, config.min_insync_replicas or limits.DEFAULT_MIN_INSYNC_REPLICAS)

    # ---- AlterPartition (a task) ------------------------------------------------------------

    def _alter_partition(self, p: Partition, change: IsrChange) -> Task[None]:
        """Ask the controller to commit an ISR and apply its answer, asking again until answered.

        With no answer for the partition (the RPC failed, or NOT_CONTROLLER from a
        controller that is not, or no longer, active), an earlier copy may have been
        committed and its answer lost: the proposal stays pending (the HW keeps counting
        the member being added) and is asked again until answered or leadership moves
        on. Clearing it let a leader count an ISR smaller than the committed one (sim
        seeds KI-4, 340).
        """
        backoff_ms = limits.ALTER_PARTITION_RETRY_BACKOFF_MS_MIN
        while True:
            # Built for each attempt: a broker that re-registered meanwhile asks with its new
            # broker epoch (asking with the old one is refused forever, sim seed 26).
            req = controller_pb2.AlterPartitionRequest(
                broker_id=self.broker_id,
                broker_epoch=self.broker_epoch,
                partitions=[
                    controller_pb2.AlterPartitionItem(
                        topic=p.topic,
                        partition=p.partition,
                        leader_epoch=change.leader_epoch,
                        partition_epoch=change.partition_epoch,
                        new_isr=list(change.new_isr),
                    )
                ],
            )
            resp = yield CallController("AlterPartition", req, ALTER_PARTITION_TIMEOUT_MS)
            if not isinstance(resp, RpcFailed) and resp.error_code == common_pb2.NONE and resp.partitions:
                break
            if not self._still_proposing(p, change):
                return
            outcome = (
                resp.reason
                if isinstance(resp, RpcFailed)
                else f"refused: {common_pb2.ErrorCode.Name(resp.error_code)} {resp.error_message}"
            )
            self.log.warning(
                "AlterPartition for %s-%d %s; retrying in %d ms", p.topic, p.partition, outcome, backoff_ms
            )
            yield Sleep(backoff_ms)
            if not self._still_proposing(p, change):
                return
            backoff_ms = min(backoff_ms * 2, limits.ALTER_PARTITION_RETRY_BACKOFF_MS_MAX)
        result = resp.partitions[0]
        if result.HasField("state"):
            st = result.state
            p.update_isr(tuple(st.isr), st.partition_epoch, st.leader_epoch)
        if result.error_code != common_pb2.NONE:
            self.log.info(
                "AlterPartition for %s-%d: %s (%s); state re-read",
                p.topic,
                p.partition,
                common_pb2.ErrorCode.Name(result.error_code),
                result.error_message,
            )
        p.isr_change_failed()  # clears pending either way; the next check proposes again if needed
        p.maybe_advance_high_watermark()
        self.notify((p.topic, p.partition))

    def _still_proposing(self, p: Partition, change: IsrChange) -> bool:
        return (
            not self.closing
            and self.partitions.get((p.topic, p.partition)) is p
            and p.pending_isr == change.new_isr
            and p.role is Role.LEADER
            and p.leader_epoch == change.leader_epoch
        )

    # ---- controlled shutdown (a task) ----------------------------------------------------------

    def controlled_shutdown(self) -> Task[bool]:
        """Ask the controller to move our leaderships away before we stop. Returns whether it did."""
        req = controller_pb2.ControlledShutdownRequest(
            broker_id=self.broker_id, broker_epoch=self.broker_epoch
        )
        for attempt in range(1, limits.CONTROLLED_SHUTDOWN_ATTEMPTS_MAX + 1):
            resp = yield CallController("ControlledShutdown", req, limits.CONTROLLED_SHUTDOWN_TIMEOUT_MS)
            if isinstance(resp, RpcFailed):
                self.log.warning("controlled shutdown attempt %d failed: %s", attempt, resp.reason)
            elif resp.error_code == common_pb2.NONE and not resp.remaining_partitions:
                self.log.info("controlled shutdown done: no partitions led here any more")
                return True
            else:
                self.log.info(
                    "controlled shutdown attempt %d: %s, %d partitions still led here",
                    attempt,
                    common_pb2.ErrorCode.Name(resp.error_code),
                    len(resp.remaining_partitions),
                )
            if attempt < limits.CONTROLLED_SHUTDOWN_ATTEMPTS_MAX:
                yield Sleep(limits.CONTROLLED_SHUTDOWN_BACKOFF_MS * attempt)
        self.log.warning(
            "controlled shutdown incomplete; stopping anyway (the controller fails over on lease expiry)"
        )
        return False

    # ---- produce ------------------------------------------------------------------------------

    def produce(
        self, req: common_pb2.ProduceRequest, on_complete: Callable[[common_pb2.ProduceResponse], None]
    ) -> None:
        """Append as leader; answer at once (acks 0/1, errors) or when the ISR has it (acks=all)."""
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
                    info = p.append_as_leader(records, acks=req.acks, now_ms=wall)
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

    # ---- fetch ----------------------------------------------------------------------------------

    def fetch(
        self, req: common_pb2.FetchRequest, on_complete: Callable[[common_pb2.FetchResponse], None]
    ) -> None:
        """Read now, or wait in the purgatory for min_bytes, an error or max_wait_ms."""
        problem = self._replica_id_problem(req)
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
                tp = (t.topic, fp.partition)
                p = self.partitions.get(tp)
                if p is None or p.role is not Role.LEADER:
                    continue
                if fp.current_leader_epoch >= 0 and fp.current_leader_epoch != p.leader_epoch:
                    continue
                hw_before = p.high_watermark
                change = p.record_follower_fetch(req.replica_id, fp.fetch_offset, mono)
                follower = p.followers.get(req.replica_id)
                log_start_moved = follower is not None and follower.log_start_offset != fp.log_start_offset
                if follower is not None and log_start_moved:
                    # A follower took a new log start: a DeleteRecords may wait on it.
                    follower.log_start_offset = fp.log_start_offset
                if change is not None:
                    self.log.info(
                        "expanding ISR of %s-%d from %s to %s", *tp, list(p.isr), list(change.new_isr)
                    )
                    metrics.ISR_EXPANDS.inc()
                    self.io.spawn("alter-partition", self._alter_partition(p, change))
                if p.high_watermark != hw_before or log_start_moved:
                    self.notify(tp)

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
        """A consumer's short-circuit local read (clients/local_reads.py): fill pr.records_location.

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

    # ---- the fetcher's view of follower replicas (FollowerLogs) -------------------------------

    def local_leo(self, tp: TopicPartitionKey) -> int | None:
        p = self.partitions.get(tp)
        return p.log.log_end_offset if p is not None else None

    def local_log_start(self, tp: TopicPartitionKey) -> int:
        p = self.partitions.get(tp)
        return p.log.log_start_offset if p is not None else 0

    def local_high_watermark(self, tp: TopicPartitionKey) -> int | None:
        p = self.partitions.get(tp)
        return p.high_watermark if p is not None else None

    def latest_local_epoch(self, tp: TopicPartitionKey) -> int | None:
        p = self.partitions.get(tp)
        return p.log.leader_epoch_cache.latest_epoch() if p is not None else None

    def local_end_offset_for_epoch(self, tp: TopicPartitionKey, epoch: int) -> int:
        p = self.partitions.get(tp)
        if p is None:
            return 0
        _, end = p.log.leader_epoch_cache.end_offset_for_epoch(epoch)
        return end if end >= 0 else p.log.log_end_offset

    def truncate(self, tp: TopicPartitionKey, offset: int) -> None:
        p = self.partitions.get(tp)
        if p is not None:
            p.truncate_to(offset)

    def truncate_fully_and_start_at(self, tp: TopicPartitionKey, offset: int) -> None:
        p = self.partitions.get(tp)
        if p is not None:
            p.log.truncate_fully_and_start_at(offset)
            p.high_watermark = offset
            p.rebuild_producer_state()

    def append_fetched(self, tp: TopicPartitionKey, response: common_pb2.FetchPartitionResponse) -> None:
        """Append what the leader sent; take its HW and, as Kafka's follower does, its log start offset."""
        p = self.partitions.get(tp)
        if p is None or p.role is not Role.FOLLOWER:
            return
        if response.records:
            p.append_as_follower(response.records, now_ms=self.clock.wall_ms())
            self.observer.on_follower_append(p)
        moved = p.update_follower_high_watermark(response.high_watermark)
        # Retention on the leader moved its log start: follow it up to our HW (never past
        # what is committed here, never back).
        leader_start = min(response.log_start_offset, p.high_watermark)
        if leader_start > p.log.log_start_offset:
            p.log.advance_log_start_offset(leader_start)
        if moved:
            self.notify(tp)

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
