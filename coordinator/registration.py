"""Broker and gateway registration: an ephemeral `/brokers/ids/{id}` (or `/gateways/ids/{id}`) key.

The key is created in one transaction, only if missing, with a lease the returned
Registration keeps alive; it disappears within the TTL of the process going away,
which is how the controller learns of a broker failure (DESIGN.md section 7).

The **broker epoch** is the key's create_revision: every registration of a broker
id gets a new, larger one, so control requests meant for an earlier incarnation can
be fenced (STALE_BROKER_EPOCH).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from coordinator import values
from coordinator.lease import LeaseKeeper, OnLost
from coordinator.limits import REGISTRATION_RETRY_INTERVAL_S, REGISTRATION_RETRY_MARGIN_S
from coordinator.store import CoordinatorError, Get, KeyValue, MetadataStore, Put, compare_missing

log = logging.getLogger("highwater.coordinator")


class BrokerIdInUse(CoordinatorError):
    """Another live process holds this broker id's registration."""


class GatewayIdInUse(CoordinatorError):
    """Another live process holds this gateway id's registration."""


@dataclass(slots=True)
class Registration:
    """A live registration. broker_epoch: the key's create_revision (for a gateway, its
    registration epoch). Watch `lease.lost`: once set, the key is gone (or about to be)
    and the process must re-register or stop."""

    lease: LeaseKeeper
    broker_epoch: int
    key: str

    @property
    def lease_id(self) -> int:
        return self.lease.lease_id

    async def close(self, *, revoke: bool = True) -> None:
        """Deregister: stop keep-alives and (with revoke) delete the key now."""
        await self.lease.stop(revoke=revoke)


@dataclass(frozen=True, slots=True)
class _LeaseSettings:
    """How a registration's lease is kept: its TTL, the keep-alive interval (None: the
    LeaseKeeper's default) and what to call when it is lost. They travel together from the
    public register_* calls to the LeaseKeeper."""

    ttl_s: int
    keepalive_interval_s: float | None
    on_lost: OnLost | None


def _holder_address(existing: KeyValue | None) -> str:
    if existing is None:
        return "an unknown address"
    try:
        return values.registration_address(existing.value)
    except (ValueError, TypeError, KeyError):
        return "an unknown address"


async def _register(
    store: MetadataStore,
    key: str,
    info: dict[str, Any],
    lease: _LeaseSettings,
    name: str,
) -> tuple[Registration | None, KeyValue | None]:
    keeper = LeaseKeeper(on_lost=lease.on_lost, name=name)
    lease_id = await keeper.start(store, lease.ttl_s, keepalive_interval_s=lease.keepalive_interval_s)
    try:
        result = await store.txn(
            [compare_missing(key)],
            [Put(key, values.encode_registration(info), lease=lease_id), Get(key)],
            [Get(key)],
        )
    except BaseException:
        # Unknown outcome (etcd unreachable, cancelled): revoking removes the key if it was written.
        await keeper.stop(revoke=True)
        raise
    if not result.succeeded:
        await keeper.stop(revoke=True)
        return None, result.gets[0][0] if result.gets[0] else None
    created = result.gets[0][0]
    log.info("%s registered at %s (epoch %d, lease %x)", name, key, created.create_revision, lease_id)
    return Registration(lease=keeper, broker_epoch=created.create_revision, key=key), None


async def _register_id(
    store: MetadataStore,
    key: str,
    info: dict[str, Any],
    lease: _LeaseSettings,
    *,
    kind: str,
    ident: int,
    in_use: type[CoordinatorError],
) -> Registration:
    """`_register` the `kind` ("broker", "gateway") numbered `ident` at `key`; `in_use` when a
    live process holds it, naming that process's address and the `--{kind}-id` option."""
    registration, holder = await _register(store, key, info, lease, name=f"{kind} {ident}")
    if registration is None:
        raise in_use(
            f"{kind} id {ident} is already registered by a live process at {_holder_address(holder)}; "
            f"pick another --{kind}-id or stop that one"
        )
    return registration


async def register_broker(
    store: MetadataStore,
    broker_id: int,
    info: dict[str, Any],
    *,
    ttl_s: int,
    keepalive_interval_s: float | None = None,
    on_lost: OnLost | None = None,
) -> Registration:
    """Register broker_id with info (host, port, rack, metrics port) under a fresh lease.

    The lease keeper is running when this returns. Raises BrokerIdInUse when a live
    process already holds the id, ValueError for a bad TTL/interval or id,
    CoordinatorUnavailable when etcd cannot be reached.
    """
    lease = _LeaseSettings(ttl_s, keepalive_interval_s, on_lost)
    key = store.keys.broker(broker_id)
    return await _register_id(store, key, info, lease, kind="broker", ident=broker_id, in_use=BrokerIdInUse)


async def register_gateway(
    store: MetadataStore,
    gateway_id: int,
    info: dict[str, Any],
    *,
    ttl_s: int,
    keepalive_interval_s: float | None = None,
    on_lost: OnLost | None = None,
) -> Registration:
    """Register gateway_id with info (host, port) under a fresh lease; as register_broker.

    Raises GatewayIdInUse when a live process already holds the id.
    """
    lease = _LeaseSettings(ttl_s, keepalive_interval_s, on_lost)
    key = store.keys.gateway(gateway_id)
    return await _register_id(
        store, key, info, lease, kind="gateway", ident=gateway_id, in_use=GatewayIdInUse
    )


async def register_waiting_for_old_lease(
    register: Callable[[], Awaitable[Registration]], *, ttl_s: int, what: str
) -> Registration:
    """Register, waiting out the lease of a previous incarnation that died without revoking it.

    A process restarted right after a crash finds its own old key still held by a
    lease that etcd has not expired yet; Kafka's broker waits for the old session
    the same way. Gives up (raising the in-use error) after the TTL plus a margin.
    """
    deadline = asyncio.get_running_loop().time() + ttl_s + REGISTRATION_RETRY_MARGIN_S
    while True:
        try:
            return await register()
        except (BrokerIdInUse, GatewayIdInUse) as exc:
            if asyncio.get_running_loop().time() >= deadline:
                raise
            log.info("%s: id still held (%s); waiting for the old lease to expire", what, exc)
            await asyncio.sleep(REGISTRATION_RETRY_INTERVAL_S)


async def revoke_broker_incarnation(store: MetadataStore, broker_id: int, broker_epoch: int) -> bool:
    """Revoke the lease of broker_id's registration if it is still the incarnation broker_epoch.

    The controller's fast path for a broker whose connection closed (BrokerHeartbeat): its key
    then goes at once, and the controller's watch handles that as a broker failure. Reading the
    key and then revoking its lease cannot hit another incarnation: the lease revoked is the one
    the key of this incarnation names, and a re-registered broker holds a lease of its own.
    Returns whether a lease was revoked (False: the key is gone or names another incarnation).
    """
    kv = await store.get(store.keys.broker(broker_id))
    if kv is None or kv.create_revision != broker_epoch or not kv.lease:
        return False
    await store.revoke_lease(kv.lease)
    return True
