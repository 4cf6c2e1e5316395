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
BYTES_IN = Counter("highwater_bytes_in", "Record bytes appended as leader", ["topic"])
BYTES_OUT = Counter("highwater_bytes_out", "Record bytes returned to consumers", ["topic"])
REQUEST_LATENCY = Histogram(
    "highwater_request_latency_seconds",
    "Broker RPC latency",
    ["rpc"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
LEASE_KEEPALIVE_FAILURES = Gauge(
    "highwater_lease_keepalive_failures", "etcd lease keep-alive failures so far"
)
# Read at scrape time: three files per replica's active segment plus at most
# OPEN_SEGMENT_FILES_MAX of older segments (services/common/limits.py); compare with the
# process's open-files limit.
OPEN_SEGMENT_FILES = Gauge(
    "highwater_open_segment_files", "Segment files (log, offset index, time index) open in this broker"
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
