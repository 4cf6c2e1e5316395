"""Control requests on their way to brokers and gateways: one sender task per broker
incarnation (Kafka's RequestSendThread), so a slow or paused broker never stalls the
controller's event loop (event_loop.py), and requests reach each broker in the order they
were decided. When a request is sent again is sender_rules.py's pure rule; the simulation
stands in its own sender for this one (tests/sim/sim_controller_loop.SimSender).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from protos.highwater.v1 import common_pb2
from services.common import limits
from services.common.peers import PeerChannels
from services.controller import sender_rules, wire

log = logging.getLogger("highwater.controller")


def exc_name(exc: grpc.aio.AioRpcError) -> str:
    name: str = exc.code().name  # grpc is untyped: code() is a grpc.StatusCode
    return name


class BrokerSender:
    """Delivers control requests to one incarnation of a broker (or a gateway) in order.

    sender_rules.retry_after_ms decides when a request is sent again; the sender is
    replaced when the broker re-registers (ControllerEventLoop._sync_senders).
    """

    def __init__(
        self, address: str, peers: PeerChannels, *, is_gateway: bool = False, broker_epoch: int = -1
    ) -> None:
        self.address = address
        self.broker_epoch = broker_epoch
        self.peers = peers
        self.is_gateway = is_gateway
        self.queue: asyncio.Queue[tuple[str, Any, asyncio.Future[Any]]] = asyncio.Queue(
            limits.CONTROLLER_SENDER_QUEUE_LENGTH_MAX
        )
        self.task = asyncio.create_task(self._run(), name=f"control-sender-{address}")

    def send(self, rpc: str, request: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((rpc, request, fut))
        return fut

    async def _run(self) -> None:
        while True:
            rpc, request, fut = await self.queue.get()
            if isinstance(request, wire.Serialized):
                service = "GatewayService" if self.is_gateway else "BrokerService"
                call = self.peers.serialized(
                    self.address, f"/highwater.v1.{service}/{rpc}", wire.RESPONSE_TYPES[rpc]
                )
                payload: Any = request.data
            else:
                peers = self.peers
                stub = peers.gateway(self.address) if self.is_gateway else peers.broker(self.address)
                call, payload = getattr(stub, rpc), request
            attempt = 1
            while True:
                outcome: Any
                try:
                    outcome = await call(payload, timeout=limits.CONTROL_RPC_TIMEOUT_S)
                    error_code: int | None = getattr(outcome, "error_code", 0)
                except grpc.aio.AioRpcError as exc:
                    outcome, error_code = exc, None
                pause_ms = sender_rules.retry_after_ms(attempt, error_code=error_code)
                if pause_ms is None:
                    break
                if attempt == 1 or attempt % 10 == 0:
                    what = exc_name(outcome) if error_code is None else common_pb2.ErrorCode.Name(error_code)
                    log.info(
                        "%s to %s (broker epoch %d) got %s; sending it again",
                        rpc,
                        self.address,
                        self.broker_epoch,
                        what,
                    )
                await asyncio.sleep(pause_ms / 1000)
                attempt += 1
            if isinstance(outcome, grpc.aio.AioRpcError):
                log.warning(
                    "%s to %s failed %d times (%s); giving up", rpc, self.address, attempt, exc_name(outcome)
                )
                if not fut.done():
                    fut.set_exception(outcome)
                    # The warning above is the report of this failure. Whoever waits on the future
                    # (an admin call's propagation wait, a deletion's callback) may read it; most
                    # futures are dropped unread, and asyncio would log each one's traceback at
                    # ERROR ("Future exception was never retrieved") when it is collected.
                    fut.exception()
                continue
            if error_code:
                log.warning(
                    "%s to %s answered %s: %s",
                    rpc,
                    self.address,
                    common_pb2.ErrorCode.Name(error_code),
                    outcome.error_message,
                )
            if not fut.done():
                fut.set_result(outcome)

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, Exception):
            pass
        while not self.queue.empty():
            _, _, fut = self.queue.get_nowait()
            if not fut.done():
                fut.cancel()
