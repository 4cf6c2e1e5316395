"""The broker's log cleaner: picks a compacted log, cleans it off the event loop, swaps on it.

Kafka's LogCleaner + LogCleanerManager, on asyncio. One task loops: every replica (leader or
follower: each cleans its own copy) of a log whose cleanup.policy has "compact" is planned
(services/broker/log/cleaner.py, `plan_cleaning`); the dirtiest one at or over its
min.cleanable.dirty.ratio, or past its max.compaction.lag.ms, is cleaned; else a log whose
earliest kept tombstone's delete horizon has passed, so the tombstones go; else the task sleeps
--log-cleaner-backoff-ms.

Threads: the Log object is the event loop's alone. A pass reads the log's segment views, the
partition's high watermark and producer state on the loop; the offset map and every cleaned
file are built in the cleaner's own thread (a one-thread executor), which only reads old segment
files by path and writes the cleaned file, and prepares each group's swap (Log.prepare_swap: the cleaned
file's scan, its indexes, the fsyncs); only the swap's commit (Log.commit_swap: the commit
rename, deletes, renames and the in-memory update) runs back on the loop, and only if the
partition still has the same open log (bench/cleaner_bench.py measures the loop's stall). One
pass runs at a time, so one offset map (the dedupe buffer) serves every pass.

Progress: the first dirty offset of each log (everything below it was cleaned once) is written
to `cleaner-offset-checkpoint` in the log's directory after each pass and read when the cleaner
first sees the log. A lost or stale checkpoint costs only work: the pass starts from the log's
first segment and re-reads what was clean.

Tombstones: their delete horizon is in the batches (KIP-534, cleaner.py's docstring). The cleaner
remembers the earliest horizon it left and cleans the log again once it passes; for a log seen
first after a start, it does so delete.retention.ms after the start (its horizons are not known
without a read; a tombstone kept longer than delete.retention.ms is allowed, never shorter).

Failures: a pass that raises (a damaged segment, a full disk) marks the log uncleanable: logged
once per failure, metered, retried after LOG_CLEANER_UNCLEANABLE_RETRY_MS_MIN, doubling up to
..._MAX. A pass that finds the segments changed under it (retention, DeleteRecords, truncation)
deletes its cleaned file and is simply tried again later. A broken invariant halts the broker
(the caller runs this under halt_on_invariant_violation).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from clients.common.errors import HighwaterError, InvariantViolation
from clients.common.types import TopicPartitionKey
from services.broker import metrics
from services.broker.log import checkpoints
from services.broker.log.cleaner import (
    AbortedRanges,
    CleaningAborted,
    CleaningPlan,
    FilterContext,
    GroupResult,
    OffsetMap,
    Throttler,
    build_offset_map,
    clean_group,
    discard_cleaned,
    group_segments_by_size,
    plan_cleaning,
)
from services.broker.log.log import Log, SegmentsChanged, SegmentView
from services.broker.log.storage import Storage
from services.broker.partition import Partition, Role
from services.common import limits
from services.common.server import halt_on_invariant_violation

logger = logging.getLogger("highwater.log_cleaner")

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """The broker's cleaner settings, under Kafka's names (log.cleaner.*)."""

    # log.cleaner.enable: without it compacted logs keep every record.
    enable: bool = True
    # log.cleaner.dedupe.buffer.size: memory of the key-hash -> offset map of one pass.
    dedupe_buffer_bytes: int = limits.LOG_CLEANER_DEDUPE_BUFFER_BYTES_DEFAULT
    # log.cleaner.io.max.bytes.per.second: read + write rate of the cleaner (0: no limit).
    io_max_bytes_per_second: int = limits.LOG_CLEANER_IO_MAX_BYTES_PER_SECOND_DEFAULT
    # log.cleaner.backoff.ms: sleep when no log needs cleaning.
    backoff_ms: int = limits.LOG_CLEANER_BACKOFF_MS_DEFAULT
    # Ours: the share of one core the cleaner thread may use (0: no limit). Kafka has no twin:
    # its cleaner threads do not share an interpreter with the broker's request handling.
    cpu_max_share: float = limits.LOG_CLEANER_CPU_MAX_SHARE_DEFAULT
    # Ours: the share while the machine's CPUs are contended (Linux's /proc/pressure/cpu).
    cpu_share_under_pressure: float = limits.LOG_CLEANER_CPU_SHARE_UNDER_PRESSURE_DEFAULT

    def problem(self) -> str | None:
        """What is wrong with these settings, or None."""
        if self.dedupe_buffer_bytes < limits.LOG_CLEANER_DEDUPE_BUFFER_BYTES_MIN:
            return (
                "--log-cleaner-dedupe-buffer-bytes must be at least "
                f"{limits.LOG_CLEANER_DEDUPE_BUFFER_BYTES_MIN} "
                f"(1 MiB: a smaller map would rewrite a log's clean part every few thousand keys), "
                f"got {self.dedupe_buffer_bytes}"
            )
        if self.io_max_bytes_per_second < 0:
            return (
                "--log-cleaner-io-max-bytes-per-second must be >= 0 (0: no limit), "
                f"got {self.io_max_bytes_per_second}"
            )
        if self.backoff_ms < 1:
            return f"--log-cleaner-backoff-ms must be >= 1, got {self.backoff_ms}"
        if not 0 <= self.cpu_max_share <= 1:
            return (
                "--log-cleaner-cpu-max-share must be between 0 and 1 (a share of one core; 0: no "
                f"limit), got {self.cpu_max_share}"
            )
        if not 0 <= self.cpu_share_under_pressure <= 1:
            return (
                "--log-cleaner-cpu-share-under-pressure must be between 0 and 1 (a share of one "
                f"core), got {self.cpu_share_under_pressure}"
            )
        return None


@dataclass(slots=True)
class _LogState:
    """What the cleaner knows of one log (by the Log object: a reopened log starts over)."""

    log: Log
    first_dirty_offset: int
    # When a pass may remove tombstones kept so far (-1: none known to wait).
    tombstone_pass_ms: int
    last_run_ms: int = -1
    # Uncleanable: failures in a row and when the next try may run.
    failures: int = 0
    retry_at_ms: int = -1
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class CleanerLogView:
    """A read-only copy of one log's cleaner state, for describing it (LogCleaner.view)."""

    first_dirty_offset: int
    last_run_ms: int  # -1: no pass finished since the broker started
    uncleanable: bool
    last_error: str


@dataclass(slots=True)
class PassResult:
    """One pass over one log, for logs, metrics and tests."""

    tp: TopicPartitionKey
    first_dirty_offset: int
    map_end_offset: int
    map_full: bool
    groups: int
    swapped: int
    stats: GroupResult = field(default_factory=GroupResult)
    map_bytes_read: int = 0
    seconds: float = 0.0
    completed: bool = False


class WallClock(Protocol):
    """The clock of record and segment times (the broker's SystemClock; a fake in tests)."""

    def wall_ms(self) -> int: ...


class _SystemWallClock:
    def wall_ms(self) -> int:
        return int(time.time() * 1000)


class LogCleaner:
    """The cleaner of one broker: `run()` is its task; `stop()` ends it between two batches."""

    def __init__(
        self,
        config: CleanerConfig,
        partitions: Callable[[], Mapping[TopicPartitionKey, Partition]],
        *,
        clock: WallClock | None = None,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        self.config = config
        self._partitions = partitions
        self._clock: WallClock = clock or _SystemWallClock()
        self._states: dict[TopicPartitionKey, _LogState] = {}
        self._offset_map = OffsetMap(config.dedupe_buffer_bytes)
        self._abort = threading.Event()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.passes: list[PassResult] = []  # the latest few, for tests and tools
        self._throttler = Throttler(
            config.io_max_bytes_per_second,
            monotonic_ms=lambda: time.monotonic() * 1000,
            sleep_s=self._throttle_sleep,
            cpu_share=config.cpu_max_share,
            thread_cpu_s=time.thread_time,
            thread_id=threading.get_ident,
            cpu_share_under_pressure=config.cpu_share_under_pressure,
            cpu_pressure=CpuPressure().read,
        )
        # One thread for all of the cleaner's file work, so that "the cleaner thread" is one
        # thread: its CPU clock is what the CPU share holds (a pool's threads would each have
        # their own), and passes never overlap. The simulation gives one that runs jobs inline.
        self._thread = executor or concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="log-cleaner"
        )
        # What the throttler had slept when the metric was last brought up to date.
        self._throttled_io_s = self._throttled_cpu_s = 0.0

    def _throttle_sleep(self, seconds: float) -> None:
        if seconds <= 0:
            time.sleep(0)  # releases the GIL: the event loop's thread runs (Throttler.between_batches)
            return
        # Woken early by stop(): a throttled pass never holds the broker's shutdown.
        self._abort.wait(seconds)

    async def _on_thread(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """fn(*args, **kwargs) on the cleaner's thread."""
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, functools.partial(fn, *args, **kwargs)
        )

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="log-cleaner")

    async def stop(self) -> None:
        """End the task; a running pass stops at its next batch and its cleaned file is discarded."""
        self._abort.set()
        self._wakeup.set()
        task = self._task
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=limits.BROKER_CLOSE_TASKS_TIMEOUT_S)
        except TimeoutError:
            logger.warning("the log cleaner did not stop within %.0f s", limits.BROKER_CLOSE_TASKS_TIMEOUT_S)
            task.cancel()
        except Exception:
            logger.exception("the log cleaner failed while stopping")
        finally:
            self._thread.shutdown(wait=False)

    async def run(self) -> None:
        while not self._abort.is_set():
            try:
                cleaned = await self.clean_once()
            except InvariantViolation as exc:
                halt_on_invariant_violation(exc, "the log cleaner")
                return
            except CleaningAborted:
                return
            except Exception:
                # A fault outside any one log's pass (the per-log ones are caught in clean_once).
                logger.exception("the log cleaner's loop failed; trying again after the backoff")
                cleaned = False
            if not cleaned and not self._abort.is_set():
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout=self.config.backoff_ms / 1000)
                except TimeoutError:
                    pass

    def wake(self) -> None:
        """Look for a log to clean now (tests, tools)."""
        self._wakeup.set()

    def view(self, tp: TopicPartitionKey, log: Log) -> CleanerLogView | None:
        """What the cleaner knows of this log (DescribeLogDirs); None before it first sees it."""
        state = self._states.get(tp)
        if state is None or state.log is not log:
            return None
        return CleanerLogView(
            state.first_dirty_offset, state.last_run_ms, state.failures > 0, state.last_error
        )

    # ---- choosing a log ------------------------------------------------------------------

    def _candidates(
        self, now_ms: int
    ) -> list[tuple[TopicPartitionKey, Partition, _LogState, CleaningPlan[SegmentView]]]:
        """Every compacted log this broker holds, with its plan; updates the gauges."""
        partitions = self._partitions()
        for tp in [tp for tp in self._states if tp not in partitions]:
            self._forget(tp)
        out: list[tuple[TopicPartitionKey, Partition, _LogState, CleaningPlan[SegmentView]]] = []
        max_ratio = 0.0
        max_delay_s = 0.0
        uncleanable = 0
        for tp, p in partitions.items():
            log = p.log
            if p.role not in (Role.LEADER, Role.FOLLOWER) or log.is_closed or not log.config.compact:
                continue
            if log.is_offline:
                continue
            state = self._state(tp, log, now_ms)
            if state.failures:
                uncleanable += 1
            plan = plan_cleaning(
                log.segments_for_cleaning(),
                first_dirty_offset=state.first_dirty_offset,
                # Never past an open transaction: whether its records stay is not known yet.
                high_watermark=p.producers.last_stable_offset(p.high_watermark),
                log_end_offset=log.log_end_offset,
                now_ms=now_ms,
                config=log.config,
            )
            max_ratio = max(max_ratio, plan.dirty_ratio)
            if plan.has_dirty and plan.first_dirty_timestamp_ms >= 0:
                max_delay_s = max(max_delay_s, (now_ms - plan.first_dirty_timestamp_ms) / 1000)
            out.append((tp, p, state, plan))
        metrics.LOG_CLEANER_MAX_DIRTY_RATIO.set(max_ratio)
        metrics.LOG_CLEANER_MAX_COMPACTION_DELAY_SECONDS.set(max_delay_s)
        metrics.LOG_CLEANER_UNCLEANABLE_PARTITIONS.set(uncleanable)
        return out

    def _state(self, tp: TopicPartitionKey, log: Log, now_ms: int) -> _LogState:
        state = self._states.get(tp)
        if state is not None and state.log is log:
            return state
        try:
            stored = checkpoints.read_offset(log.storage, self._checkpoint_path(log))
        except HighwaterError as error:
            # The checkpoint only saves work: start from the first segment, and say so.
            logger.warning("%s-%d: %s; cleaning from the log's start", tp[0], tp[1], error)
            stored = None
        first_dirty = log.log_start_offset if stored is None else stored
        # Horizons of tombstones cleaned before this start are in the batches, not known here.
        tombstone_pass_ms = now_ms + log.config.delete_retention_ms if stored is not None else -1
        state = _LogState(log, first_dirty, tombstone_pass_ms)
        self._states[tp] = state
        return state

    def _forget(self, tp: TopicPartitionKey) -> None:
        self._states.pop(tp, None)
        try:
            metrics.LOG_CLEANER_LAST_RUN.remove(tp[0], str(tp[1]))
        except KeyError:
            pass

    @staticmethod
    def _checkpoint_path(log: Log) -> str:
        return os.path.join(log.directory, checkpoints.CLEANER_OFFSET_CHECKPOINT)

    @staticmethod
    def choose(
        candidates: Iterable[tuple[TopicPartitionKey, Partition, _LogState, CleaningPlan[SegmentView]]],
        now_ms: int,
    ) -> tuple[TopicPartitionKey, Partition, _LogState, CleaningPlan[SegmentView]] | None:
        """Kafka's grabFilthiestCompactedLog: the dirtiest log due, else one with tombstones to drop."""
        due = [
            c for c in candidates if (c[2].retry_at_ms < 0 or c[2].retry_at_ms <= now_ms) and c[3].segments
        ]
        dirty = [c for c in due if c[3].should_clean(c[1].log.config)]
        if dirty:
            # Past max.compaction.lag.ms first (KIP-354), then by dirty ratio.
            return max(dirty, key=lambda c: (c[3].past_max_compaction_lag, c[3].dirty_ratio))
        expired = [c for c in due if 0 <= c[2].tombstone_pass_ms <= now_ms]
        if expired:
            return min(expired, key=lambda c: c[2].tombstone_pass_ms)
        return None

    # ---- one pass ------------------------------------------------------------------------

    async def clean_once(self) -> bool:
        """Clean the log most in need, if any. True when a pass ran (done or failed: look again at
        once); False when none was due or the log changed under the pass (wait for the backoff)."""
        now_ms = self._clock.wall_ms()
        chosen = self.choose(self._candidates(now_ms), now_ms)
        if chosen is None:
            return False
        tp, p, state, plan = chosen
        try:
            result = await self._clean(tp, p, state, plan, now_ms)
        except (CleaningAborted, InvariantViolation):
            raise
        except SegmentsChanged as error:
            # Retention, DeleteRecords or a truncation moved the segments: try again after the
            # backoff (False), so a log whose segments keep moving is not re-read back to back.
            logger.info("%s-%d: %s", tp[0], tp[1], error.message)
            return False
        except Exception as error:
            if self._changed_under(p, state, plan):
                logger.info(
                    "%s-%d: the log changed during cleaning (%s); cleaning again later", tp[0], tp[1], error
                )
                return False
            self._mark_uncleanable(tp, state, error, now_ms)
            return True
        finally:
            # The map's table grows with the keys of the log it mapped: a broker that cleaned a
            # log of millions of keys once does not keep their table between passes.
            self._offset_map.release()
            self._count_throttling()
        state.failures = 0
        state.retry_at_ms = -1
        state.last_error = ""
        self.passes = [*self.passes[-limits.LOG_CLEANER_PASSES_KEPT + 1 :], result]
        return True

    def _count_throttling(self) -> None:
        throttler = self._throttler
        io_s, cpu_s = throttler.slept_s, throttler.cpu_slept_s
        metrics.LOG_CLEANER_THROTTLED_SECONDS.labels("io").inc(io_s - self._throttled_io_s)
        metrics.LOG_CLEANER_THROTTLED_SECONDS.labels("cpu").inc(cpu_s - self._throttled_cpu_s)
        self._throttled_io_s, self._throttled_cpu_s = io_s, cpu_s

    def _changed_under(self, p: Partition, state: _LogState, plan: CleaningPlan[SegmentView]) -> bool:
        """Whether the log lost or changed a planned segment (a file read may then fail harmlessly)."""
        log = state.log
        if p.log is not log or log.is_closed:
            return True
        views = {view.base_offset: view for view in log.segments_for_cleaning()}
        return any(views.get(segment.base_offset) != segment for segment in plan.segments)

    def _mark_uncleanable(
        self, tp: TopicPartitionKey, state: _LogState, error: BaseException, now_ms: int
    ) -> None:
        state.failures += 1
        wait_ms = min(
            limits.LOG_CLEANER_UNCLEANABLE_RETRY_MS_MIN * 2 ** (state.failures - 1),
            limits.LOG_CLEANER_UNCLEANABLE_RETRY_MS_MAX,
        )
        state.retry_at_ms = now_ms + wait_ms
        state.last_error = f"{type(error).__name__}: {error}"
        metrics.LOG_CLEANER_ERRORS.inc()
        logger.error(
            "%s-%d is uncleanable (failure %d): %s; its records are all kept, the cleaner tries it "
            "again in %d s (check the log directory %s: a damaged segment is cut by the next restart's "
            "recovery, a full disk needs space)",
            tp[0],
            tp[1],
            state.failures,
            state.last_error,
            wait_ms // 1000,
            state.log.directory,
            exc_info=not isinstance(error, HighwaterError),
        )

    async def _clean(
        self,
        tp: TopicPartitionKey,
        p: Partition,
        state: _LogState,
        plan: CleaningPlan[SegmentView],
        now_ms: int,
    ) -> PassResult:
        """One pass over one log: map on the thread, each group filtered on the thread, swapped here."""
        started = time.monotonic()
        log = state.log
        storage = log.storage
        config = log.config
        # Kafka's lastRecordsOfActiveProducers: a producer's last batch survives even when emptied.
        producer_last_offsets = {
            pid: entry.batches[-1].last_offset
            for pid, entry in p.producers.producers.items()
            if entry.batches
        }
        offset_map = self._offset_map
        stop = self._abort.is_set
        aborted = AbortedRanges.of(log.aborted_txns(log.log_start_offset, plan.cleanable_end))
        mapped = await self._on_thread(
            build_offset_map,
            storage,
            plan.segments,
            offset_map,
            start_offset=plan.first_dirty_offset,
            end_offset=plan.cleanable_end,
            throttler=self._throttler,
            stop=stop,
            aborted=aborted,
        )
        metrics.LOG_CLEANER_BYTES_READ.inc(mapped.bytes_read)
        to_clean: list[SegmentView] = [s for s in plan.segments if s.base_offset < mapped.end_offset]
        groups = group_segments_by_size(
            to_clean,
            max_size_bytes=config.segment_bytes,
            max_index_bytes=config.max_index_bytes,
            index_interval_bytes=config.index_interval_bytes,
        )
        ctx = FilterContext(
            offset_map, mapped.end_offset, now_ms, config.delete_retention_ms, producer_last_offsets, aborted
        )
        result = PassResult(
            tp,
            plan.first_dirty_offset,
            mapped.end_offset,
            mapped.full,
            len(groups),
            0,
            map_bytes_read=mapped.bytes_read,
        )
        for group in groups:
            out_path = log.cleaned_segment_path(group[0].base_offset)
            try:
                stats = await self._on_thread(
                    clean_group, storage, group, out_path, ctx, throttler=self._throttler, stop=stop
                )
            except BaseException:
                await self._on_thread(_discard_quietly, storage, out_path)
                raise
            metrics.LOG_CLEANER_BYTES_READ.inc(stats.bytes_read)
            metrics.LOG_CLEANER_BYTES_WRITTEN.inc(stats.bytes_written)
            result.stats.add(stats)
            # The swap's scan, index writes and fsyncs run here on the thread; only its commit
            # (renames, deletes, the in-memory update) runs on the loop below.
            try:
                prepared = await self._on_thread(log.prepare_swap, group, config)
            except BaseException:
                await self._on_thread(_discard_quietly, storage, out_path)
                raise
            try:
                if p.log is not log or log.is_closed or log.is_offline:
                    await self._on_thread(log.discard_prepared, prepared)
                    raise SegmentsChanged(f"log {log.directory} was closed or replaced during cleaning")
                log.commit_swap(prepared, self._clock.wall_ms())  # SegmentsChanged: files deleted
            finally:
                # The replaced segments' blocks are freed at this last close, here on the thread.
                await self._on_thread(prepared.close)
            result.swapped += 1
        # Everything below the map's end was cleaned: the next pass starts there.
        if p.log is log and not log.is_closed:
            await self._on_thread(
                checkpoints.write_offset, storage, self._checkpoint_path(log), mapped.end_offset
            )
        state.first_dirty_offset = mapped.end_offset
        state.tombstone_pass_ms = result.stats.earliest_delete_horizon_ms
        state.last_run_ms = self._clock.wall_ms()
        metrics.LOG_CLEANER_LAST_RUN.labels(tp[0], str(tp[1])).set(state.last_run_ms / 1000)
        result.seconds = time.monotonic() - started
        result.completed = True
        stats = result.stats
        logger.info(
            "%s-%d cleaned [%d, %d) in %d group(s), %.2f s: read %d bytes (map %d), wrote %d; kept %d "
            "records, removed %d (%d tombstones)%s",
            tp[0],
            tp[1],
            to_clean[0].base_offset if to_clean else plan.first_dirty_offset,
            mapped.end_offset,
            len(groups),
            result.seconds,
            stats.bytes_read + mapped.bytes_read,
            mapped.bytes_read,
            stats.bytes_written,
            stats.records_kept,
            stats.records_removed,
            stats.tombstones_removed,
            "; the offset map filled, the rest is cleaned next pass" if mapped.full else "",
        )
        return result


class CpuPressure:
    """The machine's CPU contention from Linux's pressure stall information: the fraction of the
    last 10 s during which some runnable task waited for a CPU ("some avg10" of
    /proc/pressure/cpu), re-read at most every LOG_CLEANER_CPU_PRESSURE_READ_INTERVAL_S. None
    where the kernel has none (before 4.20, or PSI disabled): the cleaner keeps its full share."""

    PATH = "/proc/pressure/cpu"

    def __init__(self, path: str = PATH) -> None:
        self._path = path
        self._read_at = -float("inf")
        self._value: float | None = None
        self._available = True

    def read(self) -> float | None:
        now = time.monotonic()
        if not self._available or now - self._read_at < limits.LOG_CLEANER_CPU_PRESSURE_READ_INTERVAL_S:
            return self._value
        self._read_at = now
        self._value = parse_cpu_pressure(self._path)
        self._available = self._value is not None
        return self._value


def parse_cpu_pressure(path: str) -> float | None:
    """ "some avg10" of a PSI file as a fraction (avg10=18.09 -> 0.1809), None if unreadable."""
    try:
        with open(path, encoding="ascii") as file:
            for line in file:
                fields = line.split()
                if fields and fields[0] == "some":
                    for field in fields[1:]:
                        name, _, value = field.partition("=")
                        if name == "avg10":
                            return float(value) / 100.0
    except (OSError, ValueError):
        return None
    return None


def _discard_quietly(storage: Storage, path: str) -> None:
    try:
        discard_cleaned(storage, path)
    except HighwaterError as error:
        logger.warning("could not delete the cleaned file %s: %s (the log's next open does)", path, error)
