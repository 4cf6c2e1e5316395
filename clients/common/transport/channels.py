"""gRPC channels as every client makes them: the options, TLS, and when a peer counts as gone.

One home for what the asyncio client library (clients/connection.py, clients/leaders.py),
the Spark connector's blocking client (spark_connector/gateway.py) and the servers' calls to
one another share: a channel to the same address with the same credentials is made the same
way on both sides, and "this process is not there" means the same status codes everywhere.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from clients.common.limits import GRPC_MAX_MESSAGE_BYTES
from clients.common.transport.tls import ClientTls

# gRPC channel reconnect back-off after a gateway restart (gRPC's own first back-off is 1 s,
# too slow for a gateway that is back in a few hundred ms).
GRPC_RECONNECT_BACKOFF_MS_INITIAL = 100
GRPC_RECONNECT_BACKOFF_MS_MAX = 1_000
# gRPC keep-alive: ping an idle channel this often, and call the peer dead when a ping
# is not answered within the timeout.
GRPC_KEEPALIVE_INTERVAL_MS = 30_000
GRPC_KEEPALIVE_TIMEOUT_MS = 10_000

# Channel options: the services' message bound, quick reconnects after a gateway
# restart, keep-alives to notice a dead peer.
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", GRPC_RECONNECT_BACKOFF_MS_INITIAL),
    ("grpc.min_reconnect_backoff_ms", GRPC_RECONNECT_BACKOFF_MS_INITIAL),
    ("grpc.max_reconnect_backoff_ms", GRPC_RECONNECT_BACKOFF_MS_MAX),
    ("grpc.keepalive_time_ms", GRPC_KEEPALIVE_INTERVAL_MS),
    ("grpc.keepalive_timeout_ms", GRPC_KEEPALIVE_TIMEOUT_MS),
]

# Status codes that mean "this process is not there (any more)": try another gateway, or
# look the partition's leader up again.
UNREACHABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


def aio_channel(address: str, tls: ClientTls | None) -> grpc.aio.Channel:
    """A grpc.aio channel to `address` with the clients' options, over TLS when `tls` is set."""
    if tls is not None:
        return tls.aio_channel(address, CHANNEL_OPTIONS)
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


def blocking_channel(address: str, tls: ClientTls | None) -> grpc.Channel:
    """A blocking channel to `address` with the clients' options, over TLS when `tls` is set."""
    if tls is not None:
        return tls.channel(address, CHANNEL_OPTIONS)
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


def unreachable_reason(error: grpc.RpcError) -> str:
    """Why a call that ended with one of UNREACHABLE_CODES failed, in a few words."""
    return f"{error.code().name}: {error.details() or ''}".rstrip(": ")


async def wait_connected(channel: grpc.aio.Channel, deadline: float) -> str:
    """'' once `channel` is READY, else why not (before `deadline`, time.monotonic() seconds)."""
    state = channel.get_state(try_to_connect=True)
    while state != grpc.ChannelConnectivity.READY:
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return "connection failed"
        if state == grpc.ChannelConnectivity.SHUTDOWN:
            return "channel shut down"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "no connection before the connect timeout"
        try:
            await asyncio.wait_for(channel.wait_for_state_change(state), remaining)
        except TimeoutError:
            return "no connection before the connect timeout"
        state = channel.get_state(try_to_connect=True)
    return ""


def wait_ready_blocking(channel: grpc.Channel, timeout_s: float) -> str:
    """'' once the blocking `channel` is READY within `timeout_s`, else why not."""
    ready = grpc.channel_ready_future(channel)
    try:
        ready.result(timeout=timeout_s)
        return ""
    except grpc.FutureTimeoutError:
        # Stop watching: grpc otherwise polls the channel's state for as long as it lives.
        ready.cancel()
        return "no connection"
