"""The gateway's registration life: the broker's rules (coordinator/broker_life.py) for a gateway.

The state table walked for a gateway, and the driver serve() runs
(services/gateway/registration_life.py over coordinator/registration.py's RegistrationLife)
against the in-memory store: a lease lost while running registers the same gateway id again
with its info unchanged, metered; a lease lost while shutting down is not registered again.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import REGISTRY

from clients.common.errors import InvariantViolation
from coordinator import broker_life as life
from coordinator import values
from coordinator.memory_store import MemoryStore
from coordinator.registration import revoke_registration_lease
from services.gateway.registration_life import gateway_registration_life

INFO = {"gateway_id": 7, "host": "h", "port": 9092, "pid": 1}
# The smallest TTL a lease may have: keep-alives every TTL / LEASE_KEEPALIVES_PER_TTL notice a
# revoked lease within a fraction of a second.
TTL_S = 1
# Bound on each wait of the driver below: several keep-alive intervals on a loaded machine.
WAIT_S = 5.0


def test_the_state_table_moves_a_gateway_through_its_life() -> None:
    gateway = life.ProcessLife("gateway", 7)
    gateway.registered(10)
    assert gateway.lease_lost()
    assert gateway.state is life.State.REREGISTERING
    gateway.registered(20)
    assert (gateway.state, gateway.epoch, gateway.registrations) == (life.State.REGISTERED, 20, 2)
    gateway.shutting_down()
    assert not gateway.lease_lost()  # a lease lost while stopping is not registered again
    gateway.stopped()
    assert gateway.stopping


def test_an_illegal_move_of_a_gateway_names_the_gateway() -> None:
    gateway = life.ProcessLife("gateway", 7)
    with pytest.raises(
        InvariantViolation, match=r"gateway 7 \(gateway epoch None\) .* registering to lease lost"
    ):
        gateway.lease_lost()


def counter(name: str) -> float:
    """A gateway registration counter's value in the process's registry (tests share it)."""
    return REGISTRY.get_sample_value(f"highwater_gateway_{name}_total") or 0.0


@pytest.mark.asyncio
async def test_a_lost_lease_registers_the_same_gateway_again_with_its_info_and_is_metered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore(now_ms=0)
    stopped: list[bool] = []
    gateway = gateway_registration_life(
        store, 7, dict(INFO), ttl_s=TTL_S, stop_process=lambda: stopped.append(True)
    )
    registrations, losses = counter("registrations"), counter("lease_losses")
    first = await gateway.register()
    key = store.keys.gateway(7)
    assert first.key == key and counter("registrations") == registrations + 1
    watcher = asyncio.create_task(gateway.watch_lease())
    try:
        with caplog.at_level(logging.WARNING, logger="highwater.gateway"):
            assert await revoke_registration_lease(store, key)
            assert await store.get(key) is None
            async with asyncio.timeout(WAIT_S):
                while gateway.current is first or gateway.life.state is not life.State.REGISTERED:
                    await asyncio.sleep(0.01)
        again = gateway.registration
        kv = await store.get(key)
        assert kv is not None and kv.create_revision == again.broker_epoch > first.broker_epoch
        assert kv.lease == again.lease_id != first.lease_id
        assert kv.value == values.encode_registration(dict(INFO)), "the same info, unchanged"
        assert counter("lease_losses") == losses + 1 and counter("registrations") == registrations + 2
        assert "gateway 7 lost its etcd lease" in caplog.text
        assert stopped == []

        # Shutting down: a lease lost now is not registered again, and the watch ends.
        gateway.shutting_down()
        await revoke_registration_lease(store, key)
        async with asyncio.timeout(WAIT_S):
            await watcher
        assert await store.get(key) is None and counter("lease_losses") == losses + 1
    finally:
        watcher.cancel()
        if gateway.current is not None:
            await gateway.current.close()
        gateway.stopped()
    assert gateway.life.stopping and gateway.life.state.value == "stopped"
