"""A standby's metadata, replayed from etcd's changes, is what a fresh load reads.

The cases write what the controller, brokers, gateways and operators write (topics created and
deleted with every key, ISR changes, configs, deletion marks, brokers re-registering, a
malformed value) into a MemoryStore, which keeps etcd's revisions, versions and watch events
(tests/unit/test_memory_store.py), and compare `MetadataImage.context()` of the replayed image
with that of a fresh `load_image`.
"""

from __future__ import annotations

import asyncio

import pytest

from coordinator import values
from coordinator.memory_store import MemoryStore
from coordinator.store import Delete, Put, WatchCompacted
from services.controller.context import ControllerContext
from services.controller.metadata_image import MetadataFollower, MetadataImage, load_image


def topic_value(topic_id: str, partitions: dict[int, tuple[int, ...]]) -> bytes:
    return values.encode_topic_assignment(topic_id, partitions, {}, {})


def broker_value(broker_id: int, port: int) -> bytes:
    return values.encode_registration({"broker_id": broker_id, "host": "127.0.0.1", "port": port})


async def create_topic(store: MemoryStore, name: str, replicas: dict[int, tuple[int, ...]]) -> None:
    """As the controller's CreateTopics commits it: states in one transaction, the topic key in another."""
    k = store.keys
    await store.txn(
        [],
        [
            Put(k.partition_state(name, p), values.encode_partition_state(r[0], 0, r, 1))
            for p, r in replicas.items()
        ],
    )
    await store.put(k.topic(name), topic_value(f"id-{name}", replicas))


async def changes(store: MemoryStore) -> None:
    """A series of changes of every kind the controller keeps."""
    k = store.keys
    await store.put(k.broker(3), broker_value(3, 9003))
    await store.delete(k.broker(1))
    await store.put(k.broker(1), broker_value(1, 9011))  # re-registered: a new broker epoch
    await store.put(k.gateway(2), values.encode_registration({"gateway_id": 2, "host": "h", "port": 2}))
    await store.delete(k.gateway(1))
    await create_topic(store, "new", {0: (3,), 1: (1,)})
    # ISR changes: the version (partition epoch) and mod_revision move.
    await store.put(k.partition_state("a", 0), values.encode_partition_state(2, 1, (2,), 1))
    await store.put(k.partition_state("a", 0), values.encode_partition_state(2, 1, (2, 1), 1))
    await store.put(k.topic_config("a"), values.encode_topic_configs({"min.insync.replicas": "2"}))
    await store.put(k.topic_config("b"), values.encode_topic_configs({"retention.ms": "1000"}))
    await store.delete(k.topic_config("b"))
    # Topic "gone" is deleted as the controller does it: every key in one transaction.
    await store.put(k.delete_topic("gone"), values.DELETE_TOPIC_MARK)
    await store.txn(
        [],
        [
            Delete(k.topic("gone")),
            Delete(k.topic_partitions_prefix("gone"), prefix=True),
            Delete(k.topic_config("gone")),
            Delete(k.delete_topic("gone")),
        ],
    )
    await store.put(k.delete_topic("b"), values.DELETE_TOPIC_MARK)  # deletion started
    await store.put(k.delete_topic("nothing"), values.DELETE_TOPIC_MARK)  # names no topic
    await store.put(k.partition_state("b", 0), b"not json")  # malformed: skipped by a load too
    await store.put(k.prefix + "/consumers/g/offsets/a/0", b"{}")  # not the controller's
    await store.put(k.controller_epoch, values.encode_controller_epoch(2))


async def initial(store: MemoryStore) -> None:
    k = store.keys
    await store.put(k.broker(1), broker_value(1, 9001))
    await store.put(k.broker(2), broker_value(2, 9002))
    await store.put(k.gateway(1), values.encode_registration({"gateway_id": 1, "host": "h", "port": 1}))
    await create_topic(store, "a", {0: (1, 2), 1: (2, 1)})
    await create_topic(store, "b", {0: (2,)})
    await create_topic(store, "gone", {0: (1,), 1: (2,), 2: (1,)})
    await store.put(k.topic_config("gone"), values.encode_topic_configs({"retention.ms": "5"}))


def fresh(image: MetadataImage) -> ControllerContext:
    return image.context(controller_id=1, epoch=7)


@pytest.mark.asyncio
async def test_replayed_image_equals_a_fresh_load() -> None:
    store = MemoryStore()
    await initial(store)
    image = await load_image(store)
    watch = store.subscribe(store.keys.prefix + "/", start_revision=image.revision + 1)
    await changes(store)
    for events in watch.drain():
        image.replay(events)
    loaded = await load_image(store)
    assert image.revision == loaded.revision == store.revision
    replayed_ctx, loaded_ctx = fresh(image), fresh(loaded)
    assert replayed_ctx == loaded_ctx
    # What the changes did, so the equality is not that of two empty pictures.
    assert sorted(loaded_ctx.topics) == ["a", "b", "new"]
    assert loaded_ctx.topics_to_delete == {"b"}
    assert loaded_ctx.live_brokers[1].port == 9011
    assert sorted(loaded_ctx.live_gateways) == [2]
    assert loaded_ctx.states[("a", 0)].isr == (2, 1) and loaded_ctx.states[("a", 0)].partition_epoch == 3
    assert ("b", 0) not in loaded_ctx.states
    assert loaded_ctx.topics["a"].configs == {"min.insync.replicas": "2"}


@pytest.mark.asyncio
async def test_replay_from_before_a_load_converges() -> None:
    """A load reads its prefixes one after another, so its watch replays changes some of its
    reads already saw; replaying them again ends where a fresh load does."""
    store = MemoryStore()
    await initial(store)
    start = store.revision
    await changes(store)
    image = await load_image(store)  # already holds every change
    image.revision = start
    watch = store.subscribe(store.keys.prefix + "/", start_revision=start + 1)
    for events in watch.drain():
        image.replay(events)
    assert fresh(image) == fresh(await load_image(store))


def test_context_shares_no_mutable_data_with_the_image() -> None:
    """The controller that takes the image changes its context by replay; the image must not move."""
    image = MetadataImage(MemoryStore().keys)
    image.put(
        image.keys.topic("t"), topic_value("id", {0: (1,)}), create_revision=1, mod_revision=1, version=1
    )
    ctx = fresh(image)
    ctx.topics["t"].assignment[1] = (2,)
    ctx.topics["t"].configs["retention.ms"] = "1"
    assert image.topics["t"].assignment == {0: (1,)} and image.configs == {}


@pytest.mark.asyncio
async def test_follower_hands_over_once_caught_up_to_the_election() -> None:
    store = MemoryStore()
    await initial(store)
    follower = MetadataFollower(store)
    await changes(store)
    # The election's transaction: the last revision the new controller must have seen.
    won = await store.put(store.keys.controller, values.encode_controller({"controller_id": 2, "epoch": 3}))
    image = await follower.take(won, timeout_s=5)
    assert image is not None and image.revision >= won
    assert fresh(image) == fresh(await load_image(store))


@pytest.mark.asyncio
async def test_follower_that_cannot_catch_up_hands_over_nothing() -> None:
    store = MemoryStore()
    await initial(store)
    follower = MetadataFollower(store)
    assert await follower.take(store.revision + 5, timeout_s=0.2) is None


@pytest.mark.asyncio
async def test_follower_reloads_after_the_history_it_needs_is_compacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A watch gap is never replayed over: the follower loads everything again."""
    store = MemoryStore()
    await initial(store)
    compacted = asyncio.Event()
    real_watch = store.watch_prefix

    async def compacting_once(prefix: str, *, start_revision: int = 0):  # type: ignore[no-untyped-def]
        if not compacted.is_set():
            compacted.set()
            raise WatchCompacted("compacted (test)", start_revision + 1)
            yield  # an async generator, like the real one
        async for events in real_watch(prefix, start_revision=start_revision):
            yield events

    monkeypatch.setattr(store, "watch_prefix", compacting_once)
    follower = MetadataFollower(store)
    await changes(store)
    won = await store.put(store.keys.controller, values.encode_controller({"controller_id": 2, "epoch": 3}))
    image = await follower.take(won, timeout_s=5)
    assert compacted.is_set()
    assert image is not None and fresh(image) == fresh(await load_image(store))


@pytest.mark.asyncio
async def test_protos_built_ahead_are_those_of_the_context_taken_over() -> None:
    """A standby builds the partition-state protos as changes arrive; the controller that takes
    the image uses them (StateProtos) only while they say what the context says."""
    store = MemoryStore()
    await initial(store)
    image = await load_image(store)
    image.warm_protos()
    watch = store.subscribe(store.keys.prefix + "/", start_revision=image.revision + 1)
    await changes(store)
    # A reassignment changes the topic key only: its partitions' protos must follow.
    await store.put(
        store.keys.topic("a"),
        values.encode_topic_assignment("id-a", {0: (1, 2, 3), 1: (2, 1)}, {0: (3,)}, {}),
    )
    for events in watch.drain():
        image.replay(events)
    assert image.warm_protos() > 0
    ctx = fresh(image)
    built = len(image.protos)
    for tp in ctx.states:
        proto = image.protos.get(tp, ctx.states[tp], ctx.topics[tp[0]])
        assert proto == ctx.partition_state_proto(tp), tp
    assert len(image.protos) == built, "every proto was built ahead"
    assert image.protos.get(("a", 0), ctx.states[("a", 0)], ctx.topics["a"]).adding_replicas == [3]
