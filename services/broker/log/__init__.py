"""The partition log (DESIGN.md section 5): segments, indexes, checkpoints, recovery, retention.

Pure logic over a `Storage` seam: no grpc, no asyncio, no etcd, no clock reads, no files.
The broker's real files are `file_storage.FileStorage`, imported only by its drivers.
"""

from .config import LogConfig
from .epoch_cache import LeaderEpochCache
from .log import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    AppendInfo,
    FetchInfo,
    LocatedRecords,
    Log,
    RecoveryReport,
)
from .storage import FileLocation, MemoryStorage, Storage, StorageFile

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "AppendInfo",
    "FetchInfo",
    "FileLocation",
    "LeaderEpochCache",
    "LocatedRecords",
    "Log",
    "LogConfig",
    "MemoryStorage",
    "RecoveryReport",
    "Storage",
    "StorageFile",
]
