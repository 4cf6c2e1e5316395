"""The coordinator against a real etcd: store semantics, registration, election, fencing, watches.

Every wait is bounded by a deadline; lease TTLs are 1 s (the local etcd's minimum)
so expiry tests take about a second each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from coordinator.election import ControllerElection, ControllerFenced, current_controller, fenced_txn
from coordinator.etcd_server import EtcdServer, free_port
from coordinator.lease import LeaseKeeper
from coordinator.memory_store import MemoryStore
from coordinator.registration import BrokerIdInUse, GatewayIdInUse, register_broker, register_gateway
from coordinator.store import (
    CoordinatorUnavailable,
    EtcdStore,
    Get,
    Put,
    WatchEvent,
    compare_missing,
)
from tests.conftest import running_etcd
from tests.unit.test_memory_store import reference_script

pytestmark = pytest.mark.integration

T = TypeVar("T")

# The shortest lease etcd grants here (1.5 x the local server's 500 ms election timeout, rounded up).
TTL_S = 1
# etcd checks for expired leases every 500 ms; a key on an abandoned 1 s lease is gone well within this.
EXPIRY_WAIT_S_MAX = TTL_S + 4.0
# Anything that should happen "at once" (a watch event, a takeover after a revoke).
PROMPT_WAIT_S_MAX = 5.0


async def wait_until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Poll check() until it returns True; fail the test after timeout_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() >= deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def retry_unavailable(call: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """Retry call while etcd is (re)starting; fail the test after timeout_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await call()
        except CoordinatorUnavailable:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
def private_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """An etcd server of this module's own: the conformance trace needs revisions nobody
    else moves, and the restart test stops and starts it."""
    yield from running_etcd(tmp_path_factory.mktemp("private-etcd"), "highwater-private-etcd")


@contextlib.asynccontextmanager
async def collecting(
    store: EtcdStore, prefix: str, start_revision: int = 0
) -> AsyncIterator[asyncio.Queue[WatchEvent]]:
    """Watch prefix in a task feeding a queue; the task is cancelled on exit."""
    queue: asyncio.Queue[WatchEvent] = asyncio.Queue()

    async def consume() -> None:
        async for batch in store.watch_prefix(prefix, start_revision=start_revision):
            for event in batch:
                queue.put_nowait(event)

    task = asyncio.create_task(consume())
    try:
        yield queue
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def next_event(queue: asyncio.Queue[WatchEvent], timeout_s: float = PROMPT_WAIT_S_MAX) -> WatchEvent:
    async with asyncio.timeout(timeout_s):
        return await queue.get()


# --- store semantics ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_etcd_and_memory_store_give_the_same_trace(private_etcd: EtcdServer) -> None:
    """Revisions, versions, compare semantics, transactions, leases and watch events:
    MemoryStore must match etcd operation for operation."""
    async with await EtcdStore.connect(private_etcd.endpoint, prefix="/conformance") as store:
        etcd_trace = await reference_script(store, f"/conformance/{secrets.token_hex(4)}/")
    memory_trace = await reference_script(MemoryStore(), "/conformance/x/")
    assert len(etcd_trace) == len(memory_trace)
    for etcd_entry, memory_entry in zip(etcd_trace, memory_trace, strict=True):
        assert memory_entry == etcd_entry


@pytest.mark.asyncio
async def test_put_get_prefix_delete_and_txn(etcd_store: EtcdStore) -> None:
    keys = etcd_store.keys
    rev = await etcd_store.put(keys.topic("t"), b'{"p":1}')
    await etcd_store.put(keys.partition_state("t", 0), b"{}")
    await etcd_store.put(keys.topic("t2"), b"{}")
    kv = await etcd_store.get(keys.topic("t"))
    assert kv is not None and (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (
        b'{"p":1}',
        rev,
        rev,
        1,
    )
    kvs, revision = await etcd_store.get_prefix(keys.topics_prefix)
    assert [keys.classify_topic_key(kv.key) for kv in kvs] == [
        ("topic", "t"),
        ("partition_state", "t", 0),
        ("topic", "t2"),
    ]
    assert revision >= rev + 2
    result = await etcd_store.txn(
        [compare_missing(keys.topic("t"))], [Put(keys.topic("t"), b"x")], [Get(keys.topic("t"))]
    )
    assert not result.succeeded and result.gets[0][0].value == b'{"p":1}'
    assert await etcd_store.delete(keys.topics_prefix, prefix=True) == 3
    assert await etcd_store.get(keys.topic("t")) is None


@pytest.mark.asyncio
async def test_connect_to_nothing_fails_fast_with_a_clear_error() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(CoordinatorUnavailable, match=f"{endpoint}.*etcd server is running"):
        await EtcdStore.connect(endpoint, timeout_s=0.5)


def test_etcd_started_on_picked_ports_survives_losing_a_port_to_another_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process binds the first port picked for etcd before etcd does (a parallel test run did this
    # to a gateway once): etcd must start on fresh ports instead of failing.
    import socket

    import coordinator.etcd_server as etcd_server

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks = iter([taken.getsockname()[1]])
    real_free_port = etcd_server.free_port
    monkeypatch.setattr(
        etcd_server, "free_port", lambda host="127.0.0.1": next(picks, None) or real_free_port(host)
    )
    server = EtcdServer(tmp_path / "data", log_path=tmp_path / "etcd.log", name="highwater-port-race")
    try:
        server.start()
        assert server.client_port != taken.getsockname()[1]
        assert "address already in use" in server.log_tail(1 << 20)
    finally:
        server.stop()
        taken.close()


# --- registration ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_broker_registration_refuses_a_live_id(etcd_store: EtcdStore) -> None:
    first = await register_broker(
        etcd_store, 1, {"host": "127.0.0.1", "port": 9001, "rack": None}, ttl_s=TTL_S
    )
    try:
        kv = await etcd_store.get(etcd_store.keys.broker(1))
        assert kv is not None and kv.lease == first.lease_id
        assert json.loads(kv.value)["port"] == 9001
        assert first.broker_epoch == kv.create_revision
        with pytest.raises(
            BrokerIdInUse, match=r"broker id 1 is already registered by a live process at 127\.0\.0\.1:9001"
        ):
            await register_broker(etcd_store, 1, {"host": "127.0.0.1", "port": 9002}, ttl_s=TTL_S)
        gateway = await register_gateway(etcd_store, 1, {"host": "127.0.0.1", "port": 9101}, ttl_s=TTL_S)
        with pytest.raises(GatewayIdInUse):
            await register_gateway(etcd_store, 1, {"host": "127.0.0.1", "port": 9102}, ttl_s=TTL_S)
        await gateway.close()
        assert await etcd_store.get(etcd_store.keys.gateway(1)) is None, (
            "close() revokes: the key goes at once"
        )
    finally:
        await first.close()


@pytest.mark.asyncio
async def test_registration_lives_while_kept_alive_and_expires_after(etcd_store: EtcdStore) -> None:
    key = etcd_store.keys.broker(7)
    registration = await register_broker(
        etcd_store, 7, {"host": "h", "port": 1}, ttl_s=TTL_S, keepalive_interval_s=0.2
    )
    _, revision = await etcd_store.get_prefix(key)
    async with collecting(etcd_store, key, start_revision=revision + 1) as events:
        # Kept alive for twice its TTL: no delete.
        with pytest.raises(TimeoutError):
            await next_event(events, timeout_s=2 * TTL_S)
        assert registration.lease.keepalives_total >= 5 and not registration.lease.lost.is_set()
        # The process "dies": keep-alives stop, the lease is not revoked.
        await registration.close(revoke=False)
        event = await next_event(events, timeout_s=EXPIRY_WAIT_S_MAX)
        assert (event.kind, event.key) == ("delete", key)
    again = await register_broker(etcd_store, 7, {"host": "h", "port": 1}, ttl_s=TTL_S)
    try:
        assert again.broker_epoch > registration.broker_epoch, "a new incarnation gets a new broker epoch"
    finally:
        await again.close()


# The owner's event loop is busy this long between yields (a broker opening a thousand logs)...
BUSY_SLICE_S = 0.4
# ... for this long: several lease TTLs.
BUSY_FOR_S = 6.0
BUSY_LEASE_TTL_S = 2


@pytest.mark.asyncio
async def test_a_lease_outlives_a_busy_event_loop_and_its_loss_still_reaches_the_owner(
    etcd_store: EtcdStore,
) -> None:
    lost_seen_on_owner_loop = asyncio.Event()
    keeper = LeaseKeeper(on_lost=lost_seen_on_owner_loop.set, name="busy owner")
    await keeper.start(etcd_store, BUSY_LEASE_TTL_S)
    try:
        assert keeper.on_own_thread, "over etcd the keep-alives run on their own thread"
        loop = asyncio.get_running_loop()
        busy_until = loop.time() + BUSY_FOR_S
        while loop.time() < busy_until:
            slice_end = time.monotonic() + BUSY_SLICE_S
            while time.monotonic() < slice_end:
                pass  # synchronous work: this loop runs nothing else meanwhile
            await asyncio.sleep(0)
        assert not keeper.lost.is_set(), "the lease was lost while only the owner's loop was busy"
        assert keeper.keepalives_total >= BUSY_FOR_S / keeper.keepalive_interval_s / 2
        assert await etcd_store.keep_alive_once(keeper.lease_id) > 0, "etcd still holds the lease"
        # A real loss still reaches the owner, on its own loop.
        await etcd_store.revoke_lease(keeper.lease_id)
        async with asyncio.timeout(BUSY_LEASE_TTL_S + PROMPT_WAIT_S_MAX):
            await lost_seen_on_owner_loop.wait()
        assert keeper.lost.is_set()
    finally:
        await keeper.stop()


# --- controller election and fencing ---------------------------------------------------------


@pytest.mark.asyncio
async def test_election_failover_and_fencing(etcd_store: EtcdStore) -> None:
    keys = etcd_store.keys
    first = ControllerElection(
        etcd_store, 1, {"host": "127.0.0.1", "port": 9301}, ttl_s=TTL_S, keepalive_interval_s=0.2
    )
    second = ControllerElection(
        etcd_store, 2, {"host": "127.0.0.1", "port": 9302}, ttl_s=TTL_S, keepalive_interval_s=0.2
    )
    third = ControllerElection(
        etcd_store, 3, {"host": "127.0.0.1", "port": 9303}, ttl_s=TTL_S, keepalive_interval_s=0.2
    )
    try:
        assert await first.campaign() == 1
        assert await current_controller(etcd_store) == {
            "controller_id": 1,
            "epoch": 1,
            "host": "127.0.0.1",
            "port": 9301,
        }
        takeover = asyncio.create_task(second.campaign())
        done, _ = await asyncio.wait({takeover}, timeout=0.5)
        assert not done, "a second candidate waits while the first holds /controller"

        # The first controller stops keeping its lease alive (a crash or a long pause).
        assert first.lease is not None
        await first.lease.stop(revoke=False)
        async with asyncio.timeout(EXPIRY_WAIT_S_MAX):
            assert await takeover == 2
        assert (await current_controller(etcd_store) or {}).get("controller_id") == 2

        # The deposed controller's writes are fenced and write nothing.
        with pytest.raises(ControllerFenced) as fenced:
            await fenced_txn(etcd_store, 1, [], [Put(keys.topic("written-by-stale"), b"{}")])
        assert (fenced.value.epoch, fenced.value.current_epoch) == (1, 2)
        assert await etcd_store.get(keys.topic("written-by-stale")) is None
        result = await fenced_txn(
            etcd_store, 2, [compare_missing(keys.topic("t"))], [Put(keys.topic("t"), b"{}")]
        )
        assert result.succeeded

        # etcd revokes the active controller's lease: it learns it lost, a standby takes over at once.
        standby = asyncio.create_task(third.campaign())
        assert second.lease is not None
        await etcd_store.revoke_lease(second.lease.lease_id)
        async with asyncio.timeout(PROMPT_WAIT_S_MAX):
            await second.lost.wait()
            assert await standby == 3
        assert not second.is_controller and third.is_controller
        await third.resign()
        assert await current_controller(etcd_store) is None
        assert (await etcd_store.get(keys.controller_epoch)).value == b"3"  # type: ignore[union-attr]
    finally:
        for election in (first, second, third):
            await election.resign()


# --- watches --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_watch_sees_puts_and_deletes_and_resumes_across_an_etcd_restart(
    private_etcd: EtcdServer,
) -> None:
    prefix = f"/restart-{secrets.token_hex(4)}"
    async with await EtcdStore.connect(private_etcd.endpoint, prefix=prefix, request_timeout_s=1.0) as store:
        base = f"{prefix}/w/"
        async with collecting(store, base) as events:
            # The watch is live once an event arrives; "from now on" may start after the first put.
            await wait_until(
                lambda: _put_and_see(store, base + "probe", events), PROMPT_WAIT_S_MAX, "the watch to start"
            )
            await store.put(base + "a", b"1")
            await store.delete(base + "a")
            seen = [await next_event(events), await next_event(events)]
            assert [(e.kind, e.key, e.value) for e in seen] == [
                ("put", base + "a", b"1"),
                ("delete", base + "a", b""),
            ]

            private_etcd.stop()
            with pytest.raises(CoordinatorUnavailable, match=private_etcd.endpoint):
                await store.get(base + "a")
            private_etcd.start()
            # Written as soon as etcd answers, most likely before the watch has re-connected.
            await retry_unavailable(lambda: store.put(base + "b", b"2"), PROMPT_WAIT_S_MAX)
            event = await next_event(events, timeout_s=PROMPT_WAIT_S_MAX)
            assert (event.kind, event.key, event.value) == ("put", base + "b", b"2")

            # A paused etcd: calls time out as unavailable; the watch carries on after resume.
            private_etcd.pause()
            try:
                with pytest.raises(CoordinatorUnavailable):
                    await store.get(base + "b")
            finally:
                private_etcd.resume()
            await retry_unavailable(lambda: store.put(base + "c", b"3"), PROMPT_WAIT_S_MAX)
            event = await next_event(events, timeout_s=PROMPT_WAIT_S_MAX)
            assert (event.kind, event.key) == ("put", base + "c")
            assert events.empty(), "nothing delivered twice"
        await store.delete(prefix + "/", prefix=True)


async def _put_and_see(store: EtcdStore, key: str, events: asyncio.Queue[WatchEvent]) -> bool:
    await store.put(key, b"")
    try:
        async with asyncio.timeout(0.2):
            while True:
                event = await events.get()
                if event.key == key:
                    # Drain any earlier probes so later assertions see only their own events.
                    while not events.empty():
                        events.get_nowait()
                    return True
    except TimeoutError:
        return False
