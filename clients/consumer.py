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
next record poll() returns. A partition without one starts from the group's
committed offset, else from `auto_offset_reset` ("earliest" | "latest" | "none":
raise). `commit()` stores the position, the NEXT offset to read, as Kafka does.
Consumers see only records below the high watermark (a consumer's Fetch has
replica_id -1), and `lag(tp)` = end offset (HW) - position.

AsyncConsumer is a facade over three parts split as Kafka's and aiokafka's consumers split
them, each in its own module:
- clients/subscription_state.py `SubscriptionState`: the subscription, the assignment,
  positions, paused partitions, seek_to_* resets (plain state, no I/O);
- clients/consumer_fetcher.py `ConsumerFetcher`: Fetch requests to the leaders (or through
  the gateway), the answers fetched ahead, decoding, positions moved past what is handed
  out (its docstring tells how poll() fetches);
- clients/consumer_coordinator.py `ConsumerCoordinator`: the group member, commits,
  auto-commit and the rebalance callbacks (clients/group_member.py runs the heartbeat).
The facade owns the gateway connection, the Metadata, resolving missing positions
(committed offset, else auto_offset_reset: ListOffsets) and poll()'s loop.

AsyncConsumer is owned by the event loop it is first used on. Consumer runs one
on a private loop thread; it is not thread-safe (as Kafka's consumer is not).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from clients.common.errors import InvariantViolation
from clients.common.fetch_request import READ_COMMITTED, READ_UNCOMMITTED
from clients.common.record_batch import next_fetch_offset
from clients.config import (
    CONSUMER_CLOSE_TIMEOUT_MS,
    DEFAULT_BOOTSTRAP,
    POLL_CALL_GRACE_MS,
    ConsumerConfig,
    build_config,
    check_group_id,
    check_int,
    check_topic_name,
)
from clients.connection import GatewayConnection, call_deadline
from clients.consumer_coordinator import (
    CLIENT_ID,
    LISTENER_NAMES,
    CommitCallback,
    ConsumerCoordinator,
    PartitionsCallback,
)
from clients.consumer_fetcher import VIA_GATEWAY, ConsumerFetcher
from clients.errors import (
    ClientClosed,
    GatewayUnavailable,
    HighwaterError,
    InvalidArgument,
    check_no_positional_timeout,
    error_for_code,
)
from clients.group_member import GroupMember
from clients.leaders import LeaderConnections
from clients.loop_thread import SyncClient
from clients.metadata import ClusterMetadata, MetadataFetcher, now_ms
from clients.subscription_state import EARLIEST, LATEST, SubscriptionState, check_partitions
from clients.transactions import GroupMetadata
from clients.types import ConsumerRecord, OffsetAndTimestamp, TopicPartition
from protos.highwater.v1 import common_pb2

# Names other modules import from here (clients/admin.py, spark_connector/reader.py, bench/).
__all__ = [
    "CLIENT_ID",
    "EARLIEST",
    "LATEST",
    "LISTENER_NAMES",
    "VIA_GATEWAY",
    "AsyncConsumer",
    "CommitCallback",
    "Consumer",
    "PartitionsCallback",
    "check_partitions",
    "next_fetch_offset",
]

log = logging.getLogger("highwater.client.consumer")


class AsyncConsumer:
    """asyncio consumer. `async with AsyncConsumer("orders", group_id="billing") as consumer:`."""

    def __init__(self, *topics: str, bootstrap: str | list[str] = DEFAULT_BOOTSTRAP, **settings: Any) -> None:
        listeners = {name: settings.pop(name, None) for name in LISTENER_NAMES}
        self.config: ConsumerConfig = build_config(ConsumerConfig, bootstrap, settings)
        self._metadata = ClusterMetadata(metadata_max_age_ms=self.config.metadata_max_age_ms)
        self._connection: GatewayConnection | None = None
        self._metadata_fetcher: MetadataFetcher | None = None
        # Channels straight to the partition leaders (direct_to_leaders; made with the
        # gateway connection, in _conn()).
        self._leaders: LeaderConnections | None = None
        self._state = SubscriptionState(self.config.auto_offset_reset)
        self._fetcher = ConsumerFetcher(
            self.config,
            self._state,
            self._metadata,
            conn=self._conn,
            meta=self._meta,
            leaders=lambda: self._leaders,
            answered=self._answered,
        )
        self._group = ConsumerCoordinator(
            self.config,
            self._state,
            listeners,
            conn=self._conn,
            answered=self._answered,
            assign=self._set_assignment,
        )
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
            self._metadata_fetcher = MetadataFetcher(self._connection, self._metadata)
            if self.config.direct_to_leaders:
                self._leaders = LeaderConnections.from_config(self.config, self._connection.tls)
        return self._connection

    def _meta(self) -> MetadataFetcher:
        self._conn()
        if self._metadata_fetcher is None:
            raise InvariantViolation("the metadata fetcher is created with the connection")
        return self._metadata_fetcher

    def _answered(self) -> bool:
        """Whether a gateway has ever answered this consumer."""
        return self._connection is not None and self._connection.ever_answered

    # --- what to read --------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replaces any subscription, leaving its group).
        Positions of partitions kept from the previous assignment are kept."""
        checked = check_partitions(partitions)
        self._state.subscription = None
        self._group.drop_member()
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
        self._group.update_listeners(
            {
                "on_partitions_assigned": on_partitions_assigned,
                "on_partitions_revoked": on_partitions_revoked,
                "on_partitions_lost": on_partitions_lost,
            }
        )
        checked_group_id = None if group_id is None else check_group_id(group_id)
        self._state.subscription = names
        self._group.subscribe(names, checked_group_id)
        self._set_assignment([tp for tp in self._state.assignment if tp.topic in names])
        for name in names:
            self._metadata.mark_stale(name)

    def unsubscribe(self) -> None:
        """Stop reading; a group member leaves its group (at the next poll() or close())."""
        self._state.subscription = None
        self._group.drop_member()
        self._set_assignment([])

    @property
    def _member(self) -> GroupMember | None:
        """The group member (tests put a fake one here: the seam to the group's coordinator)."""
        return self._group.member

    @_member.setter
    def _member(self, member: GroupMember | None) -> None:
        self._group.member = member

    @property
    def member_id(self) -> str | None:
        """This consumer's member id in its group (None when it is not a member)."""
        return self._group.member_id

    @property
    def member_epoch(self) -> int | None:
        return self._group.member_epoch

    def group_metadata(self) -> GroupMetadata:
        """This consumer's group, member and epoch, for a transactional producer's
        send_offsets_to_transaction (KIP-447: the coordinator refuses the offsets once this
        consumer is no longer the member). InvalidArgument without a group_id."""
        return _group_metadata(self.group_id, self.member_id, self.member_epoch)

    def subscription(self) -> tuple[str, ...]:
        return self._state.subscription or ()

    def assignment(self) -> list[TopicPartition]:
        return list(self._state.assignment)

    @property
    def group_id(self) -> str | None:
        return self._group.group_id

    def _set_assignment(self, partitions: list[TopicPartition]) -> None:
        self._state.assign(partitions)
        self._fetcher.retain(set(partitions))

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching these partitions until resume(); positions are kept."""
        for tp in partitions:
            self._state.paused.add(self._state.check_assigned(tp))
            self._fetcher.forget_fetch_ahead(tp)  # a paused partition holds no answer ahead (memory)

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._state.paused.discard(self._state.check_assigned(tp))

    async def partitions_for_topic(self, topic: str) -> list[int]:
        """The topic's partition ids; UnknownTopicOrPartition at once if it does not exist."""
        info = await self._meta().topic(
            check_topic_name(topic), wait_ms=0, backoff_ms=self.config.retry_backoff_ms
        )
        return list(info.partitions)

    # --- positions -------------------------------------------------------------------

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make `offset` the next record poll() returns for tp."""
        tp = self._state.check_assigned(tp)
        check_int("offset", offset, minimum=0)
        self._fetcher.drop(tp)
        self._state.seek(tp, offset)

    def _seek_to(self, partitions: tuple[TopicPartition, ...], timestamp: int) -> None:
        for tp in self._state.targets(partitions):
            self._fetcher.reset(tp, timestamp)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Read these (default: all assigned) partitions from their log start offset."""
        self._seek_to(partitions, EARLIEST)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Read only records produced from now on (the high watermark) for these partitions."""
        self._seek_to(partitions, LATEST)

    async def seek_to_timestamp(self, timestamp_ms: int, *partitions: TopicPartition) -> None:
        """Seek each partition to its first record with timestamp >= timestamp_ms (the end if none)."""
        check_int("timestamp_ms", timestamp_ms, minimum=0)
        targets = self._state.targets(partitions)
        found = await self.offsets_for_times({tp: timestamp_ms for tp in targets})
        for tp in targets:
            hit = found.get(tp)
            if hit is None:
                self._seek_to((tp,), LATEST)
            else:
                self.seek(tp, hit.offset)

    async def position(self, tp: TopicPartition) -> int:
        """Offset of the next record poll() returns for tp (resolved now if not known yet)."""
        tp = self._state.check_assigned(tp)
        await self._update_positions()
        if tp not in self._state.positions:
            raise error_for_code(common_pb2.LEADER_NOT_AVAILABLE, f"no position for {tp} yet; try again")
        return self._state.positions[tp]

    def highwater(self, tp: TopicPartition) -> int | None:
        """The high watermark of tp as of the last fetch (None before one)."""
        return self._state.high_watermarks.get(tp)

    async def lag(self, tp: TopicPartition) -> int:
        """end offset (HW, asked now) - position: records produced and not yet returned."""
        position = await self.position(tp)
        end = (await self.end_offsets([tp]))[tp]
        return max(0, end - position)

    async def _update_positions(self) -> None:
        """Give every assigned partition without a position one: seek_to_* first, then the
        group's committed offset, then auto_offset_reset."""
        state = self._state
        missing = state.missing_positions()
        if not missing:
            return
        need_committed = [tp for tp in missing if tp not in state.resets]
        if need_committed and self._group.group_id is not None:
            committed = await self._group.fetch_committed(need_committed)
            for tp in need_committed:
                offset = committed.get(tp, -1)
                if offset >= 0:
                    state.seek(tp, offset)
        wanted = state.reset_timestamps(missing)
        if not wanted:
            return
        offsets = await self._list_offsets(wanted, raise_retriable=False)
        for tp, (offset, _timestamp) in offsets.items():
            if offset >= 0:
                state.seek(tp, offset)

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
            isolation_level=READ_COMMITTED if self.config.read_committed else READ_UNCOMMITTED,
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
    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset for tp (the next offset to read), None if none."""
        return await self._group.committed(tp)

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
        return await self._group.commit(offsets, timeout_ms=timeout_ms)

    def commit_async(
        self, offsets: Mapping[TopicPartition, int] | None = None, callback: CommitCallback | None = None
    ) -> asyncio.Task[dict[TopicPartition, int]]:
        """commit() in the background; `callback(offsets, error)` runs when it is done."""
        return self._group.commit_async(offsets, callback)

    # --- polling ------------------------------------------------------------------

    async def _update_subscription(self) -> None:
        await self._group.leave_dropped()
        subscription = self._state.subscription
        if subscription is None:
            return
        if self._group.grouped:
            await self._group.reconcile()
            return
        fetcher = self._meta()
        now = now_ms()
        # Not a topic a background refresh is asking for: its answer is on the way, and
        # this poll would only wait behind it.
        stale = [
            topic
            for topic in subscription
            if self._metadata.needs_refresh(topic, now) and not self._fetcher.refreshing(topic)
        ]
        if stale:
            await fetcher.refresh(stale)
        partitions = [tp for tp in self._state.assignment if tp.topic not in subscription]
        for topic in subscription:
            info = self._metadata.get(topic)
            if info is not None:
                partitions.extend(TopicPartition(topic, p) for p in info.partitions)
        if partitions != self._state.assignment:
            self._set_assignment(partitions)

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
        if self._state.subscription is None and not self._state.assignment:
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
        await self._group.maybe_auto_commit(now_ms())
        fetched_once = not fetch_late
        while True:
            try:
                await self._update_subscription()
                await self._update_positions()
                ready = self._fetcher.take_buffered(limit)
                if ready:
                    # The next answer is fetched while the caller works through these records.
                    self._fetcher.fetch_ahead()
                    return ready
                remaining = deadline - now_ms()
                if fetched_once and remaining <= 0:
                    return []
                fetched_once = True
                await self._fetcher.fetch(max(0, remaining), self._group.changed())
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
        self._fetcher.abandon()
        try:
            await self._group.close(commit_timeout_ms, connected=lambda: self._connection is not None)
        finally:
            self._closed = True
            self._fetcher.close()
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
        if not self._fetcher.buffered:
            return None
        taken = self._fetcher.take_buffered(1)
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
        if (
            not self._fetcher.buffered
            or not self._fetcher.in_flight_complete
            or self._closed
            or (self._state.subscription is not None and not self._group.grouped)
            or not self._group.nothing_due(now_ms())
        ):
            return []
        return self._fetcher.take_buffered(limit)


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

    def group_metadata(self) -> GroupMetadata:
        """As AsyncConsumer.group_metadata."""
        return self._async.group_metadata()

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


def _group_metadata(group_id: str | None, member_id: str | None, member_epoch: int | None) -> GroupMetadata:
    if group_id is None:
        raise InvalidArgument("group_metadata() needs a consumer with a group_id")
    return GroupMetadata(group_id, member_id or "", -1 if member_epoch is None else member_epoch)
