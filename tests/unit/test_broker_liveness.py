"""The controller's grace-period bookkeeping for brokers' liveness streams (services/controller/liveness.py),
driven by a clock the test moves; the broker side's reconnect back-off; and the servicer's stream
handler over a MemoryStore (what it revokes, and what a standby answers)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from clients.common.errors import InvariantViolation
from coordinator.memory_store import MemoryStore
from protos.highwater.v1 import common_pb2, controller_pb2
from services.broker.heartbeat import next_backoff_ms
from services.common import limits
from services.controller import metrics
from services.controller.liveness import BrokerConnections
from services.controller.server import ControllerServicer

GRACE_MS = 300


def test_a_stream_not_reopened_within_the_grace_period_is_due_once() -> None:
    c = BrokerConnections(GRACE_MS)
    c.opened(1, 10)
    assert c.connected(1, 10) and c.connected_count() == 1
    assert c.next_deadline_ms() is None
    c.closed(1, 10, now_ms=1_000)
    assert not c.connected(1, 10) and c.connected_count() == 0
    assert c.next_deadline_ms() == 1_300
    assert c.due(1_299) == []
    assert c.due(1_300) == [(1, 10)]
    assert c.due(5_000) == []  # named once only
    assert c.next_deadline_ms() is None


def test_reopening_within_the_grace_period_cancels_it() -> None:
    c = BrokerConnections(GRACE_MS)
    c.opened(1, 10)
    c.closed(1, 10, now_ms=1_000)
    c.opened(1, 10)  # the broker reconnected after a blip
    assert c.connected(1, 10)
    assert c.due(10_000) == []
    assert c.next_deadline_ms() is None


def test_an_incarnation_with_two_streams_is_disconnected_only_when_both_ended() -> None:
    # A broker may open its new stream before the controller has seen the old one end.
    c = BrokerConnections(GRACE_MS)
    c.opened(1, 10)
    c.opened(1, 10)
    c.closed(1, 10, now_ms=1_000)
    assert c.connected(1, 10)
    assert c.due(10_000) == []
    c.closed(1, 10, now_ms=2_000)
    assert c.due(2_300) == [(1, 10)]


def test_only_the_incarnation_that_lost_its_stream_is_named() -> None:
    c = BrokerConnections(GRACE_MS)
    c.opened(1, 10)
    c.opened(2, 11)
    c.closed(1, 10, now_ms=1_000)
    assert c.due(1_300) == [(1, 10)]
    assert c.connected(2, 11)


def test_a_newer_incarnation_forgets_the_older_ones_of_the_same_broker() -> None:
    # The broker lost its lease and registered again: the old epoch's key is gone anyway.
    c = BrokerConnections(GRACE_MS)
    c.opened(1, 10)
    c.closed(1, 10, now_ms=1_000)
    c.opened(1, 20)
    assert c.due(10_000) == []
    c.closed(1, 10, now_ms=2_000)  # a late end of a forgotten stream changes nothing
    assert c.due(10_000) == []
    assert c.connected(1, 20)


def test_a_later_stream_of_an_older_incarnation_does_not_forget_the_newer_one() -> None:
    c = BrokerConnections(GRACE_MS)
    c.opened(1, 20)
    c.opened(1, 10)
    c.closed(1, 20, now_ms=1_000)
    assert c.due(1_300) == [(1, 20)]


def test_due_incarnations_come_oldest_first_each_after_its_own_grace_period() -> None:
    c = BrokerConnections(GRACE_MS)
    for broker in (1, 2, 3):
        c.opened(broker, broker * 10)
    c.closed(3, 30, now_ms=1_000)
    c.closed(1, 10, now_ms=1_100)
    c.closed(2, 20, now_ms=1_200)
    assert c.next_deadline_ms() == 1_300
    assert c.due(1_400) == [(3, 30), (1, 10)]
    assert c.next_deadline_ms() == 1_500
    assert c.due(1_500) == [(2, 20)]


def test_closing_a_stream_never_opened_is_ignored() -> None:
    c = BrokerConnections(GRACE_MS)
    c.closed(7, 70, now_ms=1_000)
    assert c.due(10_000) == []


def test_reconnect_backoff_starts_small_doubles_and_is_bounded() -> None:
    steps = [0]
    for _ in range(10):
        steps.append(next_backoff_ms(steps[-1]))
    assert steps[1] == limits.BROKER_HEARTBEAT_BACKOFF_MS_MIN
    assert steps[2] == 2 * limits.BROKER_HEARTBEAT_BACKOFF_MS_MIN
    assert max(steps) == limits.BROKER_HEARTBEAT_BACKOFF_MS_MAX
    assert steps[-1] == limits.BROKER_HEARTBEAT_BACKOFF_MS_MAX
    # A broken stream is reopened at once; a second attempt after one failed one still falls
    # inside the smallest grace period.
    assert limits.BROKER_HEARTBEAT_BACKOFF_MS_MIN < limits.BROKER_CONNECTION_GRACE_MS_MIN


def test_grace_period_is_checked_against_its_range_and_the_lease_ttl() -> None:
    limits.check_connection_grace(grace_ms=limits.BROKER_CONNECTION_GRACE_MS, lease_ttl_s=6)
    with pytest.raises(InvariantViolation):
        limits.check_connection_grace(grace_ms=limits.BROKER_CONNECTION_GRACE_MS_MIN - 1, lease_ttl_s=6)
    with pytest.raises(InvariantViolation):
        limits.check_connection_grace(grace_ms=6_000, lease_ttl_s=6)


# ---- the servicer's stream handler, over a MemoryStore ------------------------------------------

WAIT_S = 5.0  # bound on every wait below; the grace period used is 50 ms


async def _registered(store: MemoryStore, broker_id: int) -> int:
    """A registration key under a lease, as register_broker writes it; returns its broker epoch."""
    lease = await store.grant_lease(6)
    await store.put(store.keys.broker(broker_id), b'{"broker_id": %d}' % broker_id, lease=lease)
    kv = await store.get(store.keys.broker(broker_id))
    assert kv is not None
    return kv.create_revision


async def _stream(
    servicer: ControllerServicer, broker_id: int, broker_epoch: int, end: asyncio.Event
) -> tuple[controller_pb2.BrokerHeartbeatResponse, asyncio.Task[Any]]:
    """Open a stream: its first answer, and the task that holds it until `end` is set."""

    async def requests() -> AsyncIterator[controller_pb2.BrokerHeartbeatRequest]:
        yield controller_pb2.BrokerHeartbeatRequest(broker_id=broker_id, broker_epoch=broker_epoch)
        await end.wait()

    answers = servicer.BrokerHeartbeat(requests(), None)  # type: ignore[arg-type]
    first = await anext(answers)
    return first, asyncio.ensure_future(anext(answers, None))


async def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _active_servicer(store: MemoryStore) -> ControllerServicer:
    """A servicer acting as the active controller at epoch 4, with a 50 ms grace period."""
    servicer = ControllerServicer(store)  # type: ignore[arg-type]
    servicer.activate(SimpleNamespace(epoch=4), broker_connection_grace_ms=50)  # type: ignore[arg-type]
    return servicer


@pytest.mark.asyncio
async def test_a_stream_that_ends_gets_its_incarnations_lease_revoked_after_the_grace_period() -> None:
    store = MemoryStore()
    epoch = await _registered(store, 1)
    servicer = _active_servicer(store)
    revoked_before = metrics.BROKER_CONNECTION_REVOCATIONS._value.get()
    end = asyncio.Event()
    first, held = await _stream(servicer, 1, epoch, end)
    assert first.error_code == common_pb2.NONE and first.controller_epoch == 4
    await asyncio.sleep(0.1)  # longer than the grace period, while the stream is open
    assert await store.get(store.keys.broker(1)) is not None
    end.set()  # the broker's side ends
    await held
    started = time.monotonic()
    await _until(lambda: not store._data.get(store.keys.broker(1)), "the registration to go")
    assert time.monotonic() - started >= 0.04
    assert metrics.BROKER_CONNECTION_REVOCATIONS._value.get() == revoked_before + 1
    servicer.stand_by()


@pytest.mark.asyncio
async def test_a_stream_naming_another_incarnation_revokes_nothing() -> None:
    store = MemoryStore()
    epoch = await _registered(store, 1)
    servicer = _active_servicer(store)
    watch = servicer.connection_watch
    assert watch is not None
    end = asyncio.Event()
    _, held = await _stream(servicer, 1, epoch - 1, end)  # an older incarnation's stream
    end.set()
    await held
    # The grace period ran out and the check was made (MemoryStore never suspends mid-call).
    await _until(lambda: watch.connections.next_deadline_ms() is None, "the grace period to end")
    await asyncio.sleep(0)
    assert await store.get(store.keys.broker(1)) is not None
    servicer.stand_by()


@pytest.mark.asyncio
async def test_a_controller_that_stops_acting_ends_its_streams_and_revokes_nothing() -> None:
    store = MemoryStore()
    epoch = await _registered(store, 1)
    servicer = _active_servicer(store)
    _, held = await _stream(servicer, 1, epoch, asyncio.Event())
    servicer.stand_by()
    assert await asyncio.wait_for(held, WAIT_S) is None  # the stream ended: the broker looks again
    await asyncio.sleep(0.1)
    assert await store.get(store.keys.broker(1)) is not None


@pytest.mark.asyncio
async def test_a_standby_answers_not_controller_and_ends_the_stream() -> None:
    store = MemoryStore()
    servicer = ControllerServicer(store)  # type: ignore[arg-type]
    first, held = await _stream(servicer, 1, 7, asyncio.Event())
    assert first.error_code == common_pb2.NOT_CONTROLLER
    assert await asyncio.wait_for(held, WAIT_S) is None
