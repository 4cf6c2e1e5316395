"""A controller candidate in the simulation: only a driver of the real campaign, role and event loop.

The campaign is coordinator/controller_life.campaign, its etcd steps done by
election.perform_step on the simulated etcd (a SimLease, timers, a simulated watch); the
role moves through controller_life.ControllerLife; a term is the real ControllerEventLoop's
begin() and turn() (its error handling included) through `run_sync`, its broker watch the
loop's own `_membership_event`. The transport is tests/sim/sim_controller_loop.py, the
servicer tests/sim/sim_controller_servicer.py, the standby's follower tests/sim/sim_standby.py.
One deliberate difference: an InvariantViolation is raised out of the run instead of
halting the process, since finding those is the point of the simulation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from clients.common.errors import InvariantViolation
from coordinator import controller_life as life_rules
from coordinator.election import perform_step
from coordinator.memory_store import MemoryWatch
from coordinator.store import CoordinatorUnavailable, WatchCompacted
from services.controller.event_loop import ControllerResigned
from services.controller.results import ControllerResult
from tests.sim.clock import EventLoop
from tests.sim.config import SimConfig
from tests.sim.network import Network
from tests.sim.sim_broker_seams import controller_node
from tests.sim.sim_controller_loop import SimControllerLoop
from tests.sim.sim_controller_servicer import SimControllerServicer
from tests.sim.sim_etcd import SimEtcd, SimLease, run_sync
from tests.sim.sim_standby import SimStandby

if TYPE_CHECKING:
    from tests.sim.checker import Checker

# A step the driver cannot answer at once: the campaign waits for a timer or a watch.
PARKED = object()


class SimController(SimControllerServicer):
    """One controller candidate process."""

    def __init__(
        self,
        controller_id: int,
        loop: EventLoop,
        network: Network,
        etcd: SimEtcd,
        config: SimConfig,
        checker: Checker,
    ) -> None:
        super().__init__(controller_node(controller_id), loop, network)
        self.controller_id = controller_id
        self.config = config
        self.etcd = etcd
        self.client = etcd.client(self)
        self.checker = checker
        # Set for the settle phase: no rebalancing, so the final check sees a cluster at rest.
        self.quiet = False
        # What this candidate's life went through, for tests/sim/test_controller_life.py:
        # "campaign paused" (etcd unreachable mid-campaign), "took over" (won after waiting for a
        # holder to go), "warm start" (the standby's metadata taken), and each TermEnd's value.
        self.counts: Counter[str] = Counter()
        etcd.watch(self, self._on_etcd_change)
        self._start_process()

    def _start_process(self) -> None:
        self.life = life_rules.ControllerLife(self.controller_id)
        self.lease: SimLease | None = None
        self.granted: dict[int, SimLease] = {}
        self.active: SimControllerLoop | None = None
        self.after(self.config.campaign_retry_ms, self._tick)
        self._stand_by()

    def crash_process(self) -> None:
        self.trace("CRASH")
        if self.active is not None:
            self.active.stop_senders()
        self.crash()

    def restart_process(self) -> None:
        self.restart()
        self.trace("restart")
        self._start_process()

    @property
    def epoch(self) -> int | None:
        return self.life.epoch

    def _tick(self) -> None:
        """Watch streams reconnect and catch up once etcd is reachable again."""
        self._on_etcd_change()
        self.after(self.config.campaign_retry_ms, self._tick)

    def _on_etcd_change(self) -> None:
        if self.active is None:
            self.standby.follow()
            if self.gone_watch is not None:
                self._check_controller_gone()
        else:
            self.active.drain_broker_watch()

    # ---- standing by and campaigning: controller_life.campaign through the seam -----------------

    def _stand_by(self) -> None:
        """A fresh copy of the metadata (loaded, then the watch replayed) and a new campaign."""
        self.standby = SimStandby(self, self.etcd, self.client, self.controller_id)
        self.gone_watch: MemoryWatch | None = None
        self.awaited_holder = False
        info = {"host": self.name, "port": 9093}
        self.campaign = life_rules.campaign(self.controller_id, info, self.config.lease_ttl_s)
        self.after(0, self._resume_campaign, self.campaign, None)

    def _resume_campaign(self, campaign: Generator[Any, Any, life_rules.Won], answer: Any) -> None:
        """Run the campaign until it waits or wins (a campaign of an earlier standing-by is void)."""
        while campaign is self.campaign:
            try:
                step = campaign.send(answer)
            except StopIteration as done:
                self._took_office(done.value)
                return
            answer = self._perform(step)
            if answer is PARKED:
                return

    def _perform(self, step: life_rules.ElectionStep) -> Any:
        try:
            if isinstance(step, life_rules.GrantLease):
                lease = SimLease(self, self.client, step.ttl_s, on_lost=self._on_lease_lost)
                self.granted[lease.lease_id] = lease
                return lease.lease_id
            if isinstance(step, life_rules.RevokeLease):
                self.granted.pop(step.lease_id).stop(revoke=True)
                return None
            if isinstance(step, life_rules.Pause):
                self.counts["campaign paused"] += 1
                self.trace("campaign: %s; again in %.1f s", step.why, step.seconds)
                self.after(int(step.seconds * 1000), self._resume_campaign, self.campaign, None)
                return PARKED
            if isinstance(step, life_rules.AwaitControllerGone):
                self.awaited_holder = True
                self.gone_watch = self.etcd.subscribe(self.etcd.keys.controller, step.start_revision)
                self._check_controller_gone()
                return PARKED
            return run_sync(perform_step(self.client, step))  # type: ignore[arg-type]
        except CoordinatorUnavailable as exc:
            return life_rules.Unreachable(str(exc))

    def _check_controller_gone(self) -> None:
        """The campaign's watch: resume it once `/controller` is deleted (a compacted watch: read
        again); a watch stream cut from etcd breaks, as the real one does (CoordinatorUnavailable)."""
        if self.gone_watch is None:
            return
        if not self.client.reachable():
            self.gone_watch = None
            self._resume_campaign(
                self.campaign, life_rules.Unreachable(f"{self.name}: watch on /controller broke")
            )
            return
        key = self.etcd.keys.controller
        try:
            gone = any(
                e.key == key and e.kind == "delete" for batch in self.gone_watch.drain() for e in batch
            )
        except WatchCompacted:
            gone = True
        if gone:
            self.gone_watch = None
            self._resume_campaign(self.campaign, None)

    # ---- the term: candidacy.Candidacy._term's order, the real event loop ---------------------------

    def _took_office(self, won: life_rules.Won) -> None:
        self.lease = self.granted.pop(won.lease_id)
        self.life.won(won.epoch, stopping=False)
        self.trace("elected controller, epoch %d", won.epoch)
        self.counts["took over"] += self.awaited_holder
        loop = SimControllerLoop(self, self.client, self.controller_id, won.epoch)
        self.active = loop  # its turns run from here on (the servicer answers once ACTIVE)
        try:
            image = self.standby.take(won.revision)
            self.counts["warm start"] += image is not None
            startup = run_sync(loop.begin(image))
        except InvariantViolation:
            raise
        except Exception as exc:
            self.trace("failed to start at epoch %d: %s", won.epoch, type(exc).__name__)
            self._end_term(life_rules.TermEnd.FAILED)
            return
        loop._sync_senders()
        loop._send(startup.result)  # what _run(startup=...) queues first
        self.life.started()
        loop.watch_brokers(startup.revision)
        self.checker.on_controller_active(self, won.epoch)
        if self.config.leader_imbalance_check_interval_ms > 0:
            self.after(self.config.leader_imbalance_check_interval_ms, self._rebalance_tick, loop)

    def _rebalance_tick(self, loop: SimControllerLoop) -> None:
        """_rebalance_ticks: queue AutoLeaderRebalance every leader.imbalance.check.interval."""
        if loop is not self.active or self.quiet:
            return
        loop.queue_rebalance()
        self.after(self.config.leader_imbalance_check_interval_ms, self._rebalance_tick, loop)

    def _on_lease_lost(self) -> None:
        if self.lease is not None and self.lease.lost:
            self._end_term(life_rules.TermEnd.LEASE_LOST)

    def _end_term(self, why: life_rules.TermEnd) -> None:
        """Candidacy._term's finally: stop the loop, resign (revoke the lease), stand by again."""
        if not self.life.end_term(why):
            return
        self.counts[why.value] += 1
        self.trace("stops acting at epoch %s (%s)", self.epoch, why.value)
        loop, self.active = self.active, None
        if loop is not None:
            loop.stop_senders()
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.stop(revoke=True)
        self.life.stood_down(stopping=False)
        self._stand_by()

    def process_queued(
        self, loop: SimControllerLoop, name: str, handler: Callable[[], ControllerResult]
    ) -> None:
        if loop is self.active and self.life.acting:
            self._process(name, handler)

    def _process(self, name: str, handler: Callable[[], ControllerResult]) -> ControllerResult | Exception:
        """One turn of the real loop; its error handling is ControllerEventLoop.turn's."""
        loop = self.active
        if loop is None or not self.life.acting:
            return ControllerResigned("not active")
        outcome = loop.run_turn(name, handler)
        if loop.resigned.is_set():
            self._end_term(life_rules.TermEnd.RESIGNED)
        return outcome
