"""The consumer group service of a gateway: the pure coordinator (services/groups) over etcd.

Every gateway serves every group; there is no per-group coordinator to elect or fail over.
A group's whole coordinator state is one etcd value (`/consumers/<group>/state`), changed
only by compare-and-swap on its mod revision: each heartbeat reads it, runs the pure
`coordinator.heartbeat` and writes the new state if it changed, retrying on a lost race.
So two gateways never decide from different states, and a gateway's death loses nothing.

Liveness is an etcd lease per member (the ZooKeeper-era consumers' ephemeral node): a join
grants one of the member's session timeout and puts `/consumers/<group>/members/<id>` under
it, each heartbeat refreshes it, and when a member goes silent etcd deletes the key. Every
gateway watches those deletes and runs `coordinator.expire` (idempotent under the CAS); a
sweep every GROUP_SWEEP_INTERVAL_MS catches deletes that happened while no gateway watched.

Heartbeats long-poll: when the coordinator has nothing new for a member, the gateway holds
the answer up to HEARTBEAT_LONG_POLL_MS, woken by any change of the group's state key, so a
partition freed by a leave or an expiry reaches its new owner within milliseconds instead of
a heartbeat interval. The member sends its next heartbeat as soon as it has the answer.

Offset commits of members are fenced here too (`commit_guard`): the commit's transaction
compares the state key's mod revision with the one the epoch check read, so a member
expired in between cannot have its commit applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from clients.common.topics import group_id_problem, topic_name_problem
from clients.common.types import TopicPartitionKey
from coordinator import consumer_offsets, values
from coordinator.store import (
    Compare,
    CoordinatorError,
    Delete,
    KeyValue,
    MetadataStore,
    Op,
    Put,
    WatchEvent,
    compare_mod_revision,
)
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.common import limits
from services.gateway import metrics
from services.groups import coordinator
from services.groups.coordinator import GroupState, HeartbeatRequest
from services.groups.errors import GroupError

log = logging.getLogger("highwater.gateway.groups")
T = TypeVar("T")
_Keyed = TypeVar("_Keyed", KeyValue, WatchEvent)

# The gateway API's codes of the group errors its group calls answer (the coordinator's
# refusals, a refused commit); services/groups/errors.py maps every one to Kafka's wire.
GROUP_ERROR_CODES: dict[GroupError, common_pb2.ErrorCode] = {
    GroupError.UNKNOWN_MEMBER_ID: common_pb2.UNKNOWN_MEMBER_ID,
    GroupError.FENCED_MEMBER_EPOCH: common_pb2.FENCED_MEMBER_EPOCH,
    GroupError.STALE_MEMBER_EPOCH: common_pb2.STALE_MEMBER_EPOCH,
    GroupError.UNRELEASED_INSTANCE_ID: common_pb2.UNRELEASED_INSTANCE_ID,
    GroupError.UNSUPPORTED_ASSIGNOR: common_pb2.UNSUPPORTED_ASSIGNOR,
    GroupError.GROUP_MAX_SIZE_REACHED: common_pb2.GROUP_MAX_SIZE_REACHED,
    GroupError.NON_EMPTY_GROUP: common_pb2.NON_EMPTY_GROUP,
}
# What to do about each; a refused commit to a group with members says it with the group's name
# (group_calls.py), so NON_EMPTY_GROUP has no message here.
GROUP_ERROR_MESSAGES: dict[GroupError, str] = {
    GroupError.UNKNOWN_MEMBER_ID: "this member is not in the group (its session expired or it left): "
    "rejoin with member_epoch 0",
    GroupError.FENCED_MEMBER_EPOCH: "this member's epoch is not the group's: drop its partitions without "
    "committing and rejoin with member_epoch 0",
    GroupError.STALE_MEMBER_EPOCH: "an offset commit from an older epoch of this member: a newer owner may "
    "have moved on; rejoin",
    GroupError.UNRELEASED_INSTANCE_ID: "another live member holds this group.instance.id; stop it or wait "
    "for its session to expire",
    GroupError.UNSUPPORTED_ASSIGNOR: "unknown server assignor; use 'uniform' or 'range'",
    GroupError.GROUP_MAX_SIZE_REACHED: f"the group already has {coordinator.GROUP_MEMBERS_MAX} members",
}
ASSIGNOR_NAMES = ("uniform", "range")


def _decode_state(value: bytes) -> GroupState:
    """A group's state record as stored under its state key (JSON)."""
    return GroupState.from_record(json.loads(value))


class GroupStateConflict(Exception):
    """The group's state kept changing under this gateway's compare-and-swap."""


@dataclass(frozen=True)
class _Loaded:
    state: GroupState
    mod_revision: int  # 0: no state key yet


class GroupService:
    """Group heartbeats, admin calls and commit fencing for one gateway."""

    def __init__(
        self,
        store: MetadataStore,
        partition_counts: Callable[[Sequence[str]], Awaitable[dict[str, int]]],
        end_offsets: Callable[[Sequence[TopicPartitionKey]], Awaitable[dict[TopicPartitionKey, int]]]
        | None = None,
        *,
        session_timeout_ms_default: int = limits.GROUP_SESSION_TIMEOUT_MS_DEFAULT,
    ) -> None:
        self.store = store
        self.keys = store.keys
        self._partition_counts = partition_counts
        self._end_offsets = end_offsets
        self.session_timeout_ms_default = session_timeout_ms_default
        # group -> a future completed (and replaced) whenever the group's state key changes.
        self._changed: dict[str, asyncio.Future[None]] = {}
        self._leases: dict[tuple[str, str], int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # This gateway's copies of group states, and one lock per group for its own updates.
        self._states: dict[str, _Loaded] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._expiring: set[asyncio.Task[None]] = set()

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name="group-watch"),
            asyncio.create_task(self._sweep_forever(), name="group-sweep"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- state in etcd ---------------------------------------------------------------

    async def _load(self, group: str) -> _Loaded:
        """The group's state: this gateway's copy (kept current by its own writes and by the
        watch), else read from etcd. A copy gone stale only makes a compare-and-swap fail,
        which forgets it and reads again: no decision is written from a stale state."""
        cached = self._states.get(group)
        if cached is not None:
            return cached
        kv = await self.store.get(self.keys.consumer_group_state(group))
        loaded = (
            _Loaded(GroupState(group_id=group), 0)
            if kv is None
            else _Loaded(_decode_state(kv.value), kv.mod_revision)
        )
        return self._remember(group, loaded)

    def _remember(self, group: str, loaded: _Loaded) -> _Loaded:
        cached = self._states.get(group)
        if cached is None or loaded.mod_revision >= cached.mod_revision:
            self._states[group] = loaded
        return self._states[group]

    def forget(self, group: str) -> None:
        """Drop this gateway's copy of the group's state (a compare-and-swap found it stale)."""
        self._states.pop(group, None)

    async def _update(
        self,
        group: str,
        step: Callable[[GroupState], tuple[GroupState, T]],
        extra_ops: Callable[[GroupState, T], list[Op]] | None = None,
    ) -> tuple[GroupState, T]:
        """Run `step` on the current state and write its result if it changed, by CAS.

        Updates of one group through this gateway run one at a time (its lock), so they do
        not lose compare-and-swaps to each other; only another gateway's write can."""
        key = self.keys.consumer_group_state(group)
        lock = self._locks.setdefault(group, asyncio.Lock())
        async with lock:
            for _ in range(limits.GROUP_STATE_CAS_ATTEMPTS_MAX):
                loaded = await self._load(group)
                started = time.perf_counter()
                new_state, result = step(loaded.state)
                decided_s = time.perf_counter() - started
                ops = extra_ops(new_state, result) if extra_ops is not None else []
                if new_state == loaded.state and not ops:
                    return new_state, result
                writes: list[Op] = [*ops]
                if new_state != loaded.state:
                    writes.append(Put(key, _encode(new_state)))
                outcome = await self.store.txn([compare_mod_revision(key, loaded.mod_revision)], writes)
                if not outcome.succeeded:
                    self.forget(group)
                    continue
                if new_state != loaded.state:
                    self._remember(group, _Loaded(new_state, outcome.revision))
                    metrics.GROUP_ASSIGNMENT_SECONDS.observe(decided_s)
                if new_state.group_epoch > loaded.state.group_epoch:
                    metrics.GROUP_REBALANCES.labels(group).inc()
                return new_state, result
        raise GroupStateConflict(
            f"group {group!r}: its state changed under {limits.GROUP_STATE_CAS_ATTEMPTS_MAX} attempts "
            "in a row"
        )

    # --- heartbeat -------------------------------------------------------------------

    async def heartbeat(
        self, request: gateway_pb2.ConsumerGroupHeartbeatRequest, client_host: str
    ) -> gateway_pb2.ConsumerGroupHeartbeatResponse:
        problem = _heartbeat_problem(request)
        if problem is not None:
            return gateway_pb2.ConsumerGroupHeartbeatResponse(
                error_code=common_pb2.INVALID_REQUEST, error_message=problem
            )
        group = request.group_id
        subscribed = None if request.subscription_unchanged else frozenset(request.subscribed_topics)
        owned = None if request.owned_unchanged else frozenset((p.topic, p.partition) for p in request.owned)
        pure_request = HeartbeatRequest(
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            instance_id=request.instance_id or None,
            client_id=request.client_id,
            client_host=client_host,
            subscribed_topics=subscribed,
            owned=owned,
            rebalance_timeout_ms=request.rebalance_timeout_ms or coordinator.REBALANCE_TIMEOUT_MS_DEFAULT,
            assignor=request.server_assignor or None,
        )
        if request.member_epoch > 0 and not await self._refresh_lease(group, request.member_id):
            # Its session expired: make sure the state says so before answering.
            await self._expire(group, request.member_id)
            return _refused(GroupError.UNKNOWN_MEMBER_ID)

        lease = 0
        if request.member_epoch == coordinator.EPOCH_JOIN:
            session_ms = request.session_timeout_ms or self.session_timeout_ms_default
            lease = await self.store.grant_lease(max(1, math.ceil(session_ms / 1000)))
        # Registered before deciding, so a change that lands while this heartbeat is decided
        # still wakes its long poll.
        waiter = self._waiter(group)
        try:
            answer = await self._heartbeat_once(group, pure_request, lease)
        except BaseException:
            if lease:  # the join did not happen: its session lease goes at once, not at its TTL
                await self.store.revoke_lease(lease)
            raise
        if lease and (answer.error is not None or answer.member_id == ""):
            await self.store.revoke_lease(lease)
        if request.member_epoch == coordinator.EPOCH_LEAVE:
            old = self._leases.pop((group, request.member_id), 0)
            if old:
                await self.store.revoke_lease(old)
        if answer.error is None and _nothing_to_tell(answer, pure_request):
            answer = await self._long_poll(group, pure_request, answer, waiter)
        return _response(answer)

    async def _heartbeat_once(
        self, group: str, request: HeartbeatRequest, lease: int
    ) -> coordinator.HeartbeatAnswer:
        counts = await self._partition_counts(sorted(await self._topics_of(group, request)))
        new_member_id = uuid.uuid4().hex

        def step(state: GroupState) -> tuple[GroupState, coordinator.HeartbeatAnswer]:
            return coordinator.heartbeat(state, request, counts, new_member_id)

        def member_key(state: GroupState, answer: coordinator.HeartbeatAnswer) -> list[Op]:
            if not lease or answer.error is not None:
                return []
            # The joined member's liveness key, under its new lease, in the same transaction.
            return [Put(self.keys.consumer_group_member(group, answer.member_id), b"", lease=lease)]

        def leave_ops(state: GroupState, answer: coordinator.HeartbeatAnswer) -> list[Op]:
            if request.member_epoch == coordinator.EPOCH_LEAVE and request.member_id:
                return [Delete(self.keys.consumer_group_member(group, request.member_id))]
            return member_key(state, answer)

        _, answer = await self._update(group, step, leave_ops)
        if lease and answer.error is None:
            self._leases[(group, answer.member_id)] = lease
        return answer

    async def _topics_of(self, group: str, request: HeartbeatRequest) -> set[str]:
        """The topics whose partition counts the coordinator needs: every member's subscription."""
        loaded = await self._load(group)
        topics = {t for m in loaded.state.members.values() for t in m.subscribed_topics}
        if request.subscribed_topics is not None:
            topics |= request.subscribed_topics
        return topics

    def _waiter(self, group: str) -> asyncio.Future[None]:
        """A future completed at the group's next state change."""
        waiter = self._changed.get(group)
        if waiter is None or waiter.done():
            waiter = self._changed[group] = asyncio.get_running_loop().create_future()
        return waiter

    async def _long_poll(
        self,
        group: str,
        request: HeartbeatRequest,
        answer: coordinator.HeartbeatAnswer,
        waiter: asyncio.Future[None],
    ) -> coordinator.HeartbeatAnswer:
        """Hold an answer with nothing new until the group's state changes (or the poll ends),
        then heartbeat again with what the member last reported."""
        try:
            await asyncio.wait_for(asyncio.shield(waiter), limits.GROUP_HEARTBEAT_LONG_POLL_MS / 1000)
        except TimeoutError:
            return answer
        again = HeartbeatRequest(
            member_id=answer.member_id,
            member_epoch=answer.member_epoch,
            instance_id=request.instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            subscribed_topics=None,
            owned=request.owned,  # still what it owns: it is waiting for this answer
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            assignor=None,
        )
        return await self._heartbeat_once(group, again, 0)

    def _notify(self, group: str) -> None:
        waiter = self._changed.pop(group, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- liveness --------------------------------------------------------------------

    async def _refresh_lease(self, group: str, member_id: str) -> bool:
        """Refresh the member's session lease; False when it no longer exists."""
        lease = self._leases.get((group, member_id))
        if lease is None:
            kv = await self.store.get(self.keys.consumer_group_member(group, member_id))
            if kv is None or not kv.lease:
                return False
            lease = self._leases[(group, member_id)] = kv.lease
        if await self.store.keep_alive_once(lease) > 0:
            return True
        self._leases.pop((group, member_id), None)
        return False

    async def _expire(self, group: str, member_id: str) -> None:
        self._leases.pop((group, member_id), None)
        _, changed = await self._update(group, lambda state: coordinator.expire(state, member_id))
        if changed:
            log.info("group %s: member %s removed (session expired)", group, member_id)

    def _group_keys(self, items: Iterable[_Keyed]) -> Iterator[tuple[_Keyed, str, str, str]]:
        """Each item stored under a consumer group's keys with the (group, kind, rest) its key
        names (Keys.parse_consumer_group_key); items under any other key are skipped."""
        for item in items:
            parsed = self.keys.parse_consumer_group_key(item.key)
            if parsed is not None:
                group, kind, rest = parsed
                yield item, group, kind, rest

    async def _watch(self) -> None:
        """State changes wake long-polling heartbeats; member key deletes are expiries."""
        prefix = self.keys.consumers_prefix
        while True:
            try:
                self._states.clear()  # events may have been missed: read states afresh
                await self.sweep()
                async for events in self.store.watch_prefix(prefix):
                    for event, group, kind, rest in self._group_keys(events):
                        if kind == "state":
                            if event.kind == "put":
                                state = _decode_state(event.value)
                                self._remember(group, _Loaded(state, event.mod_revision))
                            else:
                                self.forget(group)
                            self._notify(group)
                        elif kind == "members" and event.kind == "delete":
                            task = asyncio.create_task(self._expire_logged(group, rest))
                            self._expiring.add(task)
                            task.add_done_callback(self._expiring.discard)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # etcd unavailable or compacted: start over after a pause
                log.warning("group watch interrupted (%s); restarting", exc)
                await asyncio.sleep(limits.GROUP_WATCH_RETRY_BACKOFF_MS / 1000)

    async def _expire_logged(self, group: str, member_id: str) -> None:
        try:
            await self._expire(group, member_id)
        except (CoordinatorError, GroupStateConflict) as exc:
            log.warning("group %s: could not remove expired member %s yet: %s", group, member_id, exc)

    async def sweep(self) -> None:
        """Expire members whose liveness key is gone (a delete no gateway saw)."""
        kvs, _ = await self.store.get_prefix(self.keys.consumers_prefix)
        live: set[tuple[str, str]] = set()
        states: dict[str, GroupState] = {}
        committed: dict[str, dict[TopicPartitionKey, int]] = {}
        for kv, group, kind, rest in self._group_keys(kvs):
            if kind == "members":
                live.add((group, rest))
            elif kind == "state":
                states[group] = _decode_state(kv.value)
            else:
                offset = self.keys.parse_consumer_offset(kv.key)
                if offset is not None:
                    committed.setdefault(group, {})[(offset[1], offset[2])] = values.decode_consumer_offset(
                        kv.value
                    )["offset"]
        for group, state in states.items():
            metrics.GROUP_MEMBERS.labels(group).set(len(state.members))
            for member_id in state.members:
                if (group, member_id) not in live:
                    await self._expire_logged(group, member_id)
        await self._export_lag(committed)

    async def _export_lag(self, committed: dict[str, dict[TopicPartitionKey, int]]) -> None:
        if self._end_offsets is None or not committed:
            return
        ends = await self._end_offsets(sorted({tp for offsets in committed.values() for tp in offsets}))
        for group, offsets in committed.items():
            lag = sum(max(0, ends[tp] - o) for tp, o in offsets.items() if tp in ends and o >= 0)
            metrics.GROUP_LAG.labels(group).set(lag)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(limits.GROUP_SWEEP_INTERVAL_MS / 1000)
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("group sweep failed: %s", exc)

    # --- offset commits --------------------------------------------------------------

    async def commit_guard(self, group: str) -> tuple[GroupState, Compare]:
        """The group's state an offset commit is checked against (services/groups/
        offset_commits.py), and the compare its transaction must carry (the state unchanged
        since this read)."""
        loaded = await self._load(group)
        return loaded.state, compare_mod_revision(self.keys.consumer_group_state(group), loaded.mod_revision)

    # --- admin -----------------------------------------------------------------------

    async def list_groups(self) -> gateway_pb2.ListGroupsResponse:
        kvs, _ = await self.store.get_prefix(self.keys.consumers_prefix)
        groups: dict[str, GroupState | None] = {}
        for kv, group, kind, _ in self._group_keys(kvs):
            if kind == "state":
                groups[group] = _decode_state(kv.value)
            else:
                groups.setdefault(group, None)
        response = gateway_pb2.ListGroupsResponse()
        for group in sorted(groups):
            state = groups[group] or GroupState(group_id=group)
            response.groups.add(
                group_id=group,
                state=coordinator.state_name(state),
                members=len(state.members),
                group_epoch=state.group_epoch,
            )
        return response

    async def describe(self, group: str) -> gateway_pb2.GroupDescription:
        loaded = await self._load(group)
        if loaded.mod_revision == 0:
            kvs, _ = await self.store.get_prefix(self.keys.consumer_group_prefix(group))
            if not kvs:
                return gateway_pb2.GroupDescription(
                    group_id=group,
                    error_code=common_pb2.GROUP_ID_NOT_FOUND,
                    error_message=f"no group {group!r}: it has no members and no committed offsets",
                )
        d = coordinator.describe(loaded.state)
        out = gateway_pb2.GroupDescription(
            group_id=group,
            state=coordinator.state_name(loaded.state),
            group_epoch=d.group_epoch,
            target_epoch=d.target_epoch,
            assignor=d.assignor,
        )
        for m in d.members:
            out.members.add(
                member_id=m.member_id,
                instance_id=m.instance_id or "",
                client_id=m.client_id,
                client_host=m.client_host,
                member_epoch=m.member_epoch,
                assignment=_tps(m.assignment | m.pending_revocation),
                target_assignment=_tps(m.target),
                subscribed_topics=sorted(m.subscribed_topics),
                state="away" if m.away else m.state.name.lower(),
            )
        return out

    async def delete(self, group: str) -> gateway_pb2.DeleteGroupResult:
        """Delete a group's offsets and state; refused while it has members."""
        loaded = await self._load(group)
        if not coordinator.deletable(loaded.state):
            return gateway_pb2.DeleteGroupResult(
                group_id=group,
                error_code=common_pb2.NON_EMPTY_GROUP,
                error_message=f"group {group!r} has {len(loaded.state.members)} members; stop them first",
            )
        kvs, _ = await self.store.get_prefix(self.keys.consumer_group_prefix(group))
        if not kvs:
            return gateway_pb2.DeleteGroupResult(
                group_id=group, error_code=common_pb2.GROUP_ID_NOT_FOUND, error_message=f"no group {group!r}"
            )
        if not await consumer_offsets.delete_group_if_state_unchanged(self.store, group, loaded.mod_revision):
            self.forget(group)
            return gateway_pb2.DeleteGroupResult(
                group_id=group,
                error_code=common_pb2.NON_EMPTY_GROUP,
                error_message=f"group {group!r} changed while being deleted (a member joined?); try again",
            )
        return gateway_pb2.DeleteGroupResult(group_id=group)


def _encode(state: GroupState) -> bytes:
    return json.dumps(state.to_record(), separators=(",", ":")).encode()


def _tps(tps: frozenset[TopicPartitionKey]) -> list[common_pb2.TopicPartition]:
    return [common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(tps)]


def _refused(error: GroupError) -> gateway_pb2.ConsumerGroupHeartbeatResponse:
    return gateway_pb2.ConsumerGroupHeartbeatResponse(
        error_code=GROUP_ERROR_CODES[error], error_message=GROUP_ERROR_MESSAGES[error]
    )


def _response(answer: coordinator.HeartbeatAnswer) -> gateway_pb2.ConsumerGroupHeartbeatResponse:
    if answer.error is not None:
        return _refused(answer.error)
    return gateway_pb2.ConsumerGroupHeartbeatResponse(
        member_id=answer.member_id,
        member_epoch=answer.member_epoch,
        # The gateway long-polls, so a member heartbeats again as soon as it has the answer.
        heartbeat_interval_ms=0,
        assignment=_tps(answer.assignment),
    )


def _nothing_to_tell(answer: coordinator.HeartbeatAnswer, request: HeartbeatRequest) -> bool:
    """A regular heartbeat whose answer repeats what the member reported owning, at its epoch."""
    return (
        request.member_epoch > 0
        and answer.member_epoch == request.member_epoch
        and request.owned is not None
        and answer.assignment == request.owned
    )


def _heartbeat_problem(request: gateway_pb2.ConsumerGroupHeartbeatRequest) -> str | None:
    problem = group_id_problem(request.group_id)
    if problem is not None:
        return problem
    if request.member_epoch < coordinator.EPOCH_LEAVE_STATIC:
        return (
            f"member_epoch {request.member_epoch} is not an epoch (0 joins, -1 leaves, -2 leaves for a while)"
        )
    if request.member_epoch != coordinator.EPOCH_JOIN and not request.member_id:
        return "member_id is empty: only a join (member_epoch 0) may leave it empty"
    if request.member_epoch == coordinator.EPOCH_JOIN and not request.subscribed_topics:
        return "a join must name the topics it subscribes to"
    if len(request.subscribed_topics) > limits.GROUP_SUBSCRIBED_TOPICS_MAX:
        return (
            f"{len(request.subscribed_topics)} subscribed topics; "
            f"the limit is {limits.GROUP_SUBSCRIBED_TOPICS_MAX}"
        )
    for name in request.subscribed_topics:
        problem = topic_name_problem(name)
        if problem is not None:
            return f"subscribed topic: {problem}"
    if request.server_assignor and request.server_assignor not in ASSIGNOR_NAMES:
        return f"server_assignor {request.server_assignor!r} is not one of {', '.join(ASSIGNOR_NAMES)}"
    if request.session_timeout_ms and not (
        limits.GROUP_SESSION_TIMEOUT_MS_MIN
        <= request.session_timeout_ms
        <= limits.GROUP_SESSION_TIMEOUT_MS_MAX
    ):
        return (
            f"session_timeout_ms {request.session_timeout_ms} is outside "
            f"{limits.GROUP_SESSION_TIMEOUT_MS_MIN}..{limits.GROUP_SESSION_TIMEOUT_MS_MAX}"
        )
    if request.rebalance_timeout_ms < 0:
        return f"rebalance_timeout_ms {request.rebalance_timeout_ms} is negative"
    if len(request.owned) > limits.GROUP_OWNED_PARTITIONS_MAX:
        return f"{len(request.owned)} owned partitions; the limit is {limits.GROUP_OWNED_PARTITIONS_MAX}"
    if len(request.instance_id) > limits.GROUP_INSTANCE_ID_MAX_CHARS:
        return (
            f"instance_id is {len(request.instance_id)} characters; "
            f"the limit is {limits.GROUP_INSTANCE_ID_MAX_CHARS}"
        )
    return None
