"""The broker's liveness stream to the active controller (BrokerHeartbeat).

A registered broker keeps one stream open to the active controller, naming its
incarnation (broker id and broker epoch). The stream carries nothing after the first
request and answer: what matters is that it is open. A broker process that dies resets
its connections at once, the controller sees the stream end, and if the same incarnation
does not open another within the grace period it revokes that incarnation's lease
(services/controller/liveness.py). So this side must reopen a stream that broke *at once*
and well within the grace period (100 ms and up): each attempt uses a fresh channel,
because a channel's own reconnect back-off (up to a second) would outlast it, and the
pauses between failed attempts start at 50 ms.

The stream is reopened when it breaks or ends, when etcd names another controller (a
deposed controller that is paused neither answers nor resets), and when the broker
registers again (lease lost: a new broker epoch). The lease stays the authority for a
broker that goes silent without closing its connections; this stream only shortens the
case where the process is gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from coordinator.election import current_controller
from coordinator.store import CoordinatorError, MetadataStore
from protos.highwater.v1 import common_pb2, controller_pb2, controller_pb2_grpc
from services.common import limits
from services.common.server import channel_options
from services.security.channels import open_channel

log = logging.getLogger("highwater.broker")


def next_backoff_ms(previous_ms: int) -> int:
    """The pause before the next attempt after one more failure: 50 ms doubling to 1 s."""
    return min(
        max(previous_ms * 2, limits.BROKER_HEARTBEAT_BACKOFF_MS_MIN), limits.BROKER_HEARTBEAT_BACKOFF_MS_MAX
    )


async def _controller_address(store: MetadataStore) -> str | None:
    info = await current_controller(store)
    return f"{info['host']}:{info['port']}" if info else None


class ControllerHeartbeat:
    """Keeps this broker's BrokerHeartbeat stream open to the active controller; `run` as a task."""

    def __init__(self, store: MetadataStore, broker_id: int, broker_epoch: Callable[[], int]) -> None:
        self.store = store
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        # Set when the broker registered again: the open stream names an incarnation that is gone.
        self._reregistered = asyncio.Event()
        self.accepted_total = 0  # streams a controller accepted (tests and logs)

    def reopen(self) -> None:
        """The broker epoch changed: reopen the stream naming the new incarnation."""
        self._reregistered.set()

    async def run(self) -> None:
        backoff_ms = 0
        while True:
            try:
                accepted = await self._one_stream()
            except asyncio.CancelledError:
                raise
            except (CoordinatorError, grpc.aio.AioRpcError, TimeoutError) as exc:
                log.debug("broker %d: controller stream failed (%s)", self.broker_id, exc)
                accepted = False
            # A stream that was accepted and then ended is reopened at once; failed attempts back off.
            backoff_ms = 0 if accepted else next_backoff_ms(backoff_ms)
            if backoff_ms:
                await asyncio.sleep(backoff_ms / 1000)

    async def _one_stream(self) -> bool:
        """Open a stream to the controller etcd names and hold it while it lasts; True if accepted."""
        address = await _controller_address(self.store)
        if address is None:
            return False
        self._reregistered.clear()
        epoch = self.broker_epoch()
        channel = open_channel(address, channel_options())
        try:
            # The generated *_pb2_grpc module is unannotated.
            stub = controller_pb2_grpc.ControllerServiceStub(channel)  # type: ignore[no-untyped-call]
            call = stub.BrokerHeartbeat()
            await call.write(
                controller_pb2.BrokerHeartbeatRequest(broker_id=self.broker_id, broker_epoch=epoch)
            )
            first = await asyncio.wait_for(call.read(), limits.BROKER_HEARTBEAT_ACCEPT_TIMEOUT_MS / 1000)
            if first is grpc.aio.EOF or first.error_code != common_pb2.NONE:
                call.cancel()
                return False
            self.accepted_total += 1
            log.debug(
                "broker %d (epoch %d): liveness stream open to controller at %s (epoch %d)",
                self.broker_id,
                epoch,
                address,
                first.controller_epoch,
            )
            await self._hold(call, address)
            call.cancel()
            return True
        finally:
            await channel.close()

    async def _hold(self, call: grpc.aio.StreamStreamCall, address: str) -> None:
        """Until the stream ends, the broker re-registers, or etcd names another controller."""
        ended = asyncio.ensure_future(call.read())  # EOF or an error when the stream ends
        reregistered = asyncio.ensure_future(self._reregistered.wait())
        try:
            while True:
                done, _ = await asyncio.wait(
                    [ended, reregistered],
                    timeout=limits.BROKER_HEARTBEAT_CONTROLLER_CHECK_MS / 1000,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if done:
                    return
                try:
                    if await _controller_address(self.store) != address:
                        return
                except CoordinatorError:
                    continue  # etcd unreachable: keep the stream; the lease decides meanwhile
        finally:
            reregistered.cancel()
            ended.cancel()
            if ended.done() and not ended.cancelled() and ended.exception() is not None:
                log.debug("broker %d: controller stream broke (%s)", self.broker_id, ended.exception())
