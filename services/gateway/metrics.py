"""Gateway metrics."""

from __future__ import annotations

from prometheus_client import Histogram

REQUEST_LATENCY = Histogram(
    "highwater_gateway_request_latency_seconds",
    "Gateway RPC latency",
    ["rpc"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
