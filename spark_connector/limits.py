"""Every bound of the Spark connector in one place, with its unit in its name and why.

A user may change the ones marked "option" through a `highwater.`-prefixed data
source option (spark_connector/options.py lists them); the rest are fixed.
"""

from __future__ import annotations

from clients.common import limits as client_limits
from clients.common.limits import GRPC_MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES, PRODUCER_BATCHES_KEPT

# --- reading ---------------------------------------------------------------
# One Fetch asks for this much of one partition (option highwater.fetch.max.bytes). 8 MiB
# is ~80k records of 100 B: big enough that per-RPC cost (~0.5 ms, FACTS.md) is a few
# percent of decoding it, small enough that a task holds two of them (one decoding, one
# in flight) in well under the gRPC message bound.
FETCH_MAX_BYTES_DEFAULT = 8 * 1024 * 1024
FETCH_MAX_BYTES_MAX = GRPC_MAX_MESSAGE_BYTES // 2
# Option highwater.fetch.from.leaders (default true): a task fetches straight from each
# partition's leader (Metadata names it), as Kafka's consumers do, instead of through a
# gateway, which costs ~0.4 µs of gateway CPU per 100-byte record (it parses, re-wraps and
# re-serialises every Fetch answer; bench/RESULTS.md). A leader whose address does not
# accept a connection within this long (brokers not reachable from the Spark executors,
# e.g. behind a gateway in containers) is not tried again by that task: it reads through
# the gateway, as it does after any failed direct Fetch.
LEADER_CONNECT_TIMEOUT_MS = 2_000
# A short-circuit local read (option highwater.local.reads) asks the leader to locate this
# much, at least fetch.max.bytes: the bytes never travel in a gRPC message, so only the task's
# memory bounds it (one pread buffer of this size). It is decoded in groups of fetch.max.bytes,
# so Spark gets Arrow batches of the same size either way; what it saves is three of every four
# locate calls (~1 ms of the leader's CPU and ~0.3 ms of the task's each, bench/RESULTS.md).
LOCAL_READ_BYTES = 32 * 1024 * 1024
# When a Fetch below the planned end offset comes back empty (a new leader whose high
# watermark has not caught up yet), the next one long-polls this long.
FETCH_EMPTY_WAIT_MS = 500
# maxBytesPerTrigger turns bytes into offsets by sampling this much of each partition
# from the micro-batch's start offset (a soft limit, as Databricks' Kafka source has).
BYTES_SAMPLE_MAX_BYTES = 256 * 1024
# spark_connector/columnar.py decodes a Fetch's batches in groups of at most this many bytes
# of record sections (after decompression): bounds the buffers one call allocates and the
# Arrow batch handed on. An uncompressed Fetch (8 MiB by default) is one group.
COLUMNS_GROUP_BYTES_MAX = 256 * 1024 * 1024

# Option maxTriggerDelay: with minOffsetsPerTrigger, a trigger is skipped while fewer offsets
# are available, but never for longer than this since the last batch. 15 minutes is Spark's
# Kafka source's default.
MAX_TRIGGER_DELAY_MS_DEFAULT = 15 * 60 * 1000

# --- all RPCs ----------------------------------------------------------------
# gRPC channels one process keeps open for its clients (spark_connector/gateway.py,
# _SharedChannels): one per gateway and broker address and credentials, so a cluster's worth
# and more; beyond it the least recently used is closed.
SHARED_CHANNELS_MAX = 64
# Option highwater.request.timeout.ms: one RPC to a gateway.
REQUEST_TIMEOUT_MS_DEFAULT = 30_000
# Option highwater.connect.timeout.ms: how long to wait for any gateway of `bootstrap` to
# accept a connection before failing the query with the addresses tried.
CONNECT_TIMEOUT_MS_DEFAULT = 10_000
# Retriable errors (leader moving, leader not available, a gateway restarting) are retried
# with this back-off until the retry deadline (option highwater.retry.timeout.ms) passes.
RETRY_BACKOFF_MS = 200
RETRY_TIMEOUT_MS_DEFAULT = 60_000

# --- writing ---------------------------------------------------------------
# Option highwater.batch.size.bytes: a record batch is closed once its records reach this
# size. Under the broker's MAX_MESSAGE_BYTES (1 MiB) so one batch never exceeds a topic's
# default max.message.bytes; a single larger record still goes alone in its own batch.
WRITE_BATCH_BYTES_DEFAULT = 512 * 1024
WRITE_BATCH_BYTES_MAX = MAX_MESSAGE_BYTES - 1024
# A record batch also closes at this many records (varint offset deltas stay small).
WRITE_BATCH_RECORDS_MAX = 50_000
# One Produce carries at most this many bytes of batches (several partitions at once): the
# default and the maximum of option highwater.max.request.size (kafka.max.request.size).
PRODUCE_REQUEST_BYTES_MAX = 8 * 1024 * 1024
# The broker remembers the last PRODUCER_BATCHES_KEPT batches per producer id and
# partition. A writer task moves to a fresh derived producer id after that many batches
# to one partition, so every batch it wrote stays recognisable to a replay (see writer.py).
BATCHES_PER_PRODUCER_ID = PRODUCER_BATCHES_KEPT
# Producer epochs are int16 on the wire; the streaming writer uses batchId modulo this as
# the epoch, and folds batchId // this into the producer id.
PRODUCER_EPOCH_MODULUS = 32_767
# Derived producer ids live in [2**62, 2**63): the controller hands out ids from 0 upwards
# in blocks of 1000, so the two never meet.
DERIVED_PRODUCER_ID_BASE = 1 << 62

# deliveryGuarantee=exactly-once (spark_connector/transactions.py). The transaction timeout a
# task's transaction gets unless transactionTimeoutMs says otherwise, and the most it may ask
# (the coordinator's bounds, clients/common/limits.py): a task and the driver's commit must fit in
# it, and a driver that dies holds read_committed readers of the topics back at most this long.
TRANSACTION_TIMEOUT_MS_DEFAULT = client_limits.TRANSACTION_TIMEOUT_MS_DEFAULT
TRANSACTION_TIMEOUT_MS_MAX = client_limits.TRANSACTION_TIMEOUT_MS_MAX
# A transactional id is {prefix}:{query id (36)}:{partition id}, within the coordinator's
# TRANSACTIONAL_ID_MAX_CHARS.
TRANSACTIONAL_ID_PREFIX_MAX_CHARS = 200
