"""Checkpoint files of a partition directory, in Kafka's text format with a version line.

Each file is written whole with `Storage.write_atomic` (temp, fsync, rename), so a
reader sees the old or the new content, never a mix. Format (version 0):

    0            <- version
    N            <- number of entries
    entry...     <- one per line, fields separated by one space

Single-value files (recovery point, log start offset, high watermark) hold one entry
with one integer. The leader epoch file holds "epoch start_offset" entries.
"""

from __future__ import annotations

from services.common.errors import StorageError

from .storage import Storage

CHECKPOINT_VERSION = 0

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "high-watermark-checkpoint"
CLEAN_SHUTDOWN_MARKER = ".clean-shutdown"


def write_entries(storage: Storage, path: str, entries: list[tuple[int, ...]]) -> None:
    lines = [str(CHECKPOINT_VERSION), str(len(entries))]
    lines.extend(" ".join(str(field) for field in entry) for entry in entries)
    storage.write_atomic(path, ("\n".join(lines) + "\n").encode("ascii"))


def read_entries(storage: Storage, path: str, *, fields_per_entry: int) -> list[tuple[int, ...]] | None:
    """The entries of a checkpoint, or None if the file does not exist.

    Raises StorageError for a malformed file or an unknown version: a checkpoint is
    written atomically, so a bad one means outside damage, not a torn write.
    """
    if not storage.exists(path):
        return None
    text = storage.read_file(path).decode("ascii", errors="replace")
    lines = text.splitlines()
    try:
        version = int(lines[0])
        if version != CHECKPOINT_VERSION:
            raise StorageError(f"checkpoint {path} has version {version}, expected {CHECKPOINT_VERSION}")
        count = int(lines[1])
        entries = [tuple(int(field) for field in line.split()) for line in lines[2 : 2 + count]]
    except (IndexError, ValueError) as error:
        raise StorageError(f"malformed checkpoint {path}: {error}") from error
    if len(entries) != count or any(len(entry) != fields_per_entry for entry in entries):
        raise StorageError(f"malformed checkpoint {path}: expected {count} entries of {fields_per_entry} fields")
    return entries


def write_offset(storage: Storage, path: str, value: int) -> None:
    write_entries(storage, path, [(value,)])


def read_offset(storage: Storage, path: str) -> int | None:
    entries = read_entries(storage, path, fields_per_entry=1)
    if entries is None:
        return None
    if len(entries) != 1:
        raise StorageError(f"checkpoint {path} holds {len(entries)} values, expected 1")
    return entries[0][0]
