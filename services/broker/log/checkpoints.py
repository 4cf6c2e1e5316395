"""Checkpoint files of a partition directory, in Kafka's text format with a version line.

Each file is written whole with `Storage.write_atomic` (temp, fsync, rename), so a
reader sees the old or the new content, never a mix. Format (version 0):

    0            <- version
    N            <- number of entries
    entry...     <- one per line, fields separated by one space

Single-value files (recovery point, log start offset) hold one entry with one integer.
The leader epoch file holds "epoch start_offset" entries. The high watermarks of every
replica of a data directory share one file there, `replication-offset-checkpoint`, with
"topic partition offset" entries, as Kafka keeps them: one fsync per checkpoint pass
instead of one per partition (a broker with a thousand partitions under load would
otherwise fsync a thousand files every pass).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from clients.common.errors import StorageError
from clients.common.types import TopicPartitionKey

from .storage import Storage

# Kafka's checkpoint version; what every log's checkpoints are written in, but see below.
CHECKPOINT_VERSION = 0
# A compacted log has offset holes, which releases before 2026-11-28 take for damage: their
# recovery cuts the log at the first hole. A compacted log's leader epoch checkpoint is written
# in version 1 (same text, another version line), so the release of 2026-11-27, which checks
# versions, refuses the log instead of cutting it (docs/UPGRADING.md, rollback). Once written,
# version 1 stays: the holes do not go away when the policy changes.
CHECKPOINT_VERSION_HOLES = 1
CHECKPOINT_VERSIONS_READ = (CHECKPOINT_VERSION, CHECKPOINT_VERSION_HOLES)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
CLEAN_SHUTDOWN_MARKER = ".clean-shutdown"
# The log cleaner's progress in a compacted log's directory: its first dirty offset (everything
# below it was cleaned once), one value as the recovery point (services/broker/log_cleaner.py).
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
# The idempotent producers' state as it was at some log end (services/broker/producer_state.py
# encodes it; the log only keeps the bytes): written before the log start moves, so retention
# cannot make a replica forget a producer whose retry may still come.
PRODUCER_SNAPSHOT = "producer-state-snapshot"
# The log's aborted transactions (services/broker/log/txn_index.py), Kafka's .txnindex entries.
ABORTED_TXN_INDEX = "aborted-transactions.txnindex"


def encode_entries(entries: list[tuple[int | str, ...]], *, version: int = CHECKPOINT_VERSION) -> bytes:
    lines = [str(version), str(len(entries))]
    lines.extend(" ".join(str(field) for field in entry) for entry in entries)
    return ("\n".join(lines) + "\n").encode("ascii")


def write_entries(
    storage: Storage, path: str, entries: list[tuple[int | str, ...]], *, version: int = CHECKPOINT_VERSION
) -> None:
    storage.write_atomic(path, encode_entries(entries, version=version))


def read_version(storage: Storage, path: str) -> int | None:
    """The version line of a checkpoint, or None if the file does not exist or has none."""
    if not storage.exists(path):
        return None
    first = storage.read_file(path).split(b"\n", 1)[0]
    return int(first) if first.strip().isdigit() else None


def read_fields(storage: Storage, path: str, *, fields_per_entry: int) -> list[list[str]] | None:
    """The entries of a checkpoint as lists of fields, or None if the file does not exist.

    Raises StorageError for a malformed file (a checkpoint is written atomically, so a bad
    one means outside damage, not a torn write) and CheckpointVersionError, a StorageError,
    for a version this release does not read.
    """
    if not storage.exists(path):
        return None
    text = storage.read_file(path).decode("ascii", errors="replace")
    lines = text.splitlines()
    try:
        version = int(lines[0])
        if version not in CHECKPOINT_VERSIONS_READ:
            raise CheckpointVersionError(path, version)
        count = int(lines[1])
        entries = [line.split() for line in lines[2 : 2 + count]]
    except (IndexError, ValueError) as error:
        raise StorageError(f"malformed checkpoint {path}: {error}") from error
    if len(entries) != count or any(len(entry) != fields_per_entry for entry in entries):
        raise StorageError(
            f"malformed checkpoint {path}: expected {count} entries of {fields_per_entry} fields"
        )
    return entries


def read_entries(storage: Storage, path: str, *, fields_per_entry: int) -> list[tuple[int, ...]] | None:
    """The entries of an all-integer checkpoint, or None if the file does not exist (see read_fields)."""
    entries = read_fields(storage, path, fields_per_entry=fields_per_entry)
    if entries is None:
        return None
    try:
        return [tuple(int(field) for field in entry) for entry in entries]
    except ValueError as error:
        raise StorageError(f"malformed checkpoint {path}: {error}") from error


def write_offset(storage: Storage, path: str, value: int) -> None:
    write_entries(storage, path, [(value,)])


def read_offset(storage: Storage, path: str) -> int | None:
    entries = read_entries(storage, path, fields_per_entry=1)
    if entries is None:
        return None
    if len(entries) != 1:
        raise StorageError(f"checkpoint {path} holds {len(entries)} values, expected 1")
    return entries[0][0]


class UnknownFileVersion(StorageError):  # type: ignore[misc, valid-type]  # a class built by _error
    """A broker file in a format version this release cannot read: a newer release wrote it.

    Not damage, so never "recovered" by starting over: rewriting the file in this release's
    format would throw away what the newer release stored. The message names the file, the
    version found, the versions this release reads and what to do.
    """

    def __init__(self, path: str, version: object, readable: tuple[int, ...]) -> None:
        versions = ", ".join(str(v) for v in readable)
        super().__init__(
            f"{path} has format version {version!r}; this release reads version(s) {versions}. "
            "A newer release wrote it: run that release (or a later one) again; a rollback below the "
            "release that changed this format is not supported (docs/UPGRADING.md)"
        )


class CheckpointVersionError(UnknownFileVersion):
    """A checkpoint in a version other than CHECKPOINT_VERSIONS_READ."""

    def __init__(self, path: str, version: int) -> None:
        super().__init__(f"checkpoint {path}", version, CHECKPOINT_VERSIONS_READ)


@dataclass(frozen=True)
class PreparedCheckpoint:
    """High watermarks to write to one checkpoint file; `write()` touches nothing else, so it may
    run on a thread of its own while the broker's loop goes on (one at a time per file)."""

    storage: Storage
    path: str
    high_watermarks: dict[TopicPartitionKey, int]

    def write(self) -> None:
        lines: list[tuple[int | str, ...]] = [
            (topic, partition, offset) for (topic, partition), offset in sorted(self.high_watermarks.items())
        ]
        write_entries(self.storage, self.path, lines)


class HighWatermarkCheckpoint:
    """The high watermarks of one data directory's replicas, in `replication-offset-checkpoint`.

    Read once at start; `stored_at_start(tp)` gives a replica its HW when its log is opened.
    `write(hws)` stores the HWs of the replicas loaded now plus those of the file not loaded
    yet (a restarted broker opens a replica only when a LeaderAndIsr names it), and skips
    the write when nothing changed. `forget(tp)` drops a deleted replica's entry.
    """

    def __init__(self, storage: Storage, data_dir: str, warn: Callable[..., None] | None = None) -> None:
        self._storage = storage
        self._path = os.path.join(data_dir, REPLICATION_OFFSET_CHECKPOINT)
        self._warn = warn or (lambda msg, *args: None)
        storage.mkdir(data_dir)
        self._on_disk: dict[TopicPartitionKey, int] = {}
        try:
            for topic, partition, offset in read_fields(storage, self._path, fields_per_entry=3) or []:
                try:
                    self._on_disk[(topic, int(partition))] = int(offset)
                except ValueError as error:
                    raise StorageError(f"malformed checkpoint {self._path}: {error}") from error
        except CheckpointVersionError:
            raise  # a newer release's file: the broker does not start (see the class)
        except StorageError as error:
            # Only HWs are lost: every replica starts at HW 0 (never above what is committed), a
            # follower learns the leader's with its first fetch and a leader recomputes its own
            # from its followers. Refusing to start would take every replica here offline.
            self._warn(
                "%s; starting every replica of this directory at high watermark 0 and rewriting the file",
                error,
            )
            self._on_disk = {}
        self._not_loaded = dict(self._on_disk)
        self._topic_writable: dict[str, bool] = {}  # topic name -> whether it fits a line

    def stored_at_start(self, tp: TopicPartitionKey) -> int:
        """The HW stored for tp (0 if none); from now on the loaded replica reports it."""
        return self._not_loaded.pop(tp, 0)

    def forget(self, tp: TopicPartitionKey) -> None:
        self._not_loaded.pop(tp, None)

    def write(self, high_watermarks: dict[TopicPartitionKey, int]) -> bool:
        """Store these HWs (plus the not yet loaded ones) if they differ from the file; True if written."""
        prepared = self.prepare(high_watermarks)
        if prepared is None:
            return False
        prepared.write()
        self.written(prepared)
        return True

    def prepare(self, high_watermarks: dict[TopicPartitionKey, int]) -> PreparedCheckpoint | None:
        """What `write` would store, or None when the file holds it already. Its `write()` may run
        on another thread (with 10,000 replicas the sort, encoding and fsync took 30-46 ms, on the
        broker's event loop every 5 s); `written(prepared)` afterwards, on the owner's."""
        # Each topic's name is checked once: per replica it was most of this call's 57 ms at
        # 10,000 replicas, on the event loop (services/common/loop_stalls.py's records).
        writable = self._topic_writable
        merged: dict[TopicPartitionKey, int] = {}
        for source in (self._not_loaded, high_watermarks):
            for tp, hw in source.items():
                ok = writable.get(tp[0])
                if ok is None:
                    ok = writable[tp[0]] = self._writable(tp)
                if ok:
                    merged[tp] = hw
        if merged == self._on_disk:
            return None
        return PreparedCheckpoint(self._storage, self._path, merged)

    def written(self, prepared: PreparedCheckpoint) -> None:
        """`prepared` is on disk now: the next write compares with it."""
        self._on_disk = prepared.high_watermarks

    def _writable(self, tp: TopicPartitionKey) -> bool:
        """Whether tp fits one "topic partition offset" line (legal topic names always do)."""
        if tp[0] and tp[0].isascii() and not any(c.isspace() for c in tp[0]):
            return True
        self._warn(
            "topic name %r cannot be written to %s; its high watermark is not checkpointed", tp[0], self._path
        )
        return False
