"""MemoryStore behaves like etcd: revisions, versions, compare semantics, leases, watches.

The expected values are etcd's (store.py's docstring states the rules);
`reference_script` is also run against a real etcd in
tests/integration/test_coordinator.py, which checks that both give the same trace.
The LeaseKeeper, registration and election tests at the end run the coordinator's
own logic over MemoryStore in virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from coordinator.election import ControllerElection, ControllerFenced, current_controller, fenced_txn
from coordinator.keys import Keys
from coordinator.lease import LeaseKeeper
from coordinator.limits import ETCD_TXN_OPS_MAX
from coordinator.memory_store import MemoryStore
from coordinator.registration import BrokerIdInUse, register_broker
from coordinator.store import (
    Compare,
    CoordinatorError,
    CoordinatorUnavailable,
    Delete,
    Get,
    KeyValue,
    LeaseLost,
    MetadataStore,
    Put,
    WatchCompacted,
    WatchEvent,
    compare_create_revision,
    compare_missing,
    compare_mod_revision,
    compare_value,
    compare_version,
)

# Bound on every wait in these tests (real seconds; everything here is instant).
WAIT_S_MAX = 2.0


# --- the reference script, shared with the integration test --------------------------


async def reference_script(store: MetadataStore, base: str) -> list[Any]:
    """Run etcd operations under `base` and return a trace with revisions relative to the start.

    Nothing else may write to the store meanwhile (revisions are global).
    """
    _, start = await store.get_prefix(base)
    trace: list[Any] = []

    def rel(revision: int) -> int:
        return revision - start if revision else 0

    def kv(item: KeyValue | None) -> tuple[Any, ...] | None:
        if item is None:
            return None
        return (
            item.key.removeprefix(base),
            item.value,
            rel(item.create_revision),
            rel(item.mod_revision),
            item.version,
            item.lease != 0,
        )

    a, b, c = base + "a", base + "b", base + "c"
    trace.append(("put", rel(await store.put(a, b"1"))))
    trace.append(("put", rel(await store.put(a, b"2"))))
    trace.append(("get", kv(await store.get(a))))
    trace.append(("get missing", kv(await store.get(b))))
    trace.append(("delete missing", await store.delete(b)))
    trace.append(("put", rel(await store.put(b, b"x"))))
    trace.append(("put", rel(await store.put(base + "b/child", b"y"))))
    kvs, revision = await store.get_prefix(base)
    trace.append(("prefix", [kv(i) for i in kvs], rel(revision)))

    compares: list[tuple[str, Compare]] = [
        ("missing on missing", compare_missing(c)),
        ("missing on present", compare_missing(a)),
        ("value equal", compare_value(a, b"2")),
        ("value differs", compare_value(a, b"1")),
        ("value on missing", compare_value(c, b"")),
        ("value != on missing", Compare(c, "value", "!=", b"z")),
        ("value <", Compare(a, "value", "<", b"3")),
        ("value >", Compare(a, "value", ">", b"3")),
        ("version 2", compare_version(a, 2)),
        ("version > 1", Compare(a, "version", ">", 1)),
        ("version < 1 on missing", Compare(c, "version", "<", 1)),
        ("mod_revision", compare_mod_revision(a, start + 2)),
        ("mod_revision 0 on missing", compare_mod_revision(c, 0)),
        ("create_revision", compare_create_revision(a, start + 1)),
        ("create_revision !=", Compare(a, "create_revision", "!=", start + 1)),
    ]
    for name, compare in compares:
        result = await store.txn([compare], [], [])
        trace.append(("compare", name, result.succeeded, rel(result.revision)))

    # A transaction: all compares must hold; writes share one revision; a Get after a Put sees it.
    result = await store.txn(
        [compare_value(a, b"2"), compare_missing(c)],
        [Put(c, b"new"), Put(a, b"3"), Get(a), Get(base, prefix=True), Delete(b)],
        [Get(a)],
    )
    trace.append(
        ("txn ok", result.succeeded, rel(result.revision), [[kv(i) for i in g] for g in result.gets])
    )
    result = await store.txn([compare_missing(c)], [Put(c, b"again")], [Get(c), Get(base + "nothing")])
    trace.append(
        ("txn failed", result.succeeded, rel(result.revision), [[kv(i) for i in g] for g in result.gets])
    )
    for name, bad in [
        ("duplicate put", [Put(a, b"1"), Put(a, b"2")]),
        ("put inside deleted range", [Delete(base, prefix=True), Put(a, b"1")]),
        ("too many ops", [Put(f"{base}many/{i}", b"") for i in range(ETCD_TXN_OPS_MAX + 1)]),
    ]:
        try:
            await store.txn([], bad)
            trace.append(("refused", name, False))
        except CoordinatorError:
            trace.append(("refused", name, True))

    # Leases: keys attached, a put without the lease detaches a key, revoke deletes the rest at once.
    lease = await store.grant_lease(30)
    trace.append(("put leased", rel(await store.put(base + "l/2", b"", lease=lease))))
    trace.append(("put leased", rel(await store.put(base + "l/1", b"", lease=lease))))
    trace.append(("put leased", rel(await store.put(base + "l/3", b"", lease=lease))))
    trace.append(("detach", rel(await store.put(base + "l/3", b"kept"))))
    trace.append(("leased kv", kv(await store.get(base + "l/1"))))
    trace.append(("keep-alive", await store.keep_alive_once(lease) > 0))
    await store.revoke_lease(lease)
    kvs, revision = await store.get_prefix(base + "l/")
    trace.append(("after revoke", [kv(i) for i in kvs], rel(revision)))
    trace.append(("keep-alive revoked", await store.keep_alive_once(lease)))
    await store.revoke_lease(lease)  # already gone: not an error
    try:
        await store.put(base + "l/4", b"", lease=lease)
        trace.append(("put on revoked lease", "no error"))
    except LeaseLost:
        trace.append(("put on revoked lease", "LeaseLost"))
    trace.append(("delete prefix", await store.delete(base + "b", prefix=True)))
    _, end = await store.get_prefix(base)
    trace.append(("end", rel(end)))

    # Everything again, as watch events from the start.
    events: list[tuple[Any, ...]] = []
    async with contextlib.aclosing(store.watch_prefix(base, start_revision=start + 1)) as stream:
        async with asyncio.timeout(WAIT_S_MAX):
            async for batch in stream:
                events.extend(
                    (
                        e.kind,
                        e.key.removeprefix(base),
                        e.value,
                        rel(e.create_revision),
                        rel(e.mod_revision),
                        e.version,
                    )
                    for e in batch
                )
                if batch[-1].mod_revision >= end:
                    break
    trace.append(("events", events))
    return trace


@pytest.mark.asyncio
async def test_reference_script_expected_values() -> None:
    store = MemoryStore()
    trace = await reference_script(store, "/ref/")
    as_dict = {}
    for entry in trace:
        as_dict.setdefault(entry[0], []).append(entry[1:])
    assert [r for (r,) in as_dict["put"]] == [1, 2, 3, 4]
    assert as_dict["get"] == [(("a", b"2", 1, 2, 2, False),)]
    assert as_dict["get missing"] == [(None,)]
    assert as_dict["delete missing"] == [(0,)]
    compares = {name: (ok, rev) for name, ok, rev in as_dict["compare"]}
    assert {name for name, (ok, _) in compares.items() if ok} == {
        "missing on missing",
        "value equal",
        "value <",
        "version 2",
        "version > 1",
        "version < 1 on missing",
        "mod_revision",
        "mod_revision 0 on missing",
        "create_revision",
    }
    assert {rev for _, rev in compares.values()} == {4}, "read-only transactions take no revision"
    ok, rev, gets = as_dict["txn ok"][0]
    assert ok and rev == 5
    assert gets == [
        [("a", b"3", 1, 5, 3, False)],
        [
            ("a", b"3", 1, 5, 3, False),
            ("b", b"x", 3, 3, 1, False),
            ("b/child", b"y", 4, 4, 1, False),
            ("c", b"new", 5, 5, 1, False),
        ],
    ]
    assert as_dict["txn failed"] == [(False, 5, [[("c", b"new", 5, 5, 1, False)], []])]
    assert all(refused for _, refused in as_dict["refused"])
    assert as_dict["detach"] == [(9,)]
    assert as_dict["after revoke"] == [([("l/3", b"kept", 8, 9, 2, False)], 10)]
    assert as_dict["keep-alive revoked"] == [(0,)]
    assert as_dict["put on revoked lease"] == [("LeaseLost",)]
    assert as_dict["delete prefix"] == [(1,)]  # b was deleted in the transaction; b/child remains
    assert as_dict["end"] == [(11,)]
    events = as_dict["events"][0][0]
    assert [e[4] for e in events] == sorted(e[4] for e in events), "events in revision order"
    assert ("delete", "b", b"", 0, 5, 0) in events
    # The transaction's writes come in op order, the revoke's deletes in key order.
    assert [e[:2] for e in events if e[4] == 5] == [("put", "c"), ("put", "a"), ("delete", "b")]
    assert [e[:2] for e in events if e[4] == 10] == [("delete", "l/1"), ("delete", "l/2")]


# --- revisions, versions, compares ------------------------------------------------------


@pytest.mark.asyncio
async def test_revisions_and_versions_follow_etcd() -> None:
    store = MemoryStore()
    assert store.revision == 1
    assert await store.put("/k", b"a") == 2
    assert await store.put("/k", b"b") == 3
    assert await store.get("/k") == KeyValue("/k", b"b", 2, 3, 2, 0)
    assert await store.delete("/k") == 1
    assert store.revision == 4
    assert await store.delete("/k") == 0
    assert store.revision == 4, "a delete that deletes nothing takes no revision"
    assert await store.put("/k", b"c") == 5
    assert await store.get("/k") == KeyValue("/k", b"c", 5, 5, 1, 0), "a re-created key starts at version 1"


@pytest.mark.asyncio
async def test_get_prefix_is_sorted_and_bounded_by_prefix() -> None:
    store = MemoryStore()
    for key in ("/t/b", "/t/a", "/tz", "/t/a/x"):
        await store.put(key, b"")
    kvs, revision = await store.get_prefix("/t/")
    assert [kv.key for kv in kvs] == ["/t/a", "/t/a/x", "/t/b"]
    assert revision == store.revision == 5


@pytest.mark.asyncio
async def test_failed_txn_runs_failure_branch_and_takes_no_revision_without_writes() -> None:
    store = MemoryStore()
    await store.put("/a", b"1")
    result = await store.txn([compare_value("/a", b"2")], [Put("/a", b"3")], [Get("/a")])
    assert not result.succeeded
    assert result.revision == 2
    assert result.gets == [[KeyValue("/a", b"1", 2, 2, 1, 0)]]
    result = await store.txn([compare_value("/a", b"2")], [], [Put("/b", b"x")])
    assert not result.succeeded and result.revision == 3, "the failure branch may write"


def test_compare_rejects_wrong_value_types() -> None:
    with pytest.raises(ValueError):
        Compare("/a", "version", "==", b"1")
    with pytest.raises(ValueError):
        Compare("/a", "value", "==", 1)
    with pytest.raises(ValueError):
        Compare("/a", "lease", "==", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Compare("/a", "version", "<=", 1)  # type: ignore[arg-type]


# --- leases --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_lease_expiry_deletes_keys_in_one_revision_at_the_deadline() -> None:
    store = MemoryStore(now_ms=1_000)
    lease = await store.grant_lease(2)
    await store.put("/l/a", b"", lease=lease)
    await store.put("/l/b", b"", lease=lease)
    await store.put("/plain", b"")
    assert store.advance(2_999) == []
    assert await store.keep_alive_once(lease) == 2
    assert store.lease_deadline_ms(lease) == 4_999
    assert store.advance(4_998) == []
    assert (await store.get("/l/a")) is not None
    revision = store.revision
    assert store.advance(4_999) == [lease]
    assert store.revision == revision + 1
    assert (await store.get_prefix("/l/"))[0] == []
    assert await store.get("/plain") is not None
    assert await store.keep_alive_once(lease) == 0
    with pytest.raises(LeaseLost):
        await store.put("/l/a", b"", lease=lease)
    with pytest.raises(LeaseLost):
        await store.txn([], [Put("/x", b""), Put("/l/a", b"", lease=lease)])
    assert await store.get("/x") is None, "a refused transaction writes nothing"
    with pytest.raises(ValueError):
        store.advance(0)


@pytest.mark.asyncio
async def test_expiry_order_and_lease_without_keys() -> None:
    store = MemoryStore()
    late = await store.grant_lease(3)
    early = await store.grant_lease(1)
    await store.put("/late", b"", lease=late)
    revision = store.revision
    assert store.advance(10_000) == [early, late]
    assert store.revision == revision + 1, "expiring a lease without keys takes no revision"
    assert store.lease_ids() == []


@pytest.mark.asyncio
async def test_unavailable_store_raises_and_watch_resumes_without_gaps() -> None:
    store = MemoryStore()
    lease = await store.grant_lease(5)
    await store.put("/w/leased", b"", lease=lease)
    seen: list[WatchEvent] = []

    async def consume() -> None:
        async for batch in store.watch_prefix("/w/"):
            seen.extend(batch)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    await store.put("/w/1", b"")
    async with asyncio.timeout(WAIT_S_MAX):
        while not seen:
            await asyncio.sleep(0)
    store.set_available(False)
    with pytest.raises(CoordinatorUnavailable):
        await store.put("/w/2", b"")
    store.expire_lease(lease)  # a change made while the watcher is cut off
    for _ in range(3):
        await asyncio.sleep(0)
    assert [e.key for e in seen] == ["/w/1"], "no events while etcd is unreachable"
    store.set_available(True)
    await store.put("/w/3", b"")
    async with asyncio.timeout(WAIT_S_MAX):
        while len(seen) < 3:
            await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert [(e.kind, e.key) for e in seen] == [("put", "/w/1"), ("delete", "/w/leased"), ("put", "/w/3")]


# --- watches -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_watch_delivers_in_revision_order_from_a_past_revision() -> None:
    store = MemoryStore()
    await store.put("/w/a", b"1")
    start = store.revision
    await store.put("/w/b", b"2")
    await store.put("/other", b"")
    await store.txn([], [Put("/w/c", b"3"), Delete("/w/a")])
    batches: list[list[WatchEvent]] = []
    async with (
        contextlib.aclosing(store.watch_prefix("/w/", start_revision=start)) as stream,
        asyncio.timeout(WAIT_S_MAX),
    ):
        async for batch in stream:
            batches.append(batch)
            if len(batches) == 3:
                break
    assert [[(e.kind, e.key, e.mod_revision) for e in b] for b in batches] == [
        [("put", "/w/a", 2)],
        [("put", "/w/b", 3)],
        [("put", "/w/c", 5), ("delete", "/w/a", 5)],
    ]


@pytest.mark.asyncio
async def test_subscribe_drain_is_a_synchronous_cursor() -> None:
    store = MemoryStore()
    watch = store.subscribe("/s/")
    assert watch.drain() == []
    await store.put("/s/1", b"a")
    await store.put("/x", b"")
    await store.delete("/s/1")
    assert [[(e.kind, e.key) for e in b] for b in watch.drain()] == [[("put", "/s/1")], [("delete", "/s/1")]]
    assert watch.drain() == []


@pytest.mark.asyncio
async def test_compaction_fails_watches_that_start_too_early() -> None:
    store = MemoryStore(history_revisions_max=3)
    for i in range(6):
        await store.put(f"/c/{i}", b"")
    assert store.compacted_revision == store.revision - 3
    with pytest.raises(WatchCompacted):
        store.subscribe("/c/", start_revision=2).drain()
    assert len(store.subscribe("/c/", start_revision=store.revision - 2).drain()) == 3
    with pytest.raises(WatchCompacted):
        async for _ in store.watch_prefix("/c/", start_revision=1):
            pass


@pytest.mark.asyncio
async def test_cancelling_the_consumer_ends_the_watch() -> None:
    store = MemoryStore()

    async def consume() -> None:
        async for _ in store.watch_prefix("/"):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert store._waiters == [] or all(f.done() for f in store._waiters)
    await store.put("/after", b"")  # no one to wake, no error


@pytest.mark.asyncio
async def test_close_ends_watches_and_refuses_calls() -> None:
    store = MemoryStore()
    results: list[int] = []

    async def consume() -> None:
        async for batch in store.watch_prefix("/"):
            results.append(len(batch))

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    await store.close()
    async with asyncio.timeout(WAIT_S_MAX):
        await task
    with pytest.raises(CoordinatorError):
        await store.get("/a")


# --- LeaseKeeper, registration and election in virtual time --------------------------------


class VirtualTime:
    """A clock for one LeaseKeeper: each of its sleeps moves time (and the store's clock) on."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.now_s = 0.0

    def clock(self) -> float:
        return self.now_s

    async def sleep(self, delay_s: float) -> None:
        self.now_s += delay_s
        self.store.advance(round(self.now_s * 1000))
        await asyncio.sleep(0)

    async def run_until(self, now_s: float) -> None:
        async with asyncio.timeout(WAIT_S_MAX):
            while self.now_s < now_s:
                await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_lease_keeper_keeps_the_lease_then_declares_it_lost_when_etcd_is_unreachable() -> None:
    store = MemoryStore()
    vt = VirtualTime(store)
    calls: list[str] = []
    keeper = LeaseKeeper(on_lost=lambda: calls.append("lost"), sleep=vt.sleep, clock=vt.clock)
    lease = await keeper.start(store, 2)
    assert keeper.keepalive_interval_s == 0.5
    await store.put("/reg", b"", lease=lease)
    await vt.run_until(20.0)
    assert await store.get("/reg") is not None
    assert not keeper.lost.is_set() and keeper.keepalives_total >= 30
    store.set_available(False)
    lost_from = vt.now_s
    async with asyncio.timeout(WAIT_S_MAX):
        await keeper.lost.wait()
    assert vt.now_s - lost_from <= 2.0 + keeper.keepalive_interval_s
    assert keeper.keepalive_failures_total >= 2
    assert calls == ["lost"]
    store.set_available(True)
    assert await store.get("/reg") is None, "the lease expired in the store as well"
    await keeper.stop()


@pytest.mark.asyncio
async def test_lease_keeper_sees_an_expired_lease_at_the_next_keepalive() -> None:
    store = MemoryStore()
    vt = VirtualTime(store)
    keeper = LeaseKeeper(sleep=vt.sleep, clock=vt.clock)
    lease = await keeper.start(store, 4)
    store.expire_lease(lease)
    async with asyncio.timeout(WAIT_S_MAX):
        await keeper.lost.wait()
    assert vt.now_s == 1.0 and keeper.keepalive_failures_total == 0
    await keeper.stop()


@pytest.mark.asyncio
async def test_lease_keeper_refuses_an_interval_too_close_to_the_ttl() -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match="keep-alive interval"):
        await LeaseKeeper().start(store, 2, keepalive_interval_s=1.0)
    with pytest.raises(ValueError, match="TTL"):
        await LeaseKeeper().start(store, 0)
    assert store.lease_ids() == [], "checked before any lease is granted"


@pytest.mark.asyncio
async def test_registration_and_broker_epoch_over_memory_store() -> None:
    store = MemoryStore()
    first = await register_broker(store, 1, {"host": "h1", "port": 9001}, ttl_s=10)
    assert first.broker_epoch == (await store.get(first.key)).create_revision  # type: ignore[union-attr]
    with pytest.raises(BrokerIdInUse, match="h1:9001"):
        await register_broker(store, 1, {"host": "h2", "port": 9002}, ttl_s=10)
    assert len(store.lease_ids()) == 1, "the refused registration revoked its lease"
    await first.close()
    second = await register_broker(store, 1, {"host": "h2", "port": 9002}, ttl_s=10)
    assert second.broker_epoch > first.broker_epoch
    await second.close(revoke=False)


@pytest.mark.asyncio
async def test_election_fencing_over_memory_store() -> None:
    store = MemoryStore()
    keys: Keys = store.keys
    # Real-time keep-alives, but frequent, so the deposed controller notices at once.
    first = ControllerElection(store, 1, {"host": "h", "port": 1}, ttl_s=1, keepalive_interval_s=0.02)
    second = ControllerElection(store, 2, {"host": "h", "port": 2}, ttl_s=1, keepalive_interval_s=0.02)
    assert await first.campaign() == 1
    assert await current_controller(store) == {"controller_id": 1, "epoch": 1, "host": "h", "port": 1}
    waiting = asyncio.create_task(second.campaign())
    await asyncio.sleep(0)
    assert not waiting.done()
    store.expire_lease(first.lease.lease_id)  # type: ignore[union-attr]
    async with asyncio.timeout(WAIT_S_MAX):
        assert await waiting == 2
    async with asyncio.timeout(WAIT_S_MAX):
        await first.lost.wait()
    with pytest.raises(ControllerFenced) as fenced:
        await fenced_txn(store, 1, [], [Put(keys.topic("t"), b"{}")])
    assert (fenced.value.epoch, fenced.value.current_epoch) == (1, 2)
    assert await store.get(keys.topic("t")) is None
    ok = await fenced_txn(store, 2, [compare_missing(keys.topic("t"))], [Put(keys.topic("t"), b"{}")])
    assert ok.succeeded
    again = await fenced_txn(
        store, 2, [compare_missing(keys.topic("t"))], [Put(keys.topic("t"), b"{}")], [Get(keys.topic("t"))]
    )
    assert not again.succeeded and again.gets[0][0].value == b"{}", (
        "the caller's own compare failed: no ControllerFenced"
    )
    await second.resign()
    assert await current_controller(store) is None


# --- the key layout the stores are used with ---------------------------------------------------


def test_key_layout_and_parsers() -> None:
    keys = Keys("/hw/")
    assert keys.broker(3) == "/hw/brokers/ids/3" and keys.parse_broker_id("/hw/brokers/ids/3") == 3
    assert keys.parse_gateway_id(keys.gateway(4)) == 4
    assert (keys.controller, keys.controller_epoch) == ("/hw/controller", "/hw/controller_epoch")
    assert keys.partition_state("t", 2) == "/hw/brokers/topics/t/partitions/2/state"
    assert keys.classify_topic_key(keys.topic("t")) == ("topic", "t")
    assert keys.classify_topic_key(keys.partition_state("t", 2)) == ("partition_state", "t", 2)
    assert keys.classify_topic_key(keys.topic_partitions_prefix("t") + "x/state") is None
    assert keys.classify_topic_key(keys.broker(1)) is None
    assert keys.consumer_offset("g", "t", 0) == "/hw/consumers/g/offsets/t/0"
    assert keys.parse_consumer_offset(keys.consumer_offset("g", "t", 0)) == ("g", "t", 0)
    assert keys.consumer_offset("g", "t", 0).startswith(keys.consumer_group_prefix("g"))
    assert not keys.consumer_offset("g2", "t", 0).startswith(keys.consumer_group_prefix("g"))
    assert keys.parse_topic_name(keys.delete_topic("t"), keys.delete_topics_prefix) == "t"
    assert (
        keys.topic_config("t") == "/hw/config/topics/t" and keys.producer_id_block == "/hw/producer_id_block"
    )
    for bad in ("/hw/brokers/ids/", "/hw/brokers/ids/x", "/hw/brokers/ids/1/2", "/other/brokers/ids/1"):
        with pytest.raises(ValueError):
            keys.parse_broker_id(bad)
    for bad_name in ("", "a/b"):
        with pytest.raises(ValueError):
            keys.topic(bad_name)
    with pytest.raises(ValueError):
        keys.broker(-1)
    with pytest.raises(ValueError):
        Keys("highwater")


@pytest.mark.asyncio
async def test_a_standby_whose_watch_history_is_compacted_reads_the_election_again() -> None:
    """etcd compacts its history; a standby waiting for /controller to go whose watch fell behind
    the retained history gets WatchCompacted. It must read the election again and go on waiting,
    not end its campaign (a controller process that never campaigns again)."""
    store = MemoryStore(history_revisions_max=3)
    first = ControllerElection(store, 1, {"host": "h", "port": 1}, ttl_s=1, keepalive_interval_s=0.02)
    second = ControllerElection(store, 2, {"host": "h", "port": 2}, ttl_s=1, keepalive_interval_s=0.02)
    assert await first.campaign() == 1
    waiting = asyncio.create_task(second.campaign())
    for _ in range(3):
        await asyncio.sleep(0)  # the standby reads the election and starts watching
    for i in range(10):  # more writes than the history keeps, before the watcher runs again
        await store.put(f"/elsewhere/{i}", b"")
    for _ in range(10):
        await asyncio.sleep(0)
    assert not waiting.done(), waiting.exception() if waiting.done() else None
    store.expire_lease(first.lease.lease_id)  # type: ignore[union-attr]
    async with asyncio.timeout(WAIT_S_MAX):
        assert await waiting == 2
    await second.resign()
