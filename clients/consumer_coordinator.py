"""The consumer's side of its group (Kafka's ConsumerCoordinator, aiokafka's
consumer/group_coordinator.py): membership, committed offsets and the rebalance callbacks,
against the gateway's group RPCs.

With a group id (and group_protocol "consumer", the default), a subscription's partitions
are the ones the group's coordinator assigns this member: consumers of one group share the
subscription's partitions, a partition moves when members join or leave, and a member
fenced by the coordinator (its session expired while it was paused) cannot commit
(clients/group_member.py runs the heartbeat; Kafka's KIP-848 protocol). reconcile(), called
by every poll(), follows the assignment: on_partitions_revoked runs before a partition is
given up (with auto-commit on, its position is committed first), on_partitions_assigned
after new ones are taken, on_partitions_lost when they were taken away without a chance to
commit. The callbacks may be coroutine functions.

Commits store positions (the NEXT offset to read, as Kafka does) with the member's id and
epoch, retried with back-off on retriable errors (commit()); commit_async() runs one in the
background and close() completes those before leaving the group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from clients.common.errors import InvariantViolation
from clients.config import COMMIT_OFFSETS_PER_REQUEST_MAX, ConsumerConfig, check_int
from clients.connection import GatewayConnection, call_deadline, current_call_deadline
from clients.errors import HighwaterError, InvalidArgument, RequestTimedOut, error_for_code
from clients.group_member import FENCED_CODES, GroupMember
from clients.metadata import now_ms
from clients.subscription_state import SubscriptionState, check_partitions
from clients.types import TopicPartition
from protos.highwater.v1 import common_pb2, gateway_pb2

log = logging.getLogger("highwater.client.consumer")

# A rebalance callback: called with the partitions concerned; may be a coroutine function.
PartitionsCallback = Callable[[list[TopicPartition]], Any]
LISTENER_NAMES = ("on_partitions_assigned", "on_partitions_revoked", "on_partitions_lost")
# Commit answers that mean this member was fenced: it must drop its partitions and rejoin.
# (STALE_MEMBER_EPOCH is not one: the member's heartbeat moved on, and the commit named
# partitions it no longer owns; the error goes to the caller.)
_COMMIT_FENCED_CODES = FENCED_CODES
# What a member tells the coordinator it is (kafka-consumer-groups' CLIENT-ID column).
CLIENT_ID = "highwater-python"

CommitCallback = Callable[[dict[TopicPartition, int], HighwaterError | None], Any]


def check_listeners(listeners: Mapping[str, Any]) -> dict[str, PartitionsCallback | None]:
    for name, callback in listeners.items():
        if callback is not None and not callable(callback):
            raise InvalidArgument(f"{name} must be callable (called with a list of TopicPartition)")
    return dict(listeners)


class ConsumerCoordinator:
    """A consumer's group: its id, its member (None until the first poll() of a grouped
    subscription, and after it was dropped), members dropped and still to leave, the
    rebalance callbacks, auto-commit's schedule and commit_async()'s commits in flight.

    `conn` is the consumer's gateway connection (made on first use); `answered` says whether
    a gateway has ever answered; `assign` changes the consumer's assignment (the
    SubscriptionState's and what the fetcher holds for partitions given up).
    """

    def __init__(
        self,
        config: ConsumerConfig,
        state: SubscriptionState,
        listeners: dict[str, PartitionsCallback | None],
        *,
        conn: Callable[[], GatewayConnection],
        answered: Callable[[], bool],
        assign: Callable[[list[TopicPartition]], None],
    ) -> None:
        self._config = config
        self._state = state
        self._listeners = check_listeners(listeners)
        self._conn = conn
        self._answered = answered
        self._assign = assign
        self.group_id = config.group_id
        self.member: GroupMember | None = None
        self.leaving: list[GroupMember] = []
        # commit_async()'s commits not yet done: close() completes them first (Kafka's close()
        # does), and nobody need await one (its error goes to the callback).
        self._async_commits: set[asyncio.Task[dict[TopicPartition, int]]] = set()
        self._next_auto_commit_ms = now_ms() + config.auto_commit_interval_ms

    # --- membership ------------------------------------------------------------------

    @property
    def grouped(self) -> bool:
        """Whether the subscription is read as a member of a consumer group."""
        return (
            self._state.subscription is not None
            and self.group_id is not None
            and self._config.group_protocol == "consumer"
        )

    def update_listeners(self, given: Mapping[str, PartitionsCallback | None]) -> None:
        """Replace the callbacks given (None: keep the one given before)."""
        self._listeners.update(check_listeners({k: v for k, v in given.items() if v is not None}))

    def subscribe(self, names: tuple[str, ...], group_id: str | None) -> None:
        """The subscription is now `names` (and the group `group_id`, if one is given): a new
        group's member starts over; the same group's member tells it the new topics."""
        if group_id is not None and group_id != self.group_id:
            self.drop_member()
            self.group_id = group_id
        if self.member is not None:
            self.member.resubscribe(names)

    def drop_member(self) -> None:
        """Stop being a member: the member leaves its group at the next poll() or close()."""
        if self.member is not None:
            self.leaving.append(self.member)
            self.member = None

    async def leave_dropped(self) -> None:
        for member in self.leaving:
            await member.leave()
        self.leaving.clear()

    @property
    def member_id(self) -> str | None:
        return self.member.member_id or None if self.member is not None else None

    @property
    def member_epoch(self) -> int | None:
        return self.member.epoch if self.member is not None else None

    def changed(self) -> asyncio.Event | None:
        """The member's event set when its assignment changes (None: not a member)."""
        return self.member.changed if self.member is not None else None

    def nothing_due(self, now: int) -> bool:
        """Whether no leave, rebalance or auto-commit waits for a poll()."""
        member = self.member
        auto_commit_due = (
            self.group_id is not None and self._config.enable_auto_commit and now >= self._next_auto_commit_ms
        )
        return not (self.leaving or (member is not None and member.changed.is_set()) or auto_commit_due)

    async def close(self, commit_timeout_ms: int, *, connected: Callable[[], bool]) -> None:
        """Complete commit_async()'s commits, commit positions (with auto-commit on and a
        connection made: asked after those commits, which may have made it), revoke the
        partitions and leave the group."""
        if self._async_commits:
            # Commits the application made before close() are made before it leaves the group.
            await asyncio.wait(set(self._async_commits), timeout=commit_timeout_ms / 1000)
        if self.group_id is not None and self._config.enable_auto_commit and connected():
            try:
                await self.commit(timeout_ms=commit_timeout_ms)
            except HighwaterError as error:
                log.warning("final commit for group %s failed: %s", self.group_id, error)
        if self.member is not None:
            await self.call_listener("on_partitions_revoked", list(self._state.assignment))
        self.drop_member()
        await self.leave_dropped()

    # --- committed offsets ----------------------------------------------------------

    def _require_group(self, what: str) -> str:
        if self.group_id is None:
            raise InvalidArgument(
                f"{what} needs a group_id (Consumer(group_id=...) or subscribe(..., group_id=...))"
            )
        return self.group_id

    async def fetch_committed(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
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
        offset = (await self.fetch_committed([checked])).get(checked, -1)
        return offset if offset >= 0 else None

    async def commit(
        self, offsets: Mapping[TopicPartition, int] | None = None, *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """AsyncConsumer.commit (its docstring is the contract: retries, bounds, errors)."""
        group = self._require_group("commit()")
        budget_ms = (
            self._config.default_api_timeout_ms
            if timeout_ms is None
            else check_int("timeout_ms", timeout_ms, minimum=1)
        )
        if offsets is None:
            positions = self._state.positions
            to_commit = {tp: positions[tp] for tp in self._state.assignment if tp in positions}
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
            member = self.member
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
                min(self._config.retry_backoff_max_ms, self._config.retry_backoff_ms << min(attempts - 1, 20))
                / 1000
            )
            if time.monotonic() + pause_s >= bound_s:
                raise RequestTimedOut(
                    f"commit of {len(chunk)} offset(s) for group {group!r} not acknowledged within "
                    f"{(time.monotonic() - started_s) * 1000:.0f} ms ({attempts} attempt(s); bound: "
                    f"commit(timeout_ms=...), default_api_timeout_ms={self._config.default_api_timeout_ms}, "
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
        return error.retriable and error.code != common_pb2.STALE_MEMBER_EPOCH and self._answered()

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
            log.debug("commit_async for group %s failed: %s", self.group_id, task.exception())

    async def maybe_auto_commit(self, now: int) -> None:
        if self.group_id is None or not self._config.enable_auto_commit or now < self._next_auto_commit_ms:
            return
        self._next_auto_commit_ms = now + self._config.auto_commit_interval_ms
        try:
            await self.commit()
        except HighwaterError as error:
            log.warning("auto-commit for group %s failed: %s", self.group_id, error)

    # --- polling ------------------------------------------------------------------

    async def reconcile(self) -> None:
        """Follow the group's assignment: give up partitions the coordinator took away
        (committing their positions first with auto-commit on), take the new ones, and drop
        everything without committing when the member was fenced; then tell the member."""
        member = self.member
        if member is None:
            group_id, subscription = self.group_id, self._state.subscription
            if group_id is None or subscription is None:
                raise InvariantViolation(
                    f"reconcile() needs a grouped subscription (group {group_id!r}, topics {subscription!r})"
                )
            member = self.member = GroupMember(
                self._conn,
                group_id,
                subscription,
                instance_id=self._config.group_instance_id,
                session_timeout_ms=self._config.session_timeout_ms,
                rebalance_timeout_ms=self._config.max_poll_interval_ms,
                assignor=self._config.group_remote_assignor,
                client_id=CLIENT_ID,
            )
            member.start()
        member.changed.clear()
        if member.error is not None:
            raise member.error
        if member.lost:
            lost = list(self._state.assignment)
            self._assign([])
            await self.call_listener("on_partitions_lost", lost)
            member.rejoin()
            return
        target = member.target
        if target is None:
            return  # no answer yet
        revoked = [tp for tp in self._state.assignment if tp not in target]
        if revoked:
            if self._config.enable_auto_commit:
                positions = {tp: self._state.positions[tp] for tp in revoked if tp in self._state.positions}
                try:
                    await self.commit(positions)
                except HighwaterError as error:
                    log.warning("commit before revoking %s failed: %s", revoked, error)
                    if member.was_fenced():
                        return await self.reconcile()
            await self.call_listener("on_partitions_revoked", revoked)
            self._assign([tp for tp in self._state.assignment if tp in target])
        added = [tp for tp in sorted(target) if tp not in self._state.assignment]
        if added:
            self._assign(self._state.assignment + added)
            await self.call_listener("on_partitions_assigned", added)
        member.report_owned(frozenset(self._state.assignment))

    async def call_listener(self, name: str, partitions: list[TopicPartition]) -> None:
        callback = self._listeners.get(name)
        if callback is None or not partitions:
            return
        outcome = callback(list(partitions))
        if asyncio.iscoroutine(outcome):
            await outcome
