"""Every bound of the coordinator package in one place, with its unit in its name and why.

Relations between these settings are checked where they meet (LeaseKeeper checks the
keep-alive interval against the lease TTL at start). Service-level settings (the
brokers' lease TTL and so on) live in services/common/limits.py and are passed in.
"""

from __future__ import annotations

# --- requests to etcd --------------------------------------------------------
# Every unary etcd call (get, put, txn, lease grant/revoke/keep-alive) gives up after
# this long in total, retries included, and raises CoordinatorUnavailable. Local etcd
# answers in about a millisecond; five seconds rides out a leader election in a
# three-node etcd cluster (election timeout 1 s by default) without hanging a caller.
ETCD_REQUEST_TIMEOUT_S = 5.0
# EtcdStore.connect keeps trying for this long by default before it gives up: long
# enough for `highwater cluster up` to start etcd and the services side by side.
ETCD_CONNECT_TIMEOUT_S = 5.0
# Pause between connection attempts inside EtcdStore.connect.
ETCD_CONNECT_RETRY_S = 0.1
# Attempts etcd3aio makes for an idempotent request (get, put, delete, lease calls)
# that fails UNAVAILABLE / DEADLINE_EXCEEDED, inside ETCD_REQUEST_TIMEOUT_S.
ETCD_REQUEST_ATTEMPTS_MAX = 3
# A transaction is sent exactly once: a retried compare-and-swap whose first attempt
# was applied but whose answer was lost would come back "failed" for the wrong reason.
ETCD_TXN_ATTEMPTS_MAX = 1
# gRPC's channel backs off up to 120 s between reconnects by default; after an etcd
# restart that would leave every service blind for minutes. Cap the back-off.
ETCD_RECONNECT_BACKOFF_MS_MIN = 100
ETCD_RECONNECT_BACKOFF_MS_MAX = 1_000
# A range read asks for at most this many keys per response and pages through the
# rest at the first page's revision, so one answer never nears the message limit.
ETCD_RANGE_PAGE_KEYS = 1_000
# gRPC's client default of 4 MiB per received message is below what one page of
# large values (up to ETCD_REQUEST_BYTES_MAX each) may need.
ETCD_RESPONSE_BYTES_MAX = 64 * 1024 * 1024
# etcd's own server-side limits (defaults of --max-txn-ops and --max-request-bytes).
# MemoryStore enforces them too, so the simulation catches a controller write that
# real etcd would refuse.
ETCD_TXN_OPS_MAX = 128
ETCD_REQUEST_BYTES_MAX = 1536 * 1024

# --- watches -----------------------------------------------------------------
# A broken watch stream (etcd restarted, connection reset) is re-opened from the
# revision after the last delivered event, backing off between these bounds.
WATCH_RECONNECT_BACKOFF_S_MIN = 0.1
WATCH_RECONNECT_BACKOFF_S_MAX = 2.0

# --- leases ------------------------------------------------------------------
# The default keep-alive interval is the TTL divided by this: three keep-alives may
# be lost before the lease is in danger.
LEASE_KEEPALIVES_PER_TTL = 4
# The keep-alive interval must stay below this fraction of the TTL, or a single lost
# keep-alive (or one slow etcd answer) expires the lease.
LEASE_KEEPALIVE_INTERVAL_TTL_RATIO_MAX = 0.5
# The shortest lease TTL we ask for; etcd itself rounds a shorter TTL up to
# 1.5 x its election timeout.
LEASE_TTL_S_MIN = 1

# --- controller election -----------------------------------------------------
# A candidate that cannot reach etcd retries its campaign with a back-off capped here.
ELECTION_RETRY_BACKOFF_S_MIN = 0.1
ELECTION_RETRY_BACKOFF_S_MAX = 2.0

# --- the local etcd server (etcd_server.py) ----------------------------------
# How long `start()` waits for a fresh etcd to answer its health check; a healthy
# single-node etcd is ready in well under a second on loopback.
ETCD_SERVER_START_TIMEOUT_S = 10.0
# Ports picked here are free when picked but another process may bind them before etcd does; etcd is started
# again on fresh ports this many times in all before the start fails.
ETCD_SERVER_PORT_PICK_ATTEMPTS = 3
# SIGTERM grace before SIGKILL on stop().
ETCD_SERVER_STOP_TIMEOUT_S = 5.0
# Raft timings of the local single-node server: short, so a restart elects itself at
# once and the minimum lease TTL is 1 s (etcd: 1.5 x election timeout, rounded up).
ETCD_SERVER_HEARTBEAT_INTERVAL_MS = 50
ETCD_SERVER_ELECTION_TIMEOUT_MS = 500
# Health probes while starting: each bounded, with a short pause between them.
ETCD_SERVER_HEALTH_PROBE_TIMEOUT_S = 1.0
ETCD_SERVER_HEALTH_PROBE_INTERVAL_S = 0.05
# How much of etcd's log a failed start quotes in its exception.
ETCD_SERVER_LOG_TAIL_BYTES = 4_000
# etcd keeps every revision of every key until it is compacted, and every offset commit is
# a write: without compaction a cluster whose consumers commit grows etcd until its space
# quota raises the NOSPACE alarm and every write fails. etcd compacts its history itself
# (--auto-compaction-mode=periodic), keeping this much of it. Five minutes is far longer
# than any watch of ours needs to resume after a broken stream (seconds: an etcd restart,
# a reset connection), and a watcher that is further behind gets "required revision has
# been compacted" (WatchCompacted) and re-reads what it follows. etcd's duration syntax.
ETCD_AUTO_COMPACTION_RETENTION = "5m"
# etcd's backend space quota (--quota-backend-bytes); etcd's own default, passed
# explicitly so the number operators see in `cluster describe` is the one in force.
# etcd older than 3.6 does not report its quota in Status: the controller shows this one.
ETCD_QUOTA_BACKEND_BYTES = 2 * 1024 * 1024 * 1024
# Writes etcd keeps in its in-memory raft log before it snapshots and drops all but the last
# 5,000 (--snapshot-count). etcd 3.4's default, 100,000, let a cluster whose consumers commit
# grow etcd's memory by ~20 MiB an hour for hours (bench/RESULTS.md, "Soak"): every offset
# commit is an entry, ~1.7 KiB of it in memory. 10,000 is etcd 3.5's own default, lowered for
# that reason; with it etcd's memory levels off after ~10,000 writes.
ETCD_SNAPSHOT_COUNT = 10_000

# --- etcd's size (etcd_status.py) ---------------------------------------------
# The controller reads etcd's database size, quota and alarms this often for its metrics
# and `cluster describe`: two small reads, and the database grows by well under its quota
# in a minute even at the commit rates bench/RESULTS.md measured.
ETCD_STATUS_POLL_INTERVAL_S = 15.0

# --- MemoryStore -------------------------------------------------------------
# Revisions of history kept for watches that start in the past (etcd keeps history
# until compaction). A watcher further behind than this gets WatchCompacted, as it
# would from etcd after a compaction.
MEMORY_STORE_HISTORY_REVISIONS_MAX = 100_000

# A restarted process waits this much beyond the lease TTL for its previous
# incarnation's registration to expire before giving up.
REGISTRATION_RETRY_MARGIN_S = 5.0
REGISTRATION_RETRY_INTERVAL_S = 0.25
# A broker that lost its lease registers again for at most this many lease TTLs, pausing this
# long between attempts, then stops: without a registration the controller ignores it.
LEASE_REREGISTER_TTLS_MAX = 10
LEASE_REREGISTER_BACKOFF_S = 0.5
