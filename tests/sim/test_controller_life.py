"""Issue 40: the controller's process life, driven through its seam, in scripted failovers.

The simulated controllers run coordinator/controller_life.py's campaign and role table
and the real event loop (tests/sim/sim_controller.py is only their driver). These runs
put that code through the failovers it exists for, on a quiet cluster with acks=all
producers running, and the checker holds every rule of DESIGN.md section 8 throughout:

- `test_standby_takes_over_with_its_metadata`: the active controller crashes; the standby,
  waiting for `/controller` to go, wins the next epoch and starts from the metadata it
  followed (a warm start).
- `test_controller_losing_etcd_mid_campaign_backs_off_and_wins_once_back`: the standby is
  cut off from etcd, then the active controller crashes; the standby's watch breaks, its
  campaign backs off (each pause longer) while etcd is unreachable, and it wins once back.
- `test_lease_loss_during_a_brokers_controlled_shutdown`: the active controller's lease
  expires while a broker's controlled shutdown is asking it to move leadership; the term
  ends (lease lost), a controller wins the next epoch, and the broker still stops cleanly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tests.sim.config import SimConfig
from tests.sim.network import ETCD
from tests.sim.sim_broker import SimBroker
from tests.sim.sim_controller import SimController
from tests.sim.simulation import Simulation
from tests.sim.test_liveness import QUIET

TWO_CANDIDATES: SimConfig = dataclasses.replace(QUIET, controllers=2, fault_phase_ms=14_000)
SEED = 7


@dataclass
class Seen:
    """What a scripted fault found when it fired."""

    controller: SimController | None = None
    epoch: int = 0
    paused_while_cut: int = 0
    broker: SimBroker | None = None
    stopped_at_ms: int | None = None


def _active(sim: Simulation) -> SimController:
    (active,) = [c for c in sim.controllers if c.up and c.active is not None]
    return active


def _standby(sim: Simulation) -> SimController:
    (standby,) = [c for c in sim.controllers if c.up and c.active is None]
    return standby


def test_standby_takes_over_with_its_metadata() -> None:
    sim = Simulation(SEED, TWO_CANDIDATES)
    seen = Seen()

    def crash_the_active() -> None:
        active = _active(sim)
        seen.controller, seen.epoch = _standby(sim), active.epoch or 0
        active.crash_process()

    sim.loop.call_at(5_000, crash_the_active)
    sim.run()
    standby = seen.controller
    assert standby is not None and standby.active is not None, "the standby did not take over"
    assert (standby.epoch or 0) > seen.epoch
    assert standby.counts["took over"] >= 1 and standby.counts["warm start"] >= 1, standby.counts
    assert sim.checker.acks_all_total > 0


def test_controller_losing_etcd_mid_campaign_backs_off_and_wins_once_back() -> None:
    sim = Simulation(SEED, TWO_CANDIDATES)
    seen = Seen()

    def cut_the_standby_from_etcd() -> None:
        seen.controller, seen.epoch = _standby(sim), _active(sim).epoch or 0
        sim.network.cut_link(seen.controller.name, ETCD)

    def restore() -> None:
        assert seen.controller is not None
        seen.paused_while_cut = seen.controller.counts["campaign paused"]
        sim.network.restore_link(seen.controller.name, ETCD)

    sim.loop.call_at(4_000, cut_the_standby_from_etcd)
    sim.loop.call_at(4_500, lambda: _active(sim).crash_process())
    sim.loop.call_at(9_000, restore)
    sim.run()
    standby = seen.controller
    assert standby is not None
    # Unreachable for 4.5 s: the watch broke, then pauses of 0.1, 0.2, 0.4, 0.8, 1.6, 2 s at most.
    assert seen.paused_while_cut >= 3, standby.counts
    assert standby.active is not None, "the standby did not win once etcd was back"
    assert (standby.epoch or 0) > seen.epoch
    assert sim.checker.acks_all_total > 0


def test_lease_loss_during_a_brokers_controlled_shutdown() -> None:
    sim = Simulation(SEED, TWO_CANDIDATES)
    seen = Seen()

    def stopped() -> None:
        seen.stopped_at_ms = sim.loop.now_ms

    def shut_down_a_leader() -> None:
        state = sim.checker.states[("t0", 0)]
        seen.broker = next(b for b in sim.brokers if b.broker_id == state.leader)
        active = seen.controller = _active(sim)
        seen.epoch = active.epoch or 0
        seen.broker.controlled_shutdown(stopped)
        # The ControlledShutdown request is on its way: the controller's session ends now.
        assert active.lease is not None
        sim.etcd.expire_lease(active.lease.lease_id, noticed_after_ms=5)

    sim.loop.call_at(5_000, shut_down_a_leader)
    sim.run()
    controller, broker = seen.controller, seen.broker
    assert controller is not None and broker is not None
    assert controller.counts["lease lost"] >= 1, controller.counts
    assert seen.stopped_at_ms is not None, f"{broker.name}'s controlled shutdown never finished"
    now_active = [c for c in sim.controllers if c.up and c.active is not None]
    assert now_active and max(c.epoch or 0 for c in now_active) > seen.epoch
    assert sim.checker.acks_all_total > 0
