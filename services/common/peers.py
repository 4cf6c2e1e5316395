"""gRPC channels to other Highwater processes, cached by address.

Thin: a dictionary of grpc.aio channels and stubs. Callers own timeouts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from protos.highwater.v1 import broker_pb2_grpc, controller_pb2_grpc, gateway_pb2_grpc
from services.common.server import channel_options
from services.security.channels import open_channel

S = TypeVar("S")


class PeerChannels:
    """One channel per address, reused for every call to that process."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, str], Any] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_channel(address, channel_options())
        return ch

    def _stub(self, kind: str, address: str, factory: Callable[[grpc.aio.Channel], S]) -> S:
        key = (kind, address)
        stub: S | None = self._stubs.get(key)  # the stub `factory` made for this key before
        if stub is None:
            stub = self._stubs[key] = factory(self.channel(address))
        return stub

    def broker(self, address: str) -> broker_pb2_grpc.BrokerServiceStub:
        return self._stub("broker", address, broker_pb2_grpc.BrokerServiceStub)

    def controller(self, address: str) -> controller_pb2_grpc.ControllerServiceStub:
        return self._stub("controller", address, controller_pb2_grpc.ControllerServiceStub)

    def gateway(self, address: str) -> gateway_pb2_grpc.GatewayServiceStub:
        return self._stub("gateway", address, gateway_pb2_grpc.GatewayServiceStub)

    def serialized(self, address: str, method: str, response_type: Any) -> Any:
        """A unary call on address's channel taking its request already encoded (bytes).

        method: the full gRPC name ("/highwater.v1.BrokerService/UpdateMetadata"); the answer is
        parsed into response_type as a stub's would be.
        """
        return self._stub(
            method,
            address,
            lambda ch: ch.unary_unary(
                method, request_serializer=None, response_deserializer=response_type.FromString
            ),
        )

    async def drop(self, address: str) -> None:
        ch = self._channels.pop(address, None)
        self._stubs = {k: v for k, v in self._stubs.items() if k[1] != address}
        if ch is not None:
            await ch.close()

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        self._stubs.clear()
