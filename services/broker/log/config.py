"""Limits of one partition log, with units in their names and their relations checked once.

Defaults follow Kafka's topic configs (segment.bytes, segment.ms, retention.*,
max.message.bytes, index.interval.bytes, segment.index.bytes, flush.*, cleanup.policy and the
compaction configs).
"""

from __future__ import annotations

from dataclasses import dataclass

from clients.common.errors import InvalidConfig
from clients.common.record_batch import BATCH_HEADER_SIZE, TIMESTAMP_TYPES
from clients.common.topics import (
    CLEANUP_POLICIES,
    CLEANUP_POLICY_COMPACT,
    CLEANUP_POLICY_DELETE,
    retention_applies,
)
from services.common import limits

# Timestamp bounds are int64 milliseconds on the wire; the largest means "no limit".
INT64_MAX = 2**63 - 1

# Index entries store a segment position as int32, so a segment (plus the one batch that
# may straddle its size limit) must stay below 2 GiB.
SEGMENT_POSITION_MAX = 2**31 - 1
# Index entry layouts: offset index (relative offset, position: 2 x int32); time index
# (timestamp int64, relative offset int32).
OFFSET_INDEX_ENTRY_BYTES = 8
TIME_INDEX_ENTRY_BYTES = 12


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of one partition log. -1 means unlimited where Kafka allows it; None means off."""

    # Roll the active segment when the next append would take it past this size.
    segment_bytes: int = limits.LOG_SEGMENT_BYTES_DEFAULT
    # Roll the active segment when its first batch was appended this long ago.
    segment_ms: int = limits.LOG_SEGMENT_MS_DEFAULT
    # Delete the oldest whole segments while the log is bigger than this (-1: no limit).
    retention_bytes: int = limits.LOG_RETENTION_BYTES_DEFAULT
    # Delete whole segments whose newest batch is older than this (-1: keep forever).
    retention_ms: int = limits.LOG_RETENTION_MS_DEFAULT
    # Largest batch accepted from a producer, log overhead included (Kafka: 1 MiB + 12).
    max_message_bytes: int = limits.MAX_MESSAGE_BYTES
    # Bytes of log between two sparse offset-index entries (bounds the scan after a lookup).
    index_interval_bytes: int = limits.LOG_INDEX_INTERVAL_BYTES_DEFAULT
    # Size of an offset index before the segment rolls (Kafka segment.index.bytes, 10 MiB);
    # also bounds the memory the active segment's in-memory index copy may take.
    max_index_bytes: int = limits.LOG_INDEX_BYTES_MAX_DEFAULT
    # fsync after this many messages since the last flush (None: leave it to the OS, as Kafka).
    flush_messages: int | None = None
    # fsync when this long has passed since the last flush (None: off).
    flush_ms: int | None = None
    # Kafka's message.timestamp.type: CreateTime keeps the producer's record timestamps;
    # LogAppendTime makes the leader's clock every record's timestamp (the leader writes it
    # into each batch's max_timestamp; clients/common/record_validation.py).
    message_timestamp_type: str = "CreateTime"
    # How far behind the leader's clock a CreateTime record's timestamp may be (Kafka's
    # message.timestamp.before.max.ms; its default, Long.MAX_VALUE, is no limit).
    message_timestamp_before_max_ms: int = INT64_MAX
    # How far ahead of it (Kafka 4.0's default, KIP-1030: one hour). A timestamp from the
    # future holds a segment back from time-based retention and skews time lookups.
    message_timestamp_after_max_ms: int = limits.MESSAGE_TIMESTAMP_AFTER_MAX_MS_DEFAULT
    # Kafka's cleanup.policy in canonical text ("delete", "compact" or "compact,delete"). Without
    # "delete", retention_ms and retention_bytes delete nothing, as in Kafka. With "compact" the
    # log cleaner (services/broker/log_cleaner.py) keeps only the latest record per key below the
    # active segment; with both, retention also deletes whole old segments.
    cleanup_policy: str = CLEANUP_POLICY_DELETE
    # The cleaner takes a compacted log once this share of its cleanable bytes is dirty (written
    # since the last cleaning): lower cleans more often, rewriting more bytes per key kept.
    min_cleanable_dirty_ratio: float = limits.MIN_CLEANABLE_DIRTY_RATIO_DEFAULT
    # A record stays uncompacted at least this long after it was written, so a consumer within
    # this lag of the head reads every update, not only each key's latest.
    min_compaction_lag_ms: int = 0
    # A record stays uncompacted at most this long (plus the cleaner's delay): older dirty data is
    # cleaned whatever the dirty ratio (KIP-354; INT64_MAX: no bound, the ratio alone decides).
    max_compaction_lag_ms: int = INT64_MAX
    # How long a tombstone (a key's null value) is kept after the segment holding it was first
    # cleaned, so a consumer reading the log within that time sees the key's delete.
    delete_retention_ms: int = limits.DELETE_RETENTION_MS_DEFAULT

    def __post_init__(self) -> None:
        def require(condition: bool, message: str) -> None:
            if not condition:
                raise InvalidConfig(f"LogConfig: {message}")

        require(
            self.segment_bytes >= BATCH_HEADER_SIZE,
            f"segment_bytes {self.segment_bytes} is below one batch header",
        )
        require(
            self.segment_bytes + self.max_message_bytes <= SEGMENT_POSITION_MAX,
            f"segment_bytes {self.segment_bytes} + max_message_bytes {self.max_message_bytes} must stay "
            "below 2 GiB (index positions are int32)",
        )
        require(self.segment_ms > 0, f"segment_ms {self.segment_ms} must be positive")
        require(self.retention_bytes >= -1, f"retention_bytes {self.retention_bytes} must be -1 or >= 0")
        require(self.retention_ms >= -1, f"retention_ms {self.retention_ms} must be -1 or >= 0")
        require(
            self.max_message_bytes >= BATCH_HEADER_SIZE,
            f"max_message_bytes {self.max_message_bytes} is below one batch header ({BATCH_HEADER_SIZE})",
        )
        require(
            self.index_interval_bytes >= 0, f"index_interval_bytes {self.index_interval_bytes} is negative"
        )
        require(
            self.max_index_bytes >= 4 * TIME_INDEX_ENTRY_BYTES,
            f"max_index_bytes {self.max_index_bytes} holds fewer than 4 index entries",
        )
        require(
            self.flush_messages is None or self.flush_messages >= 1,
            f"flush_messages {self.flush_messages} must be >= 1",
        )
        require(self.flush_ms is None or self.flush_ms >= 0, f"flush_ms {self.flush_ms} must be >= 0")
        require(
            self.message_timestamp_type in TIMESTAMP_TYPES,
            f"message_timestamp_type {self.message_timestamp_type!r} must be one of {TIMESTAMP_TYPES}",
        )
        require(
            0 <= self.message_timestamp_before_max_ms <= INT64_MAX,
            f"message_timestamp_before_max_ms {self.message_timestamp_before_max_ms} must be 0..{INT64_MAX}",
        )
        require(
            0 <= self.message_timestamp_after_max_ms <= INT64_MAX,
            f"message_timestamp_after_max_ms {self.message_timestamp_after_max_ms} must be 0..{INT64_MAX}",
        )
        policies = self.cleanup_policy.split(",")
        require(
            all(policy in CLEANUP_POLICIES for policy in policies),
            f"cleanup_policy {self.cleanup_policy!r} must be a comma-separated list of {CLEANUP_POLICIES}",
        )
        require(
            0.0 <= self.min_cleanable_dirty_ratio <= 1.0,
            f"min_cleanable_dirty_ratio {self.min_cleanable_dirty_ratio} must be between 0 and 1",
        )
        require(
            0 <= self.min_compaction_lag_ms <= INT64_MAX,
            f"min_compaction_lag_ms {self.min_compaction_lag_ms} must be 0..{INT64_MAX}",
        )
        require(
            1 <= self.max_compaction_lag_ms <= INT64_MAX,
            f"max_compaction_lag_ms {self.max_compaction_lag_ms} must be 1..{INT64_MAX}",
        )
        # Kafka refuses a topic whose records would have to be cleaned before they may be.
        require(
            self.max_compaction_lag_ms >= self.min_compaction_lag_ms,
            f"max_compaction_lag_ms {self.max_compaction_lag_ms} must be >= min_compaction_lag_ms "
            f"{self.min_compaction_lag_ms}",
        )
        require(
            0 <= self.delete_retention_ms <= INT64_MAX,
            f"delete_retention_ms {self.delete_retention_ms} must be 0..{INT64_MAX}",
        )

    @property
    def retention_applies(self) -> bool:
        """Whether retention_ms and retention_bytes delete segments (cleanup.policy has "delete")."""
        return retention_applies(self.cleanup_policy)

    @property
    def compact(self) -> bool:
        """Whether the log cleaner compacts this log (cleanup.policy has "compact")."""
        return CLEANUP_POLICY_COMPACT in self.cleanup_policy.split(",")

    @property
    def max_segment_ms(self) -> int:
        """How old the active segment may grow before it rolls (Kafka's LogConfig.maxSegmentMs):
        segment_ms, or for a compacted log max_compaction_lag_ms if sooner, since the cleaner
        never cleans the active segment and would otherwise miss that bound."""
        return min(self.segment_ms, self.max_compaction_lag_ms) if self.compact else self.segment_ms

    @property
    def max_index_entries(self) -> int:
        """Entries per segment index before a roll (the time index has the same count limit)."""
        return self.max_index_bytes // TIME_INDEX_ENTRY_BYTES
