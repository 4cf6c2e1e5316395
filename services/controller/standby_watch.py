"""A standby controller's liveness stream to the active one (StandbyHeartbeat).

While it stands by, a controller holds one stream open to the controller etcd names. A
controller process that dies resets its connections at once: the stream breaks, and new
ones are refused. If for --controller-connection-grace-ms no stream is accepted while
`/controller` still names the same controller epoch, the standby revokes that epoch's lease
(coordinator.election.revoke_controller_term): `/controller` goes, and the election (which
this standby is waiting in) runs at once instead of when the lease expires.

The lease stays the authority for a controller that goes silent without resetting anything
(paused, host or network lost): its streams stay open and nothing here fires. A controller
that answers but is not acting (elected and still loading, or standing down) is alive: its
NOT_CONTROLLER answer clears the clock. One that was in fact alive when its lease was revoked
(a blip longer than the grace period between it and this standby) is fenced by its epoch as
after an expired lease: a controller move, never a lost write (ARCHITECTURE.md section 7).

The decision is `BrokenLink` (pure, driven by the caller's clock); `StandbyHeartbeat` is its
asyncio adapter.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import grpc

from coordinator.election import current_controller, revoke_controller_term
from coordinator.store import CoordinatorError, MetadataStore
from protos.highwater.v1 import common_pb2, controller_pb2, controller_pb2_grpc
from services.common import limits
from services.common.server import channel_options
from services.security.channels import open_channel

log = logging.getLogger("highwater.controller")

# What one attempt found: a stream accepted and then ended; an answer that the named controller is
# not acting; no answer at all (refused, reset, timed out).
Outcome = Literal["ended", "not_acting", "unreachable"]


@dataclass
class BrokenLink:
    """Since when no stream to the active controller of `epoch` has been open (None: linked)."""

    grace_ms: int
    epoch: int | None = None
    since_ms: int = 0

    def observe(self, epoch: int, outcome: Outcome, now_ms: int) -> None:
        """An attempt at the controller of `epoch` ended with `outcome`."""
        if outcome == "not_acting":
            self.epoch = None  # it answered: alive, whatever it is doing
        elif self.epoch != epoch:
            self.epoch, self.since_ms = epoch, now_ms  # the clock starts at the first sign of death

    def named(self, epoch: int | None) -> None:
        """etcd names the controller of `epoch` (None: none): a link to another one is forgotten."""
        if self.epoch is not None and self.epoch != epoch:
            self.epoch = None

    def due(self, now_ms: int) -> int | None:
        """The epoch whose lease is due for revocation now, if any (returned once)."""
        if self.epoch is None or now_ms - self.since_ms < self.grace_ms:
            return None
        epoch, self.epoch = self.epoch, None
        return epoch

    def remaining_ms(self, now_ms: int) -> int | None:
        return None if self.epoch is None else max(0, self.since_ms + self.grace_ms - now_ms)


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class StandbyHeartbeat:
    """Holds this standby's stream to the active controller; `run` as a task while standing by."""

    def __init__(
        self,
        store: MetadataStore,
        controller_id: int,
        grace_ms: int,
        clock_ms: Callable[[], int] = _monotonic_ms,
    ) -> None:
        self.store = store
        self.controller_id = controller_id
        self.link = BrokenLink(grace_ms)
        self._clock_ms = clock_ms
        self.revoked_epochs: list[int] = []  # tests and logs

    async def run(self) -> None:
        while True:
            try:
                info = await current_controller(self.store)
            except CoordinatorError:
                await asyncio.sleep(limits.STANDBY_HEARTBEAT_IDLE_MS / 1000)
                continue
            if info is None or int(info["controller_id"]) == self.controller_id:
                self.link.named(None)  # the election decides; nothing to watch
                await asyncio.sleep(limits.STANDBY_HEARTBEAT_IDLE_MS / 1000)
                continue
            epoch = int(info["epoch"])
            self.link.named(epoch)
            due = self.link.due(self._clock_ms())
            if due is not None:
                await self._revoke(due)
                continue
            remaining_ms = self.link.remaining_ms(self._clock_ms())
            accept_timeout_ms = limits.BROKER_HEARTBEAT_ACCEPT_TIMEOUT_MS
            if remaining_ms is not None:
                accept_timeout_ms = max(remaining_ms, limits.STANDBY_HEARTBEAT_RETRY_MS)
            outcome = await self._one_stream(f"{info['host']}:{info['port']}", epoch, accept_timeout_ms)
            self.link.observe(epoch, outcome, self._clock_ms())
            if outcome == "not_acting":
                await asyncio.sleep(limits.STANDBY_HEARTBEAT_IDLE_MS / 1000)
            elif outcome == "unreachable":
                await asyncio.sleep(limits.STANDBY_HEARTBEAT_RETRY_MS / 1000)
            # "ended": try again at once, the grace period is running

    async def _revoke(self, epoch: int) -> None:
        try:
            revoked = await revoke_controller_term(self.store, epoch)
        except CoordinatorError as exc:
            log.warning("could not revoke controller epoch %d's lease: %s; its lease decides", epoch, exc)
            return
        if revoked:
            self.revoked_epochs.append(epoch)
            log.warning(
                "controller %d: the active controller (epoch %d) reset its connections and accepted "
                "none for %d ms: revoking its lease; the election runs now",
                self.controller_id,
                epoch,
                self.link.grace_ms,
            )

    async def _one_stream(self, address: str, epoch: int, accept_timeout_ms: int) -> Outcome:
        """Open a stream to the controller at address and hold it while it lasts."""
        channel = open_channel(address, channel_options())
        try:
            # The generated *_pb2_grpc module is unannotated.
            stub = controller_pb2_grpc.ControllerServiceStub(channel)  # type: ignore[no-untyped-call]
            call = stub.StandbyHeartbeat()
            try:
                await call.write(controller_pb2.StandbyHeartbeatRequest(controller_id=self.controller_id))
                first = await asyncio.wait_for(call.read(), accept_timeout_ms / 1000)
            except (grpc.aio.AioRpcError, TimeoutError) as exc:
                call.cancel()
                if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    # An active controller of an older release (a rolling upgrade): it answered, so it
                    # is alive; its lease decides, as before this stream existed (docs/UPGRADING.md).
                    return "not_acting"
                return "unreachable"
            if first is grpc.aio.EOF:
                return "unreachable"
            if first.error_code != common_pb2.NONE or first.controller_epoch != epoch:
                call.cancel()
                return "not_acting"
            await self._hold(call, epoch)
            call.cancel()
            return "ended"
        finally:
            await channel.close()

    async def _hold(self, call: grpc.aio.StreamStreamCall, epoch: int) -> None:
        """Until the stream ends or etcd names another controller epoch (a deposed controller that
        is paused neither answers nor resets: the new one must be watched instead)."""
        ended = asyncio.ensure_future(call.read())
        try:
            while True:
                check_s = limits.BROKER_HEARTBEAT_CONTROLLER_CHECK_MS / 1000
                done, _ = await asyncio.wait([ended], timeout=check_s)
                if done:
                    return
                try:
                    info = await current_controller(self.store)
                except CoordinatorError:
                    continue  # etcd unreachable: keep the stream; the lease decides meanwhile
                if info is None or int(info["epoch"]) != epoch:
                    return
        finally:
            ended.cancel()
