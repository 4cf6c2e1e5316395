"""Broker metrics, named after Kafka's where they mean the same thing."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PARTITION_COUNT = Gauge("highwater_partition_count", "Partition replicas on this broker")
LEADER_COUNT = Gauge("highwater_leader_count", "Partitions this broker leads")
UNDER_REPLICATED = Gauge(
    "highwater_under_replicated_partitions",
    "Partitions led here whose ISR is smaller than their replica list",
)
ISR_SHRINKS = Counter("highwater_isr_shrinks", "ISR shrinks proposed by this broker as leader")
ISR_EXPANDS = Counter("highwater_isr_expands", "ISR expansions proposed by this broker as leader")
FETCHER_MAX_LAG = Gauge(
    "highwater_replica_fetcher_max_lag", "Largest HW - fetch offset over followed partitions"
)
REPLICA_FETCH_SESSIONS = Gauge(
    "highwater_replica_fetch_sessions", "Followers' incremental fetch sessions held by this leader"
)
REPLICA_FETCH_SESSION_PARTITIONS = Gauge(
    "highwater_replica_fetch_session_partitions",
    "Partitions over the followers' fetch sessions held by this leader",
)
OPEN_TRANSACTIONS = Gauge(
    "highwater_open_transactions",
    "Producers with an open transaction, summed over the partitions led here (issue 41)",
)
LAST_STABLE_OFFSET_MAX_LAG = Gauge(
    "highwater_last_stable_offset_max_lag",
    "Largest HW - last stable offset over partitions led here: how far read_committed consumers "
    "trail read_uncommitted ones because of an open transaction",
)
BYTES_IN = Counter("highwater_bytes_in", "Record bytes appended as leader", ["topic"])
BYTES_OUT = Counter("highwater_bytes_out", "Record bytes returned to consumers", ["topic"])


def forget_topic(topic: str) -> None:
    """Drop a deleted topic's labelled series: a cluster that creates and deletes topics (stream
    processing's repartition and changelog topics, tests) would otherwise keep one series per
    topic it ever had, for the broker's life, in memory and in every scrape."""
    for metric in (BYTES_IN, BYTES_OUT):
        try:
            metric.remove(topic)
        except KeyError:
            pass  # no record of that topic passed through this broker


REQUEST_LATENCY = Histogram(
    "highwater_request_latency_seconds",
    "Broker RPC latency",
    ["rpc"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
LEASE_KEEPALIVE_FAILURES = Gauge(
    "highwater_lease_keepalive_failures", "etcd lease keep-alive failures so far"
)
# Read at scrape time: each replica's active .log (limits.OPEN_FILES_PER_REPLICA) plus at most
# OPEN_SEGMENT_FILES_MAX of older segments (services/common/limits.py); compare with the
# process's open-files limit.
OPEN_SEGMENT_FILES = Gauge(
    "highwater_open_segment_files", "Segment files (log, offset index, time index) open in this broker"
)
# The log cleaner of compacted topics (services/broker/log_cleaner.py), after Kafka's LogCleaner metrics.
LOG_CLEANER_BYTES_READ = Counter(
    "highwater_log_cleaner_bytes_read", "Segment bytes the log cleaner read (offset map and filtering)"
)
LOG_CLEANER_BYTES_WRITTEN = Counter(
    "highwater_log_cleaner_bytes_written", "Cleaned segment bytes the log cleaner wrote"
)
LOG_CLEANER_LAST_RUN = Gauge(
    "highwater_log_cleaner_last_run_timestamp_seconds",
    "Wall-clock time the log cleaner last finished a pass over this compacted log",
    ["topic", "partition"],
)
LOG_CLEANER_MAX_DIRTY_RATIO = Gauge(
    "highwater_log_cleaner_max_dirty_ratio",
    "Largest dirty ratio (dirty / cleanable bytes) over this broker's compacted logs "
    "(Kafka: max-dirty-percent / 100)",
)
LOG_CLEANER_MAX_COMPACTION_DELAY_SECONDS = Gauge(
    "highwater_log_cleaner_max_compaction_delay_seconds",
    "Age of the oldest uncleaned record over this broker's compacted logs, from the newest record "
    "time of each log's first dirty segment",
)
LOG_CLEANER_ERRORS = Counter(
    "highwater_log_cleaner_errors", "Cleaning passes that failed (the log was marked uncleanable)"
)
LOG_CLEANER_THROTTLED_SECONDS = Counter(
    "highwater_log_cleaner_throttled_seconds",
    "Time the log cleaner slept to hold a limit: io (--log-cleaner-io-max-bytes-per-second, Kafka's "
    "log.cleaner.io.max.bytes.per.second) or cpu (--log-cleaner-cpu-max-share)",
    ["limit"],
)
LOG_CLEANER_UNCLEANABLE_PARTITIONS = Gauge(
    "highwater_log_cleaner_uncleanable_partitions",
    "Compacted logs whose last cleaning failed and that wait for a retry "
    "(Kafka: uncleanable-partitions-count)",
)
# Read from the real files' count: replica_manager (the driver that owns FileStorage) sets
# OPEN_SEGMENT_FILES.set_function(open_real_file_count), so the pure core importing these
# metrics does not import the file layer.
# The Kafka protocol listener (services/kafka/listener.py), by Kafka's API name.
KAFKA_REQUEST_LATENCY = Histogram(
    "highwater_kafka_request_latency_seconds",
    "Kafka protocol request latency, from its frame read to its answer built",
    ["api"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
KAFKA_CONNECTIONS = Gauge("highwater_kafka_connections", "Open Kafka protocol connections")
KAFKA_CONNECTIONS_CLOSED = Counter(
    "highwater_kafka_connections_closed",
    "Kafka connections this broker closed: a request it could not answer, an oversized one, "
    "an answer it could not encode, a body late or over the partial-frame budget, the "
    "connection bounds (global, per client address), or idleness",
    ["reason"],
)
KAFKA_PARTIAL_FRAME_BYTES = Gauge(
    "highwater_kafka_partial_frame_bytes",
    "Bytes of Kafka request bodies being read, over all connections (bounded by "
    "--kafka-partial-frame-bytes-max)",
)
# Incremental fetch sessions (KIP-227) of the Kafka listener (services/kafka/fetch_sessions.py),
# by Kafka's names.
KAFKA_FETCH_SESSIONS = Gauge(
    "highwater_kafka_incremental_fetch_sessions",
    "Incremental fetch sessions this broker keeps (Kafka: NumIncrementalFetchSessions)",
)
KAFKA_FETCH_SESSION_PARTITIONS_CACHED = Gauge(
    "highwater_kafka_incremental_fetch_partitions_cached",
    "Partitions held over all incremental fetch sessions (Kafka: NumIncrementalFetchPartitionsCached)",
)
KAFKA_FETCH_SESSION_EVICTIONS = Counter(
    "highwater_kafka_incremental_fetch_session_evictions",
    "Incremental fetch sessions evicted to make room for new ones "
    "(Kafka: IncrementalFetchSessionEvictionsPerSec, as a running total)",
)
