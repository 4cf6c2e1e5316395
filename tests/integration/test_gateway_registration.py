"""A gateway whose etcd lease is lost registers again (services/gateway/registration_life.py).

The gateway's `/gateways/ids/{id}` key is how clients and the controller find it; it goes
with the lease. Revoking the lease in etcd (what etcd does when the lease expires during a
partition or a long pause) deletes the key at once; the running gateway must notice and
register again with the same id and the same info, well within its lease TTL plus the
re-registration backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from coordinator import values
from coordinator.registration import revoke_registration_lease
from coordinator.store import EtcdStore, KeyValue
from protos.highwater.v1 import common_pb2
from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster
from tests.integration.helpers import gateway_stub, wait_for

pytestmark = pytest.mark.integration

GATEWAY_ID = 1


def gateway_key(endpoint: str) -> KeyValue | None:
    """The gateway's registration key as etcd holds it now (None when absent)."""

    async def get() -> KeyValue | None:
        store = await EtcdStore.connect(endpoint)
        try:
            return await store.get(store.keys.gateway(GATEWAY_ID))
        finally:
            await store.close()

    return asyncio.run(get())


def revoke_gateway_lease(endpoint: str) -> bool:
    async def revoke() -> bool:
        store = await EtcdStore.connect(endpoint)
        try:
            return await revoke_registration_lease(store, store.keys.gateway(GATEWAY_ID))
        finally:
            await store.close()

    return asyncio.run(revoke())


def registered_again(endpoint: str, before: KeyValue) -> KeyValue | None:
    """The gateway's key once it is a registration later than `before` (None until then)."""
    kv = gateway_key(endpoint)
    return kv if kv is not None and kv.create_revision > before.create_revision else None


def test_a_gateway_whose_lease_is_revoked_registers_again_with_the_same_id_and_info(
    make_cluster: Callable[..., TestCluster],
) -> None:
    c = make_cluster(brokers=1)
    before = wait_for(lambda: gateway_key(c.etcd_endpoint), timeout_s=10, what="the gateway's registration")
    assert before is not None  # wait_for returned it truthy
    pid = c.processes[f"gateway-{GATEWAY_ID}"].pid

    assert revoke_gateway_lease(c.etcd_endpoint), "the gateway's key had no lease to revoke"

    # The lease keeper notices at its next keep-alive (TTL / LEASE_KEEPALIVES_PER_TTL); a bound of
    # a few TTLs leaves room for a loaded machine without hiding a gateway that never comes back.
    after = wait_for(
        lambda: registered_again(c.etcd_endpoint, before),
        timeout_s=4 * TEST_LEASE_TTL_S,
        what="the gateway to register again after its lease was revoked",
    )
    assert after is not None
    assert after.lease and after.lease != before.lease, "registered under a new lease"
    assert after.value == before.value, "the same gateway id with its info (address, pid) unchanged"
    assert values.decode_gateway_registration(after.value)["gateway_id"] == GATEWAY_ID
    assert c.processes[f"gateway-{GATEWAY_ID}"].pid == pid, "the same gateway process, not a restart"
    log = c.processes[f"gateway-{GATEWAY_ID}"].log_path.read_text(errors="replace")
    assert f"gateway {GATEWAY_ID} lost its etcd lease" in log, "the loss is logged"
    # And it still serves at the address it registered.
    gateway_stub(c.gateway_address).Metadata(common_pb2.MetadataRequest(), timeout=10)
