"""Every bound of the services in one place, with its unit in its name and why.

A setting a user may change lives in the service's config dataclass and takes
its default from here; relations between settings are checked at start-up
(`check_relations`). Bounds that belong to one module's own mechanism (a codec's
buffer, a test seam) may live beside it, named with their unit and a comment; every
bound a user or an operator meets is here.
"""

from __future__ import annotations

from clients.common.errors import check
from clients.common.limits import (
    BATCH_SIZE_BYTES_DEFAULT as BATCH_SIZE_BYTES_DEFAULT,
)
from clients.common.limits import (
    COMMIT_OFFSETS_PER_REQUEST_MAX as COMMIT_OFFSETS_PER_REQUEST_MAX,
)
from clients.common.limits import (
    DECOMPRESSED_BATCH_BYTES_MAX as DECOMPRESSED_BATCH_BYTES_MAX,
)
from clients.common.limits import (
    DEFAULT_MIN_INSYNC_REPLICAS as DEFAULT_MIN_INSYNC_REPLICAS,
)
from clients.common.limits import (
    DELETE_RETENTION_MS_DEFAULT as DELETE_RETENTION_MS_DEFAULT,
)
from clients.common.limits import (
    FETCH_MAX_BYTES_DEFAULT as FETCH_MAX_BYTES_DEFAULT,
)
from clients.common.limits import (
    FETCH_MAX_WAIT_MS_MAX as FETCH_MAX_WAIT_MS_MAX,
)
from clients.common.limits import (
    FETCH_PARTITION_MAX_BYTES_DEFAULT as FETCH_PARTITION_MAX_BYTES_DEFAULT,
)

# The protocol's bounds are defined beside the wire format; re-exported so a service reads
# every bound from here.
from clients.common.limits import (
    GRPC_MAX_MESSAGE_BYTES as GRPC_MAX_MESSAGE_BYTES,
)
from clients.common.limits import (
    LOG_RETENTION_BYTES_DEFAULT as LOG_RETENTION_BYTES_DEFAULT,
)
from clients.common.limits import (
    LOG_RETENTION_MS_DEFAULT as LOG_RETENTION_MS_DEFAULT,
)
from clients.common.limits import (
    LOG_SEGMENT_BYTES_DEFAULT as LOG_SEGMENT_BYTES_DEFAULT,
)
from clients.common.limits import (
    LOG_SEGMENT_MS_DEFAULT as LOG_SEGMENT_MS_DEFAULT,
)
from clients.common.limits import (
    MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES,
)
from clients.common.limits import (
    MESSAGE_TIMESTAMP_AFTER_MAX_MS_DEFAULT as MESSAGE_TIMESTAMP_AFTER_MAX_MS_DEFAULT,
)
from clients.common.limits import (
    MIN_CLEANABLE_DIRTY_RATIO_DEFAULT as MIN_CLEANABLE_DIRTY_RATIO_DEFAULT,
)
from clients.common.limits import (
    OFFSET_METADATA_MAX_CHARS as OFFSET_METADATA_MAX_CHARS,
)
from clients.common.limits import (
    PRODUCE_TIMEOUT_MS_DEFAULT as PRODUCE_TIMEOUT_MS_DEFAULT,
)
from clients.common.limits import (
    PRODUCE_TIMEOUT_MS_MAX as PRODUCE_TIMEOUT_MS_MAX,
)
from clients.common.limits import (
    PRODUCER_BATCHES_KEPT as PRODUCER_BATCHES_KEPT,
)
from clients.common.limits import (
    PRODUCER_EPOCH_MAX as PRODUCER_EPOCH_MAX,
)
from clients.common.limits import (
    TOPIC_NAME_MAX_CHARS as TOPIC_NAME_MAX_CHARS,
)
from clients.common.limits import (
    TRANSACTION_TIMEOUT_MS_MAX as TRANSACTION_TIMEOUT_MS_MAX,
)
from clients.common.limits import (
    TRANSACTIONAL_ID_MAX_CHARS as TRANSACTIONAL_ID_MAX_CHARS,
)

# --- gRPC ------------------------------------------------------------------
# How long a stopping service lets in-flight RPCs finish (SIGTERM -> exit).
SHUTDOWN_GRACE_S = 5.0
# Control RPCs (LeaderAndIsr, UpdateMetadata, StopReplica, AlterPartition):
# small and local, so a slow answer means the peer is in trouble.
CONTROL_RPC_TIMEOUT_S = 5.0
# Partitions in one LeaderAndIsr request; a broker's share of a larger change goes in several,
# in order. A broker takes ~9 ms per new replica (its log's directory and files) on a loaded
# 2-core machine: one request for a 10,000-partition topic passed CONTROL_RPC_TIMEOUT_S, was
# sent again from the start five times, and left two thirds of the replicas never created
# (bench/scale.py). 250 new replicas take ~2.3 s.
LEADER_AND_ISR_PARTITIONS_PER_REQUEST_MAX = 250
# Channels between our processes reconnect to a peer that went away after this back-off,
# doubling up to the most: a restarted broker or controller is reached again within a second.
PEER_RECONNECT_BACKOFF_MS_MIN = 100
PEER_RECONNECT_BACKOFF_MS_MAX = 1_000
# Malformed requests are logged at most once per this interval, with how many came since, so
# whoever can reach a port cannot fill the disk with tracebacks (common/request_guard.py).
MALFORMED_REQUEST_LOG_INTERVAL_S = 10.0

# --- token listener (--client-port) ------------------------------------------
# Whoever reaches this listener is unknown until a call's headers show a valid bearer token
# (no client certificates here), so it runs on a gRPC server of its own with these bounds, and
# a call without a valid token is refused from its headers, before gRPC reads its body
# (security/runtime.py, TokenListenerGate). Such a call costs its headers plus the data HTTP/2
# flow control let through before the refusal (one stream window: 64 KiB, grown by gRPC's
# bandwidth-delay estimate on a busy connection). 16 concurrent 60 MiB requests without
# credentials took a gateway from 228 MiB to 1.47 GiB RSS when bodies were read first; 24 of
# them now add 26-43 MiB (tests/integration/test_memory_bounds.py).
# Connections at once (grpc.max_allowed_incoming_connections; one more is closed at accept and
# its client sees UNAVAILABLE). An idle TLS connection costs ~57 KiB of gateway RSS (measured),
# so 1,024 cost ~57 MiB. gRPC Python has no per-address cap: one client can hold them all for
# TOKEN_LISTENER_CONNECTION_IDLE_MS and lock others out, a denial of service but no blow-up.
TOKEN_LISTENER_CONNECTIONS_MAX = 1_024
# HTTP/2 streams (calls) per connection: RFC 7540's recommended minimum, and the client
# library's largest max_in_flight_requests, so a producer never waits on it.
TOKEN_LISTENER_STREAMS_PER_CONNECTION_MAX = 100
# Calls whose headers are in but that the server has not yet taken up
# (grpc.server.max_pending_requests, gRPC's default made explicit; more are refused
# RESOURCE_EXHAUSTED): with TOKEN_LISTENER_METADATA_BYTES_MAX, at most 1,000 * 8 KiB = 8 MiB
# of headers waiting for the gate, whatever the connections * streams product.
TOKEN_LISTENER_PENDING_CALLS_MAX = 1_000
# Headers of one call (grpc.max_metadata_size, gRPC's default made explicit); a bearer token
# is at most tokens.TOKEN_CHARS_MAX (128) characters.
TOKEN_LISTENER_METADATA_BYTES_MAX = 8 * 1024
# A connection must finish TLS and the HTTP/2 preface within this (gRPC's default: 120 s),
# so half-open connections give their slots back within seconds.
TOKEN_LISTENER_HANDSHAKE_TIMEOUT_MS = 10_000
# A connection without calls for this long is closed (GOAWAY; clients reconnect on their next
# call), so idle connections give their slots back. Above the handshake timeout (checked).
TOKEN_LISTENER_CONNECTION_IDLE_MS = 60_000

# --- etcd leases -----------------------------------------------------------
# A dead broker's registration disappears at most this long after its last
# keep-alive; failover time is bounded below by it (Kafka's
# zookeeper.session.timeout.ms plays the same role).
LEASE_TTL_S = 6
LEASE_TTL_S_MIN = 2
# The longest --lease-ttl-s: a dead process is noticed no sooner than its lease expires.
LEASE_TTL_S_MAX = 300
# How long a broker that lost its lease tries to register again: coordinator/limits.py
# LEASE_REREGISTER_* (the registration rules, coordinator/broker_life.py, hold them).

# --- broker liveness stream (BrokerHeartbeat; services/controller/liveness.py) ------------
# A broker's stream to the active controller that ended is given this long to be opened again
# by the same incarnation before the controller revokes that incarnation's lease: a process that
# dies resets its connections at once, so a crash costs this instead of a lease TTL. A network
# blip longer than this costs a leader move (the broker re-registers), never data.
BROKER_CONNECTION_GRACE_MS = 300
# Below this a broker's own reconnect (etcd lookup, TCP and HTTP/2 set-up, on a loaded host)
# would not fit, and every controller hiccup would cost a leader move.
BROKER_CONNECTION_GRACE_MS_MIN = 100
# Above this the stream saves little over the lease; must also stay under the lease TTL (checked).
BROKER_CONNECTION_GRACE_MS_MAX = 60_000
# A broker reopens a broken stream after this pause, doubling up to the most, so a reconnect
# fits well inside the grace period while a controller that is down is not hammered.
BROKER_HEARTBEAT_BACKOFF_MS_MIN = 50
BROKER_HEARTBEAT_BACKOFF_MS_MAX = 1_000
# While its stream is open a broker looks up the active controller in etcd this often, so a
# stream held by a deposed controller that is paused (no reset, no answer) moves to the new one.
BROKER_HEARTBEAT_CONTROLLER_CHECK_MS = 1_000
# How long the broker waits for the controller's first answer on a new stream.
BROKER_HEARTBEAT_ACCEPT_TIMEOUT_MS = 2_000

# --- controller liveness stream (StandbyHeartbeat; services/controller/standby_watch.py) ---
# A standby whose stream to the active controller broke, and which cannot open another while etcd
# still names the same controller epoch, revokes that epoch's lease after this long: a crashed
# controller costs this instead of a lease TTL. Same range and reasoning as the brokers' grace.
CONTROLLER_CONNECTION_GRACE_MS = 300
# While the link is broken the standby tries again this often (each attempt a fresh channel: a
# channel's own reconnect back-off would outlast the grace period).
STANDBY_HEARTBEAT_RETRY_MS = 50
# A named controller that answers but is not (yet) acting, or no controller at all: looked up
# again after this pause.
STANDBY_HEARTBEAT_IDLE_MS = 200

# --- replication -----------------------------------------------------------
# Kafka's replica.lag.time.max.ms: a follower not caught up for this long
# leaves the ISR.
REPLICA_LAG_TIME_MAX_MS = 10_000
# The smallest --replica-lag-time-max-ms (check_relations also wants it above twice
# REPLICA_FETCH_WAIT_MAX_MS): a shorter one drops followers on any GC pause or slow disk.
REPLICA_LAG_TIME_MAX_MS_MIN = 1_000
# Follower fetches: long-poll wait and sizes (Kafka's replica.fetch.*).
REPLICA_FETCH_WAIT_MAX_MS = 500
REPLICA_FETCH_MIN_BYTES = 1
REPLICA_FETCH_MAX_BYTES = 10 * 1024 * 1024
REPLICA_FETCH_PARTITION_MAX_BYTES = 1024 * 1024
# The most a leader puts in one answer to a follower, whatever max_bytes it asked for (Kafka's
# replica.fetch.response.max.bytes, 10 MiB): a broker id is all a follower fetch shows, so
# anything claiming one could otherwise ask for a whole log in one answer.
REPLICA_FETCH_RESPONSE_MAX_BYTES = 10 * 1024 * 1024
# A leader reads every partition of a follower's fetch session again this often, whatever it
# was told (services/broker/replica_sessions.py): a change nobody notified the session of
# (retention moving the log start) reaches the follower within it. A broker holding 10,000
# replicas leads ~3,333 partitions in each of two sessions: sweeping them every 10 s took ~2.5%
# of a core of an idle broker (py-spy, 2026-11-29), a quarter of its idle CPU; every 30 s, a third
# of that. What such a change holds up is a DeleteRecords waiting for followers' log starts.
REPLICA_FETCH_SESSION_SWEEP_MS = 30_000
# A sweep marks at most this many of a session's partitions for each of its fetches, so it is
# spread over a few fetches instead of one read of every partition: in one piece, 3,333
# partitions held the leader's event loop ~50-100 ms, the p99 of a partition among 10,000.
REPLICA_FETCH_SESSION_SWEEP_PARTITIONS = 500
# A follower whose leader would not open a fetch session (an older broker) fetches in full and
# asks again after this long, as REPLICA_FETCH_STREAM_RETRY_S for the stream.
REPLICA_FETCH_SESSION_RETRY_MS = 60_000

# --- fetch answers (services/broker/core.py read_all) ------------------------------------------
# The most a broker puts in one consumer Fetch answer, over gRPC or the Kafka listener, whatever
# max_bytes and partition_max_bytes the client asked for: the default of --fetch-max-bytes (Kafka's
# fetch.max.bytes, 55 MiB). Every answer is read into memory and copied while it is encoded; four
# Fetches asking 2^31-1 bytes of a 100 MB partition took a leader from ~200 MiB to 1.1 GiB RSS.
# As in Kafka (KIP-74) the answer's first batch is returned whole even when larger, so a consumer
# always makes progress: an answer holds at most max(this, that one batch) bytes of records, and
# a batch is at most a topic's max.message.bytes (MAX_MESSAGE_BYTES_MAX at most). A partition
# takes at most what is left of the answer, so this also bounds each partition's share.
FETCH_RESPONSE_MAX_BYTES_DEFAULT = 55 * 1024 * 1024
# The range of --fetch-max-bytes. Below 1 KiB an answer would rarely hold more than its one
# first batch; above the gRPC message bound less 1 MiB for the answer's framing (per partition
# a few dozen bytes, error messages) a gRPC Fetch answer could not be sent at all.
FETCH_RESPONSE_MAX_BYTES_MIN = 1024
FETCH_RESPONSE_MAX_BYTES_CEILING = GRPC_MAX_MESSAGE_BYTES - 1024 * 1024
# A partition whose fetch failed waits this long before the next try
# (Kafka's replica.fetch.backoff.ms).
REPLICA_FETCH_BACKOFF_MS = 1_000
# ... except after UNKNOWN_LEADER_EPOCH: the leader has not yet applied the LeaderAndIsr
# that this follower already has (both were sent together), so it will in milliseconds.
# A full back-off here costs every failover a second.
REPLICA_FETCH_EPOCH_RACE_BACKOFF_MS = 50
# A leader that answered UNIMPLEMENTED to FetchStream (an older broker, during a rolling upgrade) is
# fetched from with unary Fetch calls; the stream is tried again after this long, since the leader
# may have been upgraded behind the same address. One refused stream per minute costs nothing.
REPLICA_FETCH_STREAM_RETRY_S = 60.0
# How often a leader checks its followers for ISR shrink.
ISR_CHECK_INTERVAL_MS = 1_000
# The purgatory drops answered operations from every watcher list once the lists hold twice the
# entries its last purge left, and at least this many more (Kafka's purgeInterval, 1,000
# operations; ours counts entries, an operation once per partition it watches: a follower's
# fetch of 3,334 partitions is 3,334). Between purges an answered operation waits in the lists
# of partitions that did not change; each purge walks what was added since the last.
PURGATORY_PURGE_ENTRIES_MIN = 10_000
# HWs are checkpointed and retention applied every this many ISR checks (Kafka: every 5 s):
# an fsync per partition each second would cost more than the HW a crash might re-read.
HW_CHECKPOINT_EVERY_ISR_TICKS = 5
# An AlterPartition (ISR change) that got no answer is retried after this back-off, doubling up
# to the most: quick after a controller failover, without hammering a controller in trouble.
ALTER_PARTITION_RETRY_BACKOFF_MS_MIN = 100
ALTER_PARTITION_RETRY_BACKOFF_MS_MAX = 2_000

# --- broker shutdown ---------------------------------------------------------
# A stopping broker asks the controller to move its leaderships away (Kafka's
# controlled.shutdown.max.retries / retry.backoff.ms): at most this many attempts, the n-th
# retry after n * CONTROLLED_SHUTDOWN_BACKOFF_MS, each call with twice the control deadline
# (the controller elects a new leader for every partition the broker leads before answering).
CONTROLLED_SHUTDOWN_ATTEMPTS_MAX = 3
CONTROLLED_SHUTDOWN_BACKOFF_MS = 200
CONTROLLED_SHUTDOWN_TIMEOUT_MS = int(CONTROL_RPC_TIMEOUT_S * 2 * 1000)
# Then it waits this long at most for its fetchers and tasks to end, so SIGTERM -> exit stays
# bounded even with a fetcher stuck on a dead leader.
BROKER_CLOSE_TASKS_TIMEOUT_S = 5.0

# --- topics ----------------------------------------------------------------
PARTITIONS_PER_TOPIC_MAX = 10_000
# Replicas one broker may hold (Kafka's operational guidance: at most ~4,000 partitions per broker).
# Every open replica holds file handles and memory; CreateTopics and CreatePartitions refuse to go
# past this (one 10,000-partition topic with RF 3 once exhausted every broker's file handles).
REPLICAS_PER_BROKER_MAX = 4_000
# The highest a broker's --replicas-max may raise that bound for a cluster that wants more
# replicas per broker (a benchmark of 100,000 partitions on a few brokers): each replica pins
# OPEN_FILES_PER_REPLICA files, so 50,000 of them + the cache stays under Linux's default
# per-process ceiling (fs.nr_open, 1,048,576), and the broker raises its open-files limit to what
# it needs.
REPLICAS_PER_BROKER_MAX_CEILING = 50_000
DEFAULT_NUM_PARTITIONS = 3
DEFAULT_REPLICATION_FACTOR = 3
# Idempotent producer ids whose state (epoch, last batches) one partition replica keeps; past
# this the least recently written one is forgotten. Every short-lived producer (open, send,
# close) gets a new id, and without a bound each one stayed in memory for the broker's life
# (~1 KiB each: bench/soak.py, issue 43). Kafka forgets an id after producer.id.expiration.ms
# (a day) without a write; forgetting one only stops the duplicate check of its retries, and
# far fewer producers than this write one partition at a time.
PRODUCER_IDS_PER_PARTITION_MAX = 1_000

# --- storage (partition logs) ------------------------------------------------
# Files each replica holds open whatever else it does: its active segment's .log, appended to on
# every produce. The active segment's offset and time indexes are kept in memory and written once
# per ~500 entries, so their files share the cache below with every inactive segment's (three
# per replica until 2026-11-29: 10,000 replicas on a broker then needed 30,000 open files, above
# this machine's 20,000 hard limit; issue 42).
OPEN_FILES_PER_REPLICA = 1
# Open handles of other segment files (log, offset index, time index), for all the replicas of a
# broker together; the least recently used is closed past this and reopened when used again. A
# broker needs OPEN_FILES_PER_REPLICA * REPLICAS_PER_BROKER_MAX + OPEN_SEGMENT_FILES_MAX + sockets
# under its open-files limit however many segments it holds (tiny segment_bytes or offset jumps
# once took three brokers to 20,000 open files). A catch-up read of an old segment touches two
# files (offset index, log): 1,024 serve ~500 such readers at once without reopening.
OPEN_SEGMENT_FILES_MAX = 1_024
# What a broker holds besides segment files (sockets of clients, peers and etcd, its own files
# and libraries): the open-files limit it asks for is OPEN_FILES_PER_REPLICA *
# REPLICAS_PER_BROKER_MAX + OPEN_SEGMENT_FILES_MAX + this (broker/server.py warns below that).
OPEN_FILES_OTHER_MIN = 4_096
# The page-cache window: the most recently written bytes of each log file a broker leaves in the
# page cache; what falls further behind its end is written back and dropped from the cache as the
# file grows (posix_fadvise DONTNEED every window/16 bytes of appends). The cache then holds what
# readers at the tail want and stops growing by every byte written: on this kind of VM a page
# cache that grows into memory the guest has not touched yet costs 1.4-2.7 ns per byte written
# against ~0.2 ns into pages it reuses, a third of every broker's CPU at 10 KB records
# (bench/RESULTS.md, "The page cache"). 64 MiB holds seconds of a hot partition; readers further
# behind read from disk. -1: leave the page cache to the kernel (Kafka's behaviour).
LOG_CACHE_WINDOW_BYTES_DEFAULT = 64 * 1024 * 1024
LOG_CACHE_WINDOW_BYTES_MIN = 1024 * 1024
LOG_CACHE_WINDOW_OFF = -1
# Appends between two drops: 1/16 of the window, so each byte behind the window is asked about
# 16 times while it stays in the window's second half (a page still being written back when
# first asked is dropped by a later call).
LOG_CACHE_DROP_STEPS_PER_WINDOW = 16
# A topic's log settings when its config does not say (LOG_SEGMENT_BYTES_DEFAULT ...) are defined
# beside the topic config schema (clients/common/limits.py) and re-exported above.
# Bytes of log between two sparse offset-index entries: bounds the scan after an index lookup.
LOG_INDEX_INTERVAL_BYTES_DEFAULT = 4096
# An offset index's size before its segment rolls (Kafka's segment.index.bytes); also bounds
# the memory of the active segment's in-memory index copy.
LOG_INDEX_BYTES_MAX_DEFAULT = 10 * 1024 * 1024

# --- the log cleaner of compacted topics (services/broker/log/cleaner.py, log_cleaner.py) -------
# Memory for the key-hash -> latest-offset map of one cleaning pass (Kafka's
# log.cleaner.dedupe.buffer.size, 128 MiB). A log with more distinct keys in its dirty part than
# fit is cleaned in several passes. A pass sizes the map's table for the keys its dirty range can
# hold (at most this), and gives it back when it ends: a small log costs a small table.
LOG_CLEANER_DEDUPE_BUFFER_BYTES_DEFAULT = 128 * 1024 * 1024
# The smallest buffer the broker accepts: a map of a few thousand keys would make a pass per few
# thousand keys, rewriting the log's clean part each time.
LOG_CLEANER_DEDUPE_BUFFER_BYTES_MIN = 1024 * 1024
# What one map entry costs: a slot of the open-addressing table is a 128-bit key hash and an int64
# offset (24 bytes), and the table keeps a quarter of its slots free so probes stay short: 32 bytes
# a key (services/broker/log/cleaner.py OffsetMap; it was 160 as a dict of MD5 digests).
LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES = 32
# Bytes the cleaner reads from a segment file at once (Kafka's log.cleaner.io.buffer.size, 512
# KiB); a batch bigger than this is read whole, so a read is at most max(this, one batch).
LOG_CLEANER_READ_CHUNK_BYTES = 512 * 1024
# Bytes the cleaner writes to a cleaned segment at once: bounds the memory of its output.
LOG_CLEANER_WRITE_CHUNK_BYTES = 512 * 1024
# The cleaner's read + write rate (Kafka's log.cleaner.io.max.bytes.per.second, unlimited there).
# Bounded here by default so a cleaning pass leaves the disk to produce and fetch; 0: no limit.
LOG_CLEANER_IO_MAX_BYTES_PER_SECOND_DEFAULT = 64 * 1024 * 1024
# How often the throttler compares its rate with the limit (Kafka's Throttler checks every 300 ms):
# shorter measures noise, longer lets a burst through.
LOG_CLEANER_THROTTLE_CHECK_INTERVAL_MS = 300
# Sleep between two looks for a log to clean when none needs it (Kafka's log.cleaner.backoff.ms).
LOG_CLEANER_BACKOFF_MS_DEFAULT = 15_000
# The share of one core the cleaner thread may use by default. Its record work runs in kernels
# that hold no GIL, but on a 2-core machine running three brokers every cycle it spends is one
# produce and fetch do not get: bench/cleaner_impact.py measured a busy cleaner at this share
# (bench/RESULTS.md). At it the cleaner still works through several MB of log a second.
LOG_CLEANER_CPU_MAX_SHARE_DEFAULT = 0.1
# The share the cleaner falls back to while the machine's CPUs are contended: Linux's pressure
# stall information (/proc/pressure/cpu "some avg10") says tasks waited for a CPU during more
# than LOG_CLEANER_CPU_PRESSURE_THRESHOLD of the last 10 s. Then every cycle the cleaner takes is
# one a runnable produce or fetch waits for: measured, three busy cleaners at 0.1 each cost a
# saturated 2-core machine 20-25% of its produce throughput (bench/RESULTS.md, issue 39). At this
# floor the cleaner still progresses (never starved: max.compaction.lag.ms keeps its meaning) and
# takes back its full share as soon as the machine has spare cycles. Where the kernel has no
# pressure information, the full share applies.
LOG_CLEANER_CPU_SHARE_UNDER_PRESSURE_DEFAULT = 0.02
LOG_CLEANER_CPU_PRESSURE_THRESHOLD = 0.10
# How often the cleaner thread re-reads /proc/pressure/cpu (the figure is a 10 s average).
LOG_CLEANER_CPU_PRESSURE_READ_INTERVAL_S = 1.0
# A log whose cleaning failed is left alone this long, then tried again; each further failure
# doubles the wait up to the maximum (Kafka marks it uncleanable until the broker restarts; a retry
# that backs off lets a transient fault, a full disk, heal without a restart and never loops).
LOG_CLEANER_UNCLEANABLE_RETRY_MS_MIN = 60_000
LOG_CLEANER_UNCLEANABLE_RETRY_MS_MAX = 60 * 60 * 1000
# Results of the latest passes the cleaner keeps for tests and tools (older ones are dropped).
LOG_CLEANER_PASSES_KEPT = 16

# --- security (services/security) -------------------------------------------------
# Bounds of the security flags themselves. The smallest --max-request-bytes still fits one
# default-size batch plus framing (a smaller one would refuse ordinary produce requests).
MAX_REQUEST_BYTES_MIN = 64 * 1024
# A record batch v2 holds at most 2^31 - 1 records; --max-batch-records stays below something sane.
MAX_BATCH_RECORDS_MAX = 10_000_000
# The most --max-concurrent-requests-per-connection accepts.
REQUESTS_PER_CONNECTION_MAX = 10_000
# Requests that may wait for a slot on one connection, per slot; beyond that a request is
# refused at once (RESOURCE_EXHAUSTED) rather than held in memory.
WAITING_PER_SLOT_MAX = 4
# A stream opened with a bearer token re-checks it this often while idle: a revoked or expired
# token ends the stream (UNAUTHENTICATED) within this bound.
STREAM_TOKEN_RECHECK_S = 1.0
# Quotas: a bucket holds at most this many seconds of quota, so a principal idle for a while may
# burst this much before it is throttled (Kafka's window is 11 samples of 1 s; one second keeps
# the enforced rate tight).
QUOTA_BURST_S = 1.0
# One response asks for at most this long a pause (Kafka caps the throttle time at its quota
# window); a longer debt is collected over later requests.
THROTTLE_TIME_MS_MAX = 30_000
# Principals whose quota is tracked; the least recently used bucket is dropped beyond it (a
# dropped principal starts again with a full bucket, which at worst grants it one burst).
PRINCIPALS_TRACKED_MAX = 10_000
# Bearer tokens in the cluster: every service keeps every token record in memory.
TOKENS_MAX = 10_000
# After the watch on the security records broke, they are re-read after this back-off, doubling
# up to the most: ACL and token changes reach every service within seconds of etcd recovering.
SECURITY_RELOAD_BACKOFF_S_MIN = 0.1
SECURITY_RELOAD_BACKOFF_S_MAX = 5.0
# Validity of the certificates `highwater tls init` makes: the CA for ten years; leaf certificates
# for 825 days, the longest that browsers and most tooling still accept.
CA_VALID_DAYS = 3650
CERT_VALID_DAYS = 825

# --- gateway ---------------------------------------------------------------
# A Subscribe stream pushes at most this much per message.
SUBSCRIBE_MAX_BYTES_DEFAULT = 1024 * 1024
# The most record bytes a gateway Fetch answer (merged from every leader asked), a Subscribe poll
# or a ConsumeRecords poll carries, whatever the client asked: the brokers' default
# --fetch-max-bytes (the gateway does not know each broker's flag; one set lower answers less).
# A gateway Fetch answer is one gRPC message, so the leaders share this bound rather than each
# answering up to it (routing.leader_share), and what passes it beyond the first batch is left
# out of the answer (routing.keep_within), to be fetched again.
GATEWAY_FETCH_RESPONSE_MAX_BYTES = FETCH_RESPONSE_MAX_BYTES_DEFAULT
# --- gateway: record-level calls (ProduceRecords, ConsumeRecords; docs/GRPC.md) ---------
# Records in one ProduceRecords request. Each gets a RecordResult in the answer, and the
# request is planned in one step on the event loop; 100,000 small records take ~0.3 s of it.
PRODUCE_RECORDS_PER_REQUEST_MAX = 100_000
# A client's request id, kept with its answer so its retry writes nothing twice.
PRODUCE_REQUEST_ID_MAX_CHARS = 128
# How many finished request ids the gateway remembers, and for how long: a client retries
# within its own deadline (seconds to minutes), so 10 minutes covers any sane retry; the
# count bounds the memory (an answer holds one RecordResult per record).
PRODUCE_REQUEST_IDS_KEPT = 10_000
PRODUCE_REQUEST_ID_KEPT_MS = 10 * 60 * 1000
# The gateway cuts a partition's records into batches of at most this many bytes (estimated
# before compression), under the broker's default max.message.bytes, as a Kafka producer's
# batch.size keeps batches under it. A topic with a smaller max_message_bytes cuts smaller.
RECORD_BATCH_BYTES_TARGET = 1024 * 1024 - 4096
# Records per gateway-made batch (the security layer's records-per-batch limit is a
# per-deployment setting; this keeps gateway batches under any sane one).
RECORDS_PER_BATCH_MAX = 10_000
# A ConsumeRecords stream message holds at most this many records (default, most).
CONSUME_RECORDS_PER_MESSAGE_DEFAULT = 500
CONSUME_RECORDS_PER_MESSAGE_MAX = 10_000
# ... and at most about this many bytes of keys, values and headers (a record larger goes alone):
# decoded records of a poll (up to GATEWAY_FETCH_RESPONSE_MAX_BYTES compressed, more once
# decompressed) cut by count alone could pass the gRPC message bound and end the stream.
CONSUME_RECORDS_MESSAGE_BYTES_MAX = GRPC_MAX_MESSAGE_BYTES // 4
# The long-poll wait of each fetch a ConsumeRecords stream makes for its client.
CONSUME_FETCH_WAIT_MS = 500


def check_relations(
    *,
    lease_ttl_s: int,
    keepalive_interval_s: float,
    replica_lag_time_max_ms: int,
    replica_fetch_wait_max_ms: int,
) -> None:
    """Relations between settings that must hold, checked loudly at start-up."""
    check(
        lease_ttl_s >= LEASE_TTL_S_MIN,
        "lease_ttl_s=%s is below the minimum %s s",
        lease_ttl_s,
        LEASE_TTL_S_MIN,
    )
    check(
        keepalive_interval_s * 2 < lease_ttl_s,
        "keep-alive interval %.2f s must be well under half the lease TTL %s s",
        keepalive_interval_s,
        lease_ttl_s,
    )
    check(
        replica_fetch_wait_max_ms * 2 < replica_lag_time_max_ms,
        "replica fetch wait %s ms must be well under replica.lag.time.max.ms %s ms, or idle followers "
        "would fall out of the ISR",
        replica_fetch_wait_max_ms,
        replica_lag_time_max_ms,
    )


def check_connection_grace(*, grace_ms: int, lease_ttl_s: int, of: str = "broker") -> None:
    """--broker-connection-grace-ms (or the controllers', of="controller") in its range and under
    the lease TTL, checked at start-up."""
    check(
        BROKER_CONNECTION_GRACE_MS_MIN <= grace_ms <= BROKER_CONNECTION_GRACE_MS_MAX,
        "%s connection grace %s ms is outside [%s, %s] ms",
        of,
        grace_ms,
        BROKER_CONNECTION_GRACE_MS_MIN,
        BROKER_CONNECTION_GRACE_MS_MAX,
    )
    check(
        grace_ms < lease_ttl_s * 1000,
        "%s connection grace %s ms must be under the lease TTL %s s, or the lease would always "
        "notice a dead %s first",
        of,
        grace_ms,
        lease_ttl_s,
        of,
    )


# --- controller
# An admin call (CreateTopics, DeleteTopics, ...) waits this long for the brokers to
# acknowledge the control RPCs it caused before answering; past it the caller gets the
# answer anyway and the RPCs keep retrying in the background.
ADMIN_PROPAGATION_WAIT_S = 5.0
# Events waiting for the controller's single event loop; a full queue pushes back on
# admin callers instead of growing memory without bound.
CONTROLLER_EVENT_QUEUE_LENGTH_MAX = 10_000
# Control requests waiting to be sent to one broker; a broker this far behind is stuck,
# and its sender is replaced when it re-registers.
CONTROLLER_SENDER_QUEUE_LENGTH_MAX = 10_000
# A standby controller that wins the election waits at most this long for its copy of the
# metadata (metadata_image.MetadataFollower) to catch up to the election's revision, then
# reads etcd itself. Caught up takes milliseconds (one watch event); this bounds a standby
# still loading or whose watch broke, where a fresh load is no slower than waiting longer.
CONTROLLER_STANDBY_CATCH_UP_S_MAX = 10.0
# A standby whose etcd watch failed loads the metadata again after this pause (etcd down:
# no busy loop of full reads).
CONTROLLER_STANDBY_RELOAD_BACKOFF_S = 0.5
# Kafka's leader.imbalance.check.interval.seconds: how often the controller looks for
# brokers that lead too few of their preferred partitions.
LEADER_IMBALANCE_CHECK_INTERVAL_S = 300.0
# Kafka's leader.imbalance.per.broker.percentage: the share of a broker's preferred
# partitions led elsewhere above which preferred elections move leadership back.
LEADER_IMBALANCE_PER_BROKER_PERCENTAGE = 10

# --- gateway
# The least time between two metadata pulls from the controller, so a burst of
# stale-metadata errors from many clients costs one pull, not one each.
GATEWAY_METADATA_REFRESH_INTERVAL_MS_MIN = 50
# How long one Subscribe poll waits at a broker for new records before answering empty.
SUBSCRIBE_POLL_WAIT_MS = 500

# --- consumer groups (services/gateway/groups.py) -------------------------------------------
# A member silent this long is removed and its partitions move (its etcd lease's TTL, rounded
# up to whole seconds). Kafka's KIP-848 default is 45 s; 10 s moves a dead member's
# partitions sooner, and a heartbeat every ~0.5 s keeps a live one far from it.
GROUP_SESSION_TIMEOUT_MS_DEFAULT = 10_000
# etcd refuses leases shorter than ~1.5 election timeouts; a member may not ask for less.
GROUP_SESSION_TIMEOUT_MS_MIN = 2_000
GROUP_SESSION_TIMEOUT_MS_MAX = 300_000
# A heartbeat with nothing new for its member is held this long, woken by any change of its
# group: the next heartbeat follows at once, so this is also how often a session is refreshed.
GROUP_HEARTBEAT_LONG_POLL_MS = 500
# Compare-and-swap rounds on a group's state before a heartbeat gives up (REQUEST_TIMED_OUT,
# retriable): members of one group race only while membership changes.
GROUP_STATE_CAS_ATTEMPTS_MAX = 20
# How often every gateway checks that each member's liveness key still exists (a lease that
# expired while no gateway watched), and how long a broken watch waits before restarting.
GROUP_SWEEP_INTERVAL_MS = 5_000
GROUP_WATCH_RETRY_BACKOFF_MS = 500
# Request bounds of ConsumerGroupHeartbeat.
GROUP_SUBSCRIBED_TOPICS_MAX = 1_000
GROUP_OWNED_PARTITIONS_MAX = PARTITIONS_PER_TOPIC_MAX
GROUP_INSTANCE_ID_MAX_CHARS = 249

# --- transactions (services/transactions/coordinator.py; issue 41) ----------------------------
# TRANSACTION_TIMEOUT_MS_MAX and TRANSACTIONAL_ID_MAX_CHARS are clients/common/limits.py's (a
# producer checks them before it asks).
# Partitions and consumer groups one transaction may hold, and offsets it may have pending. The
# whole transactional id's state is one etcd value rewritten at every step: 5,000 partitions
# (~40 bytes of JSON each) plus 5,000 pending offsets (~80 bytes each) stay near 0.6 MiB, under
# etcd's 1.5 MiB value limit; Kafka Streams and Flink transactions span tens of partitions.
TRANSACTION_PARTITIONS_MAX = 5_000
TRANSACTION_GROUPS_MAX = 100
TRANSACTION_PENDING_OFFSETS_MAX = 5_000
# An idle transactional id's state is deleted after this long without a transaction (Kafka's
# transactional.id.expiration.ms, 7 days), so ids derived from one-off jobs do not pile up in etcd.
TRANSACTIONAL_ID_EXPIRATION_MS = 7 * 24 * 3_600_000
# How often the coordinator's driver looks for timed-out transactions to abort (Kafka's
# transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s): a timeout is enforced
# this much late at worst.
TRANSACTION_TIMEOUT_CHECK_INTERVAL_MS = 10_000
# How often a broker re-reads the broker set that places transactional ids on coordinators
# (services/transactions/hosting.py). When a broker leaves, its ids' prepared transactions are
# completed by their new coordinator this much later at worst: a commit's markers, and so the
# LSO of its partitions, wait about this long after a coordinator's death.
TRANSACTION_OWNERSHIP_CHECK_INTERVAL_MS = 1_000
# Reads and compare-and-swap writes one step of the coordinator's driver
# (services/transactions/driver.py) tries before it answers CONCURRENT_TRANSACTIONS (retriable):
# a write is lost only to another coordinator's write of the same id (a failover overlap or a
# producer's own concurrent calls), so a few attempts settle it; more would hide a livelock.
TRANSACTION_CAS_ATTEMPTS_MAX = 8
# Transactional ids whose last state (and its etcd revision) a transaction driver remembers, to
# compare-and-swap on without reading etcd first (services/transactions/driver.py). One entry
# is a few hundred bytes; beyond this the oldest is forgotten and costs one read when next used.
TRANSACTION_STATES_REMEMBERED_MAX = 10_000
# Rounds of WriteTxnMarkers one completion makes for the partitions not yet marked, and the pause
# between rounds (a leader election takes about this long). A transaction still unmarked after
# them stays prepared in etcd and the next timeout check (TRANSACTION_TIMEOUT_CHECK_INTERVAL_MS)
# tries again, so a partition without a leader holds up only its own transaction's completion.
TRANSACTION_MARKER_ROUNDS_MAX = 10
# A request for a transactional id whose previous transaction its coordinator is completing
# waits up to this long for the completion before it is decided (services/transactions/driver.py):
# a completion takes a few milliseconds (markers and one etcd write), while the
# CONCURRENT_TRANSACTIONS a client would get otherwise sends it into a retry backoff of its own.
# Bounded so that a completion held up by an unreachable leader answers in time (retriable).
TRANSACTION_COMPLETION_WAIT_MS = 1_000
# How long a gateway's transaction call (services/gateway/transaction_calls.py, transactions_admin.py)
# may wait for etcd before it answers COORDINATOR_NOT_AVAILABLE (retriable): the Kafka listener's
# bound for its etcd reads, so both doors give up alike.
TRANSACTION_CALL_TIMEOUT_S = 10.0
TRANSACTION_MARKER_RETRY_BACKOFF_MS = 200

# --- Kafka protocol listener (services/kafka/, docs/KAFKA.md) ---------------------------------
# One Kafka request's size prefix may say at most this; a larger one closes the connection
# before its body is read (Kafka's socket.request.max.bytes is 100 MiB; ours is the gRPC bound,
# so the two listeners accept the same largest produce).
KAFKA_REQUEST_BYTES_MAX = GRPC_MAX_MESSAGE_BYTES
# Requests one Kafka connection may have in progress; answers leave in request order, so a
# client's next request waits for a slot (librdkafka pipelines up to 1,000,000 by default;
# a long-polling Fetch must not hold back its connection's Produce, hence more than one).
KAFKA_REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX = 32
# Open Kafka connections per broker; one more is closed as soon as it is accepted.
KAFKA_CONNECTIONS_MAX = 1_000
# Connections the kernel queues for the Kafka listener before it accepts them (asyncio's default).
KAFKA_LISTEN_BACKLOG = 100
# A Kafka connection with no request for this long is closed (Kafka's connections.max.idle.ms,
# 10 minutes): clients reconnect when they need to, and forgotten ones do not hold a slot of
# KAFKA_CONNECTIONS_MAX forever.
KAFKA_CONNECTION_IDLE_MS_MAX = 600_000
# A TLS handshake on the Kafka port must finish within this, or the connection is dropped: a
# client that opens a socket and never completes the handshake holds no slot for long.
KAFKA_TLS_HANDSHAKE_TIMEOUT_S = 10.0
# Open Kafka connections per client address, below KAFKA_CONNECTIONS_MAX so that one client
# (a leak, a reconnect storm, 1,050 idle sockets) cannot take every slot and lock the others
# out (Kafka's max.connections.per.ip; Kafka's default is unbounded, and a librdkafka client
# opens about two per broker, so 100 leaves room for dozens of clients behind one NAT address).
# --kafka-connections-per-ip-overrides raises or lowers it for named addresses.
KAFKA_CONNECTIONS_PER_IP_MAX = 100
# Once a frame's size is read, its whole body must arrive within this, or the connection is
# closed (Kafka's request.timeout.ms default): a client that announces 1 MiB and sends 100 bytes
# no longer holds its connection and buffer until the idle bound. 30 s carries a 64 MiB
# request at 2.2 MiB/s.
KAFKA_REQUEST_BODY_TIMEOUT_MS = 30_000
# Bytes of frames read in part, summed over every connection of a broker: a body is read in
# KAFKA_FRAME_READ_CHUNK_BYTES pieces, each counted before it is read, and the connection whose
# next piece would pass this is closed. Eight connections announcing 60 MiB and sending all but a
# byte once took a broker from ~190 to ~700 MiB RSS. Twice KAFKA_REQUEST_BYTES_MAX, so two of the
# largest produces can arrive at once (checked: at least one request's bound).
KAFKA_PARTIAL_FRAME_BYTES_MAX = 2 * KAFKA_REQUEST_BYTES_MAX
# The piece a request body is read in (and counted against KAFKA_PARTIAL_FRAME_BYTES_MAX): a body
# of this size or less is read at once, a larger one never buffers more than announced-and-arrived.
KAFKA_FRAME_READ_CHUNK_BYTES = 1024 * 1024
# Refused Kafka connections are logged at most once per this interval, with how many were
# refused since, so a client retrying in a loop cannot fill the log.
KAFKA_REFUSAL_LOG_INTERVAL_S = 10.0
# How long Metadata may reuse the registered brokers' Kafka addresses read from etcd.
KAFKA_BROKER_LIST_CACHE_MS = 1_000
# One call a Kafka request makes to the controller or etcd (InitProducerId, admin requests,
# offset commits) waits at most this long; it is answered REQUEST_TIMED_OUT after.
KAFKA_BACKEND_CALL_TIMEOUT_S = 10.0
# DeleteRecords (Kafka's API 21): how long the leader waits for every ISR member to take the new
# log start offset before answering REQUEST_TIMED_OUT for the partition (Kafka's DeleteRecords
# timeout; its admin clients send 30 s, request.timeout.ms). Followers take it from their next
# Fetch answers, one or two REPLICA_FETCH_WAIT_MAX_MS rounds; the cap bounds how long a request
# can hold its slot in the purgatory, as PRODUCE_TIMEOUT_MS_MAX does for acks=all.
DELETE_RECORDS_TIMEOUT_MS_DEFAULT = 30_000
DELETE_RECORDS_TIMEOUT_MS_MAX = 300_000
# Incremental fetch sessions (KIP-227, services/kafka/fetch_sessions.py). Sessions one broker
# keeps (Kafka's max.incremental.fetch.session.cache.slots, default 1,000): a consumer past it is
# served full Fetches, as without sessions, until an old session can be evicted.
KAFKA_FETCH_SESSION_CACHE_SLOTS = 1_000
# A session is evicted for a new one only after it has lived this long (or went unused this long;
# Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS, 2 minutes): clients opening sessions in a loop
# cannot push out the ones in use.
KAFKA_FETCH_SESSION_EVICTION_MS = 120_000
# Partitions in one session and over all sessions of a broker (Kafka bounds neither). A cached
# partition costs ~320 bytes (measured), so the cache holds at most ~64 MiB; 20,000 per session is
# twice the 10,000 partitions of a whole cluster in our scale benchmark. A Fetch past either is
# served without a session.
KAFKA_FETCH_SESSION_PARTITIONS_MAX = 20_000
KAFKA_FETCH_SESSION_CACHE_PARTITIONS_MAX = 200_000
# An event-loop stall this long or longer is logged with the stack the loop was in
# (services/common/loop_stalls.py; every stall goes to highwater_event_loop_stall_seconds). A
# request that waits 100 ms behind one callback is a tail worth a line; shorter stalls on a
# loaded two-core machine are common enough to drown the log (HIGHWATER_LOOP_STALL_RECORD_MS
# lowers it for a benchmark).
LOOP_STALL_RECORD_MS = 100
