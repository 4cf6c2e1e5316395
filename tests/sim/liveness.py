"""The brokers' liveness streams to the active controller, and the controller's fast failure path.

The shipped logic runs unchanged: each active period of a controller owns a
services/controller/liveness.BrokerConnections (the grace-period bookkeeping), and
what it names is revoked by coordinator/registration.revoke_broker_incarnation on the
controller's simulated etcd client. What is modelled here is the asyncio and gRPC
around them (services/controller/server.py BrokerConnectionWatch and BrokerHeartbeat,
services/broker/heartbeat.py), level-triggered: after every event `reconcile` compares
the streams that are open with the ones that can be.

- A stream (broker incarnation, broker epoch) -> controller is open while the broker
  process runs and the controller acts (`active`) in the same active period and the
  link between them is up. A paused process keeps its sockets, so its stream stays open.
- It opens (BrokerConnections.opened) when the broker knows a broker epoch (it has
  registered), neither side is paused, the broker reaches etcd (it looks the controller
  up there) and the link is up: at once when any of those becomes true (the real broker
  reopens an accepted stream that ended without pausing).
- It closes (BrokerConnections.closed, at the time the controller handles it) when the
  link is cut (a partition, a cut link, a link storm resetting it), the broker crashes or
  stops, or it registers again (the stream names the old epoch; the new one opens). A
  controller that stops acting drops its watch: closings it sees then are ignored, as in
  BrokerConnectionWatch.closed.
- A link storm resets each open stream with probability of its drop rate; the broker's
  reconnect attempts then fail with that probability each, pausing by heartbeat.py's
  `next_backoff_ms` between them, so an unlucky reconnect outlasts the grace period.
- The controller's side runs as the controller's own events and timers: a paused
  controller handles closings when it resumes, a crashed one never does.

One simplification: a broker holds a stream to every controller that believes it acts
(the real broker follows the one etcd names, and moves within a second of a change);
two controllers believe they act only while a deposed one has not noticed yet.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.registration import revoke_broker_incarnation
from coordinator.store import CoordinatorError
from services.broker.heartbeat import next_backoff_ms
from services.controller.liveness import BrokerConnections
from tests.sim.clock import EventLoop
from tests.sim.network import ETCD, Network
from tests.sim.sim_etcd import run_sync

if TYPE_CHECKING:
    from tests.sim.sim_broker import SimBroker
    from tests.sim.sim_controller import SimController, SimControllerLoop


class SimConnectionWatch:
    """BrokerConnectionWatch for one active period of one controller, on that controller's timers."""

    def __init__(
        self, model: LivenessModel, controller: SimController, active: SimControllerLoop, grace_ms: int
    ) -> None:
        self.model = model
        self.controller = controller
        self.active = active
        self.connections = BrokerConnections(grace_ms)
        self.stopped = False
        self._timer_at_ms: int | None = None

    def opened(self, broker_id: int, broker_epoch: int) -> None:
        if not self.stopped:
            self.connections.opened(broker_id, broker_epoch)

    def closed(self, broker_id: int, broker_epoch: int) -> None:
        if self.stopped:
            return  # this controller no longer acts: streams end because it stood down
        self.connections.closed(broker_id, broker_epoch, self.controller.loop.now_ms)
        self._arm()

    def stop(self) -> None:
        self.stopped = True

    def _arm(self) -> None:
        """The watch task's sleep until next_deadline_ms (one timer, moved earlier when needed)."""
        deadline_ms = self.connections.next_deadline_ms()
        if deadline_ms is None or (self._timer_at_ms is not None and self._timer_at_ms <= deadline_ms):
            return
        self._timer_at_ms = deadline_ms
        self.controller.after(deadline_ms - self.controller.loop.now_ms, self._wake, deadline_ms)

    def _wake(self, at_ms: int) -> None:
        if self._timer_at_ms == at_ms:
            self._timer_at_ms = None
        if self.stopped:
            return
        for broker_id, broker_epoch in self.connections.due(self.controller.loop.now_ms):
            self._revoke(broker_id, broker_epoch)
        self._arm()

    def _revoke(self, broker_id: int, broker_epoch: int) -> None:
        controller = self.controller
        try:
            revoked = run_sync(
                revoke_broker_incarnation(controller.client, broker_id, broker_epoch)  # type: ignore[arg-type]
            )
        except CoordinatorError as exc:
            controller.trace(
                "could not revoke broker %d's lease (epoch %d): %s", broker_id, broker_epoch, exc
            )
            return
        if revoked:
            self.model.on_revoked(controller, broker_id, broker_epoch)


@dataclass(slots=True)
class _Stream:
    watch: SimConnectionWatch
    broker_incarnation: int
    broker_epoch: int


class LivenessModel:
    """Every broker's stream to every acting controller; counts what the fast path did."""

    def __init__(
        self,
        loop: EventLoop,
        network: Network,
        rng: random.Random,
        grace_ms: int,
        brokers: list[SimBroker],
        controllers: list[SimController],
    ) -> None:
        self.loop = loop
        self.network = network
        self.rng = rng
        self.grace_ms = grace_ms
        self.enabled = grace_ms > 0
        self.brokers = brokers
        self.controllers = controllers
        self._watches: dict[int, SimConnectionWatch] = {}
        self._streams: dict[tuple[int, int], _Stream] = {}
        # A stream a link storm reset cannot be reopened before this (the broker's failed attempts).
        self._blocked_until_ms: dict[tuple[int, int], int] = {}
        # (broker id, broker epoch) -> the process incarnation that registered it.
        self._incarnation_of: dict[tuple[int, int], int] = {}
        # ---- counters ----
        self.streams_opened = 0
        self.streams_closed = 0
        self.storm_resets = 0
        # Leases the fast path revoked: all; of a process still running (alive); of those, with
        # the link to the revoking controller cut at that moment (alive and partitioned away);
        # of a process that had crashed or stopped (the fast path proper).
        self.revocations = 0
        self.revocations_alive = 0
        self.revocations_alive_partitioned = 0
        self.revocations_dead = 0

    # ---- the streams ---------------------------------------------------------------------

    def reconcile(self) -> None:
        """After every event: close the streams that cannot last, open the ones that can."""
        if not self.enabled:
            return
        watches = self._watches
        for controller in self.controllers:
            active = controller.active if controller.up else None
            watch = watches.get(controller.controller_id)
            if watch is not None and watch.active is not active:
                watch.stop()
                del watches[controller.controller_id]
                watch = None
            if watch is None and active is not None:
                watches[controller.controller_id] = SimConnectionWatch(
                    self, controller, active, self.grace_ms
                )
        reachable = self.network.reachable
        streams = self._streams
        now_ms = self.loop.now_ms
        for broker in self.brokers:
            up = broker.up
            for controller in self.controllers:
                key = (broker.broker_id, controller.controller_id)
                stream = streams.get(key)
                watch = watches.get(controller.controller_id)
                if stream is not None:
                    if (
                        stream.watch is watch
                        and up
                        and broker.incarnation == stream.broker_incarnation
                        and broker.broker_epoch == stream.broker_epoch
                        and reachable(broker.name, controller.name)
                    ):
                        continue
                    del streams[key]
                    self._close(broker, stream)
                if (
                    watch is not None
                    and up
                    and not broker.paused
                    and not controller.paused
                    and broker.broker_epoch > 0
                    and now_ms >= self._blocked_until_ms.get(key, 0)
                    and reachable(broker.name, controller.name)
                    and reachable(broker.name, ETCD)
                ):
                    self._open(broker, controller, watch, key)

    def _open(
        self, broker: SimBroker, controller: SimController, watch: SimConnectionWatch, key: tuple[int, int]
    ) -> None:
        epoch = broker.broker_epoch
        self._streams[key] = _Stream(watch, broker.incarnation, epoch)
        self._incarnation_of[(broker.broker_id, epoch)] = broker.incarnation
        self.streams_opened += 1
        controller.after(0, watch.opened, broker.broker_id, epoch)

    def _close(self, broker: SimBroker, stream: _Stream) -> None:
        self.streams_closed += 1
        if not stream.watch.stopped:
            stream.watch.controller.after(0, stream.watch.closed, broker.broker_id, stream.broker_epoch)

    def on_storm(self, drop_rate: float, until_ms: int) -> None:
        """A link storm starts: each open stream is reset with probability drop_rate, and the
        broker's reconnect attempts fail as often, backing off as heartbeat.py does.
        """
        if not self.enabled or drop_rate <= 0:
            return
        now_ms = self.loop.now_ms
        by_id = {b.broker_id: b for b in self.brokers}
        for key, stream in list(self._streams.items()):
            if self.rng.random() >= drop_rate:
                continue
            self.storm_resets += 1
            del self._streams[key]
            self._close(by_id[key[0]], stream)
            delay_ms = backoff_ms = 0
            while self.rng.random() < drop_rate and now_ms + delay_ms < until_ms:
                backoff_ms = next_backoff_ms(backoff_ms)
                delay_ms += backoff_ms
            if delay_ms:
                self._blocked_until_ms[key] = min(now_ms + delay_ms, until_ms)
                self.loop.call_at(self._blocked_until_ms[key], self.reconcile)
            self.loop.trace(
                "net", "liveness stream b%d -> c%d reset by the storm, reopens in %d ms", (*key, delay_ms)
            )

    # ---- what the fast path did ----------------------------------------------------------

    def on_revoked(self, controller: SimController, broker_id: int, broker_epoch: int) -> None:
        self.revocations += 1
        broker = next(b for b in self.brokers if b.broker_id == broker_id)
        alive = broker.up and broker.incarnation == self._incarnation_of.get((broker_id, broker_epoch))
        partitioned = alive and not self.network.reachable(broker.name, controller.name)
        if alive:
            self.revocations_alive += 1
            if partitioned:
                self.revocations_alive_partitioned += 1
        else:
            self.revocations_dead += 1
        controller.trace(
            "broker %d's liveness stream closed and was not reopened within %d ms (broker epoch %d): "
            "lease revoked (broker %s)",
            broker_id,
            self.grace_ms,
            broker_epoch,
            ("alive, cut off from this controller" if partitioned else "alive") if alive else "gone",
        )
