"""Consumers: `AsyncConsumer` (asyncio) and `Consumer` (synchronous).

A consumer reads the partitions it was given with `assign()`, or, after `subscribe()`:
- with a group id (and group_protocol "consumer", the default), the partitions the group's
  coordinator assigns it: consumers of one group share the subscription's partitions, a
  partition moves when members join or leave, and a member fenced by the coordinator (its
  session expired while it was paused) cannot commit (clients/group_member.py; Kafka's
  KIP-848 protocol). on_partitions_revoked runs before a partition is given up (with
  auto-commit on, its position is committed first), on_partitions_assigned after new ones
  are taken, on_partitions_lost when they were taken away without a chance to commit.
  The callbacks run inside poll() (for Consumer, on its loop thread: a callback may not
  call the Consumer's own blocking methods), and may be coroutine functions.
- without a group id (or with group_protocol "none"), every partition of the topics
  (found from Metadata and followed as partitions are added).

Positions (Kafka's semantics, half-open): `position(tp)` is the offset of the
next record poll() will return. A partition without one starts from the group's
committed offset, else from `auto_offset_reset` ("earliest" | "latest" | "none":
raise). `commit()` stores the position, the NEXT offset to read, as Kafka does.
Consumers see only records below the high watermark (a consumer's Fetch has
replica_id -1), and `lag(tp)` = end offset (HW) - position.

Offsets need not be contiguous: a compacted topic's cleaner removes records and whole
batches and keeps the offsets of the rest. Positions therefore follow the batches, never
a count of records: after a batch the position is its last offset + 1 (Kafka's
batch.nextOffset, past records removed from its end), a Fetch at an offset inside a hole
answers from the next batch, and an answer with no batch below the HW to a Fetch of that
partition alone moves the position to the HW (a hole reaching it; _take_fetched).

poll() fetches the assigned partitions straight from each one's leader broker, as
Kafka's consumer does (direct_to_leaders, the default: one Fetch per leader, all out at
once, each answer taken as it comes, so records from one leader never wait for
another's long poll). Partitions whose leader is not known now (no Metadata yet, none
elected, or the topic marked stale by an error) go in one Fetch through the gateway
while Metadata is refreshed in the background. With direct_to_leaders off, every
partition goes in one Fetch through the gateway. poll() hands back ConsumerRecords in
offset order per partition, decoding the answers' batches straight into them a batch at
a time as they are handed out (records.iter_records_as: per batch in C, one tuple built
per record; _Buffered). Per-partition errors that a retry may fix (leadership moved,
leader not available), and a leader that cannot be reached, back the partition off for
retry_backoff_ms and refresh metadata; OFFSET_OUT_OF_RANGE resets the position per
auto_offset_reset; other errors are raised.

Fetching ahead (Kafka's Fetcher does the same): when poll() hands out records, the next
Fetch for the fetchable partitions, at the offsets after what is buffered, is sent at
once, so the leaders work while the caller processes the records. One Fetch is out at a
time per destination (a leader, or the gateway) and its answer stays undecoded until the
buffers are handed out: at most one answer (fetch_max_bytes) per destination ahead. A
partition that is sought, reset, paused, unassigned or revoked meanwhile leaves the
Fetch's `asked` partitions and its part of the answer is dropped (_FetchInFlight), so no
record is handed out twice or skipped.

AsyncConsumer is owned by the event loop it is first used on. Consumer runs one
on a private loop thread; it is not thread-safe (as Kafka's consumer is not).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from clients.common import records
from clients.common.errors import CorruptMessage, InvariantViolation, MessageTooLarge, OffsetOutOfRange
from clients.common.fetch_request import consumer_fetch_request
from clients.common.record_batch import iter_batch_headers
from clients.config import (
    COMMIT_OFFSETS_PER_REQUEST_MAX,
    CONSUMER_CLOSE_TIMEOUT_MS,
    DEFAULT_BOOTSTRAP,
    LEADER_MOVE_CHECK_AFTER_MS,
    PARTITION_FETCH_BYTES_GROWTH_FACTOR,
    POLL_CALL_GRACE_MS,
    ConsumerConfig,
    build_config,
    check_group_id,
    check_int,
    check_topic_name,
)
from clients.connection import GatewayConnection, call_deadline, current_call_deadline
from clients.errors import (
    ClientClosed,
    GatewayUnavailable,
    HighwaterError,
    InvalidArgument,
    LeaderMoved,
    RequestTimedOut,
    check_no_positional_timeout,
    error_for_code,
)
from clients.group_member import FENCED_CODES, GroupMember
from clients.leaders import LeaderConnections, unless_leader_moves
from clients.loop_thread import SyncClient
from clients.metadata import ClusterMetadata, MetadataFetcher, now_ms
from clients.types import ConsumerRecord, OffsetAndTimestamp, TopicPartition
from protos.highwater.v1 import common_pb2, gateway_pb2

log = logging.getLogger("highwater.client.consumer")

EARLIEST = -2  # ListOffsets timestamp for the log start offset
# A rebalance callback: called with the partitions concerned; may be a coroutine function.
PartitionsCallback = Callable[[list[TopicPartition]], Any]
LISTENER_NAMES = ("on_partitions_assigned", "on_partitions_revoked", "on_partitions_lost")
# Commit answers that mean this member was fenced: it must drop its partitions and rejoin.
# (STALE_MEMBER_EPOCH is not one: the member's heartbeat moved on, and the commit named
# partitions it no longer owns; the error goes to the caller.)
_COMMIT_FENCED_CODES = FENCED_CODES
# What a member tells the coordinator it is (kafka-consumer-groups' CLIENT-ID column).
CLIENT_ID = "highwater-python"


def _check_listeners(listeners: Mapping[str, Any]) -> dict[str, PartitionsCallback | None]:
    for name, callback in listeners.items():
        if callback is not None and not callable(callback):
            raise InvalidArgument(f"{name} must be callable (called with a list of TopicPartition)")
    return dict(listeners)


LATEST = -1  # ListOffsets timestamp for the high watermark
_RESET_TIMESTAMPS = {"earliest": EARLIEST, "latest": LATEST}

CommitCallback = Callable[[dict[TopicPartition, int], HighwaterError | None], Any]


def check_partitions(partitions: Iterable[object], what: str = "partitions") -> list[TopicPartition]:
    """TopicPartitions (or (topic, partition) pairs) -> a checked list; InvalidArgument if not."""
    if isinstance(partitions, (str, bytes)):
        raise InvalidArgument(f"{what} must be a list of TopicPartition, got {type(partitions).__name__}")
    checked: list[TopicPartition] = []
    for item in partitions:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidArgument(f"{what}: {item!r} is not a TopicPartition(topic, partition)")
        tp = TopicPartition(check_topic_name(item[0]), check_int("partition", item[1], minimum=0))
        if tp not in checked:
            checked.append(tp)
    return checked


# The destination of a Fetch part sent through a gateway (a leader's is its "host:port").
VIA_GATEWAY = ""


@dataclasses.dataclass(slots=True)
class _FetchPart:
    """One Fetch of the fetch in flight, to one destination (a partition leader's address, or
    VIA_GATEWAY), and the fetch offset it asked each partition at.

    A partition leaves `asked` when its answer may no longer be used (seek, seek_to_*, an
    offset reset, pause, unassignment or a revoked partition): its records would no longer
    be the ones after the consumer's position, and using them would hand a record out
    twice or skip some. The answer of a partition still in `asked` is used only if the
    partition's fetch offset is still the one asked.
    """

    destination: str
    task: asyncio.Task[common_pb2.FetchResponse]
    asked: dict[TopicPartition, int]

    def abandon(self) -> None:
        """Drop the answer: cancel the call if it is still out (its outcome is not wanted)."""
        self.asked.clear()
        if not self.task.done():
            self.task.cancel()
        self.task.add_done_callback(_discard_outcome)


class _FetchInFlight:
    """The consumer's one logical Fetch in flight, sent and not yet taken: one part per
    destination (each partition's leader with direct_to_leaders, else the gateway), each
    partition in one part at most. Parts are answered and taken independently: a leader
    with records is not held back by another's long poll, and since a position moves only
    when an answer is taken, a part dropped unanswered loses nothing.

    `complete`: every partition that was fetchable when parts were last sent has a part out
    (Consumer.poll may then hand out buffered records without running the loop; a part
    taken or dropped since clears it).
    """

    __slots__ = ("complete", "parts")

    def __init__(self) -> None:
        self.parts: dict[str, _FetchPart] = {}
        self.complete = False

    def asked(self) -> set[TopicPartition]:
        return {tp for part in self.parts.values() for tp in part.asked}

    def forget(self, tp: TopicPartition) -> None:
        """tp's answer will not be used, whichever part asked for it."""
        for part in self.parts.values():
            part.asked.pop(tp, None)

    def remove(self, part: _FetchPart) -> None:
        """The part is taken (its answer is being used) or dropped."""
        if self.parts.get(part.destination) is part:
            del self.parts[part.destination]
        self.complete = False

    def drop(self, part: _FetchPart) -> None:
        part.abandon()
        self.remove(part)

    def abandon(self) -> None:
        for part in list(self.parts.values()):
            self.drop(part)


def _discard_outcome(task: asyncio.Task[common_pb2.FetchResponse]) -> None:
    """Retrieve a dropped Fetch's error so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


class _Buffered:
    """A partition's records from a taken Fetch answer, decoded a batch at a time as they are
    handed out (Kafka's CompletedFetch does the same).

    The answer waits as bytes and about one batch of it exists as objects at a time. Decoding
    a whole answer at once (tens of thousands of records) kept them alive long enough to be
    promoted to the garbage collector's oldest generation, whose full collections then walked
    them again and again: bench/RESULTS.md measured that at about as much CPU as decoding.
    A corrupt batch is raised when it is the next thing to hand out, never before the
    records ahead of it, and again at every take until a seek moves past it (as Kafka's
    consumer stays at a corrupt record).
    """

    __slots__ = ("_batches", "_error", "_next", "_records")

    def __init__(self, batches: Iterator[list[ConsumerRecord]]) -> None:
        self._batches = batches
        self._records: list[ConsumerRecord] = []
        self._next = 0
        self._error: HighwaterError | None = None  # a CorruptMessage

    def ready(self) -> bool:
        """Whether something is next (a record, or the corrupt batch's error), decoding the
        next batches until one has a record; False once the answer is used up."""
        while self._next >= len(self._records) and self._error is None:
            try:
                batch = next(self._batches, None)
            except CorruptMessage as error:
                self._error = error
                return True
            if batch is None:
                return False
            self._records, self._next = batch, 0
        return True

    @property
    def error_next(self) -> bool:
        """Whether the corrupt batch's error, not a record, is next (after ready())."""
        return self._next >= len(self._records) and self._error is not None

    def take(self, want: int) -> list[ConsumerRecord]:
        """Up to `want` records of the decoded batch (after ready()); raises the corrupt batch's
        CorruptMessage when it is next."""
        if self._error is not None and self._next >= len(self._records):
            raise self._error
        taken = self._records[self._next : self._next + want]
        self._next += len(taken)
        return taken


def next_fetch_offset(buf: bytes, fetch_offset: int) -> int | None:
    """The offset after the last complete batch in `buf` (None: no complete batch)."""
    last = None
    for header in iter_batch_headers(buf):
        last = header.next_offset
    return None if last is None else max(last, fetch_offset)


class AsyncConsumer:
    """asyncio consumer. `async with AsyncConsumer("orders", group_id="billing") as consumer:`."""

    def __init__(self, *topics: str, bootstrap: str | list[str] = DEFAULT_BOOTSTRAP, **settings: Any) -> None:
        listeners = {name: settings.pop(name, None) for name in LISTENER_NAMES}
        self.config: ConsumerConfig = build_config(ConsumerConfig, bootstrap, settings)
        self._listeners: dict[str, PartitionsCallback | None] = _check_listeners(listeners)
        self._member: GroupMember | None = None
        self._leaving: list[GroupMember] = []
        self._group_id = self.config.group_id
        self._metadata = ClusterMetadata(metadata_max_age_ms=self.config.metadata_max_age_ms)
        self._connection: GatewayConnection | None = None
        self._fetcher: MetadataFetcher | None = None
        self._assignment: list[TopicPartition] = []
        self._subscription: tuple[str, ...] | None = None
        self._positions: dict[TopicPartition, int] = {}  # next offset poll() returns
        self._fetch_offsets: dict[TopicPartition, int] = {}  # next offset to fetch
        self._resets: dict[TopicPartition, int] = {}  # EARLIEST / LATEST asked by seek_to_*
        self._buffers: dict[TopicPartition, _Buffered] = {}  # only partitions with records to hand out
        # The one Fetch out at a time (a part per leader): sent while poll() hands out the
        # buffers (fetching ahead), or by a poll with nothing buffered; its answers are taken
        # once the buffers are empty.
        self._in_flight = _FetchInFlight()
        # Channels straight to the partition leaders (direct_to_leaders; made with the
        # gateway connection, in _conn()).
        self._leaders: LeaderConnections | None = None
        # Background Metadata refreshes of topics whose leaders are not known now, and when
        # each topic may be refreshed again (ms): at most one per retry_backoff_ms.
        self._refreshing: dict[str, asyncio.Task[None]] = {}
        # commit_async()'s commits not yet done: close() completes them first (Kafka's close()
        # does), and nobody need await one (its error goes to the callback).
        self._async_commits: set[asyncio.Task[dict[TopicPartition, int]]] = set()
        self._refresh_not_before_ms: dict[str, int] = {}
        self._high_watermarks: dict[TopicPartition, int] = {}
        self._partition_fetch_bytes: dict[TopicPartition, int] = {}
        self._backoff_until_ms: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._next_auto_commit_ms = now_ms() + self.config.auto_commit_interval_ms
        self._drain_start = 0
        self._closed = False
        # When the first poll() began (now_ms()): a cluster no gateway of which has answered
        # since is raised as GatewayUnavailable once connect_timeout_ms have passed.
        self._first_poll_ms: int | None = None
        if topics:
            self.subscribe(list(topics))

    # --- connection --------------------------------------------------------------

    def _conn(self) -> GatewayConnection:
        if self._closed:
            raise ClientClosed("the consumer is closed")
        if self._connection is None:
            self._connection = GatewayConnection.from_config(self.config)
            self._fetcher = MetadataFetcher(self._connection, self._metadata)
            if self.config.direct_to_leaders:
                self._leaders = LeaderConnections.from_config(self.config, self._connection.tls)
        return self._connection

    def _meta(self) -> MetadataFetcher:
        self._conn()
        if self._fetcher is None:
            raise InvariantViolation("the metadata fetcher is created with the connection")
        return self._fetcher

    # --- what to read --------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replaces any subscription, leaving its group).
        Positions of partitions kept from the previous assignment are kept."""
        checked = check_partitions(partitions)
        self._subscription = None
        self._drop_member()
        self._set_assignment(checked)

    def subscribe(
        self,
        topics: Iterable[str],
        group_id: str | None = None,
        *,
        on_partitions_assigned: PartitionsCallback | None = None,
        on_partitions_revoked: PartitionsCallback | None = None,
        on_partitions_lost: PartitionsCallback | None = None,
    ) -> None:
        """Read `topics`: with a group id (this one or the configured one), the partitions the
        group assigns this member; without, every partition, following new ones. The
        callbacks (each called with a list of TopicPartition) replace those given before."""
        if isinstance(topics, str):
            topics = [topics]
        names = tuple(dict.fromkeys(check_topic_name(topic) for topic in topics))
        if not names:
            raise InvalidArgument("subscribe() needs at least one topic")
        given = {
            "on_partitions_assigned": on_partitions_assigned,
            "on_partitions_revoked": on_partitions_revoked,
            "on_partitions_lost": on_partitions_lost,
        }
        self._listeners.update(_check_listeners({k: v for k, v in given.items() if v is not None}))
        if group_id is not None and check_group_id(group_id) != self._group_id:
            self._drop_member()
            self._group_id = group_id
        self._subscription = names
        if self._member is not None:
            self._member.resubscribe(names)
        self._set_assignment([tp for tp in self._assignment if tp.topic in names])
        for name in names:
            self._metadata.mark_stale(name)

    def unsubscribe(self) -> None:
        """Stop reading; a group member leaves its group (at the next poll() or close())."""
        self._subscription = None
        self._drop_member()
        self._set_assignment([])

    @property
    def _grouped(self) -> bool:
        """Whether the subscription is read as a member of a consumer group."""
        return (
            self._subscription is not None
            and self._group_id is not None
            and self.config.group_protocol == "consumer"
        )

    def _drop_member(self) -> None:
        if self._member is not None:
            self._leaving.append(self._member)
            self._member = None

    @property
    def member_id(self) -> str | None:
        """This consumer's member id in its group (None when it is not a member)."""
        return self._member.member_id or None if self._member is not None else None

    @property
    def member_epoch(self) -> int | None:
        return self._member.epoch if self._member is not None else None

    def subscription(self) -> tuple[str, ...]:
        return self._subscription or ()

    def assignment(self) -> list[TopicPartition]:
        return list(self._assignment)

    @property
    def group_id(self) -> str | None:
        return self._group_id

    def _set_assignment(self, partitions: list[TopicPartition]) -> None:
        keep = set(partitions)
        for state in (
            self._positions,
            self._fetch_offsets,
            self._resets,
            self._buffers,
            self._high_watermarks,
            self._backoff_until_ms,
            self._partition_fetch_bytes,
        ):
            for tp in [tp for tp in state if tp not in keep]:
                del state[tp]
        for tp in self._in_flight.asked() - keep:
            self._in_flight.forget(tp)
        self._paused &= keep
        self._assignment = partitions

    def _check_assigned(self, tp: object) -> TopicPartition:
        checked = check_partitions([tp], "partition")[0]
        if checked not in self._assignment:
            raise InvalidArgument(f"{checked} is not assigned to this consumer")
        return checked

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching these partitions until resume(); positions are kept."""
        for tp in partitions:
            self._paused.add(self._check_assigned(tp))
            self._forget_fetch_ahead(tp)  # a paused partition holds no answer ahead (memory)

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._paused.discard(self._check_assigned(tp))

    async def partitions_for_topic(self, topic: str) -> list[int]:
        """The topic's partition ids; UnknownTopicOrPartition at once if it does not exist."""
        info = await self._meta().topic(
            check_topic_name(topic), wait_ms=0, backoff_ms=self.config.retry_backoff_ms
        )
        return list(info.partitions)

    # --- positions -------------------------------------------------------------------

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make `offset` the next record poll() returns for tp."""
        tp = self._check_assigned(tp)
        check_int("offset", offset, minimum=0)
        self._resets.pop(tp, None)
        self._buffers.pop(tp, None)
        self._forget_fetch_ahead(tp)
        self._positions[tp] = self._fetch_offsets[tp] = offset

    def _seek_to(self, partitions: tuple[TopicPartition, ...], timestamp: int) -> None:
        for tp in [self._check_assigned(tp) for tp in partitions] if partitions else list(self._assignment):
            self._buffers.pop(tp, None)
            self._forget_fetch_ahead(tp)
            self._positions.pop(tp, None)
            self._fetch_offsets.pop(tp, None)
            self._resets[tp] = timestamp

    def _forget_fetch_ahead(self, tp: TopicPartition) -> None:
        """The Fetch in flight's answer for tp will not be used: tp was sought, paused or
        unassigned since it was sent, and its records are no longer the next ones to hand out.
        Local state only (Consumer calls it from the caller's thread); the next poll() drops
        a Fetch left with no partition."""
        self._in_flight.forget(tp)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Read these (default: all assigned) partitions from their log start offset."""
        self._seek_to(partitions, EARLIEST)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Read only records produced from now on (the high watermark) for these partitions."""
        self._seek_to(partitions, LATEST)

    async def seek_to_timestamp(self, timestamp_ms: int, *partitions: TopicPartition) -> None:
        """Seek each partition to its first record with timestamp >= timestamp_ms (the end if none)."""
        check_int("timestamp_ms", timestamp_ms, minimum=0)
        targets = [self._check_assigned(tp) for tp in partitions] if partitions else list(self._assignment)
        found = await self.offsets_for_times({tp: timestamp_ms for tp in targets})
        for tp in targets:
            hit = found.get(tp)
            if hit is None:
                self._seek_to((tp,), LATEST)
            else:
                self.seek(tp, hit.offset)

    async def position(self, tp: TopicPartition) -> int:
        """Offset of the next record poll() returns for tp (resolved now if not known yet)."""
        tp = self._check_assigned(tp)
        await self._update_positions()
        if tp not in self._positions:
            raise error_for_code(common_pb2.LEADER_NOT_AVAILABLE, f"no position for {tp} yet; try again")
        return self._positions[tp]

    def highwater(self, tp: TopicPartition) -> int | None:
        """The high watermark of tp as of the last fetch (None before one)."""
        return self._high_watermarks.get(tp)

    async def lag(self, tp: TopicPartition) -> int:
        """end offset (HW, asked now) - position: records produced and not yet returned."""
        position = await self.position(tp)
        end = (await self.end_offsets([tp]))[tp]
        return max(0, end - position)

    async def _update_positions(self) -> None:
        """Give every assigned partition without a position one: seek_to_* first, then the
        group's committed offset, then auto_offset_reset."""
        missing = [tp for tp in self._assignment if tp not in self._positions]
        if not missing:
            return
        wanted: dict[TopicPartition, int] = {}
        need_committed = [tp for tp in missing if tp not in self._resets]
        if need_committed and self._group_id is not None:
            committed = await self._fetch_committed(need_committed)
            for tp in need_committed:
                offset = committed.get(tp, -1)
                if offset >= 0:
                    self._positions[tp] = self._fetch_offsets[tp] = offset
        for tp in missing:
            if tp in self._positions:
                continue
            if tp in self._resets:
                wanted[tp] = self._resets[tp]
            elif self.config.auto_offset_reset == "none":
                raise OffsetOutOfRange(f"{tp} has no committed offset and auto_offset_reset is 'none'")
            else:
                wanted[tp] = _RESET_TIMESTAMPS[self.config.auto_offset_reset]
        if not wanted:
            return
        offsets = await self._list_offsets(wanted, raise_retriable=False)
        for tp, (offset, _timestamp) in offsets.items():
            if offset >= 0:
                self._resets.pop(tp, None)
                self._positions[tp] = self._fetch_offsets[tp] = offset

    # --- offsets from the gateway -------------------------------------------------------

    async def _list_offsets(
        self, timestamps: Mapping[TopicPartition, int], *, raise_retriable: bool = True
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets: {tp: (offset, timestamp)}; retriable per-partition errors are raised
        or (raise_retriable=False) left out for the next try."""
        by_topic: dict[str, list[common_pb2.ListOffsetsPartition]] = {}
        for tp, timestamp in timestamps.items():
            by_topic.setdefault(tp.topic, []).append(
                common_pb2.ListOffsetsPartition(
                    partition=tp.partition, timestamp=timestamp, current_leader_epoch=-1
                )
            )
        request = common_pb2.ListOffsetsRequest(
            replica_id=-1,
            topics=[common_pb2.ListOffsetsTopic(topic=t, partitions=p) for t, p in by_topic.items()],
        )
        response = await self._conn().call("ListOffsets", request)
        result: dict[TopicPartition, tuple[int, int]] = {}
        for topic in response.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.topic, part.partition)
                if part.error_code != common_pb2.NONE:
                    error = error_for_code(part.error_code, part.error_message or f"ListOffsets for {tp}")
                    if error.refresh_metadata:
                        self._metadata.mark_stale(tp.topic)
                    if raise_retriable or not error.retriable:
                        raise error
                    continue
                result[tp] = (part.offset, part.timestamp)
        return result

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Log start offset of each partition."""
        tps = check_partitions(partitions)
        return {
            tp: offset for tp, (offset, _) in (await self._list_offsets(dict.fromkeys(tps, EARLIEST))).items()
        }

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """High watermark of each partition: the offset the next committed record will get."""
        tps = check_partitions(partitions)
        return {
            tp: offset for tp, (offset, _) in (await self._list_offsets(dict.fromkeys(tps, LATEST))).items()
        }

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """First offset with a timestamp >= the one given, per partition (None: no such record).

        The broker answers with that record's offset and timestamp, found inside its batch as
        Kafka's broker does (Log.offset_for_timestamp).
        """
        tps = check_partitions(timestamps)
        asked = {tp: check_int("timestamp_ms", timestamps[tp], minimum=0) for tp in tps}
        found = await self._list_offsets(asked)
        return {
            tp: OffsetAndTimestamp(*found[tp]) if tp in found and found[tp][0] >= 0 else None for tp in tps
        }

    # --- committed offsets -----------------------------------------------------------------

    def _require_group(self, what: str) -> str:
        if self._group_id is None:
            raise InvalidArgument(
                f"{what} needs a group_id (Consumer(group_id=...) or subscribe(..., group_id=...))"
            )
        return self._group_id

    async def _fetch_committed(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        request = gateway_pb2.FetchCommittedOffsetsRequest(
            group_id=self._require_group("committed offsets"),
            partitions=[
                common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in partitions
            ],
        )
        response = await self._conn().call("FetchCommittedOffsets", request)
        if response.error_code != common_pb2.NONE:
            raise error_for_code(response.error_code, response.error_message or "FetchCommittedOffsets")
        return {TopicPartition(o.topic, o.partition): o.offset for o in response.offsets}

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset for tp (the next offset to read), None if none."""
        checked = check_partitions([tp], "partition")[0]
        offset = (await self._fetch_committed([checked])).get(checked, -1)
        return offset if offset >= 0 else None

    async def commit(
        self, offsets: Mapping[TopicPartition, int] | None = None, *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """Store offsets for the group (default: the position of every assigned partition).

        An offset is the NEXT one to read, as in Kafka. Returns what was committed.
        Retriable errors (no gateway answers, a timeout, the coordinator moving) are retried
        with back-off for up to timeout_ms (default default_api_timeout_ms; inside poll(),
        never past the poll's own timeout), as Kafka's commitSync does; then RequestTimedOut
        naming the bound and the last error. Other errors (a fenced member, a stale member
        epoch: partitions it no longer owns) are raised at once, typed, for the first
        partition that failed. Committing the same offsets again is harmless, so a retry
        after an unanswered attempt is safe.
        """
        group = self._require_group("commit()")
        budget_ms = (
            self.config.default_api_timeout_ms
            if timeout_ms is None
            else check_int("timeout_ms", timeout_ms, minimum=1)
        )
        if offsets is None:
            to_commit = {tp: self._positions[tp] for tp in self._assignment if tp in self._positions}
        else:
            to_commit = {
                tp: check_int(f"offset for {tp}", offsets[tp], minimum=0) for tp in check_partitions(offsets)
            }
        deadline_s = time.monotonic() + budget_ms / 1000
        items = list(to_commit.items())
        for start in range(0, len(items), COMMIT_OFFSETS_PER_REQUEST_MAX):
            await self._commit_chunk(group, items[start : start + COMMIT_OFFSETS_PER_REQUEST_MAX], deadline_s)
        return to_commit

    async def _commit_chunk(
        self, group: str, chunk: list[tuple[TopicPartition, int]], deadline_s: float
    ) -> None:
        """One CommitOffsets request, retried on retriable errors until `deadline_s`."""
        by_topic: dict[str, list[gateway_pb2.OffsetCommitPartition]] = {}
        for tp, offset in chunk:
            by_topic.setdefault(tp.topic, []).append(
                gateway_pb2.OffsetCommitPartition(partition=tp.partition, offset=offset, leader_epoch=-1)
            )
        topics = [gateway_pb2.OffsetCommitTopic(topic=t, partitions=p) for t, p in by_topic.items()]
        started_s = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            # Rebuilt per attempt: the member may have a new epoch since the last one.
            member = self._member
            request = gateway_pb2.CommitOffsetsRequest(
                group_id=group,
                topics=topics,
                member_id=member.member_id if member is not None and member.active else "",
                member_epoch=member.epoch if member is not None and member.active else 0,
            )
            error: HighwaterError | None = None
            try:
                with call_deadline(deadline_s):
                    response = await self._conn().call("CommitOffsets", request)
                if response.error_code != common_pb2.NONE:
                    error = error_for_code(response.error_code, response.error_message or "CommitOffsets")
                for result in response.partitions:
                    if result.error_code in _COMMIT_FENCED_CODES and member is not None:
                        member.fence(result.error_code)  # the next poll() drops the partitions, rejoins
                    if result.error_code != common_pb2.NONE and error is None:
                        error = error_for_code(
                            result.error_code,
                            result.error_message or f"commit for {result.topic}-{result.partition}",
                        )
            except HighwaterError as call_error:
                error = call_error
            if error is None:
                return
            if not self._commit_retriable(error):
                raise error
            # The caller's deadline, or the poll's when the commit runs inside poll().
            bound_s = min(deadline_s, current_call_deadline() or deadline_s)
            # Kafka's exponential retry back-off: retry_backoff_ms doubling up to retry_backoff_max_ms.
            pause_s = (
                min(self.config.retry_backoff_max_ms, self.config.retry_backoff_ms << min(attempts - 1, 20))
                / 1000
            )
            if time.monotonic() + pause_s >= bound_s:
                raise RequestTimedOut(
                    f"commit of {len(chunk)} offset(s) for group {group!r} not acknowledged within "
                    f"{(time.monotonic() - started_s) * 1000:.0f} ms ({attempts} attempt(s); bound: "
                    f"commit(timeout_ms=...), default_api_timeout_ms={self.config.default_api_timeout_ms}, "
                    f"or the enclosing poll's timeout); last error: {error}"
                ) from None
            log.info("commit for group %s: %s; retrying (attempt %d)", group, error, attempts)
            await asyncio.sleep(pause_s)

    def _commit_retriable(self, error: HighwaterError) -> bool:
        """Whether a commit that failed with `error` may be sent again as it is.

        Not STALE_MEMBER_EPOCH (retriable elsewhere): here it means the commit named partitions
        this member no longer owns, which no retry fixes. Not before any gateway ever answered:
        a wrong bootstrap address is raised at once rather than waited out.
        """
        return (
            error.retriable
            and error.code != common_pb2.STALE_MEMBER_EPOCH
            and self._connection is not None
            and self._connection.ever_answered
        )

    def commit_async(
        self, offsets: Mapping[TopicPartition, int] | None = None, callback: CommitCallback | None = None
    ) -> asyncio.Task[dict[TopicPartition, int]]:
        """commit() in the background; `callback(offsets, error)` runs when it is done."""
        snapshot = dict(offsets) if offsets is not None else None

        async def _commit() -> dict[TopicPartition, int]:
            try:
                committed = await self.commit(snapshot)
            except HighwaterError as error:
                if callback is not None:
                    callback(dict(snapshot or {}), error)
                raise
            if callback is not None:
                callback(committed, None)
            return committed

        task = asyncio.get_running_loop().create_task(_commit())
        self._async_commits.add(task)
        task.add_done_callback(self._async_commit_done)
        return task

    def _async_commit_done(self, task: asyncio.Task[dict[TopicPartition, int]]) -> None:
        """A commit_async() ended: its error went to its callback, and to whoever awaits the task;
        it is retrieved here so that one nobody awaits is not logged as never retrieved."""
        self._async_commits.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("commit_async for group %s failed: %s", self._group_id, task.exception())

    async def _maybe_auto_commit(self, now: int) -> None:
        if self._group_id is None or not self.config.enable_auto_commit or now < self._next_auto_commit_ms:
            return
        self._next_auto_commit_ms = now + self.config.auto_commit_interval_ms
        try:
            await self.commit()
        except HighwaterError as error:
            log.warning("auto-commit for group %s failed: %s", self._group_id, error)

    # --- polling ------------------------------------------------------------------

    async def _update_subscription(self) -> None:
        for member in self._leaving:
            await member.leave()
        self._leaving.clear()
        if self._subscription is None:
            return
        if self._grouped:
            await self._reconcile()
            return
        fetcher = self._meta()
        now = now_ms()
        # Not a topic a background refresh is asking for: its answer is on the way, and
        # this poll would only wait behind it.
        stale = [
            topic
            for topic in self._subscription
            if self._metadata.needs_refresh(topic, now) and topic not in self._refreshing
        ]
        if stale:
            await fetcher.refresh(stale)
        partitions = [tp for tp in self._assignment if tp.topic not in self._subscription]
        for topic in self._subscription:
            info = self._metadata.get(topic)
            if info is not None:
                partitions.extend(TopicPartition(topic, p) for p in info.partitions)
        if partitions != self._assignment:
            self._set_assignment(partitions)

    async def _reconcile(self) -> None:
        """Follow the group's assignment: give up partitions the coordinator took away
        (committing their positions first with auto-commit on), take the new ones, and drop
        everything without committing when the member was fenced; then tell the member."""
        member = self._member
        if member is None:
            assert self._group_id is not None and self._subscription is not None
            member = self._member = GroupMember(
                self._conn,
                self._group_id,
                self._subscription,
                instance_id=self.config.group_instance_id,
                session_timeout_ms=self.config.session_timeout_ms,
                rebalance_timeout_ms=self.config.max_poll_interval_ms,
                assignor=self.config.group_remote_assignor,
                client_id=CLIENT_ID,
            )
            member.start()
        member.changed.clear()
        if member.error is not None:
            raise member.error
        if member.lost:
            lost = list(self._assignment)
            self._set_assignment([])
            await self._call_listener("on_partitions_lost", lost)
            member.rejoin()
            return
        target = member.target
        if target is None:
            return  # no answer yet
        revoked = [tp for tp in self._assignment if tp not in target]
        if revoked:
            if self.config.enable_auto_commit:
                positions = {tp: self._positions[tp] for tp in revoked if tp in self._positions}
                try:
                    await self.commit(positions)
                except HighwaterError as error:
                    log.warning("commit before revoking %s failed: %s", revoked, error)
                    if member.was_fenced():
                        return await self._reconcile()
            await self._call_listener("on_partitions_revoked", revoked)
            self._set_assignment([tp for tp in self._assignment if tp in target])
        added = [tp for tp in sorted(target) if tp not in self._assignment]
        if added:
            self._set_assignment(self._assignment + added)
            await self._call_listener("on_partitions_assigned", added)
        member.report_owned(frozenset(self._assignment))

    async def _call_listener(self, name: str, partitions: list[TopicPartition]) -> None:
        callback = self._listeners.get(name)
        if callback is None or not partitions:
            return
        outcome = callback(list(partitions))
        if asyncio.iscoroutine(outcome):
            await outcome

    async def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records after each partition's position, waiting up to timeout_ms for some.

        Returns at most max_records (default max_poll_records), in offset order per
        partition; an empty list when nothing arrived in time. Never waits past timeout_ms
        (+ POLL_CALL_GRACE_MS): while no gateway has ever answered, polls return [] until
        connect_timeout_ms have passed since the first one, then raise GatewayUnavailable
        (a wrong bootstrap, as the Producer and Admin raise it).
        """
        check_int("timeout_ms", timeout_ms, minimum=0)
        limit = (
            self.config.max_poll_records
            if max_records is None
            else check_int("max_records", max_records, minimum=1)
        )
        if self._subscription is None and not self._assignment:
            raise InvalidArgument("poll() needs assign() or subscribe() first")
        started = now_ms()
        if self._first_poll_ms is None:
            self._first_poll_ms = started
        deadline = started + timeout_ms
        # Every call poll() makes (metadata, group, offsets, Fetch, auto-commit) ends by its
        # timeout (plus a short grace): an outage costs the caller the timeout, no more.
        with call_deadline((deadline + POLL_CALL_GRACE_MS) / 1000):
            try:
                records = await self._poll_until(deadline, limit, fetch_late=timeout_ms == 0)
            except GatewayUnavailable:
                raise
            except HighwaterError as error:
                self._raise_if_never_reached(error)
                raise
        if not records:
            # A subscription's group calls fail in the member's task, not here.
            self._raise_if_never_reached(None)
        return records

    def _raise_if_never_reached(self, last_error: HighwaterError | None) -> None:
        """GatewayUnavailable if no gateway has answered since the first poll, connect_timeout_ms
        ago or more: the bootstrap is wrong or the cluster is down, which waiting will not fix."""
        connection = self._connection
        if connection is None or connection.ever_answered or self._first_poll_ms is None:
            return
        waited_ms = now_ms() - self._first_poll_ms
        if waited_ms < self.config.connect_timeout_ms:
            return
        raise GatewayUnavailable(
            f"no gateway answered within {waited_ms} ms of the consumer's first poll "
            f"(connect_timeout_ms={self.config.connect_timeout_ms}): tried {', '.join(connection.addresses)}"
            + (f"; last error: {last_error}" if last_error is not None else "")
            + ". Check the bootstrap addresses and that a gateway is up"
        ) from None

    async def _poll_until(self, deadline: int, limit: int, *, fetch_late: bool) -> list[ConsumerRecord]:
        """poll()'s loop until `deadline` (ms). `fetch_late`: fetch once even if the time is up
        (poll(0) asks the gateway once, within POLL_CALL_GRACE_MS); else a poll whose time went
        on other calls (an auto-commit in an outage) returns without starting a Fetch."""
        await self._maybe_auto_commit(now_ms())
        fetched_once = not fetch_late
        while True:
            try:
                await self._update_subscription()
                await self._update_positions()
                ready = self._take_buffered(limit)
                if ready:
                    # The next answer is fetched while the caller works through these records.
                    self._fetch_ahead()
                    return ready
                remaining = deadline - now_ms()
                if fetched_once and remaining <= 0:
                    return []
                fetched_once = True
                await self._fetch(max(0, remaining))
            except HighwaterError as error:
                # A gateway restart or a leader election: ride it out, as Kafka's consumer
                # does. Before any gateway answered, only until connect_timeout_ms since the
                # first poll: then a wrong address is raised (GatewayUnavailable, by poll()).
                if not error.retriable:
                    raise
                if self._connection is not None and self._connection.ever_answered:
                    log.warning("poll: %s; retrying", error)
                else:
                    self._raise_if_never_reached(error)
                remaining = deadline - now_ms()
                if remaining <= 0:
                    return []
                await asyncio.sleep(min(remaining, self.config.retry_backoff_max_ms) / 1000)

    def _take_buffered(self, limit: int) -> list[ConsumerRecord]:
        """Up to `limit` buffered records, partitions taken in turn, each partition's position
        moved past what it gave. A corrupt batch's CorruptMessage is raised only by a call
        that has taken nothing yet, so no record taken here is lost to it."""
        taken: list[ConsumerRecord] = []
        assigned = self._assignment
        if not assigned:
            return taken
        start = self._drain_start % len(assigned)
        self._drain_start += 1
        for tp in assigned[start:] + assigned[:start]:
            buffer = self._buffers.get(tp)
            if buffer is None or tp in self._paused:
                continue
            chunk: list[ConsumerRecord] = []
            while len(taken) + len(chunk) < limit and buffer.ready():
                if buffer.error_next and (taken or chunk):
                    break  # raised by a later call, once these are handed out
                chunk += buffer.take(limit - len(taken) - len(chunk))
            if chunk:
                taken += chunk
                self._positions[tp] = chunk[-1].offset + 1
            if not buffer.ready():
                del self._buffers[tp]
                self._positions[tp] = self._fetch_offsets[tp]  # past control or compacted-away offsets
            if len(taken) >= limit:
                break
        return taken

    def _fetchable(self, now: int) -> list[TopicPartition]:
        """The partitions a Fetch sent now asks for: assigned, with a position, not paused, not
        backing off. Partitions with records still buffered are asked past them (fetching ahead)."""
        return [
            tp
            for tp in self._assignment
            if tp in self._fetch_offsets
            and tp not in self._paused
            and self._backoff_until_ms.get(tp, 0) <= now
        ]

    def _destinations(self, tps: list[TopicPartition]) -> dict[str, list[TopicPartition]]:
        """The partitions by where their Fetch goes: their leader's address from Metadata, or
        VIA_GATEWAY (direct_to_leaders off, or no leader known now: none in the last answer,
        or the topic marked stale by an error). Starts a background refresh of a topic with a
        partition whose leader is not known, or whose Metadata is older than
        metadata_max_age_ms; the gateway, which follows the controller, routes meanwhile."""
        if self._leaders is None:
            return {VIA_GATEWAY: tps}
        by_destination: dict[str, list[TopicPartition]] = {}
        leader_address = self._metadata.leader_address
        to_refresh: set[str] = set()
        for tp in tps:
            address = leader_address(tp)
            if address is None:
                address = VIA_GATEWAY
                to_refresh.add(tp.topic)
            by_destination.setdefault(address, []).append(tp)
        now = now_ms()
        for topic in {tp.topic for tp in tps}:
            if topic in to_refresh or self._metadata.needs_refresh(topic, now):
                self._refresh_in_background(topic, now)
        return by_destination

    def _refresh_in_background(self, topic: str, now: int) -> None:
        """Refresh `topic`'s Metadata without holding up poll(), which fetches its partitions
        through the gateway meanwhile; at most one refresh per topic per retry_backoff_ms."""
        if topic in self._refreshing or now < self._refresh_not_before_ms.get(topic, 0):
            return
        self._refresh_not_before_ms[topic] = now + self.config.retry_backoff_ms
        fetcher = self._meta()

        async def _refresh() -> None:
            try:
                await fetcher.refresh([topic])
            except HighwaterError as error:
                log.debug("background metadata refresh of %s: %s", topic, error)  # the next fetch asks again
            finally:
                self._refreshing.pop(topic, None)

        # A clean context: bounded by request_timeout_ms, not by the poll that started it.
        self._refreshing[topic] = asyncio.get_running_loop().create_task(
            _refresh(), context=contextvars.Context()
        )

    def _send_part(self, destination: str, tps: list[TopicPartition], max_wait_ms: int) -> None:
        asked = {tp: self._fetch_offsets[tp] for tp in tps}
        request = consumer_fetch_request(
            asked,
            max_wait_ms=max_wait_ms,
            min_bytes=self.config.fetch_min_bytes,
            max_bytes=self.config.fetch_max_bytes,
            partition_max_bytes=self.config.max_partition_fetch_bytes,
            partition_max_bytes_by=self._partition_fetch_bytes,
        )
        timeout_ms = self.config.request_timeout_ms + max_wait_ms
        if destination == VIA_GATEWAY or self._leaders is None:
            call = self._conn().call("Fetch", request, timeout_ms=timeout_ms)
        else:
            # A leader that stops answering (paused, cut off) is left once Metadata names
            # another: the partitions wait about its lease, not request_timeout_ms.
            leaders = self._leaders
            call = unless_leader_moves(
                lambda: leaders.call(destination, "Fetch", request, timeout_ms=timeout_ms),
                rpc="Fetch",
                destination=destination,
                partitions=asked,
                leader_address=self._metadata.leader_address,
                refresh_topic=lambda topic: self._refresh_in_background(topic, now_ms()),
                check_after_ms=max_wait_ms + LEADER_MOVE_CHECK_AFTER_MS,
            )
        # A clean context: the Fetch may outlive the poll that sent it (the next poll takes its
        # answer), so that poll's deadline must not cut it; each poll bounds its own wait.
        task = asyncio.get_running_loop().create_task(call, context=contextvars.Context())
        self._in_flight.parts[destination] = _FetchPart(destination, task, asked)

    def _send_missing(self, fetchable: list[TopicPartition], max_wait_ms: int, *, replace: bool) -> None:
        """Send a part for each destination of the fetchable partitions no part asks for.
        A destination with a part still out gets none (the fetch ahead), or, with `replace`,
        one asking for its partitions and the missing ones in place of the part out: a
        partition sought, resumed or added since is not left waiting behind a long poll."""
        in_flight = self._in_flight
        asked = in_flight.asked()
        missing = [tp for tp in fetchable if tp not in asked]
        complete = True
        if missing:
            for destination, tps in self._destinations(missing).items():
                part = in_flight.parts.get(destination)
                if part is not None:
                    if not replace or part.task.done():
                        complete = False
                        continue
                    wanted = part.asked.keys() | tps
                    tps = [tp for tp in fetchable if tp in wanted]
                    in_flight.drop(part)
                self._send_part(destination, tps, max_wait_ms)
        in_flight.complete = complete and bool(in_flight.parts)

    def _fetch_ahead(self) -> None:
        """Send the next Fetch now (a part per destination that has none out), at the offsets
        after what is buffered: its answers (one per destination ahead, each at most
        fetch_max_bytes) wait undecoded until the buffers are handed out. Only after a
        gateway answered: a first Fetch is the poll's own."""
        if self._closed or self._connection is None or not self._connection.ever_answered:
            return
        fetchable = self._fetchable(now_ms())
        if fetchable:
            self._send_missing(fetchable, self.config.fetch_max_wait_ms, replace=False)

    async def _fetch(self, remaining_ms: int) -> None:
        """Take the answers of the Fetch in flight (sending a part for every fetchable partition
        no part asks for), waiting at most remaining_ms (+ POLL_CALL_GRACE_MS) for the first.
        Called with nothing buffered to hand out: the answers' records become the buffers."""
        in_flight = self._in_flight
        answered = [part for part in in_flight.parts.values() if part.task.done()]
        if answered:
            self._take_parts(answered)
            return
        for part in [part for part in in_flight.parts.values() if not part.asked]:
            in_flight.drop(part)  # nothing it asked for may be used any more
        fetchable = self._fetchable(now_ms())
        if fetchable:
            self._send_missing(fetchable, min(self.config.fetch_max_wait_ms, remaining_ms), replace=True)
        if not in_flight.parts:
            if self._member is not None and not self._assignment:
                # Waiting for the group to give this member partitions: woken by its answer.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._member.changed.wait(), remaining_ms / 1000)
                return
            # Nothing to ask (all backing off or unresolved): wait a little instead of spinning.
            await asyncio.sleep(min(remaining_ms, self.config.retry_backoff_ms) / 1000)
            return
        wait_s = (remaining_ms + POLL_CALL_GRACE_MS) / 1000
        tasks: set[asyncio.Future[Any]] = {part.task for part in in_flight.parts.values()}
        if self._member is None:
            await asyncio.wait(tasks, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        else:
            # A group member stops waiting for records when its assignment changes: partitions
            # freed by a leave or a crash are taken now, not after this long poll. Nothing is
            # lost by dropping the fetch: positions move only when its answer is taken.
            changed = asyncio.ensure_future(self._member.changed.wait())
            try:
                await asyncio.wait(tasks | {changed}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Also when the poll itself is cancelled (asyncio.wait_for(poll(...)), a
                # task cancelled at shutdown): a waiter left pending is reported by asyncio
                # as "Task was destroyed but it is pending!" once collected.
                changed.cancel()
            if changed.done() and not changed.cancelled():
                for part in [part for part in in_flight.parts.values() if not part.task.done()]:
                    in_flight.drop(part)
        # Whatever has answered (the poll's time may be up: a later poll takes the rest).
        self._take_parts([part for part in in_flight.parts.values() if part.task.done()])

    def _take_parts(self, parts: list[_FetchPart]) -> None:
        """Use the answers of these (answered) parts. A leader that could not be reached, or
        answered with a retriable error, backs its partitions off and marks their topics
        stale: they go through the gateway while Metadata is asked again. A failed call
        through the gateway raises here, in the poll that takes it, as any other error."""
        for part in parts:
            self._in_flight.remove(part)  # one at a time: after a raise, the rest wait for the next poll
            try:
                response = part.task.result()
                if response.error_code != common_pb2.NONE:
                    raise error_for_code(
                        response.error_code, f"Fetch from {part.destination or 'the gateway'}"
                    )
            except HighwaterError as error:
                if part.destination == VIA_GATEWAY or not error.retriable:
                    raise
                self._leader_failed(part, error)
                continue
            asked = part.asked
            alone = sum(len(topic.partitions) for topic in response.topics) == 1
            for topic in response.topics:
                for answer in topic.partitions:
                    tp = TopicPartition(topic.topic, answer.partition)
                    if tp not in asked or self._fetch_offsets.get(tp) != asked[tp]:
                        continue  # sought, paused or unassigned while the fetch was out
                    self._take_fetched(tp, asked[tp], answer, alone=alone)

    def _leader_failed(self, part: _FetchPart, error: HighwaterError) -> None:
        """A part sent straight to a leader failed as a whole (the leader is gone, restarting
        or hung): its partitions back off for retry_backoff_ms and then go through the gateway
        until new Metadata names their leader (the controller moves a leadership that is gone)."""
        if isinstance(error, LeaderMoved):
            # Metadata already names the new leader: its partitions are fetched there next.
            log.info("Fetch from leader %s: %s", part.destination, error)
            return
        log.info("Fetch from leader %s: %s; retrying through the gateway", part.destination, error)
        retry_at_ms = now_ms() + self.config.retry_backoff_ms
        for tp in part.asked:
            self._metadata.mark_stale(tp.topic)
            self._backoff_until_ms[tp] = retry_at_ms

    def _take_fetched(
        self, tp: TopicPartition, fetch_offset: int, part: common_pb2.FetchPartitionResponse, *, alone: bool
    ) -> None:
        """Use one partition's answer. `alone`: the Fetch asked for this partition only."""
        if part.error_code != common_pb2.NONE:
            error = error_for_code(
                part.error_code, part.error_message or f"Fetch of {tp} at offset {fetch_offset}"
            )
            if part.error_code == common_pb2.OFFSET_OUT_OF_RANGE and self.config.auto_offset_reset != "none":
                log.info(
                    "%s: offset %d out of range; resetting to %s",
                    tp,
                    fetch_offset,
                    self.config.auto_offset_reset,
                )
                self._seek_to((tp,), _RESET_TIMESTAMPS[self.config.auto_offset_reset])
                return
            if error.retriable:
                if error.refresh_metadata:
                    self._metadata.mark_stale(tp.topic)
                self._backoff_until_ms[tp] = now_ms() + self.config.retry_backoff_ms
                return
            raise error
        self._high_watermarks[tp] = part.high_watermark
        buf = part.records
        if not buf:
            if alone and fetch_offset < part.high_watermark and tp not in self._buffers:
                # A compacted log's hole reaching the HW: asked alone, a leader with any batch in
                # [fetch_offset, HW) sends one (an answer's first batch always goes), so no
                # record lies there and the position moves to the HW, as it would past a batch.
                # (In a Fetch of several partitions one may come back empty only because the
                # answer's bytes went to the others: that proves nothing, and the position
                # stays, as Kafka's consumer stays, until a batch is written after the hole.)
                self._fetch_offsets[tp] = part.high_watermark
                if tp in self._positions:
                    self._positions[tp] = part.high_watermark
            return
        next_offset = next_fetch_offset(buf, fetch_offset)
        if next_offset is None:
            # A batch larger than the partition's fetch size: ask for more next time.
            current = self._partition_fetch_bytes.get(tp, self.config.max_partition_fetch_bytes)
            if current >= self.config.fetch_max_bytes:
                raise MessageTooLarge(
                    f"the batch at offset {fetch_offset} of {tp} is larger than "
                    f"fetch_max_bytes={self.config.fetch_max_bytes}"
                )
            self._partition_fetch_bytes[tp] = min(
                current * PARTITION_FETCH_BYTES_GROWTH_FACTOR, self.config.fetch_max_bytes
            )
            return
        self._partition_fetch_bytes.pop(tp, None)
        if tp in self._buffers:
            raise InvariantViolation(
                f"{tp}: a Fetch answer at offset {fetch_offset} taken while records of the last one "
                "are still buffered (answers are taken only once the buffers are handed out)"
            )
        fetched = _Buffered(
            records.iter_records_as(
                ConsumerRecord,
                buf,
                tp.topic,
                tp.partition,
                start_offset=fetch_offset,
                check_crc=self.config.check_crcs,
            )
        )
        first_ready = fetched.ready()  # decodes the first batch with a record
        self._fetch_offsets[tp] = next_offset
        if first_ready:
            self._buffers[tp] = fetched
        elif tp in self._positions:
            self._positions[tp] = next_offset  # only control or compacted-away offsets

    async def close(self, *args: object, timeout_ms: int | None = None) -> None:
        """Commit positions (with a group and auto-commit on), leave the group at once (its
        partitions move to the other members now, not a session timeout later), then close
        the channels. The final commit retries for up to timeout_ms (keyword only, in
        milliseconds; default CONSUMER_CLOSE_TIMEOUT_MS, Kafka's 30 s)."""
        check_no_positional_timeout("close", args)
        if self._closed:
            return
        commit_timeout_ms = CONSUMER_CLOSE_TIMEOUT_MS
        if timeout_ms is not None:
            commit_timeout_ms = check_int("timeout_ms", timeout_ms, minimum=1)
        self._in_flight.abandon()
        for task in self._refreshing.values():
            task.cancel()
        try:
            if self._async_commits:
                # Commits the application made before close() are made before it leaves the group.
                await asyncio.wait(set(self._async_commits), timeout=commit_timeout_ms / 1000)
            if self._group_id is not None and self.config.enable_auto_commit and self._connection is not None:
                try:
                    await self.commit(timeout_ms=commit_timeout_ms)
                except HighwaterError as error:
                    log.warning("final commit for group %s failed: %s", self._group_id, error)
            if self._member is not None:
                await self._call_listener("on_partitions_revoked", list(self._assignment))
            self._drop_member()
            for member in self._leaving:
                await member.leave()
            self._leaving.clear()
        finally:
            self._closed = True
            if self._leaders is not None:
                await self._leaders.close()
            if self._connection is not None:
                await self._connection.close()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        """Iterate records forever. Each record advances the position as poll() would."""
        while True:
            buffered = self.next_buffered()
            if buffered is not None:
                return buffered
            batch = await self.poll(self.config.fetch_max_wait_ms, max_records=1)
            if batch:
                return batch[0]

    def next_buffered(self) -> ConsumerRecord | None:
        """The next already-fetched record, if any, taken as poll() would take it (no I/O)."""
        if not self._buffers:
            return None
        taken = self._take_buffered(1)
        return taken[0] if taken else None

    def take_ready(self, max_records: int | None = None) -> list[ConsumerRecord]:
        """What poll() would return when it has nothing else to do first: records are buffered,
        the next Fetch is already out, and no auto-commit, rebalance or leave is due (with a
        subscription without a group, poll() also follows the topics' partitions: not here).
        Otherwise [] and poll() is needed. No I/O and no task: Consumer.poll calls it on the
        caller's thread, sparing two thread hops per poll while an answer is handed out."""
        limit = (
            self.config.max_poll_records
            if max_records is None
            else check_int("max_records", max_records, minimum=1)
        )
        member = self._member
        if (
            not self._buffers
            or not self._in_flight.complete
            or self._closed
            or self._leaving
            or (self._subscription is not None and not self._grouped)
            or (member is not None and member.changed.is_set())
            or (
                self._group_id is not None
                and self.config.enable_auto_commit
                and now_ms() >= self._next_auto_commit_ms
            )
        ):
            return []
        return self._take_buffered(limit)


class Consumer(SyncClient[AsyncConsumer]):
    """Synchronous consumer: an AsyncConsumer on a private event-loop thread. Not thread-safe.
    close() commits (with a group and auto-commit on), then closes the channels and the thread.

    Example::

        with Consumer("orders", group_id="billing", auto_offset_reset="earliest") as consumer:
            for record in consumer.poll(timeout_ms=1000):
                print(record.partition, record.offset, record.value)
            consumer.commit()
    """

    def __init__(self, *topics: str, bootstrap: str | list[str] = DEFAULT_BOOTSTRAP, **settings: Any) -> None:
        super().__init__(AsyncConsumer(*topics, bootstrap=bootstrap, **settings), "highwater-consumer")
        self.config = self._async.config

    # Local state: no I/O, called directly.
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._async.assign(partitions)

    def subscribe(
        self,
        topics: Iterable[str],
        group_id: str | None = None,
        *,
        on_partitions_assigned: PartitionsCallback | None = None,
        on_partitions_revoked: PartitionsCallback | None = None,
        on_partitions_lost: PartitionsCallback | None = None,
    ) -> None:
        """As AsyncConsumer.subscribe; the callbacks run inside poll(), on this consumer's loop
        thread (they may not call this Consumer's blocking methods)."""
        self._async.subscribe(
            topics,
            group_id,
            on_partitions_assigned=on_partitions_assigned,
            on_partitions_revoked=on_partitions_revoked,
            on_partitions_lost=on_partitions_lost,
        )

    def unsubscribe(self) -> None:
        self._async.unsubscribe()

    def subscription(self) -> tuple[str, ...]:
        return self._async.subscription()

    def assignment(self) -> list[TopicPartition]:
        return self._async.assignment()

    @property
    def group_id(self) -> str | None:
        return self._async.group_id

    @property
    def member_id(self) -> str | None:
        return self._async.member_id

    @property
    def member_epoch(self) -> int | None:
        return self._async.member_epoch

    def pause(self, *partitions: TopicPartition) -> None:
        self._async.pause(*partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._async.resume(*partitions)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._async.seek(tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._async.seek_to_beginning(*partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._async.seek_to_end(*partitions)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self._async.highwater(tp)

    # Calls to the gateway: run on the loop thread.
    def partitions_for_topic(self, topic: str) -> list[int]:
        return self._run(self._async.partitions_for_topic(topic), "partitions_for_topic()")

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        """As AsyncConsumer.poll. Records of an answer already fetched, while the next Fetch is
        out and nothing else is due, are taken on the caller's thread (AsyncConsumer.take_ready);
        the rest runs on the loop thread."""
        check_int("timeout_ms", timeout_ms, minimum=0)
        ready = self._async.take_ready(max_records)
        if ready:
            return ready
        return self._run(self._async.poll(timeout_ms, max_records), "poll()")

    def seek_to_timestamp(self, timestamp_ms: int, *partitions: TopicPartition) -> None:
        self._run(self._async.seek_to_timestamp(timestamp_ms, *partitions), "seek_to_timestamp()")

    def position(self, tp: TopicPartition) -> int:
        return self._run(self._async.position(tp), "position()")

    def lag(self, tp: TopicPartition) -> int:
        return self._run(self._async.lag(tp), "lag()")

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._run(self._async.beginning_offsets(list(partitions)), "beginning_offsets()")

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._run(self._async.end_offsets(list(partitions)), "end_offsets()")

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        return self._run(self._async.offsets_for_times(dict(timestamps)), "offsets_for_times()")

    def committed(self, tp: TopicPartition) -> int | None:
        return self._run(self._async.committed(tp), "committed()")

    def commit(
        self, offsets: Mapping[TopicPartition, int] | None = None, *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """Store offsets synchronously (default: every assigned partition's position), retrying
        retriable errors for up to timeout_ms (default default_api_timeout_ms); see
        AsyncConsumer.commit."""
        return self._run(self._async.commit(offsets, timeout_ms=timeout_ms), "commit()")

    def close(self, *args: object, timeout_ms: int | None = None) -> None:
        """As AsyncConsumer.close (timeout_ms keyword only, in milliseconds), then stop the
        loop thread."""
        check_no_positional_timeout("close", args)
        try:
            self._run(self._async.close(timeout_ms=timeout_ms), "close()")
        finally:
            self._thread.stop()

    def commit_async(
        self, offsets: Mapping[TopicPartition, int] | None = None, callback: CommitCallback | None = None
    ) -> concurrent.futures.Future[dict[TopicPartition, int]]:
        """Commit in the background; the future (and `callback(offsets, error)`) tell the outcome.
        The callback runs on the consumer's loop thread."""
        snapshot = dict(offsets) if offsets is not None else None

        async def _commit() -> dict[TopicPartition, int]:
            return await self._async.commit_async(snapshot, callback)

        return self._thread.submit(_commit())

    def __iter__(self) -> Consumer:
        return self

    def __next__(self) -> ConsumerRecord:
        """Iterate records forever; records already fetched are taken without a thread hop
        (nothing runs on the loop thread between calls)."""
        while True:
            buffered = self._async.next_buffered()
            if buffered is not None:
                return buffered
            batch = self.poll(self.config.fetch_max_wait_ms, max_records=1)
            if batch:
                return batch[0]
