"""Limits of one partition log, with units in their names and their relations checked once.

Defaults follow Kafka's topic configs (segment.bytes, segment.ms, retention.*,
max.message.bytes, index.interval.bytes, segment.index.bytes, flush.*).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import InvalidConfig
from services.common.record_batch import BATCH_HEADER_SIZE

MIB = 1024 * 1024
GIB = 1024 * MIB
DAY_MS = 24 * 60 * 60 * 1000

# Index entries store a segment position as int32, so a segment (plus the one batch that
# may straddle its size limit) must stay below 2 GiB.
SEGMENT_POSITION_MAX = 2**31 - 1
OFFSET_INDEX_ENTRY_BYTES = 8
TIME_INDEX_ENTRY_BYTES = 12


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of one partition log. -1 means unlimited where Kafka allows it; None means off."""

    # Roll the active segment when the next append would take it past this size.
    segment_bytes: int = 1 * GIB
    # Roll the active segment when its first batch was appended this long ago.
    segment_ms: int = 7 * DAY_MS
    # Delete the oldest whole segments while the log is bigger than this (-1: no limit).
    retention_bytes: int = -1
    # Delete whole segments whose newest batch is older than this (-1: keep forever).
    retention_ms: int = 7 * DAY_MS
    # Largest batch accepted from a producer, log overhead included (Kafka: 1 MiB + 12).
    max_message_bytes: int = 1 * MIB + 12
    # Bytes of log between two sparse offset-index entries (bounds the scan after a lookup).
    index_interval_bytes: int = 4096
    # Size of an offset index before the segment rolls (Kafka segment.index.bytes, 10 MiB);
    # also bounds the memory the active segment's in-memory index copy may take.
    max_index_bytes: int = 10 * MIB
    # fsync after this many messages since the last flush (None: leave it to the OS, as Kafka).
    flush_messages: int | None = None
    # fsync when this long has passed since the last flush (None: off).
    flush_ms: int | None = None

    def __post_init__(self) -> None:
        def require(condition: bool, message: str) -> None:
            if not condition:
                raise InvalidConfig(f"LogConfig: {message}")

        require(self.segment_bytes >= BATCH_HEADER_SIZE, f"segment_bytes {self.segment_bytes} is below one batch header")
        require(
            self.segment_bytes + self.max_message_bytes <= SEGMENT_POSITION_MAX,
            f"segment_bytes {self.segment_bytes} + max_message_bytes {self.max_message_bytes} must stay below 2 GiB "
            "(index positions are int32)",
        )
        require(self.segment_ms > 0, f"segment_ms {self.segment_ms} must be positive")
        require(self.retention_bytes >= -1, f"retention_bytes {self.retention_bytes} must be -1 or >= 0")
        require(self.retention_ms >= -1, f"retention_ms {self.retention_ms} must be -1 or >= 0")
        require(
            self.max_message_bytes >= BATCH_HEADER_SIZE,
            f"max_message_bytes {self.max_message_bytes} is below one batch header ({BATCH_HEADER_SIZE})",
        )
        require(self.index_interval_bytes >= 0, f"index_interval_bytes {self.index_interval_bytes} is negative")
        require(
            self.max_index_bytes >= 4 * TIME_INDEX_ENTRY_BYTES,
            f"max_index_bytes {self.max_index_bytes} holds fewer than 4 index entries",
        )
        require(self.flush_messages is None or self.flush_messages >= 1, f"flush_messages {self.flush_messages} must be >= 1")
        require(self.flush_ms is None or self.flush_ms >= 0, f"flush_ms {self.flush_ms} must be >= 0")

    @property
    def max_index_entries(self) -> int:
        """Entries per segment index before a roll (the time index has the same count limit)."""
        return self.max_index_bytes // TIME_INDEX_ENTRY_BYTES
