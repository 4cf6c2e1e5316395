"""Issue 40: the broker's registration life, driven through its seam, in scripted faults.

The simulated brokers run coordinator/broker_life.py's registration rules and state table
(tests/sim/sim_broker.py is only their driver: the transaction is the real
registration.perform_registration_step on the simulated etcd). These runs put that code
through the lease losses it exists for, on a quiet cluster with acks=all producers running,
and the checker holds every rule of DESIGN.md section 8 throughout:

- `test_a_lost_lease_registers_a_new_incarnation`: etcd ends a broker's session; the broker
  notices, registers again under a new lease, with a larger broker epoch.
- `test_standby_takes_over_while_a_broker_registers_again`: a broker is cut off from etcd
  until its lease is lost and its re-registration backs off; meanwhile the active controller
  crashes; once etcd is reachable again the broker registers again and the standby, now
  active, counts the new incarnation in.
- `test_lease_loss_during_the_brokers_own_controlled_shutdown`: a broker's lease is lost while
  its controlled shutdown runs; it does not register again, and it stops cleanly.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.broker_life import State
from tests.sim.network import ETCD
from tests.sim.sim_broker import SimBroker
from tests.sim.simulation import Simulation
from tests.sim.test_controller_life import SEED, TWO_CANDIDATES


@dataclass
class Seen:
    """What a scripted fault found when it fired."""

    broker: SimBroker | None = None
    broker_epoch: int = 0
    controller_epoch: int = 0
    paused_while_cut: int = 0
    stopped_at_ms: int | None = None


def _leader(sim: Simulation) -> SimBroker:
    state = sim.checker.states[("t0", 0)]
    return next(b for b in sim.brokers if b.broker_id == state.leader)


def test_a_lost_lease_registers_a_new_incarnation() -> None:
    sim = Simulation(SEED, TWO_CANDIDATES)
    seen = Seen()

    def end_the_session() -> None:
        broker = seen.broker = _leader(sim)
        seen.broker_epoch = broker.broker_epoch
        assert broker.lease is not None and broker.life.state is State.REGISTERED
        sim.etcd.expire_lease(broker.lease.lease_id, noticed_after_ms=5)

    sim.loop.call_at(5_000, end_the_session)
    sim.run()
    broker = seen.broker
    assert broker is not None
    assert broker.counts["lease lost"] >= 1 and broker.counts["re-registered"] >= 1, broker.counts
    assert broker.life.state is State.REGISTERED
    assert broker.broker_epoch > seen.broker_epoch
    assert sim.checker.acks_all_total > 0


def test_standby_takes_over_while_a_broker_registers_again() -> None:
    sim = Simulation(SEED, TWO_CANDIDATES)
    seen = Seen()

    def cut_a_broker_from_etcd() -> None:
        broker = seen.broker = _leader(sim)
        seen.broker_epoch = broker.broker_epoch
        active = [c for c in sim.controllers if c.up and c.active is not None]
        seen.controller_epoch = max(c.epoch or 0 for c in active)
        sim.network.cut_link(broker.name, ETCD)

    def crash_the_active() -> None:
        broker = seen.broker
        assert broker is not None and broker.life.state is State.REREGISTERING, broker and broker.life.state
        (active,) = [c for c in sim.controllers if c.up and c.active is not None]
        active.crash_process()

    def restore() -> None:
        assert seen.broker is not None
        seen.paused_while_cut = seen.broker.counts["registration paused"]
        sim.network.restore_link(seen.broker.name, ETCD)

    # Cut at 4 s: the lease is lost within a TTL (2 s) of the last good keep-alive; the
    # re-registration backs off while etcd stays unreachable.
    sim.loop.call_at(4_000, cut_a_broker_from_etcd)
    sim.loop.call_at(6_800, crash_the_active)
    sim.loop.call_at(8_000, restore)
    sim.run()
    broker = seen.broker
    assert broker is not None
    assert seen.paused_while_cut >= 1, broker.counts
    assert broker.counts["re-registered"] >= 1, broker.counts
    assert broker.life.state is State.REGISTERED and broker.broker_epoch > seen.broker_epoch
    now_active = [c for c in sim.controllers if c.up and c.active is not None]
    assert now_active and max(c.epoch or 0 for c in now_active) > seen.controller_epoch
    assert sim.checker.acks_all_total > 0


def test_lease_loss_during_the_brokers_own_controlled_shutdown() -> None:
    sim = Simulation(SEED, TWO_CANDIDATES)
    seen = Seen()

    def stopped() -> None:
        seen.stopped_at_ms = sim.loop.now_ms

    def shut_down_and_lose_the_lease() -> None:
        broker = seen.broker = _leader(sim)
        assert broker.lease is not None
        broker.controlled_shutdown(stopped)
        # The ControlledShutdown request is on its way: the broker's session ends now.
        sim.etcd.expire_lease(broker.lease.lease_id, noticed_after_ms=5)

    sim.loop.call_at(5_000, shut_down_and_lose_the_lease)
    sim.run()
    broker = seen.broker
    assert broker is not None
    assert seen.stopped_at_ms is not None, f"{broker.name}'s controlled shutdown never finished"
    assert broker.counts["lease lost"] >= 1, broker.counts
    assert broker.counts["re-registered"] == 0, broker.counts
    assert sim.checker.acks_all_total > 0
