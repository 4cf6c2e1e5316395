"""The consumer's fetcher (Kafka's Fetcher, aiokafka's consumer/fetcher.py): Fetch requests
to the partitions' leaders, the answers fetched ahead, decoding, and positions moved past
what is handed out.

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

Offsets need not be contiguous: a compacted topic's cleaner removes records and whole
batches and keeps the offsets of the rest. Positions therefore follow the batches, never
a count of records: after a batch the position is its last offset + 1 (Kafka's
batch.nextOffset, past records removed from its end), a Fetch at an offset inside a hole
answers from the next batch, and an answer with no batch below the HW to a Fetch of that
partition alone moves the position to the HW (a hole reaching it; _take_fetched).

Fetching ahead (Kafka's Fetcher does the same): when poll() hands out records, the next
Fetch for the fetchable partitions, at the offsets after what is buffered, is sent at
once, so the leaders work while the caller processes the records. One Fetch is out at a
time per destination (a leader, or the gateway) and its answer stays undecoded until the
buffers are handed out: at most one answer (fetch_max_bytes) per destination ahead. A
partition that is sought, reset, paused, unassigned or revoked meanwhile leaves the
Fetch's `asked` partitions and its part of the answer is dropped (_FetchInFlight), so no
record is handed out twice or skipped.

The positions themselves live in the SubscriptionState (clients/subscription_state.py),
shared with AsyncConsumer; the fetcher owns only what is fetched and not yet handed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from clients.common import records
from clients.common.control_records import drop_aborted
from clients.common.errors import CorruptMessage, InvariantViolation, MessageTooLarge
from clients.common.fetch_request import consumer_fetch_request, last_stable_offset
from clients.common.record_batch import next_fetch_offset
from clients.config import (
    LEADER_MOVE_CHECK_AFTER_MS,
    PARTITION_FETCH_BYTES_GROWTH_FACTOR,
    POLL_CALL_GRACE_MS,
    ConsumerConfig,
)
from clients.connection import GatewayConnection
from clients.errors import HighwaterError, LeaderMoved, error_for_code
from clients.leaders import LeaderConnections, unless_leader_moves
from clients.metadata import ClusterMetadata, MetadataFetcher, now_ms
from clients.subscription_state import RESET_TIMESTAMPS, SubscriptionState
from clients.types import ConsumerRecord, TopicPartition
from protos.highwater.v1 import common_pb2

log = logging.getLogger("highwater.client.consumer")

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


class ConsumerFetcher:
    """Fetches the fetchable partitions of a SubscriptionState and hands their records out.

    The consumer's connections come in as callables, read at each use: `conn` (the gateway
    connection, made on first use), `meta` (its Metadata fetcher), `leaders` (the channels to
    the partition leaders, None with direct_to_leaders off or before the connection is made)
    and `answered` (whether a gateway has ever answered: a first Fetch is the poll's own).
    """

    def __init__(
        self,
        config: ConsumerConfig,
        state: SubscriptionState,
        metadata: ClusterMetadata,
        *,
        conn: Callable[[], GatewayConnection],
        meta: Callable[[], MetadataFetcher],
        leaders: Callable[[], LeaderConnections | None],
        answered: Callable[[], bool],
    ) -> None:
        self._config = config
        self._state = state
        self._metadata = metadata
        self._conn = conn
        self._meta = meta
        self._leaders = leaders
        self._answered = answered
        # Only partitions with records to hand out, in the order they are handed out next (a
        # partition that gave some and has more goes to the back).
        self._buffers: OrderedDict[TopicPartition, _Buffered] = OrderedDict()
        # The one Fetch out at a time (a part per leader): sent while poll() hands out the
        # buffers (fetching ahead), or by a poll with nothing buffered; its answers are taken
        # once the buffers are empty.
        self._in_flight = _FetchInFlight()
        # Background Metadata refreshes of topics whose leaders are not known now, and when
        # each topic may be refreshed again (ms): at most one per retry_backoff_ms.
        self._refreshing: dict[str, asyncio.Task[None]] = {}
        self._refresh_not_before_ms: dict[str, int] = {}
        self._partition_fetch_bytes: dict[TopicPartition, int] = {}
        self._backoff_until_ms: dict[TopicPartition, int] = {}
        self._closed = False

    # --- what the consumer changed -----------------------------------------------------

    def retain(self, keep: set[TopicPartition]) -> None:
        """The assignment is now `keep`: drop what was fetched for any other partition."""
        for state in (self._buffers, self._backoff_until_ms, self._partition_fetch_bytes):
            for tp in [tp for tp in state if tp not in keep]:
                del state[tp]
        for tp in self._in_flight.asked() - keep:
            self._in_flight.forget(tp)

    def forget_fetch_ahead(self, tp: TopicPartition) -> None:
        """The Fetch in flight's answer for tp will not be used: tp was sought, paused or
        unassigned since it was sent, and its records are no longer the next ones to hand out.
        Local state only (Consumer calls it from the caller's thread); the next poll() drops
        a Fetch left with no partition."""
        self._in_flight.forget(tp)

    def drop(self, tp: TopicPartition) -> None:
        """tp's position moves elsewhere: nothing fetched for it may be handed out."""
        self._buffers.pop(tp, None)
        self.forget_fetch_ahead(tp)

    def reset(self, tp: TopicPartition, timestamp: int) -> None:
        """Look tp's position up again at `timestamp` (seek_to_*, an offset out of range)."""
        self.drop(tp)
        self._state.reset(tp, timestamp)

    def refreshing(self, topic: str) -> bool:
        """Whether a background Metadata refresh of `topic` is out."""
        return topic in self._refreshing

    @property
    def buffered(self) -> bool:
        """Whether records (or a corrupt batch's error) wait to be handed out."""
        return bool(self._buffers)

    @property
    def in_flight_complete(self) -> bool:
        """Whether every partition fetchable when parts were last sent has a part out."""
        return self._in_flight.complete

    def abandon(self) -> None:
        """Drop the Fetch in flight and the background refreshes (the consumer is closing)."""
        self._in_flight.abandon()
        for task in self._refreshing.values():
            task.cancel()

    def close(self) -> None:
        """Fetch no more (the consumer is closed)."""
        self._closed = True

    # --- fetching -----------------------------------------------------------------

    def take_buffered(self, limit: int) -> list[ConsumerRecord]:
        """Up to `limit` buffered records, partitions taken in turn, each partition's position
        moved past what it gave. A corrupt batch's CorruptMessage is raised only by a call
        that has taken nothing yet, so no record taken here is lost to it."""
        taken: list[ConsumerRecord] = []
        buffers = self._buffers
        paused = self._state.paused
        # The buffered partitions in turn, not every assigned one: walking 10,000 assigned
        # partitions at each poll was a third of a catch-up's time (bench/scale.py).
        for _ in range(len(buffers)):
            if len(taken) >= limit:
                break
            tp, buffer = next(iter(buffers.items()))
            if tp in paused:
                buffers.move_to_end(tp)
                continue
            chunk: list[ConsumerRecord] = []
            while len(taken) + len(chunk) < limit and buffer.ready():
                if buffer.error_next and (taken or chunk):
                    break  # raised by a later call, once these are handed out
                chunk += buffer.take(limit - len(taken) - len(chunk))
            if chunk:
                taken += chunk
                self._state.positions[tp] = chunk[-1].offset + 1
            if buffer.ready():
                buffers.move_to_end(tp)
            else:
                del buffers[tp]
                # Past control or compacted-away offsets.
                self._state.positions[tp] = self._state.fetch_offsets[tp]
        return taken

    def _fetchable(self, now: int) -> list[TopicPartition]:
        """The partitions a Fetch sent now asks for: assigned, with a position, not paused, not
        backing off. Partitions with records still buffered are asked past them (fetching ahead)."""
        return [
            tp
            for tp in self._state.assignment
            if tp in self._state.fetch_offsets
            and tp not in self._state.paused
            and self._backoff_until_ms.get(tp, 0) <= now
        ]

    def _destinations(self, tps: list[TopicPartition]) -> dict[str, list[TopicPartition]]:
        """The partitions by where their Fetch goes: their leader's address from Metadata, or
        VIA_GATEWAY (direct_to_leaders off, or no leader known now: none in the last answer,
        or the topic marked stale by an error). Starts a background refresh of a topic with a
        partition whose leader is not known, or whose Metadata is older than
        metadata_max_age_ms; the gateway, which follows the controller, routes meanwhile."""
        if self._leaders() is None:
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
        self._refresh_not_before_ms[topic] = now + self._config.retry_backoff_ms
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
        asked = {tp: self._state.fetch_offsets[tp] for tp in tps}
        request = consumer_fetch_request(
            asked,
            max_wait_ms=max_wait_ms,
            min_bytes=self._config.fetch_min_bytes,
            max_bytes=self._config.fetch_max_bytes,
            partition_max_bytes=self._config.max_partition_fetch_bytes,
            partition_max_bytes_by=self._partition_fetch_bytes,
            read_committed=self._config.read_committed,
            topic_ids=self._metadata.topic_ids({tp.topic for tp in tps}),
        )
        timeout_ms = self._config.request_timeout_ms + max_wait_ms
        leaders = self._leaders()
        if destination == VIA_GATEWAY or leaders is None:
            call = self._conn().call("Fetch", request, timeout_ms=timeout_ms)
        else:
            # A leader that stops answering (paused, cut off) is left once Metadata names
            # another: the partitions wait about its lease, not request_timeout_ms.
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

    def fetch_ahead(self) -> None:
        """Send the next Fetch now (a part per destination that has none out), at the offsets
        after what is buffered: its answers (one per destination ahead, each at most
        fetch_max_bytes) wait undecoded until the buffers are handed out. Only after a
        gateway answered: a first Fetch is the poll's own."""
        if self._closed or not self._answered():
            return
        fetchable = self._fetchable(now_ms())
        if fetchable:
            self._send_missing(fetchable, self._config.fetch_max_wait_ms, replace=False)

    async def fetch(self, remaining_ms: int, changed: asyncio.Event | None) -> None:
        """Take the answers of the Fetch in flight (sending a part for every fetchable partition
        no part asks for), waiting at most remaining_ms (+ POLL_CALL_GRACE_MS) for the first.
        Called with nothing buffered to hand out: the answers' records become the buffers.
        `changed`: a group member's event, set when its assignment changes (None: no group)."""
        in_flight = self._in_flight
        answered = [part for part in in_flight.parts.values() if part.task.done()]
        if answered:
            self._take_parts(answered)
            return
        for part in [part for part in in_flight.parts.values() if not part.asked]:
            in_flight.drop(part)  # nothing it asked for may be used any more
        fetchable = self._fetchable(now_ms())
        if fetchable:
            self._send_missing(fetchable, min(self._config.fetch_max_wait_ms, remaining_ms), replace=True)
        if not in_flight.parts:
            if changed is not None and not self._state.assignment:
                # Waiting for the group to give this member partitions: woken by its answer.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining_ms / 1000)
                return
            # Nothing to ask (all backing off or unresolved): wait a little instead of spinning.
            await asyncio.sleep(min(remaining_ms, self._config.retry_backoff_ms) / 1000)
            return
        wait_s = (remaining_ms + POLL_CALL_GRACE_MS) / 1000
        tasks: set[asyncio.Future[Any]] = {part.task for part in in_flight.parts.values()}
        if changed is None:
            await asyncio.wait(tasks, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        else:
            # A group member stops waiting for records when its assignment changes: partitions
            # freed by a leave or a crash are taken now, not after this long poll. Nothing is
            # lost by dropping the fetch: positions move only when its answer is taken.
            changed_wait = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait(
                    tasks | {changed_wait}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                # Also when the poll itself is cancelled (asyncio.wait_for(poll(...)), a
                # task cancelled at shutdown): a waiter left pending is reported by asyncio
                # as "Task was destroyed but it is pending!" once collected.
                changed_wait.cancel()
            if changed_wait.done() and not changed_wait.cancelled():
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
                    if tp not in asked or self._state.fetch_offsets.get(tp) != asked[tp]:
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
        retry_at_ms = now_ms() + self._config.retry_backoff_ms
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
            if part.error_code == common_pb2.OFFSET_OUT_OF_RANGE and self._config.auto_offset_reset != "none":
                log.info(
                    "%s: offset %d out of range; resetting to %s",
                    tp,
                    fetch_offset,
                    self._config.auto_offset_reset,
                )
                self.reset(tp, RESET_TIMESTAMPS[self._config.auto_offset_reset])
                return
            if error.retriable:
                if error.refresh_metadata:
                    self._metadata.mark_stale(tp.topic)
                self._backoff_until_ms[tp] = now_ms() + self._config.retry_backoff_ms
                return
            raise error
        # A read_committed consumer's end is the last stable offset (its lag, its holes).
        end = last_stable_offset(part) if self._config.read_committed else part.high_watermark
        self._state.high_watermarks[tp] = end
        buf = part.records
        if not buf:
            if alone and fetch_offset < end and tp not in self._buffers:
                # A compacted log's hole reaching the HW: asked alone, a leader with any batch in
                # [fetch_offset, HW) sends one (an answer's first batch always goes), so no
                # record lies there and the position moves to the HW, as it would past a batch.
                # (In a Fetch of several partitions one may come back empty only because the
                # answer's bytes went to the others: that proves nothing, and the position
                # stays, as Kafka's consumer stays, until a batch is written after the hole.)
                self._state.fetch_offsets[tp] = end
                if tp in self._state.positions:
                    self._state.positions[tp] = end
            return
        next_offset = next_fetch_offset(buf, fetch_offset)
        if next_offset is None:
            # A batch larger than the partition's fetch size: ask for more next time.
            current = self._partition_fetch_bytes.get(tp, self._config.max_partition_fetch_bytes)
            if current >= self._config.fetch_max_bytes:
                raise MessageTooLarge(
                    f"the batch at offset {fetch_offset} of {tp} is larger than "
                    f"fetch_max_bytes={self._config.fetch_max_bytes}"
                )
            self._partition_fetch_bytes[tp] = min(
                current * PARTITION_FETCH_BYTES_GROWTH_FACTOR, self._config.fetch_max_bytes
            )
            return
        self._partition_fetch_bytes.pop(tp, None)
        if tp in self._buffers:
            raise InvariantViolation(
                f"{tp}: a Fetch answer at offset {fetch_offset} taken while records of the last one "
                "are still buffered (answers are taken only once the buffers are handed out)"
            )
        committed: bytes | bytearray | memoryview = buf
        if self._config.read_committed and part.aborted_transactions:
            # The position still moves past the dropped batches (next_offset, from buf as sent).
            committed = drop_aborted(
                buf, ((a.producer_id, a.first_offset) for a in part.aborted_transactions)
            )
        fetched = _Buffered(
            records.iter_records_as(
                ConsumerRecord,
                committed,
                tp.topic,
                tp.partition,
                start_offset=fetch_offset,
                check_crc=self._config.check_crcs,
            )
        )
        first_ready = fetched.ready()  # decodes the first batch with a record
        self._state.fetch_offsets[tp] = next_offset
        if first_ready:
            self._buffers[tp] = fetched
        elif tp in self._state.positions:
            self._state.positions[tp] = next_offset  # only control or compacted-away offsets
