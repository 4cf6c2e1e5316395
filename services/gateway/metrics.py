"""Gateway metrics, including the consumer groups it serves (services/gateway/groups.py)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUEST_LATENCY = Histogram(
    "highwater_gateway_request_latency_seconds",
    "Gateway RPC latency",
    ["rpc"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

# Consumer groups. Every gateway serves every group, so these count what this gateway did or
# saw; sum the counters over gateways, and read a gauge from any one of them.
GROUP_REBALANCES = Counter(
    "highwater_group_rebalances_total",
    "Group epoch bumps this gateway wrote (a member joined, left or expired, or a subscription "
    "or partition count changed)",
    ["group"],
)
GROUP_MEMBERS = Gauge("highwater_group_members", "Members of the group (as of the last sweep)", ["group"])
GROUP_LAG = Gauge(
    "highwater_group_lag_records",
    "Records of the group's committed partitions not yet committed: end offset - committed, summed "
    "(as of the last sweep)",
    ["group"],
)
GROUP_ASSIGNMENT_SECONDS = Histogram(
    "highwater_group_assignment_seconds",
    "Time of one coordinator step that changed a group's state (heartbeat or expiry, assignor included)",
    buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)

# The gateway's registration (/gateways/ids/{id}, services/gateway/registration_life.py): a
# lost lease is registered again with the same id; a loss without a registration after it
# means the gateway is stopping.
GATEWAY_REGISTRATIONS = Counter(
    "highwater_gateway_registrations_total",
    "Registrations of this gateway in etcd: 1 at start, one more per lease lost and registered again",
)
GATEWAY_LEASE_LOSSES = Counter(
    "highwater_gateway_lease_losses_total",
    "Times this gateway's etcd lease was lost (its registration gone) while it ran",
)
