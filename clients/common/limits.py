"""The bounds both sides of the wire must agree on, with their units in their names and why.

A client sizes its requests by them and a service refuses what passes them, so they live
here, beside the wire format, and services/common/limits.py re-exports them with the
services' own bounds (one definition, read from either side).
"""

from __future__ import annotations

# --- gRPC ------------------------------------------------------------------
# A Produce or Fetch carries whole record batches; 64 MiB leaves room for
# several max-size batches per request without letting one request exhaust memory.
GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# --- records and requests --------------------------------------------------
# Kafka's message.max.bytes default (1 MiB + the 12-byte log overhead).
MAX_MESSAGE_BYTES = 1024 * 1024 + 12
# A compressed batch's records, decompressed, may take at most this (the leader checks
# them before appending: clients/common/record_validation.py). The gRPC limit: a batch
# this large uncompressed could have been sent as it is. Bounds the memory one produced
# batch can make the leader (and every consumer, which decompress a batch whole) take: a
# zip bomb of a few KiB otherwise inflates to gigabytes.
DECOMPRESSED_BATCH_BYTES_MAX = GRPC_MAX_MESSAGE_BYTES
# Produce requests: how long acks=all may wait for the ISR before
# REQUEST_TIMED_OUT (Kafka's request.timeout.ms is 30 s; we cap what a client may ask).
PRODUCE_TIMEOUT_MS_DEFAULT = 30_000
PRODUCE_TIMEOUT_MS_MAX = 300_000
# Fetch long-poll: the longest a Fetch may wait for min_bytes.
FETCH_MAX_WAIT_MS_MAX = 30_000
FETCH_MAX_BYTES_DEFAULT = 50 * 1024 * 1024
FETCH_PARTITION_MAX_BYTES_DEFAULT = 1024 * 1024

# --- idempotent producers ---------------------------------------------------
# The broker keeps the last this-many batches per producer id and partition (Kafka: 5,
# enough for max.in.flight.requests.per.connection=5); a retry of an older batch is not
# recognised. Writers that replay batches (the Spark writer) must stay within it.
PRODUCER_BATCHES_KEPT = 5
# Producer epochs are int16 in a batch header. Kafka (KIP-360) hands out a new producer id
# instead of bumping an epoch past this, so an epoch never wraps around.
PRODUCER_EPOCH_MAX = 2**15 - 2

# --- topics ----------------------------------------------------------------
TOPIC_NAME_MAX_CHARS = 249  # Kafka's limit: the name becomes a directory name.
DEFAULT_MIN_INSYNC_REPLICAS = 1

# --- topic configs -----------------------------------------------------------
# segment.bytes range (clients/common/topics.py checks it): a segment of at least 1 KiB
# holds a batch header and a few records; at most 1 GiB, so a segment plus one batch stays
# below the 2 GiB that int32 index positions address.
SEGMENT_BYTES_MIN = 1024
SEGMENT_BYTES_MAX = 1024 * 1024 * 1024
# max.message.bytes range's top: no request bigger than a gRPC message reaches a broker.
# With segment.bytes at most 1 GiB, segment + one batch stays below the 2 GiB that int32
# index positions can address, so the two need no joint check.
MAX_MESSAGE_BYTES_MAX = GRPC_MAX_MESSAGE_BYTES
# A topic's log settings when its config does not say (Kafka's defaults; the brokers' LogConfig
# takes them, and DescribeConfigs and Admin.describe_topics show them as DEFAULT_CONFIG values):
# roll a segment at 1 GiB or after 7 days, keep 7 days of data whatever its size.
LOG_SEGMENT_BYTES_DEFAULT = 1024 * 1024 * 1024
LOG_SEGMENT_MS_DEFAULT = 7 * 24 * 60 * 60 * 1000
LOG_RETENTION_BYTES_DEFAULT = -1
LOG_RETENTION_MS_DEFAULT = 7 * 24 * 60 * 60 * 1000
# How far ahead of the leader's clock a CreateTime timestamp may be (Kafka 4.0, KIP-1030): a
# timestamp from the future holds its segment back from time-based retention.
MESSAGE_TIMESTAMP_AFTER_MAX_MS_DEFAULT = 60 * 60 * 1000
# A compacted log's cleaning (Kafka's defaults): clean a log once half of it is dirty (not yet
# cleaned), and keep a tombstone (a key's null value) one day after the segment holding it was
# first cleaned, so a consumer that reads the log within a day sees the delete.
MIN_CLEANABLE_DIRTY_RATIO_DEFAULT = 0.5
DELETE_RETENTION_MS_DEFAULT = 24 * 60 * 60 * 1000

# --- consumer groups ---------------------------------------------------------
# A group id becomes part of an etcd key (/consumers/{group}/offsets/...): bounded, one path segment,
# printable. Kafka itself takes any string; the key is why we cannot.
GROUP_ID_MAX_CHARS = 255

# --- offsets ---------------------------------------------------------------
# Commit requests: bound the number of offsets one etcd transaction writes
# (etcd's default --max-txn-ops is 128).
COMMIT_OFFSETS_PER_REQUEST_MAX = 128
# Kafka's offset.metadata.max.bytes: the free-text metadata stored with a committed offset.
OFFSET_METADATA_MAX_CHARS = 4096

# --- security ------------------------------------------------------------------
# Principal names travel in gRPC metadata and etcd keys: printable, bounded.
PRINCIPAL_NAME_MAX_CHARS = 256
# ACLs in the cluster: every service holds all of them and scans those of a
# resource type per uncached decision, and DescribeAcls returns them in one answer.
ACL_BINDINGS_MAX = 10_000
# Bindings one CreateAcls/DeleteAcls request may name: they are written in one
# etcd transaction (etcd's default --max-txn-ops is 128).
ACL_BINDINGS_PER_REQUEST_MAX = 100
# A token string is at most this long; anything longer is refused before any work.
TOKEN_CHARS_MAX = 128
# Human text stored with a token, bounded like every other field.
TOKEN_DESCRIPTION_CHARS_MAX = 200
# Longest lifetime a token may be given (ten years): keeps expires_ms far inside int64.
TOKEN_LIFETIME_MS_MAX = 10 * 365 * 24 * 3600 * 1000
# Token ids are 16 hex digits; ids up to this long are accepted when read back (etcd keys, revocations).
TOKEN_ID_CHARS_MAX = 64

# --- producer batches ---------------------------------------------------------
# What a producer fills before sending a partition's batch (the gateway's record-level
# producer cuts the same size). Kafka's Java producer fills 16 KiB, librdkafka 1 MB; ours 64
# KiB: a batch costs our Python client and brokers tens of microseconds whatever its size, so
# at 16 KiB a 10 KB record was a batch of its own. Measured (bench/RESULTS.md, 2026-11-27):
# 100-byte records 0.77 M/s at 16 KiB, 1.0-1.1 M/s from 64 KiB up (no further gain at 256 KiB
# or 1 MiB). A batch waits no longer for being allowed to grow: linger_ms bounds that.
BATCH_SIZE_BYTES_DEFAULT = 64 * 1024

# --- transactions (issue 41) ----------------------------------------------------
# The longest transaction.timeout.ms a producer may ask for (Kafka's transaction.max.timeout.ms,
# 15 minutes): a hung producer's transaction holds back every read_committed consumer of its
# partitions (the LSO) until it times out, so the bound is what an operator must tolerate.
TRANSACTION_TIMEOUT_MS_MAX = 900_000
# Kafka's transaction.timeout.ms default: a producer that dies mid-transaction holds its
# partitions' read_committed consumers back at most this long.
TRANSACTION_TIMEOUT_MS_DEFAULT = 60_000
# A transactional id's length: it is part of an etcd key (percent-encoded, so up to 3x longer).
TRANSACTIONAL_ID_MAX_CHARS = 1_000
