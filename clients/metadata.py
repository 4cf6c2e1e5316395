"""The client's topic -> partitions cache, filled from the gateway's Metadata (aiokafka's cluster.py).

`ClusterMetadata` is pure: it holds the last answer and decides when it is too
old, and takes time as an argument. `MetadataFetcher` asks the gateway. A cache
entry is refreshed when it is older than `metadata_max_age_ms`, when a caller
marks it stale (an error flagged `refresh_metadata`: the partition count or the
leaders changed) or when the topic is unknown.

Reads are safe from any thread (a refresh replaces whole dict entries); updates
happen on the owning event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

from clients.common.errors import UnknownTopicOrPartition
from clients.common.leader_map import broker_addresses
from clients.config import UNKNOWN_TOPIC_CONFIRM_MS
from clients.connection import GatewayConnection, call_deadline
from clients.errors import HighwaterError, RequestTimedOut, error_for_code
from clients.types import TopicPartition
from protos.highwater.v1 import common_pb2


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What producers and consumers need of a topic: its partitions and which have a leader."""

    name: str
    topic_id: str
    partitions: tuple[int, ...]  # sorted partition ids
    available: tuple[int, ...]  # partitions with a leader, sorted
    metadata: common_pb2.TopicMetadata
    fetched_at_ms: int
    # TopicPartition of each partition id, built once (send() indexes it per record).
    tps: tuple[TopicPartition, ...] = ()
    # The topic's max.message.bytes (0: not known): no batch may be bigger.
    max_message_bytes: int = 0
    # The leader's broker id of each partition id (-1: none known), for sending straight to it.
    leaders: tuple[int, ...] = ()


class ClusterMetadata:
    """Cache of the last Metadata answer per topic. Pure: no I/O, time passed in."""

    def __init__(self, *, metadata_max_age_ms: int) -> None:
        self.metadata_max_age_ms = metadata_max_age_ms
        self.topics: dict[str, TopicInfo] = {}
        self.cluster_id = ""
        self.controller_id = -1
        self.brokers: tuple[common_pb2.BrokerNode, ...] = ()
        self.gateways: tuple[common_pb2.GatewayNode, ...] = ()
        # "host:port" of each broker the last answer listed: where its partitions' leaders are.
        self.broker_addresses: dict[int, str] = {}
        self._stale: set[str] = set()
        # Errors of topics the last answer knew nothing about (e.g. UNKNOWN_TOPIC_OR_PARTITION).
        self.topic_errors: dict[str, HighwaterError] = {}

    def get(self, topic: str) -> TopicInfo | None:
        return self.topics.get(topic)

    def leader_address(self, tp: TopicPartition) -> str | None:
        """Where tp's leader takes Produce and Fetch ("host:port"), or None when not known now:
        no answer names a leader, or the topic is marked stale (its leaders may have moved)."""
        info = self.topics.get(tp.topic)
        if info is None or tp.topic in self._stale or not 0 <= tp.partition < len(info.leaders):
            return None
        leader = info.leaders[tp.partition]
        return self.broker_addresses.get(leader) if leader >= 0 else None

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str]:
        """The id of each of `topics` the cache knows (a Fetch sends them: a leader that still
        holds a deleted topic of the same name then refuses the read)."""
        known = self.topics
        return {t: info.topic_id for t in topics if (info := known.get(t)) is not None and info.topic_id}

    def is_stale(self, topic: str) -> bool:
        return topic in self._stale

    def needs_refresh(self, topic: str, now_ms: int) -> bool:
        info = self.topics.get(topic)
        return info is None or topic in self._stale or now_ms - info.fetched_at_ms >= self.metadata_max_age_ms

    def mark_stale(self, topic: str | None = None) -> None:
        """Refresh `topic` (or every topic) before its next use: leaders or partitions changed."""
        if topic is None:
            self._stale.update(self.topics)
        else:
            self._stale.add(topic)

    def update(
        self, response: common_pb2.MetadataResponse, now_ms: int, *, asked: list[str] | None = None
    ) -> None:
        """Take a Metadata answer. Topics asked for but answered with an error are forgotten."""
        self.cluster_id = response.cluster_id
        self.controller_id = response.controller_id
        self.brokers = tuple(response.brokers)
        self.broker_addresses = broker_addresses(response)
        self.gateways = tuple(response.gateways)
        seen: set[str] = set()
        for topic in response.topics:
            seen.add(topic.name)
            self._stale.discard(topic.name)
            if topic.error_code != common_pb2.NONE:
                self.topics.pop(topic.name, None)
                self.topic_errors[topic.name] = error_for_code(
                    topic.error_code, topic.error_message or topic.name
                )
                continue
            self.topic_errors.pop(topic.name, None)
            ordered = sorted(topic.partitions, key=lambda p: p.partition)
            leaders = [-1] * (ordered[-1].partition + 1 if ordered else 0)
            for p in ordered:
                leaders[p.partition] = p.leader
            self.topics[topic.name] = TopicInfo(
                name=topic.name,
                topic_id=topic.topic_id,
                partitions=tuple(p.partition for p in ordered),
                available=tuple(p.partition for p in ordered if p.leader >= 0),
                metadata=topic,
                fetched_at_ms=now_ms,
                tps=tuple(
                    TopicPartition(topic.name, p) for p in range(ordered[-1].partition + 1 if ordered else 0)
                ),
                max_message_bytes=topic.config.max_message_bytes,
                leaders=tuple(leaders),
            )
        if asked is None:
            # A full answer: topics not in it are gone.
            for name in list(self.topics):
                if name not in seen:
                    del self.topics[name]
        else:
            for name in asked:
                if name not in seen:
                    self.topics.pop(name, None)
                    self.topic_errors[name] = UnknownTopicOrPartition(f"topic {name!r} does not exist")
                    self._stale.discard(name)


def now_ms() -> int:
    """Monotonic milliseconds: cache ages and timeouts, never wall time."""
    return int(time.monotonic() * 1000)


class MetadataFetcher:
    """Fetches Metadata through the connection into a ClusterMetadata. Owned by one event loop."""

    def __init__(self, connection: GatewayConnection, cache: ClusterMetadata) -> None:
        self.connection = connection
        self.cache = cache
        self._refresh_lock = asyncio.Lock()

    async def refresh(self, topics: list[str] | None = None) -> common_pb2.MetadataResponse:
        """Ask the gateway for `topics` (None: all) and update the cache."""
        async with self._refresh_lock:
            response: common_pb2.MetadataResponse = await self.connection.call(
                "Metadata", common_pb2.MetadataRequest(topics=topics or [])
            )
            self.cache.update(response, now_ms(), asked=list(topics) if topics else None)
            self.connection.learn_gateways(
                [f"{g.host}:{g.port}" for g in response.gateways if g.host and g.port]
            )
            return response

    async def topic(self, topic: str, *, wait_ms: int, backoff_ms: int, wait_setting: str = "") -> TopicInfo:
        """The topic's info, refreshed when stale; waits up to `wait_ms` for a topic that is
        unknown or has no partitions yet (a gateway learns a new topic from the controller
        a moment after CreateTopics answers). Raises UnknownTopicOrPartition after that.

        A topic the gateways answer does not exist is asked about again for
        UNKNOWN_TOPIC_CONFIRM_MS only, then UnknownTopicOrPartition is raised: topics are
        never created on first use, so waiting `wait_ms` for it would only hide the mistake
        (confluent-kafka fails the same way). A topic that exists without a leader yet is
        returned, and the sender waits for its leader.

        A refresh that fails with a retriable error (no gateway answers, a timeout) is
        retried with `backoff_ms` pauses within the same `wait_ms`, each attempt bounded by
        the time left, as Kafka's producer waits max.block.ms for metadata; after that,
        RequestTimedOut naming `wait_setting` (the caller's setting, e.g. "max_block_ms").
        Not while the connection has never reached a gateway: a wrong bootstrap address is
        raised at once (GatewayUnavailable), not waited out.
        """
        started_ms = now_ms()
        deadline_ms = started_ms + wait_ms
        attempts = 0
        # When a gateway first answered that the topic does not exist (None: not yet).
        unknown_since_ms: int | None = None
        while True:
            if not self.cache.needs_refresh(topic, now_ms()):
                info = self.cache.get(topic)
                if info is not None and info.partitions:
                    return info
            attempts += 1
            try:
                # wait_ms=0 (look once) still gets one whole attempt.
                with call_deadline(deadline_ms / 1000 if wait_ms > 0 else None):
                    await self.refresh([topic])
            except HighwaterError as refresh_error:
                if not refresh_error.retriable or not self.connection.ever_answered:
                    raise
                if now_ms() >= deadline_ms:
                    if wait_ms == 0:
                        raise
                    raise RequestTimedOut(
                        f"metadata for topic {topic!r} not available after {now_ms() - started_ms} ms "
                        f"({wait_setting or 'wait'}={wait_ms}, {attempts} attempt(s)); last error: "
                        f"{refresh_error}. Check that a gateway and the topic's leaders are up, or raise "
                        f"{wait_setting or 'the wait'}"
                    ) from None
                await asyncio.sleep(min(backoff_ms, max(0, deadline_ms - now_ms())) / 1000)
                continue
            info = self.cache.get(topic)
            if info is not None and info.partitions:
                return info
            error = self.cache.topic_errors.get(topic)
            if error is not None and not error.retriable:
                raise error
            if isinstance(error, UnknownTopicOrPartition):
                unknown_since_ms = now_ms() if unknown_since_ms is None else unknown_since_ms
                if now_ms() - unknown_since_ms >= UNKNOWN_TOPIC_CONFIRM_MS:
                    raise UnknownTopicOrPartition(
                        f"topic {topic!r} does not exist (the gateway answered so {attempts} time(s) "
                        f"over {now_ms() - started_ms} ms); topics are not created on first use: "
                        f"create it first (highwater topic create {topic}, or Admin.create_topics), "
                        "or check the topic name"
                    )
            if now_ms() >= deadline_ms:
                if error is not None:
                    raise error
                raise UnknownTopicOrPartition(f"topic {topic!r} has no partitions")
            self.cache.mark_stale(topic)
            await asyncio.sleep(min(backoff_ms, max(0, deadline_ms - now_ms())) / 1000)
