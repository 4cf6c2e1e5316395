"""The gateway process's registration life: coordinator/registration.py's RegistrationLife for a gateway.

A gateway registers `/gateways/ids/{id}` under a lease: the controller pushes UpdateMetadata
to the gateways it finds there, and clients find the gateways there. The key goes with the
lease, so a gateway whose lease is lost (an etcd partition, a pause past the TTL) would keep
running unseen; the lease watch registers it again, with the same gateway id and the same
info, by the broker's rules (coordinator/broker_life.py: register, lease lost,
re-registering), and stops the process if that does not succeed within
LEASE_REREGISTER_TTLS_MAX TTLs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from coordinator import broker_life
from coordinator.registration import GatewayIdInUse, RegistrationLife
from coordinator.store import MetadataStore
from services.gateway import metrics

log = logging.getLogger("highwater.gateway")


def gateway_registration_life(
    store: MetadataStore,
    gateway_id: int,
    info: dict[str, Any],
    *,
    ttl_s: int,
    stop_process: Callable[[], None],
) -> RegistrationLife:
    """The gateway's registration and lease watch, metered (GATEWAY_LEASE_LOSSES,
    GATEWAY_REGISTRATIONS). Owned by serve()."""
    return RegistrationLife(
        store,
        broker_life.ProcessLife("gateway", gateway_id),
        store.keys.gateway(gateway_id),
        info,
        ttl_s=ttl_s,
        in_use=GatewayIdInUse,
        on_registered=lambda registration: metrics.GATEWAY_REGISTRATIONS.inc(),
        on_lease_lost=metrics.GATEWAY_LEASE_LOSSES.inc,
        stop_process=stop_process,
        unregistered_means=(
            "without a registration clients cannot find this gateway and the controller sends it no metadata"
        ),
        log=log,
    )
