"""The batched clean close (log.close_logs, BrokerCore.close): as durable as Log.close, far fewer syncs.

Every log closed by close_logs must come back after a crash with every record, its leader
epochs and its log start offset, without a scan; and a crash or a failed sync in any of its
phases must leave logs that open correctly (a marker never vouches for what is not durable).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from clients.common.errors import StorageError
from clients.common.records import Record, decode_batches, encode_batch
from services.broker.core import RUN_MARKER_FILE
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.log.checkpoints import CLEAN_SHUTDOWN_MARKER
from services.broker.log.file_storage import FileStorage
from services.broker.log.log import CLOSE_STAGING_DIR, close_logs
from services.broker.log.storage import Storage
from tests.unit.broker_seams import Broker
from tests.unit.test_log import batch, read_all

SMALL = LogConfig(segment_bytes=2_000, index_interval_bytes=100, retention_ms=-1, max_message_bytes=1_500)
LOGS = 12


def open_logs(storage: Storage, root: str) -> list[Log]:
    return [Log.open(f"{root}/t-{i}", SMALL, storage=storage, now_ms=0) for i in range(LOGS)]


def fill_logs(logs: list[Log]) -> list[tuple[list[int], list[tuple[int, int]], int]]:
    """Different histories: several segments, epochs 0 and 3, a moved log start, an empty log.

    Returns what each log must hold after reopening: offsets, epoch entries, log start.
    """
    expected = []
    for i, log in enumerate(logs):
        for n in range(i * 3):
            log.append_as_leader(batch(3, 1_000 + n), leader_epoch=0 if n < i else 3, now_ms=n)
        if i % 4 == 1 and log.log_end_offset > 6:
            log.advance_log_start_offset(6)
        if i % 3 == 0:
            log.flush(now_ms=0)  # some logs have nothing left to flush
        expected.append((read_all(log), log.leader_epoch_cache.entries(), log.log_start_offset))
    return expected


def assert_reopened(
    storage: Storage,
    root: str,
    expected: list[tuple[list[int], list[tuple[int, int]], int]],
    *,
    clean: bool,
) -> None:
    for i, (offsets, epochs, log_start) in enumerate(expected):
        log = Log.open(f"{root}/t-{i}", SMALL, storage=storage, now_ms=0)
        assert log.recovery_report.clean_shutdown is clean, f"t-{i}"
        if clean:
            assert log.recovery_report.bytes_scanned == 0, f"t-{i} was scanned"
        assert read_all(log) == offsets, f"t-{i}"
        assert log.leader_epoch_cache.entries() == epochs, f"t-{i}"
        assert log.log_start_offset == log_start, f"t-{i}"
        log.close()


def test_a_batched_close_survives_a_crash_whole_and_skips_the_scan() -> None:
    storage = MemoryStorage()
    logs = open_logs(storage, "/data")
    expected = fill_logs(logs)
    fsyncs = storage.fsync_count
    assert close_logs(logs, storage=storage, sync_root="/data") == []
    # Three barriers for all the logs, no fsync per file (Log.close: up to ~11 per log).
    assert storage.sync_all_count == 3 and storage.fsync_count == fsyncs
    assert all(log.is_closed for log in logs)
    assert not storage.list_dir(f"/data/{CLOSE_STAGING_DIR}")
    storage.crash()
    assert_reopened(storage, "/data", expected, clean=True)


@pytest.mark.parametrize("use_syncfs", [True, False], ids=["syncfs", "fsync-every-file"])
def test_a_batched_close_on_real_files_reopens_clean(tmp_path: Path, use_syncfs: bool) -> None:
    storage = FileStorage(use_syncfs=use_syncfs)
    root = str(tmp_path)
    logs = open_logs(storage, root)
    expected = fill_logs(logs)
    assert close_logs(logs, storage=storage, sync_root=root) == []
    assert not os.path.exists(os.path.join(root, CLOSE_STAGING_DIR))
    for i in range(LOGS):
        names = os.listdir(os.path.join(root, f"t-{i}"))
        assert CLEAN_SHUTDOWN_MARKER in names and not [n for n in names if n.endswith(".tmp")]
        assert os.path.getsize(os.path.join(root, f"t-{i}", CLEAN_SHUTDOWN_MARKER)) == 0
    assert_reopened(FileStorage(), root, expected, clean=True)


class ProcessDied(Exception):
    """Not a StorageError: close_logs does not handle it, as it could not handle a kill."""


class DyingStorage(MemoryStorage):
    """Memory whose process dies when sync_all is called for the `die_at`-th time (before syncing)."""

    def __init__(self, die_at: int) -> None:
        super().__init__()
        self.die_at = die_at
        self.calls = 0

    def sync_all(self, directory: str) -> None:
        self.calls += 1
        if self.calls == self.die_at:
            raise ProcessDied(f"killed before sync {self.calls}")
        super().sync_all(directory)


@pytest.mark.parametrize("die_at", [1, 2, 3])
def test_a_crash_in_any_phase_leaves_logs_that_open_correctly(die_at: int) -> None:
    storage = DyingStorage(die_at)
    logs = open_logs(storage, "/data")
    expected = fill_logs(logs)
    with pytest.raises(ProcessDied):
        close_logs(logs, storage=storage, sync_root="/data")
    storage.crash()
    if die_at == 1:
        # Nothing of the close was synced: the unflushed suffixes may be gone, but whatever
        # is left opens by recovery, every checkpoint readable, no marker anywhere.
        for i in range(LOGS):
            log = Log.open(f"/data/t-{i}", SMALL, storage=storage, now_ms=0)
            assert not log.recovery_report.clean_shutdown
            assert read_all(log) == expected[i][0][: len(read_all(log))]
            log.close()
        return
    # The data was synced: every record is there; without a durable marker the logs recover
    # (rebuilding the epochs the staged checkpoint would have held), never trusting a stale file.
    assert_reopened(storage, "/data", expected, clean=False)


@pytest.mark.parametrize("seed", range(20))
def test_a_marker_that_reached_the_disk_never_vouches_for_a_checkpoint_that_did_not(seed: int) -> None:
    """Killed before the markers' sync: any subset of them may have reached the disk; each
    one that did must find its log's data and epoch checkpoint durable (synced before)."""
    storage = DyingStorage(3)
    logs = open_logs(storage, "/data")
    expected = fill_logs(logs)
    with pytest.raises(ProcessDied):
        close_logs(logs, storage=storage, sync_root="/data")
    storage.crash(random.Random(seed))
    for i, (offsets, epochs, log_start) in enumerate(expected):
        log = Log.open(f"/data/t-{i}", SMALL, storage=storage, now_ms=0)
        assert (read_all(log), log.leader_epoch_cache.entries(), log.log_start_offset) == (
            offsets,
            epochs,
            log_start,
        ), f"t-{i}, clean: {log.recovery_report.clean_shutdown}"
        log.close()


class FailingSyncStorage(MemoryStorage):
    """Memory whose `fail_at`-th sync_all reports a write error (and syncs nothing)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.calls = 0

    def sync_all(self, directory: str) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise StorageError(f"syncfs of {directory} failed: Input/output error")
        super().sync_all(directory)


@pytest.mark.parametrize("fail_at", [1, 2, 3])
def test_a_failed_sync_closes_the_logs_one_by_one(fail_at: int) -> None:
    storage = FailingSyncStorage(fail_at)
    logs = open_logs(storage, "/data")
    expected = fill_logs(logs)
    # Log.close's own fsyncs then succeed: every log is closed cleanly after all.
    assert close_logs(logs, storage=storage, sync_root="/data") == []
    assert all(log.is_closed for log in logs)
    storage.crash()
    assert_reopened(storage, "/data", expected, clean=True)


def test_a_rename_of_content_not_yet_durable_is_refused() -> None:
    storage = MemoryStorage()
    storage.mkdir("/data/staging")
    storage.write_unsynced("/data/staging/a", b"x")
    with pytest.raises(Exception, match="before a sync_all"):
        storage.rename_unsynced("/data/staging/a", "/data/a")
    with pytest.raises(Exception, match="before a sync_all"):
        storage.link_unsynced("/data/staging/a", "/data/b")
    storage.sync_all("/data")
    storage.rename_unsynced("/data/staging/a", "/data/a")
    storage.crash()  # the rename was not synced: undone
    assert not storage.exists("/data/a") and storage.read_file("/data/staging/a") == b"x"


# ---- the broker's close -----------------------------------------------------------------------

PARTITIONS = 20


def records(values: list[bytes], wall_ms: int) -> bytes:
    return encode_batch([Record(None, value, [], wall_ms) for value in values])


def test_a_clean_broker_close_leaves_every_log_durable_and_the_run_clean() -> None:
    storage = MemoryStorage()
    b = Broker(1, storage=storage)
    b.register(10)
    for p in range(PARTITIONS):
        b.leader_and_isr(leader=1, leader_epoch=0, isr=(1,), replicas=(1,), live=[b.node], partition=p)
        (answer,) = b.produce(
            records([b"v%d-%d" % (p, i) for i in range(p + 1)], b.clock.wall_ms()), acks=1, partition=p
        )
        assert answer.topics[0].partitions[0].error_code == 0
    syncs = storage.sync_all_count
    b.core.close()
    assert storage.sync_all_count - syncs == 3
    storage.crash()  # a power cut right after the exit: only what was synced is left

    again = Broker(1, storage=storage)
    assert again.core.start("boot-2").clean, "the run marker says clean"
    again.core.broker_epoch = 20
    for p in range(PARTITIONS):
        again.leader_and_isr(
            leader=1, leader_epoch=1, isr=(1,), replicas=(1,), live=[again.node], partition=p
        )
        log = again.core.partitions[("t", p)].log
        assert log.recovery_report.clean_shutdown and log.recovery_report.bytes_scanned == 0
        values = [r.value for r in decode_batches(log.read(0, max_bytes=1 << 20).records)]
        assert values == [b"v%d-%d" % (p, i) for i in range(p + 1)]
        assert log.leader_epoch_cache.entries()[0] == (0, 0)


def test_a_log_that_fails_to_close_leaves_the_run_unclean() -> None:
    storage = MemoryStorage()
    b = Broker(1, storage=storage)
    b.register(10)
    b.leader_and_isr(leader=1, leader_epoch=0, isr=(1,), replicas=(1,), live=[b.node])
    b.produce(records([b"a"], b.clock.wall_ms()), acks=1)
    storage.fail_writes = True
    b.core.close()
    assert "did not close cleanly" in b.lines.text("error")
    storage.fail_writes = False
    storage.crash()
    assert not Broker(1, storage=storage).core.start("boot-1").clean
    assert storage.exists(f"/data/b1/{RUN_MARKER_FILE}")
