"""One logical connection to the gateways: grpc.aio channels with failover (aiokafka's conn.py).

Gateways are stateless, so any of them will do. `GatewayConnection.call` sends an
RPC to the current gateway; when that gateway cannot be reached (the channel
will not connect, or the call ends UNAVAILABLE/CANCELLED because it stopped) the
next address is tried, round after round with a short back-off, until
`connect_timeout_ms` has passed without any gateway accepting a connection. Then
GatewayUnavailable names every address tried and the last reason, in one line.
The rules of that walk are clients/common/failover.py's, which the Spark connector's
blocking client follows too; the channels are the transport package's
(clients/common/transport/channels.py). This module is their asyncio driver.

Other whole-request failures become typed errors (clients/errors.py); a call that
takes longer than `request_timeout_ms` once connected is RequestTimedOut.

A caller with a deadline of its own (poll(timeout_ms), commit's timeout, a batch's
delivery_timeout_ms, send()'s max_block_ms) bounds every call it makes, connecting and
failing over included: `call(..., deadline=)` for one call, or `call_deadline()` around a
block of code for every call made in it (a context variable, so it reaches calls made by
helpers without passing it through each of them). A call cut by such a deadline raises
RequestTimedOut (or GatewayUnavailable when no gateway could be reached before it).

Owned by one event loop: the channels are grpc.aio objects bound to the loop that
created them, so every method must run on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import grpc

from clients.common.errors import (
    ClusterAuthorizationFailed,
    HighwaterError,
    InvalidRequest,
    MessageTooLarge,
    RequestTimedOut,
    UnknownServerError,
)
from clients.common.failover import BootstrapError, GatewayRotation, bootstrap_addresses

# CHANNEL_OPTIONS, UNREACHABLE_CODES and wait_connected are the transport package's, under the
# names this module has always exported them by.
from clients.common.transport.channels import CHANNEL_OPTIONS as CHANNEL_OPTIONS
from clients.common.transport.channels import UNREACHABLE_CODES as UNREACHABLE_CODES
from clients.common.transport.channels import aio_channel, unreachable_reason
from clients.common.transport.channels import wait_connected as wait_connected
from clients.common.transport.tls import ClientTls, ClientTlsError
from clients.config import ConnectionConfig
from clients.errors import ClientClosed, GatewayUnavailable, InvalidArgument
from protos.highwater.v1 import gateway_pb2_grpc

log = logging.getLogger("highwater.client.connection")

# The deadline (time.monotonic() seconds, None: none) that bounds every call made in the
# current context; set with `call_deadline`. A task copies it when created, so a task that
# must outlive its creator's deadline (a group member's heartbeats) starts in a clean context.
_CALL_DEADLINE_S: ContextVar[float | None] = ContextVar("highwater_call_deadline_s", default=None)


def current_call_deadline() -> float | None:
    """The deadline (time.monotonic() seconds) bounding calls made here now; None: none."""
    return _CALL_DEADLINE_S.get()


def _earliest(first: float | None, second: float | None) -> float | None:
    if first is None:
        return second
    return first if second is None else min(first, second)


@contextlib.contextmanager
def call_deadline(deadline_s: float | None) -> Iterator[None]:
    """Bound every GatewayConnection.call made inside the block by `deadline_s`
    (time.monotonic() seconds; None adds no bound). Nested blocks keep the earlier deadline."""
    token = _CALL_DEADLINE_S.set(_earliest(_CALL_DEADLINE_S.get(), deadline_s))
    try:
        yield
    finally:
        _CALL_DEADLINE_S.reset(token)


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[str]:
    """'host:port,host:port' (or a list of them) -> ['host:port', ...]; InvalidArgument if malformed."""
    try:
        return bootstrap_addresses(bootstrap)
    except BootstrapError as error:
        raise InvalidArgument(str(error)) from None


class GatewayConnection:
    """Channels to every known gateway address and the failover loop over them."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: int,
        connect_timeout_ms: int,
        retry_backoff_ms: int,
        tls: ClientTls | None = None,
    ) -> None:
        self.bootstrap_addresses = parse_bootstrap(bootstrap)
        self.tls = tls
        # Kafka's KIP-219: a response with throttle_time_ms mutes the connection that long.
        self._throttled_until = 0.0
        self.rotation = GatewayRotation(self.bootstrap_addresses)
        self.request_timeout_ms = request_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, gateway_pb2_grpc.GatewayServiceStub] = {}
        self._closed = False
        # True once any gateway has answered a call: later outages are transient, not a wrong address.
        self.ever_answered = False

    @classmethod
    def from_config(cls, config: ConnectionConfig) -> GatewayConnection:
        """The connection a client's settings ask for (bootstrap, timeouts, TLS and token):
        every client builds its connection here, so a new connection setting is passed once.
        Raises InvalidArgument for unusable TLS settings."""
        return cls(
            config.bootstrap,
            request_timeout_ms=config.request_timeout_ms,
            connect_timeout_ms=config.connect_timeout_ms,
            retry_backoff_ms=config.retry_backoff_ms,
            tls=client_tls(config),
        )

    @property
    def addresses(self) -> list[str]:
        """Every gateway address known: the bootstrap ones, then those Metadata named."""
        return self.rotation.addresses

    @property
    def current_address(self) -> str:
        return self.rotation.current

    def learn_gateways(self, addresses: Sequence[str]) -> None:
        """Add gateways that Metadata reported, after the bootstrap ones, for failover."""
        self.rotation.learn(addresses)

    def _stub(self, address: str) -> gateway_pb2_grpc.GatewayServiceStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = aio_channel(address, self.tls)
            self._channels[address] = channel
            # The generated *_pb2_grpc stubs carry no annotations (pyproject.toml, [tool.mypy]).
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)  # type: ignore[no-untyped-call]
            self._stubs[address] = stub
        return stub

    async def call(
        self, method: str, request: Any, *, timeout_ms: int | None = None, deadline: float | None = None
    ) -> Any:
        """Send `request` to GatewayService.`method` on the first gateway that answers.

        `timeout_ms` (default request_timeout_ms) bounds the RPC once a gateway is
        connected. `deadline` (time.monotonic() seconds) and the enclosing `call_deadline`
        bound the whole call, connecting and failing over included. Raises
        GatewayUnavailable, RequestTimedOut or another HighwaterError.
        """
        if self._closed:
            raise ClientClosed(f"connection to {', '.join(self.bootstrap_addresses)} is closed")
        deadline = _earliest(deadline, _CALL_DEADLINE_S.get())
        rpc_timeout_s = (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        throttled_s = self._throttled_until - time.monotonic()
        if throttled_s > 0:
            if deadline is not None:
                throttled_s = min(throttled_s, max(0.0, deadline - time.monotonic()))
            await asyncio.sleep(throttled_s)
        started = time.monotonic()
        connect_deadline = started + self.connect_timeout_ms / 1000
        if deadline is not None:
            connect_deadline = min(connect_deadline, deadline)
        walk = self.rotation.walk(connect_deadline, pause_s=self.retry_backoff_ms / 1000)
        while True:
            address = self.rotation.current
            if deadline is not None and time.monotonic() >= deadline:
                waited_ms = (time.monotonic() - started) * 1000
                raise RequestTimedOut(
                    f"{method}: the caller's deadline passed after {waited_ms:.0f} ms before a gateway "
                    f"answered ({walk.tried()})"
                )
            stub = self._stub(address)
            why = await wait_connected(self._channels[address], connect_deadline)
            if not why:
                attempt_timeout_s = rpc_timeout_s
                if deadline is not None:
                    attempt_timeout_s = max(0.0, min(attempt_timeout_s, deadline - time.monotonic()))
                try:
                    response = await getattr(stub, method)(request, timeout=attempt_timeout_s)
                    self.ever_answered = True
                    throttle_ms = getattr(response, "throttle_time_ms", 0)
                    if throttle_ms > 0:
                        log.debug("%s at %s: throttled for %d ms (quota)", method, address, throttle_ms)
                        self._throttled_until = max(
                            self._throttled_until, time.monotonic() + throttle_ms / 1000
                        )
                    return response
                except grpc.aio.AioRpcError as error:
                    if error.code() not in UNREACHABLE_CODES:
                        raise error_from_status(error, method, address) from None
                    why = unreachable_reason(error)
            log.debug("gateway %s unusable for %s: %s", address, method, why)
            pause_s = walk.failed(address, why, time.monotonic())
            if pause_s is None:
                raise GatewayUnavailable(self._unavailable_message(walk.tried(), started))
            if pause_s > 0:
                await asyncio.sleep(pause_s)

    def _unavailable_message(self, tried: str, started: float) -> str:
        waited_ms = (time.monotonic() - started) * 1000
        bound = (
            f"within {self.connect_timeout_ms} ms (connect_timeout_ms)"
            if waited_ms >= self.connect_timeout_ms
            else f"within {waited_ms:.0f} ms (the caller's deadline)"
        )
        return f"no gateway answered {bound}: {tried}"

    async def close(self) -> None:
        """Close every channel; calls in flight end CANCELLED."""
        self._closed = True
        channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            await channel.close(grace=None)


def client_tls(config: Any) -> ClientTls | None:
    """The TLS and token credentials a ConnectionConfig asks for (None: plaintext);
    InvalidArgument if unusable.
    """
    try:
        return ClientTls.from_settings(
            ssl_cafile=config.ssl_cafile,
            ssl_certfile=config.ssl_certfile,
            ssl_keyfile=config.ssl_keyfile,
            auth_token=config.auth_token,
        )
    except ClientTlsError as exc:
        raise InvalidArgument(str(exc)) from None


def error_from_status(
    error: grpc.aio.AioRpcError | grpc.RpcError, method: str, address: str, *, role: str = "gateway"
) -> HighwaterError:
    """The typed error for a whole-request gRPC failure other than UNAVAILABLE.

    UNAVAILABLE is not mapped here: the connection fails over to the next gateway
    and raises GatewayUnavailable only when none is left.
    """
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else "") or ""
    where = f"{method} at {role} {address}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimedOut(f"{where}: no answer before the deadline")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(f"{where}: {details}")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return ClusterAuthorizationFailed(f"{where}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return MessageTooLarge(f"{where}: {details}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return UnknownServerError(f"{where}: the {role} does not implement this call")
    return UnknownServerError(f"{where}: {code.name if code else 'UNKNOWN'}: {details}")
