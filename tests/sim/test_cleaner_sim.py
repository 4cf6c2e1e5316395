"""Deterministic simulation of the log cleaner (issue 39): the real cleaner, crashes anywhere.

Each seed runs a leader log and followers, each a real `Log` on its own MemoryStorage (one per
broker) behind `CrashingStorage`, a Storage that dies at its k-th mutating call (then
MemoryStorage.crash keeps only what was fsynced, with torn writes and unsynced renames decided
by the seed, and the replica reopens with Log.open). Each replica is cleaned by its own real
`LogCleaner` (services/broker/log_cleaner.py: plan, offset map, groups, clean_group,
Log.replace_segments, checkpoint) through `clean_once`, with the seed's clock; its worker-thread
steps run inline on an `InlineExecutor`, which makes them deterministic and lets a retention or
DeleteRecords step run between two of them (racing the pass, as on the broker's loop).

The schedule interleaves keyed updates and tombstones from several producer ids (idempotent and
not, compressed and not: clients/common/records.py encodes them), follower fetches
(append_as_follower, across the leader's holes), rolls, high watermark moves (every replica
flushes first: the HW never passes durable data), cleaning passes with a small dedupe buffer
(several passes per log), DeleteRecords and retention, clock ticks and crashes.

The checker (`check_replica`, `check_agreement`) holds Kafka's guarantees after every clean,
every crash and at the end, against the history of every batch the leader wrote:
- every record read back is the one written at its offset (no offset changes, nothing
  corrupted); batch and record offsets strictly increase;
- a record is missing only if it is below the log start, or a later record of its key lies
  below the replica's high watermark (so nothing at or above the HW, or past the cleaner's
  dirty point, goes), or it is a tombstone at least delete.retention.ms after the first pass
  that could have cleaned it;
- each key's latest record is readable at its offset with its value, or, if it is a tombstone
  past its retention, the key is gone entirely (no older value comes back);
- every replica gives the same latest value per key below their common high watermark;
- the producer state rebuilt from the batch headers knows every producer's last sequence;
- a pass removes nothing at or past the end of its offset map (the new first dirty offset);
- the log start moves only by DeleteRecords, retention or a follower's reset, and a crash never
  leaves a log ending below its high watermark (both would hide lost records);
- (at the end) a read at every offset, holes included, answers from the first batch holding
  an offset at or after it.

`--sim-seeds N` sets the seed count (N x CLEANER_SEEDS_PER_SIM_SEED, default 50 x 6 = 300).
A failure names its seed and replays with `run_seed(seed)`.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pytest
from prometheus_client import REGISTRY

from clients.common.errors import OffsetOutOfRange
from clients.common.record_batch import iter_batch_headers
from clients.common.records import decode_batches, encode_batch
from clients.common.topics import CLEANUP_POLICY_COMPACT
from clients.common.types import TopicPartitionKey
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.log.storage import OpenFileCache
from services.broker.log_cleaner import CleanerConfig, LogCleaner
from services.broker.partition import Partition, Role
from services.broker.producer_state import ProducerStateManager
from services.common import limits
from tests.storage_faults import StepStorage

# Seeds of this simulation per --sim-seeds seed: a seed is ~0.1 s, so the default run is a
# few hundred seeds in well under a minute.
CLEANER_SEEDS_PER_SIM_SEED = 6
STEPS = 100
DIRECTORY = "/data/compacted-0"
TP: TopicPartitionKey = ("compacted", 0)
LEADER_EPOCH = 1
PRODUCER_IDS = (-1, 7, 8, 9)  # -1: a non-idempotent producer
CODECS = ("none", "none", "gzip", "lz4", "zstd", "snappy")
KEYS = tuple(f"k{i:02d}".encode() for i in range(14))
# A step arms a crash at its k-th mutating storage call, k below this: reaches deep into a pass.
CRASH_CALL_MAX = 60

T = TypeVar("T")


class SimulatedCrash(BaseException):
    """The process died at this storage call. A BaseException: no handler of the code under test
    may catch it and carry on, as none runs after a SIGKILL."""


# ---- the crashing storage seam -----------------------------------------------------------


class CrashingStorage(StepStorage):
    """A Storage over MemoryStorage that dies at an armed mutating call and refuses every later one.

    Every call that changes the disk (creating, appending, truncating, fsyncing, renaming,
    deleting, writing a file) counts; reads do not. `calls` numbers them over the storage's whole
    life, `phase` labels them (the sim sets it around a cleaning pass; TracedLog inside
    replace_segments) so tests can see which steps crashes reached.
    """

    def __init__(self, inner: MemoryStorage, open_files_max: int) -> None:
        super().__init__(inner)
        self.inner: MemoryStorage = inner
        self.open_files = OpenFileCache(self, open_files_max)
        self.calls = 0
        self.crash_at: int | None = None
        self.dead = False
        self.phase = ""
        self.crashed_in: tuple[int, str, str] | None = None  # (call, phase, what)
        # (call, phase, what) of every mutating call, when tracing.
        self.trace: list[tuple[int, str, str]] | None = None

    def step(self, what: str) -> None:
        if self.dead:
            raise SimulatedCrash(f"{what} after the crash")
        if self.crash_at is not None and self.calls >= self.crash_at:
            self.dead = True
            self.crashed_in = (self.calls, self.phase, what)
            raise SimulatedCrash(what)
        if self.trace is not None:
            self.trace.append((self.calls, self.phase, what))
        self.calls += 1

    def arm(self, after_calls: int) -> None:
        self.crash_at = self.calls + after_calls

    def disarm(self) -> None:
        self.crash_at = None

    def restart(self, rng: random.Random) -> None:
        """A power cut: what no fsync made durable is lost (torn writes, renames by `rng`)."""
        self.open_files.crash()
        self.open_files = OpenFileCache(self, self.open_files.max_open)
        self.inner.crash(rng)
        self.dead = False
        self.crash_at = None
        self.phase = ""


class TracedLog(Log):
    """The real Log; only labels the storage calls its swap methods make (phase "swap")."""


# The swap's methods: replace_segments, or its halves when the swap is split into a prepare
# (scan, indexes, fsyncs: on the cleaner's thread) and a commit (renames: on the loop).
SWAP_METHODS = ("replace_segments", "prepare_swap", "commit_swap", "discard_prepared")


def _labelled(method: Callable[..., T]) -> Callable[..., T]:
    def labelled(self: Log, *args: Any, **kwargs: Any) -> T:
        storage = cast(CrashingStorage, self.storage)
        outer = storage.phase
        storage.phase = "swap"
        try:
            return method(self, *args, **kwargs)
        finally:
            storage.phase = outer

    return labelled


for _name in SWAP_METHODS:
    if hasattr(Log, _name):
        setattr(TracedLog, _name, _labelled(getattr(Log, _name)))


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each job at once on the caller's thread (the event loop's).

    LogCleaner hands its map and group filtering to its executor; run inline they happen in
    a deterministic order, and `before_job` runs loop-side work (retention, DeleteRecords) between
    two of them, as the broker's loop may while the worker thread reads.
    """

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.before_job: Callable[[], None] | None = None

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            if self.before_job is not None:
                self.before_job()
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:  # a SimulatedCrash too: the awaiting coroutine gets it
            future.set_exception(error)
        return future


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def wall_ms(self) -> int:
        return self.now_ms


# ---- the model ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Written:
    """One batch the leader wrote: its offsets and records ((offset, key, value))."""

    base_offset: int
    last_offset: int
    producer_id: int
    base_sequence: int
    records: tuple[tuple[int, bytes, bytes | None], ...]

    @property
    def last_sequence(self) -> int:
        return self.base_sequence + len(self.records) - 1


@dataclass
class History:
    """Every batch the leader holds (a crash cuts it back to the leader's log end)."""

    batches: list[Written] = field(default_factory=list)
    records: dict[int, tuple[bytes, bytes | None]] = field(default_factory=dict)
    offsets_by_key: dict[bytes, list[int]] = field(default_factory=dict)
    # Every batch ever written, cut ones too.
    ever: list[Written] = field(default_factory=list)

    def add(self, batch: Written) -> None:
        self.batches.append(batch)
        self.ever.append(batch)
        for offset, key, value in batch.records:
            self.records[offset] = (key, value)
            self.offsets_by_key.setdefault(key, []).append(offset)

    def cut(self, end_offset: int) -> None:
        """Forget every batch at or past end_offset (the leader lost its unflushed tail)."""
        while self.batches and self.batches[-1].base_offset >= end_offset:
            lost = self.batches.pop()
            for offset, key, _ in lost.records:
                del self.records[offset]
                self.offsets_by_key[key].remove(offset)
        if self.batches and self.batches[-1].last_offset >= end_offset:
            raise SimFailure(f"the leader's log ends at {end_offset}, inside its batch {self.batches[-1]}")

    def next_sequence(self, producer_id: int) -> int:
        for batch in reversed(self.batches):
            if batch.producer_id == producer_id:
                return batch.last_sequence + 1
        return 0


class SimFailure(AssertionError):
    """A guarantee does not hold."""


@dataclass
class Replica:
    """One broker's copy: what LogCleaner reads of a Partition (log, role, HW, producers)."""

    name: str
    storage: CrashingStorage
    log: Log
    role: Role
    high_watermark: int = 0
    producers: ProducerStateManager = field(default_factory=ProducerStateManager)
    cleaner: LogCleaner | None = None
    # Tombstone offset -> the clock at the first cleaning pass that began with it below the HW:
    # no pass cleaned it before, so its delete horizon is at least this + delete.retention.ms.
    cleanable_since_ms: dict[int, int] = field(default_factory=dict)
    crashes: int = 0
    # The log start offset as DeleteRecords, retention and fetches left it: nothing else (a
    # cleaning, a crash, a recovery) may move it up, hiding lost records below it.
    log_start_offset: int = 0
    # (call, phase, what) of the first injected crash (not a "crash" step's power cut between two
    # calls): tests check that it hit the call meant.
    crashed_at: tuple[int, str, str] | None = None


@dataclass
class Stats:
    steps: dict[str, int] = field(default_factory=dict)
    crashes: int = 0
    crash_phases: dict[str, int] = field(default_factory=dict)
    swaps: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    # Passes during which a retention or DeleteRecords step ran (racing it).
    races: int = 0

    def count(self, what: str) -> None:
        self.steps[what] = self.steps.get(what, 0) + 1


def _cleaner_errors() -> float:
    return REGISTRY.get_sample_value("highwater_log_cleaner_errors_total") or 0.0


class CleanerSim:
    """One seed's run. `forced_crash` = (replica index, call number): crash there and nowhere else."""

    def __init__(
        self,
        seed: int,
        *,
        replicas: int = 3,
        random_crashes: bool = True,
        forced_crash: tuple[int, int] | None = None,
        trace: bool = False,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.crash_rng = random.Random(seed * 7919 + 1)
        self.random_crashes = random_crashes
        self.forced_crash = forced_crash
        rng = self.rng
        policy = rng.choice([CLEANUP_POLICY_COMPACT, CLEANUP_POLICY_COMPACT, "compact,delete"])
        self.delete_retention_ms = rng.choice([0, 500, 2_000, 5_000])
        self.config = LogConfig(
            segment_bytes=rng.choice([350, 600, 1_200]),
            max_message_bytes=2_000,
            index_interval_bytes=rng.choice([0, 100, 400]),
            retention_ms=-1,
            retention_bytes=rng.choice([-1, 4_000]) if policy != CLEANUP_POLICY_COMPACT else -1,
            cleanup_policy=policy,
            min_cleanable_dirty_ratio=rng.choice([0.0, 0.0, 0.3]),
            min_compaction_lag_ms=rng.choice([0, 0, 300]),
            delete_retention_ms=self.delete_retention_ms,
        )
        # A map of 3 to 16 keys: most logs need several passes.
        self.cleaner_config = CleanerConfig(
            dedupe_buffer_bytes=rng.randint(3, 16) * limits.LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES,
            io_max_bytes_per_second=0,
            # No CPU budget: it reads the real thread clock and the machine's CPU pressure, which
            # would make a seed's run depend on the machine (the throttle has unit tests).
            cpu_max_share=0,
        )
        self.clock = Clock(1_000_000)
        self.history = History()
        self.stats = Stats()
        self.executor = InlineExecutor()
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(self.executor)
        self.replicas: list[Replica] = []
        for index in range(replicas):
            storage = CrashingStorage(MemoryStorage(), open_files_max=rng.choice([2, 4, 64]))
            if trace:
                storage.trace = []
            log = TracedLog.open(DIRECTORY, self.config, storage=storage, now_ms=self.clock.now_ms)
            replica = Replica(f"r{index}", storage, log, Role.LEADER if index == 0 else Role.FOLLOWER)
            replica.cleaner = self._new_cleaner(replica)
            self.replicas.append(replica)
        self.value_counter = 0
        self.log_start_may_move = False

    @property
    def leader(self) -> Replica:
        return self.replicas[0]

    def _new_cleaner(self, replica: Replica) -> LogCleaner:
        partitions = cast(Mapping[TopicPartitionKey, Partition], {TP: replica})
        return LogCleaner(self.cleaner_config, lambda: partitions, clock=self.clock, executor=self.executor)

    def close(self) -> None:
        self.loop.close()
        self.executor.shutdown(wait=False)

    # ---- running ---------------------------------------------------------------------------

    def run(self, steps: int = STEPS) -> Stats:
        try:
            for number in range(steps):
                self.step(number)
            self.check_all(final=True)
        finally:
            self.close()
        return self.stats

    def step(self, number: int) -> None:
        rng = self.rng
        action = rng.choices(
            ["append", "fetch", "roll", "hw", "clean", "delete_records", "retention", "tick", "crash"],
            weights=[30, 18, 4, 10, 18, 2, 2, 10, 2],
        )[0]
        self.stats.count(action)
        if action == "append":
            target = 0
        elif action == "fetch":
            target = rng.randrange(1, len(self.replicas)) if len(self.replicas) > 1 else 0
        else:
            target = rng.randrange(len(self.replicas))
        armed = self._maybe_arm(target)
        try:
            if action == "append":
                self._append()
            elif action == "fetch":
                if target:
                    self._fetch(self.replicas[target])
            elif action == "roll":
                self.replicas[target].log.roll(self.clock.now_ms)
            elif action == "hw":
                self._move_high_watermark()
            elif action == "clean":
                self._clean(self.replicas[target])
            elif action == "delete_records":
                self._delete_records(rng)
            elif action == "retention":
                self.log_start_may_move = True
                replica = self.replicas[target]
                replica.log.delete_old_segments(self.clock.now_ms, replica.high_watermark)
            elif action == "tick":
                self.clock.now_ms += rng.randint(0, max(self.delete_retention_ms, 400))
            elif action == "crash":
                self._crashed(self.replicas[target])
        except SimulatedCrash:
            crashed = next(r for r in self.replicas if r.storage.dead)
            self._crashed(crashed)
        finally:
            if armed is not None:
                armed.storage.disarm()
        for replica in self.replicas:
            start = replica.log.log_start_offset
            if self.log_start_may_move:
                replica.log_start_offset = start
            elif start > replica.log_start_offset:
                raise self.fail(
                    replica,
                    f"the log start offset went from {replica.log_start_offset} to {start} in a {action} "
                    "step (only DeleteRecords and retention move it): the records below it were lost",
                )
        self.log_start_may_move = False
        if action in ("clean", "crash") or rng.random() < 0.1:
            self.check_all(final=False)

    def _maybe_arm(self, target: int) -> Replica | None:
        if self.forced_crash is not None:
            index, call = self.forced_crash
            replica = self.replicas[index]
            if replica.storage.calls <= call and replica.crashed_at is None:
                replica.storage.crash_at = call
                return None  # stays armed until it fires
            return None
        if not self.random_crashes or self.crash_rng.random() >= 0.25:
            return None
        replica = self.replicas[target]
        replica.storage.arm(self.crash_rng.randrange(CRASH_CALL_MAX))
        return replica

    def _append(self) -> None:
        rng = self.rng
        leader = self.leader
        producer_id = rng.choice(PRODUCER_IDS)
        count = rng.randint(1, 4)
        base = leader.log.log_end_offset
        rows: list[tuple[int, bytes, bytes | None]] = []
        for i in range(count):
            key = rng.choice(KEYS)
            self.value_counter += 1
            value = None if rng.random() < 0.15 else f"{key.decode()}={self.value_counter}".encode()
            rows.append((base + i, key, value))
        sequence = self.history.next_sequence(producer_id) if producer_id >= 0 else -1
        buf = encode_batch(
            [(key, value, [], self.clock.now_ms) for _, key, value in rows],
            compression=rng.choice(CODECS),
            producer_id=producer_id,
            producer_epoch=0 if producer_id >= 0 else -1,
            base_sequence=sequence,
        )
        # In the history before the call: a crash may leave the batch on disk or not.
        self.history.add(Written(base, base + count - 1, producer_id, sequence, tuple(rows)))
        info = leader.log.append_as_leader(buf, leader_epoch=LEADER_EPOCH, now_ms=self.clock.now_ms)
        leader.producers.update(info.headers)

    def _fetch(self, follower: Replica) -> None:
        leader = self.leader.log
        try:
            info = leader.read(follower.log.log_end_offset, max_bytes=self.rng.choice([150, 4_000]))
        except OffsetOutOfRange:
            self.log_start_may_move = True
            follower.log.truncate_fully_and_start_at(leader.log_start_offset)
            follower.producers.rebuild(follower.log.batch_headers())
            return
        if info.is_empty:
            return
        appended = follower.log.append_as_follower(info.records, now_ms=self.clock.now_ms)
        follower.producers.update(appended.headers)

    def _move_high_watermark(self) -> None:
        # Every replica flushes first: a crash never loses a record below the HW.
        for replica in self.replicas:
            replica.log.flush(self.clock.now_ms)
        high_watermark = min(replica.log.log_end_offset for replica in self.replicas)
        for replica in self.replicas:
            if high_watermark < replica.high_watermark:
                raise SimFailure(f"the HW would go back from {replica.high_watermark} to {high_watermark}")
            replica.high_watermark = high_watermark

    def _delete_records(self, rng: random.Random) -> None:
        self.log_start_may_move = True
        high_watermark = self.leader.high_watermark
        start = self.leader.log.log_start_offset
        if high_watermark <= start:
            return
        offset = rng.randint(start, high_watermark)
        for replica in self.replicas:
            replica.log.advance_log_start_offset(min(offset, replica.high_watermark))

    def _clean(self, replica: Replica) -> None:
        rng = self.rng
        now = self.clock.now_ms
        for offset, (_, value) in self.history.records.items():
            if value is None and offset < replica.high_watermark:
                replica.cleanable_since_ms.setdefault(offset, now)
        if rng.random() < 0.3:
            self.executor.before_job = self._racer(replica, rng.randint(1, 3), rng)
        errors = _cleaner_errors()
        storage = replica.storage
        storage.phase = "pass"
        cleaner = replica.cleaner
        assert cleaner is not None
        last_pass = cleaner.passes[-1] if cleaner.passes else None
        before = self.present_offsets(replica)
        try:
            ran = self.loop.run_until_complete(cleaner.clean_once())
        finally:
            self.executor.before_job = None
            if not storage.dead:
                storage.phase = ""
        if _cleaner_errors() != errors:
            raise SimFailure(f"{replica.name}: the cleaner marked the log uncleanable (a pass raised)")
        if ran and cleaner.passes and cleaner.passes[-1] is not last_pass:
            result = cleaner.passes[-1]
            # Kafka's pastLatestOffset: the pass removed nothing at or past the end of its map
            # (the log's new first dirty offset), whatever later records of the key exist.
            start = replica.log.log_start_offset
            after = self.present_offsets(replica)
            lost = sorted(o for o in before - after if o >= max(result.map_end_offset, start))
            if lost:
                raise self.fail(
                    replica, f"a pass whose map ended at {result.map_end_offset} removed offsets {lost}"
                )
            self.stats.swaps += result.swapped
            self.stats.records_removed += result.stats.records_removed
            self.stats.tombstones_removed += result.stats.tombstones_removed

    def _racer(self, replica: Replica, at_job: int, rng: random.Random) -> Callable[[], None]:
        """Retention or DeleteRecords on the replica's log before the pass's `at_job`-th worker job."""
        jobs = 0

        def race() -> None:
            nonlocal jobs
            jobs += 1
            if jobs != at_job:
                return
            self.stats.races += 1
            self.log_start_may_move = True
            log = replica.log
            if rng.random() < 0.5 and replica.high_watermark > log.log_start_offset:
                log.advance_log_start_offset(rng.randint(log.log_start_offset, replica.high_watermark))
            else:
                log.delete_old_segments(self.clock.now_ms, replica.high_watermark)

        return race

    def _crashed(self, replica: Replica) -> None:
        """The replica's broker died: power cut, reopen (which may crash too), rebuild its state."""
        storage = replica.storage
        if storage.crashed_in is not None:
            self.stats.crash_phases[storage.crashed_in[1] or "other"] = (
                self.stats.crash_phases.get(storage.crashed_in[1] or "other", 0) + 1
            )
        self.stats.crashes += 1
        replica.crashes += 1
        if replica.crashed_at is None:
            replica.crashed_at = storage.crashed_in
        for attempt in range(4):
            storage.restart(self.crash_rng)
            if self.random_crashes and attempt < 3 and self.crash_rng.random() < 0.2:
                storage.arm(self.crash_rng.randrange(CRASH_CALL_MAX))
            try:
                replica.log = TracedLog.open(
                    DIRECTORY, self.config, storage=storage, now_ms=self.clock.now_ms
                )
                break
            except SimulatedCrash:
                continue
        storage.disarm()
        storage.crashed_in = None
        log = replica.log
        if log.log_end_offset < replica.high_watermark:
            raise SimFailure(
                f"{replica.name}: after a crash its log ends at {log.log_end_offset}, below the HW "
                f"{replica.high_watermark}: a committed record was lost"
            )
        if replica is self.leader:
            self.history.cut(log.log_end_offset)
            for follower in self.replicas[1:]:
                if follower.log.log_end_offset > log.log_end_offset:
                    follower.log.truncate_to(log.log_end_offset)
                    follower.producers.rebuild(follower.log.batch_headers())
        replica.producers.rebuild(log.batch_headers())
        replica.cleaner = self._new_cleaner(replica)
        self.check_producers(replica)

    # ---- the checker -----------------------------------------------------------------------

    def check_all(self, *, final: bool) -> None:
        seen = [self.check_replica(replica, every_offset=final) for replica in self.replicas]
        self.check_agreement(seen)
        for replica in self.replicas:
            self.check_producers(replica)

    def fail(self, replica: Replica, message: str) -> SimFailure:
        return SimFailure(f"seed {self.seed}, {replica.name} at {self.clock.now_ms} ms: {message}")

    def present_offsets(self, replica: Replica) -> set[int]:
        return {offset for _, _, records in self.scan(replica) for offset, _, _ in records}

    def scan(self, replica: Replica) -> list[tuple[int, int, list[tuple[int, bytes | None, bytes | None]]]]:
        """Every batch from the log start to the end: (base, last, records), as a consumer reads."""
        log = replica.log
        out: list[tuple[int, int, list[tuple[int, bytes | None, bytes | None]]]] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            info = log.read(offset, max_bytes=1 << 20)
            if info.is_empty:
                break  # a hole up to the end: the checker below finds any record missing there
            records = [(r.offset, r.key, r.value) for r in decode_batches(info.records)]
            for header in iter_batch_headers(info.records):
                inside = [r for r in records if header.base_offset <= r[0] <= header.last_offset]
                out.append((header.base_offset, header.last_offset, inside))
            if info.next_offset <= offset:
                raise self.fail(replica, f"a read at {offset} did not move forward ({info.next_offset})")
            offset = info.next_offset
        return out

    def check_replica(self, replica: Replica, *, every_offset: bool) -> dict[bytes, tuple[int, bytes | None]]:
        """The guarantees on one replica's log; returns its latest (offset, value) per key below its HW."""
        log = replica.log
        start, end, high_watermark = log.log_start_offset, log.log_end_offset, replica.high_watermark
        batches = self.scan(replica)
        present: dict[int, bytes | None] = {}
        previous = -1
        for base, last, records in batches:
            if base <= previous or last < base:
                raise self.fail(replica, f"batch [{base}, {last}] follows offset {previous}")
            for offset, key, value in records:
                if offset <= previous:
                    raise self.fail(replica, f"record offset {offset} follows offset {previous}")
                previous = offset
                if offset < start:
                    continue
                written = self.history.records.get(offset)
                if written is None or written != (key, value):
                    raise self.fail(replica, f"offset {offset} holds {(key, value)}, {written} was written")
                present[offset] = value
            previous = last
        tombstone_kept_ms = self.delete_retention_ms
        now = self.clock.now_ms
        for key, offsets in self.history.offsets_by_key.items():
            in_log = [o for o in offsets if start <= o < end]
            for i, offset in enumerate(in_log):
                if offset in present:
                    continue
                later = in_log[i + 1] if i + 1 < len(in_log) else None
                if later is not None and later < high_watermark:
                    continue  # superseded below the HW: Kafka's cleaner may remove it
                if self.history.records[offset][1] is None:
                    since = replica.cleanable_since_ms.get(offset)
                    if since is not None and now >= since + tombstone_kept_ms:
                        continue  # a tombstone past delete.retention.ms
                    raise self.fail(
                        replica,
                        f"tombstone of {key!r} at {offset} removed "
                        f"{now - since if since else 'before any'} ms after it could first be cleaned "
                        f"(HW {high_watermark}); delete.retention.ms is "
                        f"{tombstone_kept_ms}",
                    )
                raise self.fail(
                    replica,
                    f"record {key!r} at {offset} is gone with no later record of its key below the HW "
                    f"{high_watermark} (next: {later}; log [{start}, {end}))",
                )
            if in_log:
                latest = in_log[-1]
                older = [o for o in in_log[:-1] if o in present]
                if latest not in present and older:
                    raise self.fail(
                        replica,
                        f"{key!r}: its latest record (a tombstone at {latest}) is gone but older ones "
                        f"{older} came back",
                    )
        if every_offset:
            self.check_every_offset(replica, batches)
        latest_below_hw: dict[bytes, tuple[int, bytes | None]] = {}
        for offset in sorted(present):
            if offset < high_watermark:
                key = self.history.records[offset][0]
                latest_below_hw[key] = (offset, present[offset])
        return latest_below_hw

    def check_every_offset(
        self, replica: Replica, batches: list[tuple[int, int, list[tuple[int, bytes | None, bytes | None]]]]
    ) -> None:
        """A read at any offset, holes included, starts at the first batch reaching it."""
        log = replica.log
        lasts = [last for _, last, _ in batches]
        for offset in range(log.log_start_offset, log.log_end_offset):
            info = log.read(offset, max_bytes=1)
            index = bisect.bisect_left(lasts, offset)
            want = batches[index][0] if index < len(batches) else None
            got = None if info.is_empty else info.first_offset
            if got != want:
                raise self.fail(replica, f"a read at {offset} starts at batch {got}, batch {want} holds it")

    def check_agreement(self, seen: list[dict[bytes, tuple[int, bytes | None]]]) -> None:
        """Below every replica's HW and log start, all replicas give the same latest value per key
        (a tombstone one replica removed and another still keeps reads as the key being absent)."""
        high_watermark = min(replica.high_watermark for replica in self.replicas)
        start = max(replica.log.log_start_offset for replica in self.replicas)
        views: list[dict[bytes, tuple[int, bytes]]] = []
        for latest in seen:
            views.append(
                {
                    key: (offset, value)
                    for key, (offset, value) in latest.items()
                    if start <= offset < high_watermark and value is not None
                }
            )
        for key in KEYS:
            answers = {view.get(key) for view in views}
            if len(answers) > 1:
                raise SimFailure(
                    f"seed {self.seed}: replicas disagree on {key!r}: {sorted(map(str, answers))}"
                )

    def check_producers(self, replica: Replica) -> None:
        """The producer state a restart rebuilds from batch headers knows each producer's last sequence."""
        log = replica.log
        rebuilt = ProducerStateManager()
        rebuilt.rebuild(log.batch_headers())
        expected: dict[int, Written] = {}
        for batch in self.history.batches:
            if batch.producer_id >= 0 and log.log_start_offset <= batch.last_offset < log.log_end_offset:
                expected[batch.producer_id] = batch
        for producer_id, last in expected.items():
            entry = rebuilt.producers.get(producer_id)
            got = entry.last_sequence if entry is not None else None
            last_sequence = last.last_sequence
            if got == last_sequence:
                continue
            # A batch emptied by the cleaner is kept only while it is its producer's last; one whose
            # later batch this replica held and a crash then lost (above the HW) may be gone: the
            # state then knows less (an earlier sequence or none), never more.
            followed = any(
                b.producer_id == producer_id and b.base_offset > last.last_offset for b in self.history.ever
            )
            if not followed or (got is not None and got > last_sequence):
                raise self.fail(
                    replica,
                    f"producer {producer_id}'s last sequence is {got} after a rebuild, "
                    f"{last_sequence} written",
                )


def run_seed(seed: int, **kwargs: Any) -> Stats:
    return CleanerSim(seed, **kwargs).run()


def _seeds(config: pytest.Config) -> Iterator[int]:
    yield from range(config.getoption("sim_seeds") * CLEANER_SEEDS_PER_SIM_SEED)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cleaner_seed" in metafunc.fixturenames:
        metafunc.parametrize("cleaner_seed", list(_seeds(metafunc.config)))


# ---- the tests ------------------------------------------------------------------------------


def test_cleaner_seed(cleaner_seed: int) -> None:
    run_seed(cleaner_seed)


def test_a_seed_replays_exactly() -> None:
    first, second = run_seed(11), run_seed(11)
    assert first == second


def test_the_schedules_reach_what_they_claim() -> None:
    """Over a few seeds: passes swap and remove records and tombstones, retention and DeleteRecords
    race passes, and crashes land in passes, in swaps and outside them."""
    total = Stats()
    for seed in range(30):
        stats = run_seed(seed)
        total.swaps += stats.swaps
        total.records_removed += stats.records_removed
        total.tombstones_removed += stats.tombstones_removed
        total.races += stats.races
        total.crashes += stats.crashes
        for phase, count in stats.crash_phases.items():
            total.crash_phases[phase] = total.crash_phases.get(phase, 0) + count
    assert total.swaps > 100 and total.records_removed > 300 and total.tombstones_removed > 10, total
    assert total.races > 20, total
    assert {"pass", "swap", "other"} <= set(total.crash_phases), total


def _first_pass_calls(seed: int, replica: int) -> list[tuple[int, str, str]]:
    """The mutating calls of replica's first cleaning pass that swapped something, crash-free."""
    sim = CleanerSim(seed, random_crashes=False, trace=True)
    try:
        for number in range(STEPS):
            sim.step(number)
            trace = sim.replicas[replica].storage.trace
            assert trace is not None
            swap_calls = [call for call in trace if call[1] == "swap"]
            if swap_calls:
                # The whole pass the first swap belongs to: its calls are contiguous and labelled.
                first_swap = swap_calls[0][0]
                calls = [c for c in trace if c[1] in ("pass", "swap")]
                start = first_swap
                numbers = {c[0] for c in calls}
                while start - 1 in numbers:
                    start -= 1
                end = first_swap
                while end + 1 in numbers:
                    end += 1
                return [c for c in trace if start <= c[0] <= end]
    finally:
        sim.close()
    return []


@pytest.mark.parametrize(("seed", "index"), [(1, 0), (1, 1), (3, 2), (4, 1)])
def test_a_crash_at_every_mutating_call_of_a_pass_and_its_swap(seed: int, index: int) -> None:
    """Crash at each mutating storage call of one pass (cleaned file, swap, checkpoint) in turn:
    every schedule recovers and keeps every guarantee. The calls include each step of the swap
    protocol, so "every step" is enumerated here, not hoped for from random seeds."""
    calls = _first_pass_calls(seed, index)
    assert calls, f"seed {seed}: replica {index} never swapped"
    swap = [what for _, phase, what in calls if phase == "swap"]
    # The protocol's steps as log.py documents them, each a counted call.
    assert any(".cleaned.log -> " in w and w.endswith(".swap") for w in swap), swap
    assert any(w.startswith("delete ") and w.endswith(".log") for w in swap), swap
    assert any(w.startswith("rename ") and ".swap -> " in w for w in swap), swap
    assert any(w.startswith("fsync ") and ".cleaned." in w for w in swap), swap
    for call, phase, what in calls:
        sim = CleanerSim(seed, random_crashes=False, forced_crash=(index, call))
        try:
            sim.run()
        except SimFailure as failure:
            raise AssertionError(f"crash at call {call} ({phase}: {what}): {failure}") from failure
        crashed = sim.replicas[index].crashed_at
        assert crashed == (call, phase, what), f"the crash meant for call {call} ({what}) hit {crashed}"


def test_a_truncation_leaves_no_segment_durable_before_an_earlier_one() -> None:
    """Found by this simulation (seed 661): a follower's truncate_to fsynced only its active
    segment. An earlier segment rolled but never flushed then vanished in a power cut while the
    later one survived: the log reopened with its end past offsets it no longer held (here
    without any compaction), and a follower fetches only from its end, so it never copied them
    again. Every record below the reopened log end must be there."""
    storage = MemoryStorage()
    log = Log.open(DIRECTORY, LogConfig(segment_bytes=100_000, retention_ms=-1), storage=storage, now_ms=0)

    def append(*values: bytes) -> None:
        batch = encode_batch([(b"k", value, [], 0) for value in values])
        log.append_as_leader(batch, leader_epoch=LEADER_EPOCH, now_ms=0)

    append(b"a0", b"a1", b"a2")
    log.flush(0)
    log.roll(0)
    append(b"b3", b"b4", b"b5")  # a segment rolled and never flushed
    log.roll(0)
    append(b"c6", b"c7", b"c8")
    append(b"d9")
    log.truncate_to(9)  # a follower cutting a divergent suffix: fsyncs what it keeps
    storage.crash()
    reopened = Log.open(
        DIRECTORY, LogConfig(segment_bytes=100_000, retention_ms=-1), storage=storage, now_ms=0
    )
    records = decode_batches(reopened.read(0, max_bytes=1 << 20).records)
    offsets = [record.offset for record in records]
    offset = offsets[-1] + 1 if offsets else 0
    while offset < reopened.log_end_offset:
        more = [record.offset for record in decode_batches(reopened.read(offset, max_bytes=1 << 20).records)]
        offsets += more
        offset = offsets[-1] + 1
    assert offsets == list(range(reopened.log_start_offset, reopened.log_end_offset)), (
        f"log [{reopened.log_start_offset}, {reopened.log_end_offset}) holds offsets {offsets}"
    )


# Seeds that once failed by a production bug since fixed: 661 (truncate_to fsynced only the
# active segment; a power cut then kept a later segment and lost an earlier one, and the log end
# stayed past the lost offsets), 2343 (a follower's cleaned segment ended in a hole and the
# unflushed segments after it were lost: the log reopened ending below its recovery point and the
# high watermark, so its next appends would reuse committed offsets).
@pytest.mark.parametrize("seed", [661, 2343])
def test_seed_of_a_fixed_bug_stays_green(seed: int) -> None:
    run_seed(seed)
