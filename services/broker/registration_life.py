"""The broker process's registration life: coordinator/registration.py's RegistrationLife for a broker.

The first registration waits out the lease of a previous incarnation (broker_life.register);
a lost lease (a pause past the TTL, etcd expired it) registers again as a new incarnation
with a new broker epoch (broker_life.reregister), so requests meant for the old one are
fenced; a re-registration that does not succeed within LEASE_REREGISTER_TTLS_MAX TTLs stops
the process (without a registration the controller ignores it). The state moves through
broker_life.BrokerLife's table; the simulation drives the same rules (tests/sim/sim_registration.py).
The gateway lives by the same driver (services/gateway/registration_life.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from coordinator import broker_life
from coordinator.registration import BrokerIdInUse, Registration, RegistrationLife
from coordinator.store import MetadataStore

log = logging.getLogger("highwater.broker")


class BrokerRegistrationLife(RegistrationLife):
    """One broker process's registration and lease watch. Owned by serve(): `register` once at
    start, `watch_lease` as a task, `shutting_down` when the process begins to stop."""

    life: broker_life.BrokerLife

    def __init__(
        self,
        store: MetadataStore,
        broker_id: int,
        info: dict[str, Any],
        *,
        ttl_s: int,
        on_registered: Callable[[Registration], None],
        stop_process: Callable[[], None],
    ) -> None:
        self.broker_id = broker_id
        self._on_broker_registered = on_registered
        super().__init__(
            store,
            broker_life.BrokerLife(broker_id),
            store.keys.broker(broker_id),
            info,
            ttl_s=ttl_s,
            in_use=BrokerIdInUse,
            on_registered=self._registered_broker,
            on_lease_lost=lambda: None,
            stop_process=stop_process,
            unregistered_means="without a registration the controller ignores this broker",
            log=log,
        )

    def _registered_broker(self, registration: Registration) -> None:
        # A later registration of this process (the lease was lost) lost nothing on disk since.
        self.info["unclean_shutdown"] = False
        self._on_broker_registered(registration)
