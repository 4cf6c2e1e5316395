"""Calls the gateway passes through to the active controller: topic and partition admin,
DescribeCluster, InitProducerId, ACLs and tokens.

The gateway answers none of them itself: it finds the active controller in etcd, follows one
NOT_CONTROLLER redirect at a time (at most CONTROLLER_REDIRECTS_MAX), and after a call that
changes topics or leaders pulls fresh metadata so its next routing sees the change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from protos.highwater.v1 import common_pb2
from services.gateway import metrics
from services.gateway.cluster_view import ClusterView

# The response message type of one call passed through to the controller.
R = TypeVar("R")

# Statuses of the controller's own authorization checks, passed on as they are.
AUTHORIZATION_STATUSES = frozenset({grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED})
# Calls after which the gateway's metadata is stale: pulled again before answering, so the
# client's next call through this gateway routes to what the call made.
METADATA_CHANGING_RPCS = frozenset(
    {"CreateTopics", "DeleteTopics", "CreatePartitions", "ElectLeaders", "AlterTopicConfigs"}
)
# Controllers asked per call: the one etcd names, then the ones NOT_CONTROLLER redirects to
# (a redirect chain longer than an election or two is not converging; the client retries).
CONTROLLER_REDIRECTS_MAX = 3
# How long one call to the controller may take (admin calls wait for the control RPCs their
# change caused, so a created topic is usable when CreateTopics returns).
CONTROLLER_CALL_TIMEOUT_S = 30.0


class ControllerCalls:
    """Pass-through to the active controller, found through the view's store."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    async def call(
        self,
        rpc: str,
        request: Any,
        response_cls: Callable[..., R],
        context: grpc.aio.ServicerContext | None = None,
    ) -> R:
        """Call the active controller; follow NOT_CONTROLLER redirects.

        With `context`, a refusal of the controller's own authorization (it re-checks the
        forwarded principal) is passed on to the client as that status, not as a
        retriable NOT_CONTROLLER: the ACL and token calls give it.
        """
        with metrics.REQUEST_LATENCY.labels(rpc).time():
            return await self._call(rpc, request, response_cls, context)

    async def _call(
        self,
        rpc: str,
        request: Any,
        response_cls: Callable[..., R],
        context: grpc.aio.ServicerContext | None,
    ) -> R:
        address = await self.view.controller_address()
        for _ in range(CONTROLLER_REDIRECTS_MAX):
            if address is None:
                return response_cls(
                    error_code=common_pb2.NOT_CONTROLLER,
                    error_message="no controller is active; start one or retry shortly",
                )
            try:
                # The generated stubs are untyped: the answer is the response_cls message.
                answer = await getattr(self.view.peers.controller(address), rpc)(
                    request, timeout=CONTROLLER_CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                if context is not None and exc.code() in AUTHORIZATION_STATUSES:
                    await context.abort(exc.code(), f"the controller refused: {exc.details()}")
                return response_cls(
                    error_code=common_pb2.NOT_CONTROLLER,
                    error_message=f"controller at {address} could not be reached: {exc.code().name}",
                )
            resp: R = answer
            if answer.error_code == common_pb2.NOT_CONTROLLER and answer.active_controller.port:
                address = f"{answer.active_controller.host}:{answer.active_controller.port}"
                continue
            if rpc in METADATA_CHANGING_RPCS:
                await self.view.refresh_metadata(force=True)
            return resp
        return resp

    async def init_producer_id(
        self, request: common_pb2.InitProducerIdRequest
    ) -> common_pb2.InitProducerIdResponse:
        """A producer id for the gateway's own idempotent writes (record_producer.py)."""
        return await self.call("InitProducerId", request, common_pb2.InitProducerIdResponse)
