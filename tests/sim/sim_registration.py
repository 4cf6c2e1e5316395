"""A simulated broker's registration: only a driver of coordinator/broker_life.py's rules.

The rules' steps are done on the simulation's side of the seam: the registration
transaction is the real registration.perform_registration_step on the simulated etcd, a
lease is a SimLease, a pause a timer of the broker's node, the clock the simulation's.
What serve() does with the outcome (services/broker/registration_life.py) is done here
too: the broker epoch goes to the core, a lost lease registers a new incarnation unless
the process is shutting down. One deliberate difference: where the real process stops
(its first registration failed, or re-registering gave up) and its supervisor starts it
again, the simulated one keeps its process and registers again register_retry_ms later.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from coordinator import broker_life
from coordinator.registration import RegistrationOutcome, perform_registration_step
from coordinator.store import CoordinatorError
from tests.sim.sim_etcd import SimLease, run_sync

if TYPE_CHECKING:
    from tests.sim.sim_broker import SimBroker

RegistrationSteps = Generator[broker_life.RegistrationStep, Any, RegistrationOutcome]
Rules = Callable[[str, dict[str, Any], int], RegistrationSteps]
# A step the driver cannot answer at once: the registration waits for a timer.
_PARKED = object()


class SimRegistration:
    """One broker process's registration state, lease and the registration under way."""

    def __init__(self, broker: SimBroker, counts: Counter[str]) -> None:
        self.broker = broker
        # "lease lost", "re-registered", "registration paused" (a Pause of the rules), for
        # tests/sim/test_broker_life.py; kept across the broker's processes.
        self.counts = counts
        self.life = broker_life.BrokerLife(broker.broker_id)
        # The lease holding the key (the lost one until a new registration replaces it).
        self.lease: SimLease | None = None
        self.registering: RegistrationSteps | None = None
        # Leases granted by a registration and not yet holding the key or revoked.
        self._granted: dict[int, SimLease] = {}

    def start(self, rules: Rules = broker_life.register) -> None:
        """Run broker_life's `register` (at start) or `reregister` (after a lost lease)."""
        broker = self.broker
        if not broker.up or self.life.stopping:
            return
        info = {
            "broker_id": broker.broker_id,
            "host": broker.name,
            "port": broker.port,
            "rack": "",
            "metrics_port": 0,
            "unclean_shutdown": broker.unclean_shutdown,
        }
        steps = rules(broker.etcd.keys.broker(broker.broker_id), info, broker.config.lease_ttl_s)
        self.registering = steps
        self._resume(steps, None)

    def _resume(self, steps: RegistrationSteps, answer: Any) -> None:
        """Run the registration until it pauses or ends (one abandoned by a shutdown is void)."""
        while steps is self.registering and self.broker.up:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                self.registering = None
                self._ended(done.value)
                return
            answer = self._perform(steps, step)
            if answer is _PARKED:
                return

    def _perform(self, steps: RegistrationSteps, step: broker_life.RegistrationStep) -> Any:
        broker = self.broker
        try:
            if isinstance(step, broker_life.GrantLease):
                lease = SimLease(broker, broker.etcd_client, step.ttl_s, on_lost=self._on_lease_lost)
                self._granted[lease.lease_id] = lease
                return lease.lease_id
            if isinstance(step, broker_life.RevokeLease):
                self._granted.pop(step.lease_id).stop(revoke=True)
                return None
            if isinstance(step, broker_life.Pause):
                self.counts["registration paused"] += 1
                broker.trace("registration: %s; again in %.2f s", step.why, step.seconds)
                broker.after(int(step.seconds * 1000), self._resume, steps, None)
                return _PARKED
            if isinstance(step, broker_life.ReadClock):
                return broker.loop.now_ms / 1000
            return run_sync(perform_registration_step(broker.etcd_client, step))  # type: ignore[arg-type]
        except CoordinatorError as exc:
            return broker_life.Unreachable(str(exc))

    def _ended(self, outcome: RegistrationOutcome) -> None:
        broker = self.broker
        if isinstance(outcome, broker_life.Registered):
            self.lease = self._granted.pop(outcome.lease_id)
            broker.core.broker_epoch = outcome.broker_epoch
            self.counts["re-registered"] += self.life.state is broker_life.State.REREGISTERING
            self.life.registered(outcome.broker_epoch)
            broker.trace(
                "registered, broker epoch %d%s",
                outcome.broker_epoch,
                " (unclean shutdown)" if broker.unclean_shutdown else "",
            )
            broker.unclean_shutdown = False  # a later registration of this process lost nothing
            return
        starting = self.life.state is broker_life.State.REGISTERING
        again = broker_life.register if starting else broker_life.reregister
        retry_ms = broker.config.register_retry_ms
        broker.trace("registration ended without a key (%s); again in %d ms", outcome, retry_ms)
        broker.after(retry_ms, self.start, again)

    def _on_lease_lost(self) -> None:
        """The registered lease was lost: register again as a new incarnation (same data, new
        broker epoch), unless shutting down."""
        lease = self.lease
        if lease is None or not lease.lost or self.registering is not None:
            return
        self.counts["lease lost"] += 1
        if self.life.lease_lost():
            self.start(broker_life.reregister)

    def shutting_down(self) -> None:
        """serve()'s on_stop: the process begins to stop and cancels a registration under way."""
        self.life.shutting_down()
        self.registering = None

    def stopped(self) -> None:
        """Closed: the lease is revoked, deleting the key now."""
        if self.lease is not None:
            self.lease.stop(revoke=True)
        self.life.stopped()
