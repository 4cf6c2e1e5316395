"""The controller's metadata as etcd holds it, built by reading etcd or by replaying its changes.

A controller gets its `ControllerContext` from a `MetadataImage` in one of two ways, which share
every line that turns a key into context data:

- **cold**: `load_image` reads the controller's prefixes (the failover read of DESIGN.md);
- **warm**: a standby loads once, then replays every change etcd's watch reports
  (`MetadataImage.replay`, driven by `MetadataFollower`), so that on winning the election it
  only has to confirm the image has caught up to the election's revision.

The image is kept per etcd key (a put sets what a read of that key would give, a delete drops
it), so replaying changes from any revision at or before the image's own converges on what a
fresh read gives: `context()` of the two is the same (tests/unit/test_metadata_image.py).
The join a read does — partition states and configs only for topics that exist, deletion
marks only for topics that exist — happens in `context()`, since a topic's keys are written
in separate transactions that a watch can report in any order across a batch.

This module also holds the converters from the etcd value formats (coordinator/values.py)
into the context's types, which keeps context.py free of coordinator imports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from clients.common.topics import stored_topic_configs
from clients.common.types import TopicPartitionKey
from coordinator import values
from coordinator.keys import Keys
from coordinator.store import CoordinatorError, MetadataStore, WatchCompacted, WatchEvent
from services.common import limits
from services.controller.context import (
    BrokerInfo,
    ControllerContext,
    GatewayInfo,
    LeaderAndIsr,
    StateProtos,
    TopicInfo,
)

log = logging.getLogger("highwater.controller")


# ---- etcd values <-> the context's types (formats: coordinator/values.py) --------------------


def broker_info(raw: bytes, broker_epoch: int) -> BrokerInfo:
    """A /brokers/ids/{id} value; broker_epoch is the key's create_revision."""
    v = values.decode_broker_registration(raw)
    return BrokerInfo(
        v["broker_id"],
        v["host"],
        v["port"],
        v["rack"],
        v["metrics_port"],
        broker_epoch,
        v["unclean_shutdown"],
        v["replicas_max"],
    )


def gateway_info(raw: bytes) -> GatewayInfo:
    v = values.decode_gateway_registration(raw)
    return GatewayInfo(v["gateway_id"], v["host"], v["port"])


def topic_info(name: str, raw: bytes) -> TopicInfo:
    """A /brokers/topics/{topic} value; configs are stored apart and filled in later."""
    v = values.decode_topic_assignment(raw)
    return TopicInfo(name, v["topic_id"], v["partitions"], {}, v["adding_replicas"], v["removing_replicas"])


def partition_state(raw: bytes, partition_epoch: int) -> LeaderAndIsr:
    """A partition state value; partition_epoch is the key's etcd version."""
    v = values.decode_partition_state(raw)
    return LeaderAndIsr(v["leader"], v["leader_epoch"], v["isr"], v["controller_epoch"], partition_epoch)


# ---- the image ------------------------------------------------------------------------------------


class MetadataImage:
    """The controller's keys in etcd, decoded, one entry per key.

    `revision`: every change at or below it is in the image (later ones may be too, as a
    load reads its prefixes one after another). Owned by one task at a time: the follower
    while standing by, then the controller that takes it over.
    """

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.revision = 0
        self.brokers: dict[int, BrokerInfo] = {}
        self.gateways: dict[int, GatewayInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        # Partition states with the mod_revision of their key (ControllerContext.state_revisions).
        self.states: dict[TopicPartitionKey, tuple[LeaderAndIsr, int]] = {}
        self.configs: dict[str, dict[str, str]] = {}
        self.delete_marks: set[str] = set()
        # The partition-state protos a controller sends and answers with, built ahead by a standby
        # (warm_protos) for what changed since it last did: a takeover at 100,000 partitions then
        # builds none (0.75 s of the 1 s it has on this machine).
        self.protos = StateProtos()
        self._unbuilt: set[TopicPartitionKey] = set()
        self._unbuilt_topics: set[str] = set()

    def prefixes(self) -> list[str]:
        """What a load reads (and the order it reads them in)."""
        k = self.keys
        return [k.brokers_prefix, k.gateways_prefix, k.topics_prefix, k.delete_topics_prefix, k.config_prefix]

    def put(self, key: str, value: bytes, *, create_revision: int, mod_revision: int, version: int) -> None:
        """The key now holds value. A value that does not decode is dropped (logged), as a load skips it."""
        k = self.keys
        try:
            if key.startswith(k.brokers_prefix):
                info = broker_info(value, create_revision)
                self.brokers[k.parse_broker_id(key)] = info
            elif key.startswith(k.gateways_prefix):
                self.gateways[k.parse_gateway_id(key)] = gateway_info(value)
            elif key.startswith(k.topics_prefix):
                kind = k.classify_topic_key(key)
                if kind is None:
                    return
                if kind[0] == "topic":
                    self.topics[kind[1]] = topic_info(kind[1], value)
                    self._unbuilt_topics.add(kind[1])
                else:
                    self.states[(kind[1], kind[2])] = (partition_state(value, version), mod_revision)
                    self._unbuilt.add((kind[1], kind[2]))
            elif key.startswith(k.config_prefix):
                name = k.parse_topic_name(key, k.config_prefix)
                configs, skipped = stored_topic_configs(values.decode_topic_configs(value))
                for problem in skipped:
                    # Never a reason to stop: the controller must come up to let anyone fix it.
                    log.error("topic %s: stored config skipped: %s", name, problem)
                self.configs[name] = configs
            elif key.startswith(k.delete_topics_prefix):
                self.delete_marks.add(k.parse_topic_name(key, k.delete_topics_prefix))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("ignoring malformed value at %s: %s", key, exc)
            self.delete(key)

    def delete(self, key: str) -> None:
        k = self.keys
        try:
            if key.startswith(k.brokers_prefix):
                self.brokers.pop(k.parse_broker_id(key), None)
            elif key.startswith(k.gateways_prefix):
                self.gateways.pop(k.parse_gateway_id(key), None)
            elif key.startswith(k.topics_prefix):
                kind = k.classify_topic_key(key)
                if kind is not None and kind[0] == "topic":
                    self.topics.pop(kind[1], None)
                    self.protos.forget_topic(kind[1])
                elif kind is not None:
                    self.states.pop((kind[1], kind[2]), None)
                    self.protos.forget((kind[1], kind[2]))
            elif key.startswith(k.config_prefix):
                self.configs.pop(k.parse_topic_name(key, k.config_prefix), None)
            elif key.startswith(k.delete_topics_prefix):
                self.delete_marks.discard(k.parse_topic_name(key, k.delete_topics_prefix))
        except ValueError:
            pass  # a key that names nothing the controller keeps (a put of it was refused too)

    def replay(self, events: Iterable[WatchEvent]) -> None:
        """Apply changes in revision order; keys the controller does not keep only move `revision`."""
        for e in events:
            if e.kind == "put":
                self.put(
                    e.key,
                    e.value,
                    create_revision=e.create_revision,
                    mod_revision=e.mod_revision,
                    version=e.version,
                )
            else:
                self.delete(e.key)
            self.revision = max(self.revision, e.mod_revision)

    def warm_protos(self) -> int:
        """Build the protos of the states and topics changed since the last call; returns how many."""
        todo = {tp for tp in self._unbuilt if tp[0] not in self._unbuilt_topics}
        for name in self._unbuilt_topics:
            topic = self.topics.get(name)
            if topic is not None:
                todo.update((name, p) for p in topic.assignment)
        self._unbuilt.clear()
        self._unbuilt_topics.clear()
        built = 0
        for tp in todo:
            entry = self.states.get(tp)
            topic = self.topics.get(tp[0])
            if entry is not None and topic is not None and tp[1] in topic.assignment:
                self.protos.get(tp, entry[0], topic)
                built += 1
        return built

    def context(self, controller_id: int, epoch: int) -> ControllerContext:
        """A new controller's context: the join of the keys (module docstring); shares no mutable data."""
        topics = {
            name: TopicInfo(
                t.name,
                t.topic_id,
                dict(t.assignment),
                dict(self.configs.get(name, {})),
                dict(t.adding_replicas),
                dict(t.removing_replicas),
            )
            for name, t in self.topics.items()
        }
        states = {tp: s for tp, s in self.states.items() if tp[0] in topics}
        return ControllerContext(
            controller_id=controller_id,
            epoch=epoch,
            live_brokers=dict(self.brokers),
            live_gateways=dict(self.gateways),
            topics=topics,
            states={tp: s for tp, (s, _) in states.items()},
            topics_to_delete=self.delete_marks & set(topics),
            state_revisions={tp: r for tp, (_, r) in states.items()},
        )


async def load_image(store: MetadataStore) -> MetadataImage:
    """Read the controller's keys from etcd (the cold path); the image's revision is the first read's."""
    image = MetadataImage(store.keys)
    for i, prefix in enumerate(image.prefixes()):
        kvs, revision = await store.get_prefix(prefix)
        if i == 0:
            image.revision = revision
        for kv in kvs:
            image.put(
                kv.key,
                kv.value,
                create_revision=kv.create_revision,
                mod_revision=kv.mod_revision,
                version=kv.version,
            )
    return image


class MetadataFollower:
    """A standby controller's task: load the image once, then replay etcd's changes into it.

    It watches the whole key prefix, which also holds `/controller` and `/controller_epoch`:
    the election writes them, so once the image's revision reaches the election's revision
    every change before it — the previous controller's last writes included — has been
    replayed (`take`). A watch that breaks for good (history compacted, etcd refusing it)
    is replaced by a fresh load, never resumed with a gap. Owned by the campaign task.
    """

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.image: MetadataImage | None = None
        self._progress = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="controller-standby-follower")

    async def _run(self) -> None:
        keys = self.store.keys
        while True:
            try:
                started = time.monotonic()
                image = await load_image(self.store)
                log.info(
                    "standby: loaded %d topics, %d partition states at revision %d in %.0f ms; now following",
                    len(image.topics),
                    len(image.states),
                    image.revision,
                    (time.monotonic() - started) * 1000,
                )
                self.image = image
                self._progress.set()
                image.warm_protos()
                async for events in self.store.watch_prefix(
                    keys.prefix + "/", start_revision=image.revision + 1
                ):
                    image.replay(events)
                    self._progress.set()
                    image.warm_protos()
            except asyncio.CancelledError:
                raise
            except WatchCompacted as exc:
                log.warning("standby: %s; loading the metadata again", exc)
            except CoordinatorError as exc:
                log.warning("standby: following etcd failed (%s); loading the metadata again", exc)
                await asyncio.sleep(limits.CONTROLLER_STANDBY_RELOAD_BACKOFF_S)
            self.image = None

    async def take(self, revision: int, timeout_s: float) -> MetadataImage | None:
        """Stop following and hand over the image once it holds every change up to revision.

        None when it did not get there within timeout_s (still loading, etcd slow): the new
        controller then loads the metadata itself, as a cold one does.
        """
        deadline = time.monotonic() + timeout_s
        try:
            while self.image is None or self.image.revision < revision:
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    log.warning(
                        "standby: metadata not caught up to revision %d within %.1f s (at %s); loading it",
                        revision,
                        timeout_s,
                        self.image.revision if self.image is not None else "none",
                    )
                    return None
                self._progress.clear()
                try:
                    await asyncio.wait_for(self._progress.wait(), left_s)
                except TimeoutError:
                    pass
            return self.image
        finally:
            await self.stop()

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
