"""Malformed requests in plaintext mode (services/common/request_guard.py), on an in-process gRPC server."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from protos.highwater.v1 import common_pb2, gateway_pb2_grpc
from services.common.request_guard import MalformedRequestGuard

PRODUCE = "/highwater.v1.GatewayService/Produce"
SUBSCRIBE = "/highwater.v1.GatewayService/Subscribe"


async def call_with(
    payloads: list[bytes], method: str = PRODUCE, stream: bool = False
) -> list[tuple[grpc.StatusCode, str]]:
    server = grpc.aio.server(interceptors=[MalformedRequestGuard()])
    # The base servicer answers UNIMPLEMENTED: a request that parses reaches it.
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(gateway_pb2_grpc.GatewayServiceServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    statuses = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for payload in payloads:
                try:
                    if stream:
                        async for _ in channel.unary_stream(method)(payload, timeout=5):
                            pass
                    else:
                        await channel.unary_unary(method)(payload, timeout=5)
                    statuses.append((grpc.StatusCode.OK, ""))
                except grpc.aio.AioRpcError as exc:
                    statuses.append((exc.code(), exc.details() or ""))
    finally:
        await server.stop(None)
    return statuses


def test_malformed_requests_are_invalid_argument_and_logged_once_not_a_traceback_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    statuses = asyncio.run(call_with([b"\xff\xff\xff\xff garbage"] * 20))
    assert {code for code, _ in statuses} == {grpc.StatusCode.INVALID_ARGUMENT}
    assert "do not parse as the request of /highwater.v1.GatewayService/Produce" in statuses[0][1]
    assert "Traceback" not in caplog.text
    assert len([r for r in caplog.records if "malformed" in r.getMessage()]) == 1


def test_a_request_that_parses_reaches_the_servicer() -> None:
    statuses = asyncio.run(call_with([common_pb2.ProduceRequest(acks=1).SerializeToString()]))
    assert statuses[0][0] == grpc.StatusCode.UNIMPLEMENTED


def test_a_malformed_stream_request_is_refused_the_same_way() -> None:
    statuses = asyncio.run(call_with([b"\xff\xff\xff\xff"], method=SUBSCRIBE, stream=True))
    assert statuses[0][0] == grpc.StatusCode.INVALID_ARGUMENT
