"""Property tests: random appends, truncations, rolls, retention and restarts against a simple model.

The model is a list of (value, leader epoch) indexed by offset plus a log start offset.
After every step the log must agree with it: offsets contiguous from the log start to
the LEO, every readable record where the model has it, each batch carrying the epoch
it was appended in, and the leader epoch cache naming the same epoch for every offset.
A crash (MemoryStorage.crash, optionally tearing unsynced tails) may lose only what
was never flushed: the survivor is a prefix of the model no shorter than the recovery
point at the crash.
"""

from __future__ import annotations

import random
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from clients.common.record_batch import iter_batch_headers
from clients.common.records import decode_batches, encode_values
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.log.file_storage import FileStorage
from services.broker.log.storage import Storage

CONFIG = LogConfig(
    segment_bytes=600,
    index_interval_bytes=150,
    retention_ms=5_000,
    retention_bytes=1_500,
    max_message_bytes=600,
    max_index_bytes=48 * 12,
)
DIRECTORY = "/data/topic-0"
# Two open files beyond the active segment's three: old segments' files are evicted and
# reopened all the time, so every rule also runs through the open-file bound (issue 17).
OPEN_FILES_MAX = 2


class LogModel(RuleBasedStateMachine):
    """Drives one Log on MemoryStorage; subclasses swap the storage."""

    def __init__(self) -> None:
        super().__init__()
        self.storage: Storage = self.make_storage()
        self.directory = self.make_directory()
        self.now_ms = 0
        self.log = Log.open(self.directory, CONFIG, storage=self.storage, now_ms=self.now_ms)
        self.values: list[bytes] = []
        self.epochs: list[int] = []
        self.log_start = 0
        self.epoch = 0
        self.counter = 0
        # Base offsets of the batches in the model: replication truncates at batch boundaries.
        self.batch_starts: list[int] = []

    def make_storage(self) -> Storage:
        return MemoryStorage(open_files_max=OPEN_FILES_MAX)

    def make_directory(self) -> str:
        return DIRECTORY

    def reopen(self) -> None:
        self.log = Log.open(self.directory, CONFIG, storage=self.storage, now_ms=self.now_ms)

    # --- rules --------------------------------------------------------------------------

    @rule(
        sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4),
        new_epoch=st.booleans(),
        advance_ms=st.integers(0, 2_000),
    )
    def append(self, sizes: list[int], new_epoch: bool, advance_ms: int) -> None:
        self.now_ms += advance_ms
        if new_epoch:
            self.epoch += 1
        data = b""
        values: list[bytes] = []
        for size in sizes:
            batch_values = [b"v%d" % (self.counter + i) for i in range(size)]
            self.counter += size
            self.batch_starts.append(len(self.values) + len(values))
            values.extend(batch_values)
            data += encode_values(batch_values, timestamp_ms=self.now_ms)
        info = self.log.append_as_leader(data, leader_epoch=self.epoch, now_ms=self.now_ms)
        assert info.first_offset == len(self.values)
        self.values.extend(values)
        self.epochs.extend([self.epoch] * len(values))
        assert info.next_offset == len(self.values)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        target = data.draw(st.sampled_from([*self.batch_starts, len(self.values)]))
        self.log.truncate_to(target)
        assert self.log.log_end_offset == target
        self.cut_model(target)
        # As Kafka: truncating below the log start moves the log start down to the new end.
        self.log_start = min(self.log_start, target)

    @rule()
    def roll(self) -> None:
        self.log.roll(self.now_ms)

    @rule(data=st.data(), advance_ms=st.integers(0, 10_000))
    def retention(self, data: st.DataObject, advance_ms: int) -> None:
        self.now_ms += advance_ms
        high_watermark = data.draw(st.integers(self.log_start, len(self.values)))
        self.log.delete_old_segments(self.now_ms, high_watermark)
        assert self.log_start <= self.log.log_start_offset <= max(self.log_start, high_watermark)
        self.log_start = self.log.log_start_offset

    @rule(data=st.data())
    def advance_log_start(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(0, len(self.values)))
        self.log.advance_log_start_offset(target)
        self.log_start = max(self.log_start, target)
        assert self.log.log_start_offset == self.log_start

    @rule()
    def flush(self) -> None:
        self.log.flush(self.now_ms)

    @rule()
    def clean_restart(self) -> None:
        self.log.close()
        self.reopen()
        report = self.log.recovery_report
        assert report.clean_shutdown and report.bytes_dropped == 0

    @rule(seed=st.integers(0, 2**32 - 1), torn=st.booleans())
    def crash(self, seed: int, torn: bool) -> None:
        assert isinstance(self.storage, MemoryStorage)
        durable_offset = self.log.recovery_point
        self.log.abandon()
        self.storage.crash(random.Random(seed) if torn else None)
        self.reopen()
        leo = self.log.log_end_offset
        assert leo <= len(self.values) or self.log.log_start_offset == leo
        assert leo >= min(durable_offset, len(self.values)) or self.log.log_start_offset == leo
        if self.log.log_start_offset > len(self.values):
            # Everything was lost below a log start that had moved on: the log restarts empty there.
            self.values = [b""] * leo
            self.epochs = [-1] * leo
            self.batch_starts = []
        self.cut_model(leo)
        self.log_start = self.log.log_start_offset

    def cut_model(self, leo: int) -> None:
        del self.values[leo:]
        del self.epochs[leo:]
        self.batch_starts = [start for start in self.batch_starts if start < leo]

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def offsets_and_contents_match_the_model(self) -> None:
        log = self.log
        assert log.log_end_offset == len(self.values)
        assert log.log_start_offset == self.log_start <= log.log_end_offset
        bases = log.segment_base_offsets
        assert bases == sorted(bases) and bases[0] <= self.log_start
        offset = self.log_start
        while offset < log.log_end_offset:
            fetched = log.read(offset, max_bytes=200)
            assert fetched.first_offset <= offset < fetched.next_offset
            expected_next = fetched.first_offset
            for header in iter_batch_headers(fetched.records):
                assert header.base_offset == expected_next
                expected_next = header.next_offset
                if header.base_offset >= self.log_start:
                    assert header.partition_leader_epoch == self.epochs[header.base_offset]
            assert expected_next == fetched.next_offset
            for record in decode_batches(fetched.records):
                if record.offset >= offset:
                    assert record.value == self.values[record.offset]
            offset = fetched.next_offset
        assert offset == log.log_end_offset

    @invariant()
    def only_the_active_segment_and_the_cache_hold_files_open(self) -> None:
        assert self.storage.open_files.open_count <= 3 + OPEN_FILES_MAX

    @invariant()
    def epoch_cache_names_each_offsets_epoch(self) -> None:
        cache = self.log.leader_epoch_cache
        entries = cache.entries()
        assert [e for e, _ in entries] == sorted({e for e, _ in entries})
        assert [s for _, s in entries] == sorted({s for _, s in entries})
        for offset in range(self.log_start, len(self.values)):
            assert cache.epoch_for_offset(offset) == self.epochs[offset]
        if entries:
            assert entries[-1][1] < max(len(self.values), 1) or entries[-1][1] == len(self.values)

    def teardown(self) -> None:
        self.log.abandon()
        assert self.storage.open_files.open_count == 0


class FileLogModel(LogModel):
    """The same model on real files; a 'crash' is a killed process (the OS keeps every write)."""

    def make_storage(self) -> Storage:
        return FileStorage(open_files_max=OPEN_FILES_MAX)

    def make_directory(self) -> str:
        self._tmp = tempfile.TemporaryDirectory()
        return self._tmp.name + "/topic-0"

    @precondition(lambda self: False)
    @rule(seed=st.integers(0, 1), torn=st.booleans())
    def crash(self, seed: int, torn: bool) -> None:  # a power cut cannot be simulated on real files
        raise AssertionError("unreachable")

    @rule()
    def kill(self) -> None:
        self.log.abandon()
        self.reopen()
        assert not self.log.recovery_report.clean_shutdown
        assert self.log.recovery_report.bytes_dropped == 0

    def teardown(self) -> None:
        super().teardown()
        self._tmp.cleanup()


TestLogAgainstModel = LogModel.TestCase
TestLogAgainstModel.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestFileLogAgainstModel = FileLogModel.TestCase
TestFileLogAgainstModel.settings = settings(
    max_examples=15, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
