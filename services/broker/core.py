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

`BrokerCore` joins the core's parts, each a class over the one shared state
(core_state.py): control requests and role changes (core_control.py), a follower's
replicas as its fetchers see them (core_follower.py), Produce / WriteTxnMarkers /
DeleteRecords (core_appends.py), Fetch / ListOffsets / OffsetsForLeaderEpoch
(core_reads.py), the tasks that call the controller (core_tasks.py). This file keeps
the lifecycle (start, close, crash) and the periodic duties.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from dataclasses import dataclass

from clients.common.errors import HighwaterError
from services.broker import metrics
from services.broker.core_appends import Appends
from services.broker.core_control import PARTITION_METADATA_FILE, ControlRequests, log_config_from
from services.broker.core_reads import Reads
from services.broker.core_state import BrokerIO, ReplicaObserver
from services.broker.log.checkpoints import UnknownFileVersion
from services.broker.log.log import CLOSE_STAGING_DIR, close_logs
from services.broker.partition import Role
from services.common import limits

# Names other code takes from here (drivers, tests); each is defined in the part that uses it.
__all__ = [
    "PARTITION_METADATA_FILE",
    "RUN_MARKER_FILE",
    "RUN_MARKER_VERSION",
    "BrokerCore",
    "BrokerIO",
    "PreviousRun",
    "ReplicaObserver",
    "log_config_from",
]

# The periodic pass yields after this many log flushes (fsyncs) and after this many partitions.
FLUSHES_PER_YIELD = 10
ISR_PASS_PARTITIONS_PER_YIELD = 100
# The gauges' walk yields after this many partitions (a partition's share is ~5 µs).
GAUGE_PARTITIONS_PER_YIELD = 1_000
# The broker's run marker in its data directory: written "not clean" at start and
# "clean" at the end of a clean stop (see BrokerCore.start). JSON {"version", "clean",
# "boot_id"}; a marker without "version" (written before 2026-11-28) is version 1.
RUN_MARKER_FILE = "broker-run-marker"
RUN_MARKER_VERSION = 1
RUN_MARKER_VERSIONS_READ = (RUN_MARKER_VERSION,)


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


class BrokerCore(ControlRequests, Appends, Reads):
    """All replicas on this broker. Every method runs on the broker's one event loop.

    The rules live in the parts this class joins (see the module docstring); this class keeps
    the broker's lifecycle (start, close, crash) and the periodic duties.
    """

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
        now_ms = self.clock.monotonic_ms()
        self.purgatory.complete_all(now_ms)
        for session in list(self.replica_sessions.by_id.values()):
            if session.waiting is not None:
                session.waiting.deadline_ms = min(session.waiting.deadline_ms, now_ms)
                session.waiting.try_complete(now_ms)
        self.replica_sessions.close_all()
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
        """Write every replica's HW (one file, one fsync; skipped when nothing moved), now."""
        try:
            self.hw_checkpoint.write({tp: p.high_watermark for tp, p in self.partitions.items()})
        except HighwaterError as exc:
            self.log.error("writing the high watermark checkpoint of %s failed: %s", self.data_dir, exc)

    def _checkpoint_high_watermarks_aside(self) -> None:
        """The periodic checkpoint, written off the core's loop (io.run_blocking): with 10,000
        replicas its sort, encoding and fsync took 30-46 ms, a stall of every request each 5 s.
        One at a time; a pass that finds one still being written leaves this one to the next."""
        if self._hw_checkpoint_writing:
            return
        prepared = self.hw_checkpoint.prepare({tp: p.high_watermark for tp, p in self.partitions.items()})
        if prepared is None:
            return
        self._hw_checkpoint_writing = True

        def done(error: BaseException | None) -> None:
            self._hw_checkpoint_writing = False
            if error is None:
                self.hw_checkpoint.written(prepared)
            elif isinstance(error, HighwaterError):
                self.log.error("writing the high watermark checkpoint of %s failed: %s", self.data_dir, error)
            else:
                raise error

        self.io.run_blocking("hw-checkpoint", prepared.write, done)

    def periodic_duties(self) -> Generator[None, None, None]:
        """One pass of the leader's periodic duties: roll/flush, ISR shrink, HW checkpoint, retention.

        Yields after every FLUSHES_PER_YIELD flushes (each an fsync) and every
        ISR_PASS_PARTITIONS_PER_YIELD partitions.
        """
        self._isr_ticks += 1
        checkpoint_now = self._isr_ticks % limits.HW_CHECKPOINT_EVERY_ISR_TICKS == 0
        flushed = 0
        # Read once per slice: a slice runs without awaiting, and this pass visits every replica
        # of the broker each second (10,000 on one broker: its cost is the idle broker's).
        wall, now = self.clock.wall_ms(), self.clock.monotonic_ms()
        for i, p in enumerate(list(self.partitions.values())):
            if flushed >= FLUSHES_PER_YIELD or (i and i % ISR_PASS_PARTITIONS_PER_YIELD == 0):
                flushed = 0
                yield
                if self.closing:
                    return
                if self.partitions.get((p.topic, p.partition)) is not p:
                    continue  # stopped or deleted while we yielded
                wall, now = self.clock.wall_ms(), self.clock.monotonic_ms()
            try:
                p.log.maybe_roll(wall)
                flushed += int(p.log.maybe_flush(wall))
            except HighwaterError as exc:
                self.log.error("roll/flush of %s-%d failed: %s", p.topic, p.partition, exc)
            if p.role is Role.LEADER:  # followers have no ISR to keep: two in three replicas at RF 3
                self.replay_session_fetches(p)
                change = p.check_isr_shrink(now, self.replica_lag_time_max_ms)
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
            self._checkpoint_high_watermarks_aside()

    def update_gauges(self) -> Generator[None, None, None]:
        """The partition gauges, in one walk of the partitions (every second, over all of them),
        yielding every GAUGE_PARTITIONS_PER_YIELD: at 10,000 replicas one piece took 22-71 ms of
        the loop each second (services/common/loop_stalls.py's records, bench/scale.py)."""
        leaders = under_replicated = open_transactions = lso_lag_max = 0
        for i, p in enumerate(list(self.partitions.values())):
            if i and i % GAUGE_PARTITIONS_PER_YIELD == 0:
                yield
            if p.role is not Role.LEADER:
                continue
            leaders += 1
            under_replicated += p.under_replicated
            count = p.producers.open_transactions
            if count or p.producers.unreplicated:
                open_transactions += count
                lso_lag_max = max(lso_lag_max, p.high_watermark - p.last_stable_offset)
        metrics.PARTITION_COUNT.set(len(self.partitions))
        metrics.LEADER_COUNT.set(leaders)
        metrics.UNDER_REPLICATED.set(under_replicated)
        metrics.FETCHER_MAX_LAG.set(max((f.max_lag for f in self.fetchers.values()), default=0))
        metrics.REPLICA_FETCH_SESSIONS.set(len(self.replica_sessions.by_id))
        metrics.REPLICA_FETCH_SESSION_PARTITIONS.set(self.replica_sessions.partitions_held)
        metrics.OPEN_TRANSACTIONS.set(open_transactions)
        metrics.LAST_STABLE_OFFSET_MAX_LAG.set(lso_lag_max)
