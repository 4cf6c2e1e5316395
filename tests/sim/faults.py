"""Fault injection: every kind arrives as a Poisson process with its own mean interval (SimConfig).

Kinds: broker crash (kill -9, or power loss that drops unflushed bytes) and restart;
pause of a broker or controller (SIGSTOP: long ones outlive the lease); network
partitions (a random split of brokers, controllers and etcd, or one node cut off from
etcd only); controller crash or pause (a standby wins with epoch + 1, the old one
comes back deposed); link storms (loss, duplication, slow messages); a slow disk
(every write stalls the broker); an etcd session expiring under a live process.

Scenarios aimed at one mechanism:
- re-registration racing a control request: the next LeaderAndIsr / UpdateMetadata /
  StopReplica sent to a broker expires that broker's session, and the broker notices
  within a few ms, so it registers again (a new broker epoch) about when the request lands;
- power loss of an ISR member (KI-1): every member of one partition's ISR stops at once,
  one of them losing its unflushed bytes, their sessions end together (the controller
  sees them leave in one BrokerChange, so the offline partition keeps them all in its
  ISR), and the one that lost data comes back first;
- a late registration answer: a broker's registration has committed but the process
  learns its new broker epoch a few ms later (server.py sets replicas.broker_epoch only
  when register() returns), so a control request the controller sends on seeing the
  registration may land first and meet the old epoch (or none, after a restart);
- a live broker cut off from the active controller alone (it still reaches etcd, its
  followers, leaders and clients), mostly for longer than the connection grace period: the
  controller's liveness fast path (liveness.py) revokes the lease of a broker that is alive,
  which registers again while what it led moves away, fenced by leader epoch (issue 24);
- `bounce_broker` and `fail_over_controller`, which the simulation times to a topic
  deletion and to a reassignment whose targets have just joined the ISR.

Every fault ends by itself after its duration; `heal_all()` ends every fault at once
and restarts whatever is down, for the settle phase.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from tests.sim.checker import Checker
from tests.sim.clock import EventLoop, Node
from tests.sim.config import SimConfig
from tests.sim.network import ETCD, Envelope, Network
from tests.sim.sim_broker import SimBroker
from tests.sim.sim_controller import SimController
from tests.sim.sim_etcd import SimEtcd

# Durations, ms: (min, max).
BROKER_DOWNTIME_MS = (300, 8_000)
PAUSE_SHORT_MS = (50, 1_500)
PAUSE_LONG_MS = (2_500, 7_000)  # longer than the 2 s lease TTL: the session expires
PARTITION_MS = (300, 6_000)
CONTROLLER_DOWNTIME_MS = (500, 6_000)
STORM_MS = (500, 5_000)
SLOW_DISK_MS = (1_000, 6_000)
SLOW_DISK_DELAY_MS = (5, 300)
# A broker whose session was ended under it notices within this long (its next keep-alive):
# about one message latency, so the new registration races requests on their way to it.
SESSION_END_NOTICED_MS = (0, 8)
# KI-1: the member that lost data is down this long; the others come back this much later.
ISR_POWER_LOSS_DOWNTIME_MS = (300, 1_500)
ISR_POWER_LOSS_OTHERS_LATER_MS = (2_000, 6_000)
# How late a registration's answer reaches the broker: about the controller's watch delay
# plus a message, so its first LeaderAndIsr can land before the broker knows its epoch.
REGISTRATION_ANSWER_LATE_MS = (5, 30)
# A broker's link to the active controller is cut this long: mostly past the connection grace
# period (300 ms by default), so the controller revokes a live broker's lease; sometimes shorter,
# so the stream is reopened in time and nothing is revoked.
CONTROLLER_LINK_CUT_MS = (400, 4_000)
CONTROLLER_LINK_CUT_SHORT_MS = (20, 250)
CONTROLLER_LINK_CUT_SHORT_FRACTION = 0.2
# Control requests whose landing a re-registration races.
CONTROL_RPCS = frozenset({"LeaderAndIsr", "UpdateMetadata", "StopReplica"})


class FaultInjector:
    def __init__(
        self,
        loop: EventLoop,
        network: Network,
        etcd: SimEtcd,
        rng: random.Random,
        config: SimConfig,
        brokers: list[SimBroker],
        controllers: list[SimController],
        checker: Checker,
    ) -> None:
        self.loop = loop
        self.network = network
        self.etcd = etcd
        self.rng = rng
        self.config = config
        self.brokers = brokers
        self.controllers = controllers
        self.checker = checker
        self.active = False
        self.faults_injected = 0
        self._pauses: list[tuple[Node, int]] = []
        self._partition_generation = 0
        self._storm_generation = 0
        self._link_cut_generation: dict[frozenset[str], int] = {}
        # Told when a link storm starts: (drop rate, end time ms); the liveness streams' resets.
        self.on_storm: Callable[[float, int], None] = lambda drop_rate, until_ms: None
        self._restarts: dict[str, Callable[[], None]] = {}
        # broker id -> (process incarnation, broker epoch) of its last registration.
        self._known_epochs: dict[int, tuple[int, int]] = {}

    def start(self, until_ms: int) -> None:
        self.active = True
        self.until_ms = until_ms
        kinds: list[tuple[int, Callable[[], None]]] = [
            (self.config.crash_every_ms, self._crash_broker),
            (self.config.pause_every_ms, self._pause_node),
            (self.config.partition_every_ms, self._partition),
            (self.config.controller_fault_every_ms, self._controller_fault),
            (self.config.link_storm_every_ms, self._link_storm),
            (self.config.slow_disk_every_ms, self._slow_disk),
            (self.config.lease_expiry_every_ms, self._expire_lease),
            (self.config.reregistration_race_every_ms, self._arm_reregistration_race),
            (self.config.isr_power_loss_every_ms, self._isr_power_loss),
            (self.config.controller_link_cut_every_ms, self._cut_controller_link),
        ]
        for mean_ms, action in kinds:
            if mean_ms > 0:
                self._schedule(mean_ms, action)

    def _schedule(self, mean_ms: int, action: Callable[[], None]) -> None:
        at = self.loop.now_ms + int(self.rng.expovariate(1 / mean_ms))
        if at < self.until_ms:
            self.loop.call_at(at, self._fire, mean_ms, action)

    def _fire(self, mean_ms: int, action: Callable[[], None]) -> None:
        if not self.active:
            return
        self.faults_injected += 1
        action()
        self._schedule(mean_ms, action)

    def _between(self, bounds: tuple[int, int]) -> int:
        return self.rng.randint(*bounds)

    # ---- brokers ---------------------------------------------------------------------

    def _crash_broker(self) -> None:
        candidates = [b for b in self.brokers if b.up and not b.shutting_down]
        if not candidates:
            return
        broker = self.rng.choice(candidates)
        power_loss = self.rng.random() < self.config.power_loss_fraction
        broker.crash_process(power_loss=power_loss)
        if power_loss:
            self.checker.on_power_loss(broker.broker_id)
        self._restart_later(broker, broker.restart_process, self._between(BROKER_DOWNTIME_MS))

    def bounce_broker(self, broker: SimBroker) -> None:
        """Crash and restart `broker`, or end its session under it (it registers again at once)."""
        if not broker.up or broker.shutting_down:
            return
        self.faults_injected += 1
        if self.rng.random() < 0.5 and broker.lease is not None:
            self.etcd.expire_lease(
                broker.lease.lease_id, noticed_after_ms=self._between(SESSION_END_NOTICED_MS)
            )
            return
        power_loss = self.rng.random() < self.config.power_loss_fraction
        broker.crash_process(power_loss=power_loss)
        if power_loss:
            self.checker.on_power_loss(broker.broker_id)
        self._restart_later(broker, broker.restart_process, self._between(BROKER_DOWNTIME_MS))

    def on_registered(self, broker_id: int, broker_epoch: int) -> None:
        """A broker registered: maybe its process learns the new broker epoch a little late."""
        broker = next((b for b in self.brokers if b.broker_id == broker_id), None)
        if broker is None:
            return
        known, self._known_epochs[broker_id] = (
            self._known_epochs.get(broker_id),
            (broker.incarnation, broker_epoch),
        )
        # Before the answer: the previous registration's epoch, or none in a process that just started.
        before = known[1] if known is not None and known[0] == broker.incarnation else -1
        if (
            not self.active
            or broker.broker_epoch != broker_epoch
            or self.rng.random() >= self.config.late_registration_answer_fraction
        ):
            return
        self.faults_injected += 1
        broker.trace("registration answer late: broker epoch %d still %d for a while", broker_epoch, before)
        _set_broker_epoch(broker, before)
        self.loop.call_at(
            self.loop.now_ms + self._between(REGISTRATION_ANSWER_LATE_MS),
            self._registration_answered,
            broker,
            broker.incarnation,
            before,
            broker_epoch,
        )

    def _registration_answered(
        self, broker: SimBroker, incarnation: int, before: int, broker_epoch: int
    ) -> None:
        if broker.up and broker.incarnation == incarnation and broker.broker_epoch == before:
            _set_broker_epoch(broker, broker_epoch)

    def _arm_reregistration_race(self) -> None:
        self.network.on_request_sent = self._race_reregistration

    def _race_reregistration(self, env: Envelope) -> None:
        """The first control request sent after arming: its target's session ends as it travels."""
        if env.rpc not in CONTROL_RPCS or not self.active:
            return
        broker = next((b for b in self.brokers if b.name == env.dst), None)
        if broker is None or not broker.up or broker.lease is None:
            return
        self.network.on_request_sent = None
        broker.trace("session ends while %s is on its way", env.rpc)
        self.etcd.expire_lease(broker.lease.lease_id, noticed_after_ms=self._between(SESSION_END_NOTICED_MS))

    def _isr_power_loss(self) -> None:
        """KI-1: a partition's whole ISR stops at once, one member by power loss; that one returns first."""
        by_id = {b.broker_id: b for b in self.brokers}
        candidates = []
        for tp, state in sorted(self.checker.states.items()):
            members = [by_id[r] for r in state.isr if r in by_id]
            if (
                tp[0] not in self.checker.deleting
                and len(members) >= 2
                and all(m.up and not m.shutting_down for m in members)
            ):
                candidates.append(members)
        if not candidates:
            return
        members = self.rng.choice(candidates)
        lost = self.rng.choice(members)
        self.loop.trace(
            "fault", "ISR %s stops at once; %s loses power", ([m.name for m in members], lost.name)
        )
        for member in members:
            lease = member.lease
            member.crash_process(power_loss=member is lost)
            if lease is not None:
                self.etcd.expire_lease(lease.lease_id)
        self.checker.on_power_loss(lost.broker_id)
        first_ms = self._between(ISR_POWER_LOSS_DOWNTIME_MS)
        self._restart_later(lost, lost.restart_process, first_ms)
        for member in members:
            if member is not lost:
                self._restart_later(
                    member, member.restart_process, first_ms + self._between(ISR_POWER_LOSS_OTHERS_LATER_MS)
                )

    def _restart_later(self, node: Node, restart: Callable[[], None], delay_ms: int) -> None:
        incarnation = node.incarnation

        def do_restart() -> None:
            if not node.up and node.incarnation == incarnation:
                self._restarts.pop(node.name, None)
                restart()

        self._restarts[node.name] = do_restart
        self.loop.call_at(self.loop.now_ms + delay_ms, do_restart)

    def _slow_disk(self) -> None:
        broker = self.rng.choice(self.brokers)
        broker.disk_delay_ms = self._between(SLOW_DISK_DELAY_MS)
        broker.trace("disk slow: %d ms per write", broker.disk_delay_ms)
        self.loop.call_at(self.loop.now_ms + self._between(SLOW_DISK_MS), self._disk_ok, broker)

    def _disk_ok(self, broker: SimBroker) -> None:
        broker.disk_delay_ms = 0

    # ---- any process -----------------------------------------------------------------

    def _pause_node(self) -> None:
        nodes: list[Node] = [n for n in [*self.brokers, *self.controllers] if n.up and not n.paused]
        if not nodes:
            return
        node = self.rng.choice(nodes)
        long_pause = self.rng.random() < 0.4
        duration = self._between(PAUSE_LONG_MS if long_pause else PAUSE_SHORT_MS)
        self._pause_for(node, duration)

    def _pause_for(self, node: Node, duration_ms: int) -> None:
        token = node.pause()
        node.trace("PAUSED for %d ms", duration_ms)
        self._pauses.append((node, token))
        self.loop.call_at(self.loop.now_ms + duration_ms, self._unpause, node, token)

    def _unpause(self, node: Node, token: int) -> None:
        if (node, token) in self._pauses:
            self._pauses.remove((node, token))
            node.resume(token)

    def _expire_lease(self) -> None:
        holders = [
            n for n in [*self.brokers, *self.controllers] if n.up and getattr(n, "lease", None) is not None
        ]
        if not holders:
            return
        node = self.rng.choice(holders)
        lease = node.lease  # type: ignore[attr-defined]
        self.etcd.expire_lease(lease.lease_id)

    # ---- controllers -----------------------------------------------------------------

    def fail_over_controller(self) -> None:
        """Crash the active controller now (between two of its events); it restarts a little later."""
        controller = next((c for c in self.controllers if c.up and c.active is not None), None)
        if controller is None:
            return
        self.faults_injected += 1
        controller.crash_process()
        self._restart_later(controller, controller.restart_process, self._between(CONTROLLER_DOWNTIME_MS))

    def _controller_fault(self) -> None:
        active = [c for c in self.controllers if c.up and c.active is not None] or [
            c for c in self.controllers if c.up
        ]
        if not active:
            return
        controller = self.rng.choice(active)
        kind = self.rng.random()
        if kind < 0.4:
            controller.crash_process()
            self._restart_later(controller, controller.restart_process, self._between(CONTROLLER_DOWNTIME_MS))
        elif kind < 0.8:
            # Long enough to lose the lease: it resumes believing it is still the controller.
            self._pause_for(controller, self._between(PAUSE_LONG_MS))
        elif controller.lease is not None:
            # etcd ends its session under it: it acts on until its next keep-alive says so.
            self.etcd.expire_lease(controller.lease.lease_id)

    # ---- network ---------------------------------------------------------------------

    def _partition(self) -> None:
        names = [b.name for b in self.brokers] + [c.name for c in self.controllers] + [ETCD]
        if self.rng.random() < 0.3:
            # One process loses etcd but still talks to its peers (or the other way round).
            node = self.rng.choice(names[:-1])
            groups = {node: 1}
            if self.rng.random() < 0.5:
                groups = {n: 1 for n in names if n not in (node, ETCD)}  # it keeps etcd, loses the rest
        else:
            groups = {n: self.rng.randint(0, 1) for n in names}
        self._partition_generation += 1
        generation = self._partition_generation
        self.network.groups = groups
        self.loop.trace(
            "net",
            "PARTITION %s | %s",
            (
                sorted(n for n in names if groups.get(n, 0) == 0),
                sorted(n for n in names if groups.get(n, 0) == 1),
            ),
        )
        self.loop.call_at(self.loop.now_ms + self._between(PARTITION_MS), self._heal_partition, generation)

    def _heal_partition(self, generation: int) -> None:
        if generation == self._partition_generation:
            self.network.heal()
            self.loop.trace("net", "partition healed", ())

    def _link_storm(self) -> None:
        self.network.drop_rate = self.rng.choice([0.0, 0.02, 0.1, 0.3])
        self.network.dup_rate = self.rng.choice([0.0, 0.05, 0.2])
        self.network.slow_rate = self.rng.choice([0.0, 0.05, 0.2])
        self._storm_generation += 1
        self.loop.trace(
            "net",
            "STORM drop %.2f dup %.2f slow %.2f",
            (self.network.drop_rate, self.network.dup_rate, self.network.slow_rate),
        )
        until_ms = self.loop.now_ms + self._between(STORM_MS)
        self.loop.call_at(until_ms, self._calm, self._storm_generation)
        self.on_storm(self.network.drop_rate, until_ms)

    def _calm(self, generation: int) -> None:
        if generation == self._storm_generation:
            self.network.drop_rate = self.network.dup_rate = self.network.slow_rate = 0.0

    def _cut_controller_link(self) -> None:
        """Cut one live broker off from the active controller alone, for a while."""
        acting = [c for c in self.controllers if c.up and c.active is not None and c.epoch is not None]
        if not acting:
            return
        controller = max(acting, key=lambda c: c.epoch or 0)  # a deposed one may not know it yet
        candidates = [
            b
            for b in self.brokers
            if b.up and not b.shutting_down and b.lease is not None and b.broker_epoch > 0
        ]
        if not candidates:
            return
        broker = self.rng.choice(candidates)
        short = self.rng.random() < CONTROLLER_LINK_CUT_SHORT_FRACTION
        duration_ms = self._between(CONTROLLER_LINK_CUT_SHORT_MS if short else CONTROLLER_LINK_CUT_MS)
        link = frozenset((broker.name, controller.name))
        generation = self._link_cut_generation[link] = self._link_cut_generation.get(link, 0) + 1
        self.network.cut_link(broker.name, controller.name)
        self.loop.trace(
            "net",
            "LINK CUT %s <-> %s for %d ms (broker epoch %d)",
            (broker.name, controller.name, duration_ms, broker.broker_epoch),
        )
        self.loop.call_at(self.loop.now_ms + duration_ms, self._restore_link, link, generation)

    def _restore_link(self, link: frozenset[str], generation: int) -> None:
        if self._link_cut_generation.get(link) == generation:
            a, b = sorted(link)
            self.network.restore_link(a, b)
            self.loop.trace("net", "link %s <-> %s restored", (a, b))

    # ---- the end ---------------------------------------------------------------------

    def heal_all(self) -> None:
        """Stop injecting; end every fault; restart everything that is down."""
        self.active = False
        self.network.on_request_sent = None
        self.network.heal()
        self.network.cut_links.clear()
        self._link_cut_generation.clear()
        self._calm(self._storm_generation)
        for node, token in list(self._pauses):
            self._unpause(node, token)
        for broker in self.brokers:
            broker.disk_delay_ms = 0
        for restart in list(self._restarts.values()):
            restart()
        self._restarts.clear()
        self.loop.trace("sim", "all faults healed", ())


def _set_broker_epoch(broker: SimBroker, broker_epoch: int) -> None:
    """What the broker process believes its broker epoch is: the core's field.

    Only the late-registration-answer fault writes it, opening the gap between the
    registration's commit and the process reading the answer (server.py sets the
    epoch when register() returns).
    """
    broker.core.broker_epoch = broker_epoch
