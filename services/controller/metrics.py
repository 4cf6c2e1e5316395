"""Controller metrics, named after Kafka's where they mean the same thing."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ACTIVE_CONTROLLER_COUNT = Gauge("highwater_active_controller_count", "1 on the active controller, else 0")
CONTROLLER_EPOCH = Gauge("highwater_controller_epoch", "Epoch of this controller while active")
OFFLINE_PARTITIONS = Gauge("highwater_offline_partitions_count", "Partitions with no live leader")
GLOBAL_PARTITION_COUNT = Gauge("highwater_global_partition_count", "Partitions in the cluster")
UNCLEAN_ELECTIONS = Counter("highwater_unclean_leader_elections", "Leaders chosen from outside the ISR")
EVENT_QUEUE_TIME = Histogram(
    "highwater_controller_event_queue_time_seconds", "Time an event waited in the queue", ["event"]
)
EVENT_PROCESSING_TIME = Histogram(
    "highwater_controller_event_processing_seconds", "Time to decide and commit an event", ["event"]
)
# Admin calls and the brokers' AlterPartition / ControlledShutdown, as the active
# controller answers them (event queue wait and etcd commit included).
REQUEST_LATENCY = Histogram(
    "highwater_controller_request_latency_seconds",
    "Controller RPC latency",
    ["rpc"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
# Leases the controller revoked because a broker's BrokerHeartbeat stream ended and the same
# incarnation did not reopen it within --broker-connection-grace-ms (each then handled as a
# broker failure by the registration watch).
BROKER_CONNECTION_REVOCATIONS = Counter(
    "highwater_controller_broker_connection_lease_revocations",
    "Broker leases revoked because the broker's connection closed and was not reopened in time",
)
BROKER_CONNECTIONS = Gauge(
    "highwater_controller_connected_brokers",
    "Broker incarnations with a liveness stream open to this controller (0 unless active)",
)
# etcd's database, as the controller reads it every ETCD_STATUS_POLL_INTERVAL_S (every
# controller, active or standing by: they share one etcd). Alert well before size reaches
# quota: at the quota etcd raises NOSPACE and refuses every write (deploy/README.md).
ETCD_DB_SIZE_BYTES = Gauge("highwater_etcd_db_size_bytes", "Size of etcd's backend database file")
ETCD_DB_SIZE_IN_USE_BYTES = Gauge(
    "highwater_etcd_db_size_in_use_bytes", "Bytes of etcd's database holding data (the rest is reusable)"
)
ETCD_QUOTA_BYTES = Gauge("highwater_etcd_quota_bytes", "etcd's backend space quota (--quota-backend-bytes)")
ETCD_NOSPACE_ALARM = Gauge("highwater_etcd_nospace_alarm", "1 while etcd's NOSPACE alarm is raised, else 0")
ETCD_REVISION = Gauge("highwater_etcd_revision", "etcd's current revision (one per write)")
